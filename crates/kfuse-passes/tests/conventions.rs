//! Subgradient conventions at kinks (PyTorch's), checked on exact values, and the simplification
//! of trivial backward nodes.

mod common;

use common::Problem;
use kfuse_ir::{BinaryOp, Op, ReduceAxis, ReduceOp, TernaryOp, UnaryOp};

fn sum_all(p: &mut Problem, x: kfuse_ir::NodeId) -> kfuse_ir::NodeId {
    p.b.reduce(ReduceOp::Sum, ReduceAxis::All, x, None).unwrap()
}

#[test]
fn abs_at_zero_has_zero_gradient() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[4], vec![-2.0, 0.0, -0.0, 3.0]);
    let a = p.b.unary(UnaryOp::Abs, x).unwrap();
    let loss = sum_all(&mut p, a);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![-1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn clamp_passes_gradient_at_its_bounds_inclusive() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[6], vec![-1.0, 1.0, -2.0, 2.0, 0.5, 1.0]);
    let lo = p.input("lo", &["N"], &[6], vec![-1.0; 6]);
    // The last element has lo > hi: torch gives hi all the gradient there.
    let hi = p.input("hi", &["N"], &[6], vec![1.0, 1.0, 1.0, 1.0, 1.0, -3.0]);
    let c = p.b.clamp(x, lo, hi).unwrap();
    let loss = sum_all(&mut p, c);
    let g = p.gradients(loss, &["x", "lo", "hi"]);
    assert_eq!(g[0], vec![1.0, 1.0, 0.0, 0.0, 1.0, 0.0], "d/dx");
    assert_eq!(g[1], vec![0.0, 0.0, 1.0, 0.0, 0.0, 0.0], "d/dlo");
    assert_eq!(g[2], vec![0.0, 0.0, 0.0, 1.0, 0.0, 1.0], "d/dhi");
}

#[test]
fn clamp_with_literal_bounds() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[5], vec![-1.0, 1.0, -1.5, 1.5, 0.0]);
    let (lo, hi) = (p.b.lit_float(-1.0), p.b.lit_float(1.0));
    let c = p.b.clamp(x, lo, hi).unwrap();
    let loss = sum_all(&mut p, c);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![1.0, 1.0, 0.0, 0.0, 1.0]);
}

#[test]
fn elementwise_max_and_min_split_ties_half_and_half() {
    for op in [BinaryOp::Max, BinaryOp::Min] {
        let mut p = Problem::new();
        let a = p.input("a", &["N"], &[3], vec![1.0, 2.0, 5.0]);
        let b = p.input("b", &["N"], &[3], vec![1.0, 3.0, 4.0]);
        let m = p.b.binary(op, a, b).unwrap();
        let loss = sum_all(&mut p, m);
        let g = p.gradients(loss, &["a", "b"]);
        let (ga, gb) = if op == BinaryOp::Max {
            (vec![0.5, 0.0, 1.0], vec![0.5, 1.0, 0.0])
        } else {
            (vec![0.5, 1.0, 0.0], vec![0.5, 0.0, 1.0])
        };
        assert_eq!(g[0], ga, "{op:?} d/da");
        assert_eq!(g[1], gb, "{op:?} d/db");
    }
}

#[test]
fn max_of_a_value_with_itself_has_gradient_one() {
    let mut p = Problem::new();
    let a = p.input("a", &["N"], &[2], vec![1.0, -2.0]);
    let m = p.b.binary(BinaryOp::Max, a, a).unwrap();
    let loss = sum_all(&mut p, m);
    assert_eq!(p.gradients(loss, &["a"])[0], vec![1.0, 1.0]);
}

#[test]
fn max_and_min_reductions_share_the_gradient_among_ties() {
    let mut p = Problem::new();
    let x = p.input("x", &["B", "N"], &[2, 4], vec![3.0, 1.0, 3.0, 2.0, 5.0, 5.0, 5.0, -1.0]);
    let all = p.b.reduce(ReduceOp::Max, ReduceAxis::All, x, None).unwrap();
    let rows = p.b.reduce(ReduceOp::Min, ReduceAxis::Last, x, None).unwrap();
    let rows = sum_all(&mut p, rows);
    let loss = p.b.binary(BinaryOp::Add, all, rows).unwrap();
    let g = p.gradients(loss, &["x"]);
    // max over all: the three 5s share 1; min per row: 1 in row 0, -1 in row 1.
    let third = 1.0 / 3.0;
    assert_eq!(g[0], vec![0.0, 1.0, 0.0, 0.0, third, third, third, 1.0]);

    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[4], vec![3.0, 1.0, 3.0, 2.0]);
    let m = p.b.reduce(ReduceOp::Max, ReduceAxis::Last, x, None).unwrap();
    assert_eq!(p.gradients(m, &["x"])[0], vec![0.5, 0.0, 0.5, 0.0]);
}

#[test]
fn masked_max_ignores_masked_out_ties_and_gives_them_zero() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[4], vec![7.0, 5.0, 5.0, f64::NAN]);
    let t = p.input("t", &["N"], &[4], vec![0.0, 1.0, 1.0, 0.0]);
    let zero = p.b.lit_float(0.0);
    let m = p.b.binary(BinaryOp::Ne, t, zero).unwrap();
    let r = p.b.reduce(ReduceOp::Max, ReduceAxis::All, x, Some(m)).unwrap();
    assert_eq!(p.gradients(r, &["x"])[0], vec![0.0, 0.5, 0.5, 0.0]);
}

#[test]
fn masked_sum_and_mean_give_exact_zeros_even_over_nan() {
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[2, 3], vec![1.0, f64::NAN, 3.0, f64::INFINITY, 2.0, -1.0]);
        let t = p.input("t", &["B", "N"], &[2, 3], vec![1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        let zero = p.b.lit_float(0.0);
        let m = p.b.binary(BinaryOp::Ne, t, zero).unwrap();
        let sq = p.b.binary(BinaryOp::Mul, x, x).unwrap();
        let r = p.b.reduce(op, ReduceAxis::Last, sq, Some(m)).unwrap();
        let loss = sum_all(&mut p, r);
        let g = p.gradients(loss, &["x"]);
        let want =
            if op == ReduceOp::Sum { vec![2.0, 0.0, 6.0, 0.0, 4.0, -2.0] } else { vec![1.0, 0.0, 3.0, 0.0, 2.0, -1.0] };
        assert_eq!(g[0], want, "{op:?}");
    }
}

#[test]
fn where_gives_the_other_branch_exactly_zero() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[4], vec![-1.0, 0.0, 2.0, 4.0]);
    let zero = p.b.lit_float(0.0);
    let c = p.b.binary(BinaryOp::Gt, x, zero).unwrap();
    // log(x) is NaN or -inf where x <= 0; the unselected branch must not leak into the gradient.
    let l = p.b.unary(UnaryOp::Log, x).unwrap();
    let three = p.b.lit_float(3.0);
    let lin = p.b.binary(BinaryOp::Mul, x, three).unwrap();
    let w = p.b.select(c, l, lin).unwrap();
    let loss = sum_all(&mut p, w);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![3.0, 3.0, 0.5, 0.25]);
}

#[test]
fn sqrt_at_zero_gives_infinity_like_torch() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![0.0, 4.0]);
    let s = p.b.unary(UnaryOp::Sqrt, x).unwrap();
    let loss = sum_all(&mut p, s);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![f64::INFINITY, 0.25]);
}

#[test]
fn pow_follows_torch_at_zero() {
    // d(0^y)/dy is 0 for y >= 0 (not NaN from 0 * log 0); d(x^0)/dx is 0.
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[3], vec![0.0, 0.0, 2.0]);
    let y = p.input("y", &["N"], &[3], vec![2.0, 0.0, 0.0]);
    let z = p.b.binary(BinaryOp::Pow, x, y).unwrap();
    let loss = sum_all(&mut p, z);
    let g = p.gradients(loss, &["x", "y"]);
    assert_eq!(g[0], vec![0.0, 0.0, 0.0]);
    assert_eq!(g[1], vec![0.0, 0.0, 2f64.ln()]);
}

#[test]
fn a_loss_that_ignores_the_input_has_zero_gradient_of_its_shape() {
    let mut p = Problem::new();
    let _x = p.input("x", &["B", "3"], &[2, 3], vec![1.0; 6]);
    let y = p.input("y", &["N"], &[2], vec![1.0, 2.0]);
    let loss = sum_all(&mut p, y);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![0.0; 6]);

    // Through an int cast and floor only: no gradient either.
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[3], vec![0.5, 1.5, 2.5]);
    let f = p.b.unary(UnaryOp::Floor, x).unwrap();
    let i = p.b.cast(x, kfuse_ir::DType::I32);
    let fi = p.b.binary(BinaryOp::Add, f, i).unwrap();
    let loss = sum_all(&mut p, fi);
    assert_eq!(p.gradients(loss, &["x"])[0], vec![0.0; 3]);
}

#[test]
fn gradient_of_the_input_itself_is_one() {
    let mut p = Problem::new();
    let s = p.input("s", &[], &[], vec![2.5]);
    assert_eq!(p.gradients(s, &["s"])[0], vec![1.0]);
}

#[test]
fn no_trivial_nodes_in_the_backward_graph() {
    // loss = sum(where(valid, x * w + 0, 0) * 1): the backward graph should hold no `* 1`, `+ 0`,
    // `* 0`, and no double negation.
    let mut p = Problem::new();
    let x = p.input("x", &["B", "N"], &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let w = p.input("w", &["B", "N"], &[2, 3], vec![0.5; 6]);
    let t = p.input("t", &["B", "N"], &[2, 3], vec![1.0, 0.0, 1.0, 1.0, 1.0, 0.0]);
    let zero = p.b.lit_float(0.0);
    let valid = p.b.binary(BinaryOp::Ne, t, zero).unwrap();
    let xw = p.b.binary(BinaryOp::Mul, x, w).unwrap();
    let nx = p.b.unary(UnaryOp::Neg, xw).unwrap();
    let nnx = p.b.unary(UnaryOp::Neg, nx).unwrap();
    let sel = p.b.select(valid, nnx, zero).unwrap();
    let loss = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, sel, Some(valid)).unwrap();
    let before = p.b.graph().nodes.len();
    let (graph, inputs) = p.graph(loss, &["x"]);
    for (i, n) in graph.nodes.iter().enumerate().skip(before) {
        if let Op::Binary(op, a, b) = n.op {
            for side in [a, b] {
                if let Op::Const(l) = graph.node(side).op {
                    let v = l.as_f64();
                    assert!(
                        !(v == 0.0 && matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul)),
                        "v{i} {op:?} by 0\n{graph}"
                    );
                    assert!(!(v == 1.0 && matches!(op, BinaryOp::Mul | BinaryOp::Div)), "v{i} {op:?} by 1\n{graph}");
                }
            }
        }
        if let Op::Unary(UnaryOp::Neg, a) = n.op {
            assert!(!matches!(graph.node(a).op, Op::Unary(UnaryOp::Neg, _)), "v{i} double negation\n{graph}");
        }
        if let Op::Ternary(TernaryOp::Select, _, a, b) = n.op {
            assert!(a != b, "v{i} where with equal branches\n{graph}");
        }
    }
    let out = inputs.eval(&graph);
    let g = &out.iter().find(|e| e.name == "grad_x").unwrap().values;
    assert_eq!(g, &vec![0.5, 0.0, 0.5, 0.5, 0.5, 0.0]);
}

#[test]
fn gradients_are_deterministic() {
    let build = || {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "4"], &[1, 4], vec![1.0, 2.0, 3.0, 4.0]);
        let c0 = p.b.component(x, 0).unwrap();
        let c2 = p.b.component(x, 2).unwrap();
        let m = p.b.binary(BinaryOp::Max, c0, c2).unwrap();
        let e = p.b.unary(UnaryOp::Exp, m).unwrap();
        let loss = p.b.reduce(ReduceOp::Mean, ReduceAxis::All, e, None).unwrap();
        p.graph(loss, &["x"]).0
    };
    let (a, b) = (build(), build());
    assert_eq!(a, b);
    assert_eq!(a.stable_hash(), b.stable_hash());
}
