//! Gradients of reductions over any axes (with and without `keepdim` and masks) and of operands
//! broadcast along any axes, checked against central finite differences in the interpreter.

mod common;

use common::Problem;
use kfuse_ir::{BinaryOp, NodeId, ReduceAxis, ReduceOp, UnaryOp};

/// Distinct values (no ties for max/min), varied by `seed`.
fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| (((i as u64 * 7919 + seed * 104_729) % 1009) as f64 - 504.0) / 97.0 + i as f64 * 1e-3).collect()
}

/// `sum(w * y)` with `w` a fresh non-differentiated input shaped like `y`, so that every element
/// of `y` gets a different gradient.
fn weighted(p: &mut Problem, y: NodeId, seed: u64) -> NodeId {
    let shape = p.b.node(y).shape.clone();
    let sizes: Vec<usize> = shape
        .dims()
        .iter()
        .map(|d| match d {
            kfuse_ir::Dim::Const(c) => *c as usize,
            kfuse_ir::Dim::Sym(_) => panic!("test bug: weighted() needs constant shapes"),
        })
        .collect();
    let names: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let dims: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let n = sizes.iter().product();
    let w = p.input(&format!("w{seed}"), &dims, &sizes, values(n, seed + 17));
    let prod = p.b.binary(BinaryOp::Mul, w, y).unwrap();
    p.b.reduce(ReduceOp::Sum, ReduceAxis::All, prod, None).unwrap()
}

#[test]
fn reductions_over_any_axes_have_their_gradients() {
    let axis_sets: [&[i64]; 6] = [&[0], &[1], &[2], &[0, 2], &[0, 1], &[1, 2]];
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        for axes in axis_sets {
            for keepdim in [false, true] {
                let mut p = Problem::new();
                let x = p.input("x", &["3", "4", "5"], &[3, 4, 5], values(60, 1));
                let r = p.b.reduce_axes(op, x, axes, keepdim, None).unwrap();
                let loss = weighted(&mut p, r, 2);
                p.check(loss, &["x"]).unwrap_or_else(|e| panic!("{} {axes:?} keepdim {keepdim}: {e}", op.name()));
            }
        }
    }
}

#[test]
fn masked_reductions_over_any_axes_have_their_gradients() {
    for axes in [&[0][..], &[1], &[0, 2]] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let mut p = Problem::new();
            let x = p.input("x", &["3", "4", "5"], &[3, 4, 5], values(60, 3));
            // True except where (i + j + k) % 3 == 0: every reduced slice keeps an element.
            let tv = (0..60).map(|e| if (e / 20 + e / 5 % 4 + e % 5) % 3 == 0 { -1.0 } else { 1.0 }).collect();
            let t = p.input("t", &["3", "4", "5"], &[3, 4, 5], tv);
            let zero = p.b.lit_float(0.0);
            let m = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
            let r = p.b.reduce_axes(op, x, axes, false, Some(m)).unwrap();
            let loss = weighted(&mut p, r, 5);
            p.check(loss, &["x"]).unwrap_or_else(|e| panic!("{} {axes:?}: {e}", op.name()));
        }
    }
}

type Dims = &'static [&'static str];
type Sizes = &'static [usize];

#[test]
fn operands_broadcast_along_leading_and_middle_axes_get_summed_gradients() {
    // (operand dims, full dims): a [D] weight in [B, D]; [1, D] in [A, B, D]; [B, 1, D] in
    // [B, N, D]; [N, 1] in [B, N, D]; a symbolic [N] row in [B, N].
    let cases: [(Dims, Sizes, Dims, Sizes); 5] = [
        (&["D"], &[5], &["B", "D"], &[3, 5]),
        (&["1", "D"], &[1, 5], &["A", "B", "D"], &[2, 3, 5]),
        (&["B", "1", "D"], &[3, 1, 5], &["B", "N", "D"], &[3, 4, 5]),
        (&["N", "1"], &[4, 1], &["B", "N", "D"], &[3, 4, 5]),
        (&["N"], &[4], &["B", "N"], &[3, 4]),
    ];
    for (rd, rs, xd, xs) in cases {
        let mut p = Problem::new();
        let x = p.input("x", xd, xs, values(xs.iter().product(), 6));
        let r = p.input("r", rd, rs, values(rs.iter().product(), 7));
        let y = p.b.binary(BinaryOp::Mul, x, r).unwrap();
        let y = p.b.unary(UnaryOp::Tanh, y).unwrap();
        let w = p.input("w", xd, xs, values(xs.iter().product(), 8));
        let prod = p.b.binary(BinaryOp::Mul, w, y).unwrap();
        let loss = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, prod, None).unwrap();
        p.check(loss, &["r", "x"]).unwrap_or_else(|e| panic!("{rd:?} in {xd:?}: {e}"));
    }
}

/// Layer norm over the last axis of `x: [B, D]` with `gamma`, `beta: [D]` (eps 1e-5), as
/// `torch.nn.functional.layer_norm` computes it.
fn layer_norm(p: &mut Problem, x: NodeId, gamma: NodeId, beta: NodeId) -> NodeId {
    let b = &mut p.b;
    let mu = b.reduce_axes(ReduceOp::Mean, x, &[-1], true, None).unwrap();
    let xc = b.binary(BinaryOp::Sub, x, mu).unwrap();
    let sq = b.binary(BinaryOp::Mul, xc, xc).unwrap();
    let var = b.reduce_axes(ReduceOp::Mean, sq, &[-1], true, None).unwrap();
    let eps = b.lit_float(1e-5);
    let ve = b.binary(BinaryOp::Add, var, eps).unwrap();
    let rstd = b.unary(UnaryOp::Rsqrt, ve).unwrap();
    let xhat = b.binary(BinaryOp::Mul, xc, rstd).unwrap();
    let scaled = b.binary(BinaryOp::Mul, xhat, gamma).unwrap();
    b.binary(BinaryOp::Add, scaled, beta).unwrap()
}

#[test]
fn layer_norm_weight_and_bias_gradients_match_finite_differences() {
    for (rows, d) in [(1, 3), (3, 5), (4, 1)] {
        let mut p = Problem::new();
        let (b, dd) = (rows.to_string(), d.to_string());
        let x = p.input("x", &[&b, &dd], &[rows, d], values(rows * d, 9));
        let gamma = p.input("gamma", &[&dd], &[d], values(d, 10));
        let beta = p.input("beta", &[&dd], &[d], values(d, 11));
        let y = layer_norm(&mut p, x, gamma, beta);
        let loss = weighted(&mut p, y, 12);
        p.check(loss, &["x", "gamma", "beta"]).unwrap_or_else(|e| panic!("[{rows}, {d}]: {e}"));
    }
}

#[test]
fn the_bias_gradient_is_the_column_sum_of_the_upstream_gradient() {
    // loss = sum(w * (x + bias)): d loss / d bias = sum over rows of w.
    let mut p = Problem::new();
    let x = p.input("x", &["B", "D"], &[3, 2], values(6, 13));
    let bias = p.input("bias", &["D"], &[2], vec![0.5, -0.5]);
    let w = p.input("w", &["B", "D"], &[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let y = p.b.binary(BinaryOp::Add, x, bias).unwrap();
    let prod = p.b.binary(BinaryOp::Mul, w, y).unwrap();
    let loss = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, prod, None).unwrap();
    let g = p.gradients(loss, &["bias"]);
    assert_eq!(g[0], vec![9.0, 12.0]);
}
