//! The public entry points: `run`'s rounding to output dtypes, `evaluate_f64`, and the errors
//! for inputs that do not fit.

mod common;

use common::*;
use kfuse_interp::{evaluate, evaluate_f64, run, InterpError};
use kfuse_ir::{BinaryOp, BindError, DType, Graph, HostTensor, TensorData};

/// out = x * y, with x: f32[N], y: f32[N], stored as `dtype`.
fn scaled(dtype: DType) -> Graph {
    graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", DType::F32, shape(&[n])).unwrap();
        let y = b.input("y", DType::F32, shape(&[n])).unwrap();
        let p = b.binary(BinaryOp::Mul, x, y).unwrap();
        b.cast(p, dtype)
    })
}

#[test]
fn run_rounds_outputs_to_nearest_even_in_their_dtype() {
    // 1/3, and values exactly halfway between two f16 / bf16 neighbours.
    let vals = [1.0 / 3.0, 1.0 + 2f64.powi(-11), 1.0 + 3.0 * 2f64.powi(-11), 1.0 + 2f64.powi(-8)];
    let ones = t(DType::F32, &[4], &[3.0, 1.0, 1.0, 1.0]);
    let x = t(DType::F32, &[4], &[1.0 / 3.0, vals[1], vals[2], vals[3]]);
    // Evaluate keeps full precision: (f32(1/3)) * 3 is not 1.
    let e = evaluate(&scaled(DType::F16), &[("x", &x), ("y", &ones)]).unwrap();
    assert_eq!(e[0].values[0], (1.0f32 / 3.0) as f64 * 3.0);

    let f16s = run(&scaled(DType::F16), &[("x", &x), ("y", &ones)]).unwrap();
    let TensorData::F16(h) = &f16s[0].1.data else { panic!("expected f16 output, got {:?}", f16s[0].1.dtype()) };
    // f32(1/3)*3 = 1.0000000298: rounds to 1. Halfway cases round to the even mantissa;
    // 1 + 2^-8 is exact in f16.
    let got: Vec<f64> = h.iter().map(|v| v.to_f64()).collect();
    assert_eq!(got, vec![1.0, 1.0, 1.0 + 2f64.powi(-9), 1.0 + 2f64.powi(-8)]);

    let y1 = t(DType::F32, &[4], &[1.0; 4]);
    let bf = run(&scaled(DType::BF16), &[("x", &x), ("y", &y1)]).unwrap();
    assert_eq!(bf[0].1.dtype(), DType::BF16);
    // 1/3 in bf16 (8 significant bits, rounded up) is 171/512; 1 + 2^-8 ties to 1.
    assert_eq!(bf[0].1.to_f64(), vec![171.0 / 512.0, 1.0, 1.0, 1.0]);
    let hf = run(&scaled(DType::F16), &[("x", &x), ("y", &y1)]).unwrap();
    // 1/3 in f16 (11 significant bits, rounded down) is 1365/4096.
    assert_eq!(hf[0].1.to_f64()[0], 1365.0 / 4096.0);
    let i = run(&scaled(DType::I32), &[("x", &x), ("y", &ones)]).unwrap();
    assert_eq!(i[0].1.data, TensorData::I32(vec![1, 1, 1, 1]));
}

#[test]
fn evaluate_f64_keeps_float_inputs_unrounded() {
    let g = scaled(DType::F32);
    let third = 1.0 / 3.0;
    let out = evaluate_f64(&g, &[("x", vec![2], vec![third, 0.1]), ("y", vec![2], vec![3.0, 10.0])]).unwrap();
    assert_eq!(out[0].values, vec![third * 3.0, 0.1 * 10.0]);
    // Ints and bools come from the f64 values: truncated, and != 0.
    let g = graph1(|b| {
        let i = b.input("i", DType::I32, shape(&[c(2)])).unwrap();
        let m = b.input("m", DType::Bool, shape(&[c(2)])).unwrap();
        let zero = b.lit_int(0);
        b.select(m, i, zero).unwrap()
    });
    let out = evaluate_f64(&g, &[("i", vec![2], vec![2.9, -3.9]), ("m", vec![2], vec![0.5, 1.0])]).unwrap();
    assert_eq!(out[0].values, vec![2.0, -3.0]);
    // Wrong shapes are binding errors here too.
    let err = evaluate_f64(&g, &[("i", vec![3], vec![0.0; 3]), ("m", vec![2], vec![0.0; 2])]).unwrap_err();
    assert!(matches!(err, InterpError::Bind(BindError::ConstDim { .. })), "{err}");
}

#[test]
fn inputs_that_do_not_fit_are_clear_errors() {
    let g = scaled(DType::F32);
    let x = t(DType::F32, &[2], &[1.0, 2.0]);
    let y3 = t(DType::F32, &[3], &[1.0, 2.0, 3.0]);
    let yi = t(DType::I32, &[2], &[1.0, 2.0]);

    let err = evaluate(&g, &[("x", &x)]).unwrap_err();
    assert!(matches!(&err, InterpError::Bind(BindError::Missing { name, .. }) if name == "y"), "{err}");
    let err = evaluate(&g, &[("x", &x), ("y", &y3)]).unwrap_err();
    assert!(matches!(&err, InterpError::Bind(BindError::SymbolClash { .. })), "{err}");
    assert!(err.to_string().contains("N = 3"), "{err}");
    let err = evaluate(&g, &[("x", &x), ("y", &yi)]).unwrap_err();
    assert!(matches!(&err, InterpError::Bind(BindError::DType { .. })), "{err}");
    let err = evaluate(&g, &[("x", &x), ("y", &x), ("z", &x)]).unwrap_err();
    assert!(matches!(&err, InterpError::Bind(BindError::Unknown { .. })), "{err}");
    let err = evaluate(&g, &[("x", &x), ("x", &x)]).unwrap_err();
    assert_eq!(err, InterpError::DuplicateInput { name: "x".into() });
    // A tensor whose data disagrees with its own shape (fields are public).
    let bad = HostTensor { shape: vec![2], data: TensorData::F32(vec![1.0; 5]) };
    let err = evaluate(&g, &[("x", &x), ("y", &bad)]).unwrap_err();
    assert!(matches!(&err, InterpError::DataLength { expected: 2, got: 5, .. }), "{err}");
    let huge = HostTensor { shape: vec![usize::MAX, 4], data: TensorData::F32(vec![]) };
    let err = evaluate(&g, &[("x", &x), ("y", &huge)]).unwrap_err();
    assert!(matches!(&err, InterpError::SizeOverflow { .. }), "{err}");
    // A hand-broken graph is refused by the verifier instead of crashing.
    let mut broken = g.clone();
    broken.outputs[0].node = kfuse_ir::NodeId(999);
    assert!(matches!(evaluate(&broken, &[("x", &x), ("y", &x)]), Err(InterpError::Graph(_))));
}

#[test]
fn outputs_come_back_in_declaration_order_and_may_repeat_inputs() {
    let mut b = kfuse_ir::GraphBuilder::new();
    let x = b.input("x", DType::F16, shape(&[c(2)])).unwrap();
    let two = b.lit_float(2.0);
    let d = b.binary(BinaryOp::Mul, x, two).unwrap();
    b.output("double", d).unwrap();
    b.output("same", x).unwrap();
    b.output("again", d).unwrap();
    let g = b.finish().unwrap();
    let x = t(DType::F16, &[2], &[0.5, -3.0]);
    let outs = run(&g, &[("x", &x)]).unwrap();
    let names: Vec<&str> = outs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["double", "same", "again"]);
    assert_eq!(outs[0].1.to_f64(), vec![1.0, -6.0]);
    assert_eq!(outs[1].1, x);
    assert_eq!(outs[2].1.to_f64(), vec![1.0, -6.0]);
}
