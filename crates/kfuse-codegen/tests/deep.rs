//! Graphs of any depth plan and emit on the test harness's ordinary thread (a 2 MiB stack): the
//! emitter walks the graph with its own work stack, not by recursion.

use kfuse_codegen::{emit_device_function, plan, CodegenOptions};
use kfuse_ir::{BinaryOp, DType, Dim, GraphBuilder, NodeId, Shape, UnaryOp};

const DEPTH: usize = 100_000;

/// `DEPTH` nodes, each reading the one before: alternately `* 1.5`, `neg`, `+ x`.
fn chain(b: &mut GraphBuilder, x: NodeId) -> NodeId {
    let mut v = x;
    for i in 0..DEPTH {
        v = match i % 3 {
            0 => {
                let c = b.lit_float(1.5);
                b.binary(BinaryOp::Mul, v, c).unwrap()
            }
            1 => b.unary(UnaryOp::Neg, v).unwrap(),
            _ => b.binary(BinaryOp::Add, v, x).unwrap(),
        };
    }
    v
}

#[test]
fn a_chain_of_a_hundred_thousand_nodes_is_one_kernel() {
    let mut b = GraphBuilder::new();
    let n = b.symbol("N");
    let x = b.input("x", DType::F32, Shape(vec![Dim::Sym(n)])).unwrap();
    let y = chain(&mut b, x);
    b.output("y", y).unwrap();
    let s = b.reduce(kfuse_ir::ReduceOp::Sum, kfuse_ir::ReduceAxis::All, y, None).unwrap();
    b.output("s", s).unwrap();
    let g = b.finish().unwrap();
    let p = plan(&g, &CodegenOptions::default()).unwrap();
    assert_eq!(p.kernels.len(), 1);
    let src = &p.kernels[0].source;
    assert!(src.lines().filter(|l| l.trim_start().starts_with("const float v")).count() >= DEPTH);
}

#[test]
fn a_device_function_of_a_hundred_thousand_nodes_is_emitted() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, Shape::scalar()).unwrap();
    let y = chain(&mut b, x);
    b.output("y", y).unwrap();
    let g = b.finish().unwrap();
    let src = emit_device_function(&g, "act").unwrap();
    assert!(src.contains("__device__ __forceinline__ float act(float in0 /* x */)"));
    assert!(src.contains(&format!("return v{};", DEPTH - 1)));
}
