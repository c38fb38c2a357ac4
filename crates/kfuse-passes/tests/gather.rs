//! Gradients of `gather` along every axis (repeated indices add up, columns never gathered get 0),
//! of a computed source and of a one-index-per-row pick after a log-softmax, checked against
//! central finite differences in the interpreter.

mod common;

use common::Problem;
use kfuse_ir::{BinaryOp, DType, NodeId, ReduceAxis, ReduceOp, UnaryOp};

fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| (((i as u64 * 7919 + seed * 104_729) % 1009) as f64 - 504.0) / 197.0).collect()
}

/// `sum(w * y)` with a fresh input `w` shaped like `y` (constant sizes `sizes`).
fn weighted(p: &mut Problem, y: NodeId, sizes: &[usize]) -> NodeId {
    let dims: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let dims: Vec<&str> = dims.iter().map(|s| s.as_str()).collect();
    let w = p.input("w", &dims, sizes, values(sizes.iter().product(), 11));
    let prod = p.b.binary(BinaryOp::Mul, w, y).unwrap();
    p.b.reduce(ReduceOp::Sum, ReduceAxis::All, prod, None).unwrap()
}

/// Indices in `0..size` with repeats: `(e * 5 + seed) % size` over `n` positions.
fn indices(n: usize, size: usize, seed: usize) -> Vec<f64> {
    (0..n).map(|e| ((e * 5 + seed) % size) as f64).collect()
}

#[test]
fn gather_along_each_axis_has_its_gradient() {
    let x_sizes = [3usize, 4, 5];
    for axis in 0..3 {
        for (k, dtype) in [(1usize, DType::I64), (2, DType::I32), (7, DType::I64)] {
            let mut p = Problem::new();
            let x = p.input("x", &["3", "4", "5"], &x_sizes, values(60, 1));
            let mut i_sizes = x_sizes;
            i_sizes[axis] = k;
            let dims: Vec<String> = i_sizes.iter().map(|s| s.to_string()).collect();
            let dims: Vec<&str> = dims.iter().map(|s| s.as_str()).collect();
            let n = i_sizes.iter().product();
            let idx = p.input_typed("idx", dtype, &dims, &i_sizes, indices(n, x_sizes[axis], axis));
            let y = p.b.gather(x, idx, axis as i64).unwrap();
            let loss = weighted(&mut p, y, &i_sizes);
            p.check(loss, &["x"]).unwrap_or_else(|e| panic!("axis {axis}, {k} indices of {dtype}: {e}"));
        }
    }
}

#[test]
fn gather_of_a_computed_source_has_its_gradient() {
    // gather(exp(x) * x, idx, axis: -1): the chain rule through the gathered positions only.
    let mut p = Problem::new();
    let x = p.input("x", &["4", "6"], &[4, 6], values(24, 2));
    let idx = p.input_typed("idx", DType::I32, &["4", "3"], &[4, 3], indices(12, 6, 1));
    let e = p.b.unary(UnaryOp::Exp, x).unwrap();
    let s = p.b.binary(BinaryOp::Mul, e, x).unwrap();
    let y = p.b.gather(s, idx, -1).unwrap();
    let loss = weighted(&mut p, y, &[4, 3]);
    p.check(loss, &["x"]).unwrap();
}

#[test]
fn a_log_softmax_pick_per_row_has_its_gradient_and_untouched_columns_get_softmax_only() {
    // -mean(gather(log_softmax(x), labels[.., None])): dx = (softmax(x) - one_hot) / B.
    let mut p = Problem::new();
    let x = p.input("x", &["5", "7"], &[5, 7], values(35, 3));
    let labels = p.input_typed("labels", DType::I64, &["5", "1"], &[5, 1], vec![6.0, 0.0, 3.0, 3.0, 1.0]);
    let m = p.b.reduce(ReduceOp::Max, ReduceAxis::Last, x, None).unwrap();
    let m = p.b.expand_last(m);
    let z = p.b.binary(BinaryOp::Sub, x, m).unwrap();
    let ez = p.b.unary(UnaryOp::Exp, z).unwrap();
    let s = p.b.reduce(ReduceOp::Sum, ReduceAxis::Last, ez, None).unwrap();
    let ls = p.b.unary(UnaryOp::Log, s).unwrap();
    let ls = p.b.expand_last(ls);
    let lp = p.b.binary(BinaryOp::Sub, z, ls).unwrap();
    let picked = p.b.gather(lp, labels, -1).unwrap();
    let mean = p.b.reduce(ReduceOp::Mean, ReduceAxis::All, picked, None).unwrap();
    let loss = p.b.unary(UnaryOp::Neg, mean).unwrap();
    let grads = p.gradients(loss, &["x"]);
    let xv = values(35, 3);
    let label = [6usize, 0, 3, 3, 1];
    for r in 0..5 {
        let row = &xv[r * 7..r * 7 + 7];
        let mx = row.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for c in 0..7 {
            let want = ((row[c] - mx).exp() / sum - f64::from(u8::from(c == label[r]))) / 5.0;
            let got = grads[0][r * 7 + c];
            assert!((got - want).abs() < 1e-12, "row {r} column {c}: {got} vs {want}");
        }
    }
}
