//! Gradient checks for the elementwise ops that follow PyTorch's math library: autodiff agrees
//! with central finite differences (f64, on the interpreter) on random inputs inside each op's
//! domain and away from its kinks and poles; the piecewise-constant ops (sign, round, trunc, ceil,
//! floor_div) give zeros there, as PyTorch's `derivatives.yaml` says. Known values pin PyTorch's
//! conventions where finite differences cannot: `hypot` at the origin, `copysign` at `a == 0` and
//! its sign operand, and the closed forms of `lgamma`'s, `digamma`'s, `erfinv`'s and `erfc`'s
//! gradients; `grad` through `trigamma` (whose gradient would be `polygamma(2, x)`) is an error.

mod common;

use common::{distance_to, weighted_sum, Problem};
use kfuse_ir::{BinaryOp, UnaryOp};
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
fn check_unary(op: UnaryOp, b: usize, n: usize, x: &[f64], w: &[f64]) -> Result<(), TestCaseError> {
    let mut p = Problem::new();
    let xi = p.input("x", &["B", "N"], &[b, n], x.to_vec());
    let wi = p.input("w", &["B", "N"], &[b, n], w.to_vec());
    let y = p.b.unary(op, xi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, y);
    p.check(loss, &["x"]).map_err(|e| TestCaseError::fail(format!("{}: {e}", op.name())))
}

/// `sum(w * op(x, y))` with `x: [B, N]` and `y` of dims `ydims`, checked w.r.t. both.
fn check_binary(op: BinaryOp, dims: (usize, usize), ydims: &[&str], v: &[Vec<f64>]) -> Result<(), TestCaseError> {
    let (b, n) = dims;
    let mut p = Problem::new();
    let xi = p.input("x", &["B", "N"], &[b, n], v[0].clone());
    let ysizes: Vec<usize> = ydims.iter().map(|d| d.parse().unwrap_or(if *d == "B" { b } else { n })).collect();
    let yi = p.input("y", ydims, &ysizes, v[1].clone());
    let wi = p.input("w", &["B", "N"], &[b, n], v[2].clone());
    let z = p.b.binary(op, xi, yi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, z);
    p.check(loss, &["x", "y"]).map_err(|e| TestCaseError::fail(format!("{}: {e}", op.name())))
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn smooth_unary_ops((b, n, v) in matrices(2, -2.0..2.0)) {
        for op in [UnaryOp::Expm1, UnaryOp::Atan, UnaryOp::Sinh, UnaryOp::Cosh, UnaryOp::Asinh] {
            check_unary(op, b, n, &v[0], &v[1])?;
        }
    }

    #[test]
    fn log1p_above_minus_one((b, n, v) in matrices(2, -0.9..4.0)) {
        check_unary(UnaryOp::Log1p, b, n, &v[0], &v[1])?;
    }

    #[test]
    fn tan_inside_its_period((b, n, v) in matrices(2, -1.2..1.2)) {
        check_unary(UnaryOp::Tan, b, n, &v[0], &v[1])?;
    }

    #[test]
    fn acosh_above_one((b, n, v) in matrices(2, 1.1..4.0)) {
        check_unary(UnaryOp::Acosh, b, n, &v[0], &v[1])?;
    }

    #[test]
    fn asin_acos_and_atanh_inside_the_unit_interval((b, n, v) in matrices(2, -0.9..0.9)) {
        for op in [UnaryOp::Asin, UnaryOp::Acos, UnaryOp::Atanh] {
            check_unary(op, b, n, &v[0], &v[1])?;
        }
    }

    #[test]
    fn lgamma_and_digamma_of_positive_values((b, n, v) in matrices(2, 0.2..6.0)) {
        for op in [UnaryOp::Lgamma, UnaryOp::Digamma] {
            check_unary(op, b, n, &v[0], &v[1])?;
        }
    }

    #[test]
    fn lgamma_and_digamma_of_negative_values_between_the_poles((b, n, v) in matrices(2, -4.0..0.0)) {
        prop_assume!(distance_to(&v[0], |x| x - x.round()) > 0.1);
        for op in [UnaryOp::Lgamma, UnaryOp::Digamma] {
            check_unary(op, b, n, &v[0], &v[1])?;
        }
    }

    #[test]
    fn erfinv_inside_the_unit_interval((b, n, v) in matrices(2, -0.95..0.95)) {
        check_unary(UnaryOp::Erfinv, b, n, &v[0], &v[1])?;
    }

    #[test]
    fn erfc_across_its_transition((b, n, v) in matrices(2, -3.0..4.0)) {
        check_unary(UnaryOp::Erfc, b, n, &v[0], &v[1])?;
    }

    #[test]
    fn piecewise_constant_ops_have_zero_gradient((b, n, v) in matrices(2, -3.0..3.0)) {
        // Away from the integers (trunc, ceil; sign's kink at 0 is one) and the halves (round).
        prop_assume!(distance_to(&v[0], |x| x - x.round()) > 1e-3);
        prop_assume!(distance_to(&v[0], |x| x - x.floor() - 0.5) > 1e-3);
        for op in [UnaryOp::Sign, UnaryOp::Round, UnaryOp::Trunc, UnaryOp::Ceil] {
            check_unary(op, b, n, &v[0], &v[1])?;
        }
    }

    #[test]
    fn atan2_away_from_the_origin((b, n, v) in matrices(3, -3.0..3.0)) {
        let r2: Vec<f64> = v[0].iter().zip(&v[1]).map(|(y, x)| y * y + x * x).collect();
        prop_assume!(distance_to(&r2, |r| r) > 0.1);
        // Away from the branch cut (x < 0, y = 0), where atan2 jumps by 2 pi.
        let cut: Vec<f64> = v[0].iter().zip(&v[1]).map(|(y, x)| if *x < 0.0 { *y } else { 1.0 }).collect();
        prop_assume!(distance_to(&cut, |y| y) > 1e-3);
        check_binary(BinaryOp::Atan2, (b, n), &["B", "N"], &v)?;
    }

    #[test]
    fn remainder_and_floor_div_away_from_whole_quotients((b, n, v) in matrices(3, -5.0..5.0)) {
        prop_assume!(distance_to(&v[1], |y| y) > 0.3);
        let q: Vec<f64> = v[0].iter().zip(&v[1]).map(|(x, y)| x / y).collect();
        prop_assume!(distance_to(&q, |q| q - q.round()) > 1e-3);
        check_binary(BinaryOp::Remainder, (b, n), &["B", "N"], &v)?;
        check_binary(BinaryOp::FloorDiv, (b, n), &["B", "N"], &v)?;
    }

    #[test]
    fn remainder_by_a_broadcast_divisor((b, n, v) in matrices(3, 0.5..5.0)) {
        // y: [B, 1] (the first B values), summed back over N.
        let mut v = v;
        v[1].truncate(b);
        let q: Vec<f64> = v[0].iter().enumerate().map(|(i, x)| x / v[1][i / n]).collect();
        prop_assume!(distance_to(&q, |q| q - q.round()) > 1e-3);
        check_binary(BinaryOp::Remainder, (b, n), &["B", "1"], &v)?;
    }

    #[test]
    fn fmod_away_from_whole_quotients((b, n, v) in matrices(3, -5.0..5.0)) {
        prop_assume!(distance_to(&v[1], |y| y) > 0.3);
        let q: Vec<f64> = v[0].iter().zip(&v[1]).map(|(x, y)| x / y).collect();
        prop_assume!(distance_to(&q, |q| q - q.round()) > 1e-3);
        check_binary(BinaryOp::Fmod, (b, n), &["B", "N"], &v)?;
    }

    #[test]
    fn fmod_by_a_broadcast_divisor((b, n, v) in matrices(3, -5.0..5.0)) {
        // y: [B, 1] (the first B values), summed back over N.
        let mut v = v;
        v[1].truncate(b);
        prop_assume!(distance_to(&v[1], |y| y) > 0.3);
        let q: Vec<f64> = v[0].iter().enumerate().map(|(i, x)| x / v[1][i / n]).collect();
        prop_assume!(distance_to(&q, |q| q - q.round()) > 1e-3);
        check_binary(BinaryOp::Fmod, (b, n), &["B", "1"], &v)?;
    }

    #[test]
    fn hypot_away_from_the_origin((b, n, v) in matrices(3, -3.0..3.0)) {
        let r2: Vec<f64> = v[0].iter().zip(&v[1]).map(|(x, y)| x * x + y * y).collect();
        prop_assume!(distance_to(&r2, |r| r) > 0.1);
        check_binary(BinaryOp::Hypot, (b, n), &["B", "N"], &v)?;
    }

    #[test]
    fn copysign_away_from_zeros((b, n, v) in matrices(3, -3.0..3.0)) {
        // Away from |a|'s kink at a == 0 and from the sign's jump at b == 0 (b's gradient is 0).
        prop_assume!(distance_to(&v[0], |x| x) > 1e-3);
        prop_assume!(distance_to(&v[1], |y| y) > 1e-3);
        check_binary(BinaryOp::Copysign, (b, n), &["B", "N"], &v)?;
    }

    #[test]
    fn fma_sends_each_operand_its_partial((b, n, v) in matrices(4, -3.0..3.0)) {
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let y = p.input("y", &["B", "N"], &[b, n], v[1].clone());
        let z = p.input("z", &["B", "1"], &[b, 1], v[2][..b].to_vec());
        let w = p.input("w", &["B", "N"], &[b, n], v[3].clone());
        let f = p.b.fma(x, y, z).unwrap();
        let loss = weighted_sum(&mut p.b, w, f);
        p.check(loss, &["x", "y", "z"]).map_err(TestCaseError::fail)?;
        // The same input in two slots: d(x * x + x) = 2x + 1.
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[3].clone());
        let f = p.b.fma(x, x, x).unwrap();
        let loss = weighted_sum(&mut p.b, w, f);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn nan_tests_and_bitwise_ops_pass_no_gradient_but_select_it((b, n, v) in matrices(2, -3.0..3.0)) {
        // where(isfinite(x) and bitwise_and(i32(x), 1) == 0, x * x, -x): the bool/int parts only choose.
        prop_assume!(distance_to(&v[0], |x| x - x.round()) > 1e-3);
        let mut p = Problem::new();
        let x = p.input("x", &["B", "N"], &[b, n], v[0].clone());
        let w = p.input("w", &["B", "N"], &[b, n], v[1].clone());
        let fin = p.b.unary(UnaryOp::IsFinite, x).unwrap();
        let i = p.b.cast(x, kfuse_ir::DType::I32);
        let one = p.b.lit_int(1);
        let low = p.b.binary(BinaryOp::BitAnd, i, one).unwrap();
        let zero = p.b.lit_int(0);
        let even = p.b.binary(BinaryOp::Eq, low, zero).unwrap();
        let c = p.b.binary(BinaryOp::And, fin, even).unwrap();
        let sq = p.b.binary(BinaryOp::Mul, x, x).unwrap();
        let neg = p.b.unary(UnaryOp::Neg, x).unwrap();
        let z = p.b.select(c, sq, neg).unwrap();
        let loss = weighted_sum(&mut p.b, w, z);
        p.check(loss, &["x"]).map_err(TestCaseError::fail)?;
    }
}

/// The gradients of `sum(w * op(x, y))` w.r.t. `x` and `y` (both `[N]`) at the given values.
fn binary_gradients(op: BinaryOp, x: &[f64], y: &[f64], w: &[f64]) -> Vec<Vec<f64>> {
    let n = x.len();
    let mut p = Problem::new();
    let xi = p.input("x", &["N"], &[n], x.to_vec());
    let yi = p.input("y", &["N"], &[n], y.to_vec());
    let wi = p.input("w", &["N"], &[n], w.to_vec());
    let z = p.b.binary(op, xi, yi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, z);
    p.gradients(loss, &["x", "y"])
}

/// Bit-exact equality, every NaN equal to every NaN.
fn assert_bits(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{what}[{i}]: got {g:?}, want {w:?}");
    }
}

#[test]
fn fmod_sends_minus_the_truncated_quotient_to_the_divisor() {
    // torch.fmod's: a gets g, b gets -g * trunc(a / b) (toward zero, unlike remainder's floor).
    let x = [7.5, -7.5, 7.5, -7.5, 1.0];
    let y = [2.0, 2.0, -2.0, -2.0, 4.0];
    let w = [1.0, 1.0, 1.0, 1.0, 2.0];
    let g = binary_gradients(BinaryOp::Fmod, &x, &y, &w);
    assert_bits(&g[0], &w, "d/dx");
    assert_bits(&g[1][..4], &[-3.0, 3.0, 3.0, -3.0], "d/dy");
    assert_eq!(g[1][4], 0.0, "d/dy where the quotient truncates to 0");
}

#[test]
fn hypot_gradient_is_the_unit_vector_and_nan_at_the_origin() {
    let g = binary_gradients(BinaryOp::Hypot, &[3.0, -3.0, 0.0, 0.0], &[4.0, 4.0, -2.0, 0.0], &[1.0, 2.0, 1.0, 1.0]);
    // torch.hypot's: g * a / hypot(a, b) and g * b / hypot(a, b); 0 / 0 at the origin.
    assert_bits(&g[0], &[0.6, -1.2, 0.0, f64::NAN], "d/dx");
    assert_bits(&g[1], &[0.8, 1.6, -1.0, f64::NAN], "d/dy");
}

#[test]
fn copysign_gradient_is_zero_at_zero_and_none_to_the_sign() {
    let x = [1.5, 1.5, -1.5, 0.0, -0.0, 2.0];
    let y = [2.0, -2.0, -3.0, -1.0, 1.0, -0.0];
    let g = binary_gradients(BinaryOp::Copysign, &x, &y, &[2.0; 6]);
    // torch.copysign's: g * copysign(a, b) / a where a != 0, else 0; b gets zeros.
    assert_bits(&g[0], &[2.0, -2.0, 2.0, 0.0, 0.0, -2.0], "d/dx");
    assert!(g[1].iter().all(|v| *v == 0.0), "d/dy: {:?}", g[1]);
}

/// The gradient of `sum(w * op(x))` w.r.t. `x` (`[N]`) at the given values.
fn unary_gradient(op: UnaryOp, x: &[f64], w: &[f64]) -> Vec<f64> {
    let n = x.len();
    let mut p = Problem::new();
    let xi = p.input("x", &["N"], &[n], x.to_vec());
    let wi = p.input("w", &["N"], &[n], w.to_vec());
    let y = p.b.unary(op, xi).unwrap();
    let loss = weighted_sum(&mut p.b, wi, y);
    p.gradients(loss, &["x"]).remove(0)
}

/// Within `rel` of `want`, relative to `|want| + 1`.
fn assert_near(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= rel * (w.abs() + 1.0), "{what}[{i}]: got {g:?}, want {w:?}");
    }
}

#[test]
fn lgamma_digamma_and_erfinv_gradients_take_their_closed_forms() {
    use std::f64::consts::PI;
    let euler = 0.5772156649015329;
    // torch.lgamma's: g * digamma(x); digamma(1) = -γ, digamma(2) = 1 - γ, digamma(1/2) = -γ - 2 ln 2.
    let g = unary_gradient(UnaryOp::Lgamma, &[1.0, 2.0, 0.5], &[1.0, 2.0, -1.0]);
    assert_near(&g, &[-euler, 2.0 * (1.0 - euler), euler + 2.0 * 2f64.ln()], 1e-14, "d lgamma");
    // torch.digamma's: g * polygamma(1, x); π²/6 at 1, π²/2 at 1/2, π²/2 + 4 at -1/2.
    let g = unary_gradient(UnaryOp::Digamma, &[1.0, 0.5, -0.5], &[1.0, 1.0, 3.0]);
    assert_near(&g, &[PI * PI / 6.0, PI * PI / 2.0, 3.0 * (PI * PI / 2.0 + 4.0)], 1e-14, "d digamma");
    // torch.erfinv's: g * √π / 2 * exp(erfinv(x)²); √π / 2 at 0, +inf at ±1.
    let y: f64 = 0.4769362762044699; // erfinv(1/2)
    let g = unary_gradient(UnaryOp::Erfinv, &[0.0, 0.5, -0.5, 1.0], &[1.0, 1.0, 2.0, 1.0]);
    let half_sqrt_pi = PI.sqrt() / 2.0;
    let want = [half_sqrt_pi, half_sqrt_pi * (y * y).exp(), 2.0 * half_sqrt_pi * (y * y).exp()];
    assert_near(&g[..3], &want, 1e-14, "d erfinv");
    assert_eq!(g[3], f64::INFINITY, "d erfinv at 1");
}

#[test]
fn erfc_gradient_is_erfs_negated_and_keeps_its_tail() {
    use std::f64::consts::FRAC_2_SQRT_PI;
    // torch.erfc's: -g * 2/sqrt(pi) * exp(-x^2); -2/√π at 0, even in x.
    let xs = [0.0, 1.0, -1.0, 5.0, 10.0];
    let ws = [1.0, 1.0, 2.0, 1.0, -3.0];
    let g = unary_gradient(UnaryOp::Erfc, &xs, &ws);
    let want: Vec<f64> = xs.iter().zip(&ws).map(|(x, w)| -w * FRAC_2_SQRT_PI * (-x * x).exp()).collect();
    assert_eq!(g[0], -FRAC_2_SQRT_PI, "d erfc at 0");
    assert_near(&g[..3], &want[..3], 1e-15, "d erfc");
    // In the tail, relative to the value: -2/√π e^-25 ≈ -1.57e-11 at 5, and at 10 (g = -3)
    // torch.erfc's float64 gradient, 1.259296869406325e-43.
    for i in 3..5 {
        assert!((g[i] / want[i] - 1.0).abs() < 1e-14, "d erfc at {}: got {:?}, want {:?}", xs[i], g[i], want[i]);
    }
    assert!((g[4] / 1.259296869406325e-43 - 1.0).abs() < 1e-14, "d erfc at 10: {:?}", g[4]);
    // Exactly erf's gradient with the sign turned.
    let e = unary_gradient(UnaryOp::Erf, &xs, &ws);
    for (i, (a, b)) in g.iter().zip(&e).enumerate() {
        assert_eq!(a.to_bits(), (-b).to_bits(), "element {i}: d erfc {a:?}, d erf {b:?}");
    }
}

#[test]
fn grad_through_trigamma_is_refused_by_name() {
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
    let t = p.b.unary(UnaryOp::Trigamma, x).unwrap();
    let s = p.b.reduce(kfuse_ir::ReduceOp::Sum, kfuse_ir::ReduceAxis::All, t, None).unwrap();
    match kfuse_passes::grad(&mut p.b, s, x) {
        Err(kfuse_ir::IrError::NotDifferentiable { what, why }) => {
            assert!(what.contains("`trigamma`"), "{what}");
            assert!(why.contains("polygamma(2, x)"), "{why}");
        }
        other => panic!("expected NotDifferentiable, got {other:?}"),
    }
    // A trigamma the loss does not depend on through x is no obstacle.
    let mut p = Problem::new();
    let x = p.input("x", &["N"], &[2], vec![1.0, 2.0]);
    let c = p.input("c", &["N"], &[2], vec![1.0, 2.0]);
    let t = p.b.unary(UnaryOp::Trigamma, c).unwrap();
    let y = p.b.binary(BinaryOp::Mul, x, t).unwrap();
    let s = p.b.reduce(kfuse_ir::ReduceOp::Sum, kfuse_ir::ReduceAxis::All, y, None).unwrap();
    assert!(kfuse_passes::grad(&mut p.b, s, x).is_ok());
}
