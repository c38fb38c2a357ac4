//! Gradient checks for every differentiable op: autodiff agrees with central finite differences
//! (f64, on the interpreter) on random inputs away from kinks.

mod common;

use common::{distance_to, weighted_sum, Problem};
use kfuse_ir::{BinaryOp, DType, NodeId, ReduceAxis, ReduceOp, UnaryOp};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() }
}

/// A `[B, N]` shape with small run-time sizes, and `count` value vectors of that size from `range`.
fn matrices(count: usize, range: std::ops::Range<f64>) -> impl Strategy<Value = (usize, usize, Vec<Vec<f64>>)> {
    (1usize..4, 1usize..5).prop_flat_map(move |(b, n)| {
        let r = range.clone();
        (Just(b), Just(n), proptest::collection::vec(proptest::collection::vec(r, b * n), count))
    })
}

/// `sum(w * op(x))` over `x: f32[B, N]`, checked w.r.t. `x`.
fn check_unary(op: UnaryOp, b: usize, n: usize, x: Vec<f64>, w: Vec<f64>) -> Result<(), TestCaseError> {
    let mut p = Problem::new();
    let xi = p.input("x", &["B", "N"], &[b, n], x);
    let wi = p.input("w", &["B", "N"], &[b, n], w);
    let y = p.b.unary(op, xi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, y);
    p.check(loss, &["x"]).map_err(TestCaseError::fail)
}

/// `sum(w * op(x, y))` with `x: [B, N]` and `y` of the given dims, checked w.r.t. both.
#[allow(clippy::too_many_arguments)]
fn check_binary(
    op: BinaryOp,
    b: usize,
    n: usize,
    ydims: &[&str],
    ysizes: &[usize],
    x: Vec<f64>,
    y: Vec<f64>,
    w: Vec<f64>,
) -> Result<(), TestCaseError> {
    let mut p = Problem::new();
    let xi = p.input("x", &["B", "N"], &[b, n], x);
    let yi = p.input("y", ydims, ysizes, y);
    let wi = p.input("w", &["B", "N"], &[b, n], w);
    let z = p.b.binary(op, xi, yi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, z);
    p.check(loss, &["x", "y"]).map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn unary_smooth_ops((b, n, v) in matrices(2, -2.0..2.0)) {
        for op in [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::Tanh, UnaryOp::Erf, UnaryOp::Sin, UnaryOp::Cos] {
            check_unary(op, b, n, v[0].clone(), v[1].clone())?;
        }
    }

    #[test]
    fn unary_positive_domain_ops((b, n, v) in matrices(2, 0.1..5.0)) {
        for op in [UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt] {
            check_unary(op, b, n, v[0].clone(), v[1].clone())?;
        }
    }

    #[test]
    fn abs_away_from_zero((b, n, v) in matrices(2, -3.0..3.0)) {
        prop_assume!(distance_to(&v[0], |x| x) > 1e-3);
        check_unary(UnaryOp::Abs, b, n, v[0].clone(), v[1].clone())?;
    }

    #[test]
    fn floor_has_zero_gradient((b, n, v) in matrices(2, -3.0..3.0)) {
        prop_assume!(distance_to(&v[0], |x| x - x.round()) > 1e-3);
        check_unary(UnaryOp::Floor, b, n, v[0].clone(), v[1].clone())?;
    }

    #[test]
    fn add_sub_mul_same_shape((b, n, v) in matrices(3, -3.0..3.0)) {
        for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul] {
            check_binary(op, b, n, &["B", "N"], &[b, n], v[0].clone(), v[1].clone(), v[2].clone())?;
        }
    }

    #[test]
    fn div_away_from_zero((b, n, v) in matrices(3, -3.0..3.0)) {
        prop_assume!(distance_to(&v[1], |x| x) > 0.3);
        check_binary(BinaryOp::Div, b, n, &["B", "N"], &[b, n], v[0].clone(), v[1].clone(), v[2].clone())?;
    }

    #[test]
    fn pow_positive_base((b, n, v) in matrices(2, 0.2..3.0), e in proptest::collection::vec(-2.0f64..2.0, 12)) {
        let e: Vec<f64> = e.into_iter().cycle().take(b * n).collect();
        check_binary(BinaryOp::Pow, b, n, &["B", "N"], &[b, n], v[0].clone(), e, v[1].clone())?;
    }

    #[test]
    fn pow_by_literal_exponents((b, n, v) in matrices(2, 0.2..3.0)) {
        for e in [0.0, 1.0, 2.0, 3.0, 0.5, -1.5] {
            let mut p = Problem::new();
            let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
            let w = p.input("w", &["B", "N"], &[b, n], v[1].clone());
            let k = p.b.lit_float(e);
            let y = p.b.binary(BinaryOp::Pow, x, k).unwrap();
            let loss = weighted_sum(&mut p.b, w, y);
            p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn literal_to_the_power_of_x((b, n, v) in matrices(2, -2.0..2.0)) {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[1].clone());
        let k = p.b.lit_float(1.7);
        let y = p.b.binary(BinaryOp::Pow, k, x).unwrap();
        let loss = weighted_sum(&mut p.b, w, y);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn min_max_away_from_ties((b, n, v) in matrices(3, -3.0..3.0)) {
        let gaps: Vec<f64> = v[0].iter().zip(&v[1]).map(|(a, c)| a - c).collect();
        prop_assume!(distance_to(&gaps, |d| d) > 1e-3);
        for op in [BinaryOp::Min, BinaryOp::Max] {
            check_binary(op, b, n, &["B", "N"], &[b, n], v[0].clone(), v[1].clone(), v[2].clone())?;
        }
    }

    #[test]
    fn where_sends_gradient_to_the_selected_branch((b, n, v) in matrices(4, -3.0..3.0)) {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let y = p.input("y", &["B", "N"], &[b, n], v[1].clone());
        let t = p.input("t", &["B", "N"], &[b, n], v[2].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[3].clone());
        let zero = p.b.lit_float(0.0);
        let c = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
        let xs = p.b.unary(UnaryOp::Sin, x).unwrap();
        let z = p.b.select(c, xs, y).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x", "y"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn clamp_inside_and_outside((b, n, v) in matrices(4, -3.0..3.0)) {
        // lo and hi come from v[1] and v[2], ordered; x stays away from both bounds.
        let lo: Vec<f64> = v[1].iter().zip(&v[2]).map(|(a, c)| a.min(*c)).collect();
        let hi: Vec<f64> = v[1].iter().zip(&v[2]).map(|(a, c)| a.max(*c)).collect();
        let gap_lo: Vec<f64> = v[0].iter().zip(&lo).map(|(x, l)| x - l).collect();
        let gap_hi: Vec<f64> = v[0].iter().zip(&hi).map(|(x, h)| x - h).collect();
        prop_assume!(distance_to(&gap_lo, |d| d) > 1e-3 && distance_to(&gap_hi, |d| d) > 1e-3);
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let l = p.input("lo", &["B", "N"], &[b, n], lo);
        let h = p.input("hi", &["B", "N"], &[b, n], hi);
        let w = p.input("w", &["B", "N"], &[b, n], v[3].clone());
        let z = p.b.clamp(x, l, h).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x", "lo", "hi"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn components_stack_and_expand((b, v) in (1usize..5).prop_flat_map(|b| (Just(b), proptest::collection::vec(-2.0f64..2.0, b * 4 * 2)))) {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "4"], &[b, 4], v[..b * 4].to_vec());
        let w = p.input("w", &["B", "4"], &[b, 4], v[b * 4..].to_vec());
        // Components 0, 1 and 3 are used (2 gets none), one of them twice.
        let c0 = p.b.component(x, 0).unwrap();
        let c1 = p.b.component(x, 1).unwrap();
        let c3 = p.b.component(x, -1).unwrap();
        let s1 = p.b.unary(UnaryOp::Sin, c1).unwrap();
        let prod = p.b.binary(BinaryOp::Mul, c0, c3).unwrap();
        let two = p.b.lit_float(2.0);
        let c0b = p.b.binary(BinaryOp::Mul, c0, two).unwrap();
        let stacked = p.b.stack(&[prod, s1, c0b, two]).unwrap();
        let e = p.b.expand_last(c3);
        let both = p.b.binary(BinaryOp::Mul, stacked, e).unwrap();
        let loss = weighted_sum(&mut p.b, w, both);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn casts_between_floats_pass_and_int_casts_stop((b, n, v) in matrices(2, -3.0..3.0)) {
        prop_assume!(distance_to(&v[0], |x| x - x.round()) > 1e-3);
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[1].clone());
        let h = p.b.cast(x, DType::F16);
        let i = p.b.cast(x, DType::I32);
        let back = p.b.cast(i, DType::F32);
        let z = p.b.binary(BinaryOp::Mul, h, back).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn reductions_along_last_and_all((b, n, v) in matrices(3, -3.0..3.0), masked in any::<bool>()) {
        // Ties in max/min are measure-zero with continuous data, but keep values apart anyway.
        let mut sorted = v[0].clone();
        sorted.sort_by(f64::total_cmp);
        prop_assume!(sorted.windows(2).all(|p| p[1] - p[0] > 1e-3));
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            for axis in [ReduceAxis::All, ReduceAxis::Last] {
                let mut p = Problem::new();
                let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
                let t = p.input("t", &["B", "N"], &[b, n], v[1].clone());
                let w = p.input("w", &["B"], &[b], v[2][..b].to_vec());
                let zero = p.b.lit_float(0.0);
                let m = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
                let mask = masked.then_some(m);
                let sq = p.b.binary(BinaryOp::Mul, x, x).unwrap();
                let xs = p.b.binary(BinaryOp::Add, sq, x).unwrap();
                let r = p.b.reduce(op, axis, xs, mask).unwrap();
                let loss = if axis == ReduceAxis::Last { weighted_sum(&mut p.b, w, r) } else { r };
                // An empty masked mean is NaN and an empty max is -inf; skip those draws.
                let (graph, inputs) = p.graph(loss, &["x"]);
                let out = inputs.eval(&graph);
                let l = out.iter().find(|e| e.name == "loss").unwrap().values[0];
                if l.is_finite() {
                    common::check_graph(&graph, &inputs, &["x"]).map_err(TestCaseError::fail)?;
                }
            }
        }
    }

    #[test]
    fn mean_over_symbolic_axes_and_masks_lower_rank((b, n, v) in matrices(3, -3.0..3.0)) {
        // x: [B, N, 2] reduced with a [B, N] mask broadcast along the last axis... and a [N, 1] one.
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N", "2"], &[b, n, 2], v[0].iter().chain(&v[1]).copied().collect());
        let t = p.input("t", &["B", "N", "1"], &[b, n, 1], v[2].clone());
        let zero = p.b.lit_float(0.0);
        let m = p.b.binary(BinaryOp::Gt, t, zero).unwrap();
        let sq = p.b.binary(BinaryOp::Mul, x, x).unwrap();
        let r = p.b.reduce(ReduceOp::Mean, ReduceAxis::All, sq, Some(m)).unwrap();
        let r2 = p.b.reduce(ReduceOp::Mean, ReduceAxis::All, x, None).unwrap();
        let loss = p.b.binary(BinaryOp::Add, r, r2).unwrap();
        let (graph, inputs) = p.graph(loss, &["x"]);
        let l = inputs.eval(&graph).iter().find(|e| e.name == "loss").unwrap().values[0];
        if l.is_finite() {
            common::check_graph(&graph, &inputs, &["x"]).map_err(TestCaseError::fail)?;
        }
    }
}

/// `sum(w * (x op y))` with `x: [B, N]` and a broadcast `y`, for each arithmetic op.
fn check_broadcast(ydims: &[&str], ysizes: &[usize], b: usize, n: usize, v: &[Vec<f64>]) -> Result<(), TestCaseError> {
    let ylen: usize = ysizes.iter().product();
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max] {
        // Keep divisors away from 0 and max away from ties: shift y to [3.5, 6.5], x is in [-3, 3].
        let y: Vec<f64> = v[1][..ylen].iter().map(|t| t + 5.0).collect();
        check_binary(op, b, n, ydims, ysizes, v[0].clone(), y, v[2].clone())?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn broadcast_scalar_operand((b, n, v) in matrices(3, -1.5..1.5)) {
        check_broadcast(&[], &[], b, n, &v)?;
    }

    #[test]
    fn broadcast_column_operand((b, n, v) in matrices(3, -1.5..1.5)) {
        check_broadcast(&["B", "1"], &[b, 1], b, n, &v)?;
    }

    #[test]
    fn broadcast_one_by_one_operand((b, n, v) in matrices(3, -1.5..1.5)) {
        check_broadcast(&["1", "1"], &[1, 1], b, n, &v)?;
    }

    #[test]
    fn broadcast_constant_row_operand((b, v) in (1usize..4).prop_flat_map(|b| (Just(b), proptest::collection::vec(proptest::collection::vec(-1.5f64..1.5, b * 3), 3)))) {
        // A [3] row (and a [1, 3] one) in a [B, 3] result: summed per component over B.
        let mut p = Problem::new();
        let x = p.input("x", &["B", "3"], &[b, 3], v[0].clone());
        let r = p.input("r", &["3"], &[3], v[1][..3].to_vec());
        let r1 = p.input("r1", &["1", "3"], &[1, 3], v[1][..3].iter().map(|t| t * 0.5).collect());
        let w = p.input("w", &["B", "3"], &[b, 3], v[2].clone());
        let xr = p.b.binary(BinaryOp::Mul, x, r).unwrap();
        let z = p.b.binary(BinaryOp::Add, xr, r1).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x", "r", "r1"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn broadcast_through_a_scalar_upstream((b, n, v) in matrices(2, -1.5..1.5)) {
        // sum(x + s): the upstream gradient is a scalar, so the gradient of s must count elements.
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let s = p.input("s", &[], &[], vec![v[1][0]]);
        let c = p.input("c", &["B", "1"], &[b, 1], v[1][..b].to_vec());
        let z = p.b.binary(BinaryOp::Add, x, s).unwrap();
        let z = p.b.binary(BinaryOp::Add, z, c).unwrap();
        let loss = p.b.reduce(ReduceOp::Mean, ReduceAxis::All, z, None).unwrap();
        p.check(loss, &["x", "s", "c"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn shared_subexpressions_and_f16_inputs((b, n, v) in matrices(2, 0.2..2.0)) {
        let mut p = Problem::new();
        let x = p.input_typed("x", DType::F16, &["B", "N"], &[b, n], v[0].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[1].clone());
        let e = p.b.unary(UnaryOp::Exp, x).unwrap();
        let l = p.b.unary(UnaryOp::Log, e).unwrap();
        let q = p.b.binary(BinaryOp::Div, e, l).unwrap();
        let z = p.b.binary(BinaryOp::Mul, q, e).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }
}

/// The node count grows by the backward pass only; the forward nodes are reused.
#[test]
fn backward_reuses_forward_nodes() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[3], vec![0.5, 1.0, 2.0]);
    let e = p.b.unary(UnaryOp::Exp, x).unwrap();
    let loss = p.b.reduce(ReduceOp::Sum, ReduceAxis::All, e, None).unwrap();
    let before = p.b.graph().nodes.len();
    let g: NodeId = kfuse_passes::grad(&mut p.b, loss, x).unwrap();
    // d sum(exp x) / dx = exp x: the gradient is the forward node itself, materialised at x's shape
    // (no multiplication by the seed 1).
    assert_eq!(g, e, "gradient of sum(exp(x)) should be the forward exp node\n{}", p.b.graph());
    assert!(p.b.graph().nodes.len() <= before + 1, "unexpected backward nodes:\n{}", p.b.graph());
}

/// A stack whose parts broadcast against each other: the scalar part's gradient sums over `B`.
#[test]
fn stack_parts_of_different_shapes() {
    let mut p = Problem::new();
    let x = p.input("x", &["B"], &[3], vec![0.3, -1.2, 2.0]);
    let s = p.input("s", &[], &[], vec![0.7]);
    let w = p.input("w", &["B", "2"], &[3, 2], vec![1.0, -2.0, 0.5, 3.0, -1.5, 0.25]);
    let xs = p.b.unary(UnaryOp::Tanh, x).unwrap();
    let ss = p.b.binary(BinaryOp::Mul, s, s).unwrap();
    let st = p.b.stack(&[xs, ss]).unwrap();
    let loss = weighted_sum(&mut p.b, w, st);
    p.check(loss, &["x", "s"]).unwrap();
}
