//! Helpers shared by the interpreter's integration tests: shapes, tensors, one-output evaluation.
#![allow(dead_code)]

pub mod giou;

use kfuse_interp::{evaluate, Evaluated};
use kfuse_ir::{DType, Dim, Graph, GraphBuilder, HostTensor, NodeId, Shape};

/// A shape from dims.
pub fn shape(dims: &[Dim]) -> Shape {
    Shape(dims.to_vec())
}

/// A constant dim.
pub fn c(n: u64) -> Dim {
    Dim::Const(n)
}

/// The symbolic dim `name`, created on first use.
pub fn sym(b: &mut GraphBuilder, name: &str) -> Dim {
    Dim::Sym(b.symbol(name))
}

pub fn t(dtype: DType, shape: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_f64(dtype, shape.to_vec(), values)
}

/// Builds a graph whose single output `out` is what `body` returns.
pub fn graph1(body: impl FnOnce(&mut GraphBuilder) -> NodeId) -> Graph {
    let mut b = GraphBuilder::new();
    let out = body(&mut b);
    b.output("out", out).expect("fresh output name");
    b.finish().expect("test graph verifies")
}

/// Evaluates and returns the only output.
pub fn eval1(g: &Graph, inputs: &[(&str, &HostTensor)]) -> Evaluated {
    let mut outs = evaluate(g, inputs).expect("evaluation succeeds");
    assert_eq!(outs.len(), 1);
    outs.remove(0)
}

/// Asserts bit-exact equality, treating every NaN as equal to every NaN.
pub fn assert_same(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g == w || (g.is_nan() && w.is_nan()), "element {i}: got {g:?}, want {w:?} (all: {got:?})");
    }
}

/// Asserts agreement within `tol` absolute error, NaN matching NaN.
pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol || (g.is_nan() && w.is_nan()) || g == w, "element {i}: got {g:?}, want {w:?}");
    }
}
