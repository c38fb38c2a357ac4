//! What `grad` refuses, and how it says so.

mod common;

use common::Problem;
use kfuse_ir::{BinaryOp, DType, IrError, NodeId, ReduceAxis, ReduceOp, UnaryOp};
use kfuse_passes::grad;

fn not_differentiable(e: IrError) -> (String, String) {
    match e {
        IrError::NotDifferentiable { what, why } => (what, why),
        other => panic!("expected NotDifferentiable, got {other:?}"),
    }
}

#[test]
fn a_non_scalar_output_is_refused_by_name() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
    let e = p.b.unary(UnaryOp::Exp, x).unwrap();
    p.b.output("activations", e).unwrap();
    let (what, why) = not_differentiable(grad(&mut p.b, e, x).unwrap_err());
    assert!(what.contains("activations"), "{what}");
    assert!(why.contains("scalar") && why.contains("f32[N]"), "{why}");
}

#[test]
fn a_non_float_output_is_refused() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
    let zero = p.b.lit_float(0.0);
    let pos = p.b.binary(BinaryOp::Gt, x, zero).unwrap();
    let n = p.b.reduce(ReduceOp::Count, ReduceAxis::All, pos, None).unwrap();
    let (what, why) = not_differentiable(grad(&mut p.b, n, x).unwrap_err());
    assert!(what.starts_with('v'), "{what}");
    assert!(why.contains("i32"), "{why}");
}

#[test]
fn wrt_must_be_an_input() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
    let e = p.b.unary(UnaryOp::Exp, x).unwrap();
    let s = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, e, None).unwrap();
    let (_, why) = not_differentiable(grad(&mut p.b, s, e).unwrap_err());
    assert!(why.contains("input"), "{why}");
}

#[test]
fn int_and_bool_inputs_have_no_gradient() {
    for dtype in [DType::I32, DType::Bool] {
        let mut p = Problem::new();
        let k = p.input_typed("k", dtype, &["N"], &[2], vec![1.0, 0.0]);
        let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
        let kf = p.b.cast(k, DType::F32);
        let y = p.b.binary(BinaryOp::Mul, x, kf).unwrap();
        let s = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, y, None).unwrap();
        let (what, why) = not_differentiable(grad(&mut p.b, s, k).unwrap_err());
        assert!(what.contains("`k`"), "{what}");
        assert!(why.contains(dtype.name()), "{why}");
    }
}

#[test]
fn node_ids_outside_the_graph_are_errors_not_panics() {
    let mut p = Problem::new();
    let x = p.input("x", &[], &[], vec![1.0]);
    assert!(matches!(grad(&mut p.b, NodeId(99), x), Err(IrError::Malformed(_))));
    assert!(matches!(grad(&mut p.b, x, NodeId(99)), Err(IrError::Malformed(_))));
}
