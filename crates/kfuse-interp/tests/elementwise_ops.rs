//! The elementwise ops that follow PyTorch's math library (log1p .. cosh, lgamma, digamma,
//! trigamma, erfinv, erfc, sign, rounding, tests for NaN and infinity, atan2, remainder, fmod,
//! hypot, copysign, floor_div, bitwise ops, shifts, fma) against hand-computed values and std's
//! f64 functions, on edge values: signed zeros, infinities, NaN, halfway cases, negative operands,
//! poles, `i32::MIN / -1` and shift counts out of range. Expected values that are not from std are
//! PyTorch's (float64 on the CPU) for the same operands; those of the special functions are
//! SciPy's (`gammaln`, `digamma`, `polygamma(1, x)`, `erfinv`, `erfc`), where PyTorch's trigamma
//! is only accurate to about 1e-9.

mod common;

use common::*;
use kfuse_ir::{BinaryOp, DType, GraphBuilder, Op, UnaryOp};

const NAN: f64 = f64::NAN;
const INF: f64 = f64::INFINITY;
const MIN: f64 = i32::MIN as f64;
const MAX: f64 = i32::MAX as f64;

/// Bit-exact equality (so `-0.0` differs from `0.0`), every NaN equal to every NaN.
fn assert_bits(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "element {i}: got {g:?}, want {w:?}");
    }
}

fn unary_on(op: UnaryOp, dtype: DType, xs: &[f64]) -> (DType, Vec<f64>) {
    let mut out_dtype = dtype;
    let g = graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", dtype, shape(&[n])).unwrap();
        let y = b.unary(op, x).unwrap();
        out_dtype = b.node(y).dtype;
        y
    });
    let x = t(dtype, &[xs.len()], xs);
    (out_dtype, eval1(&g, &[("x", &x)]).values)
}

fn unary_f(op: UnaryOp, xs: &[f64]) -> Vec<f64> {
    unary_on(op, DType::F32, xs).1
}

fn binary_on(op: BinaryOp, dtype: DType, xs: &[f64], ys: &[f64]) -> Vec<f64> {
    let g = graph1(|b| {
        let n = sym(b, "N");
        let x = b.input("x", dtype, shape(&[n])).unwrap();
        let y = b.input("y", dtype, shape(&[n])).unwrap();
        b.binary(op, x, y).unwrap()
    });
    let (x, y) = (t(dtype, &[xs.len()], xs), t(dtype, &[ys.len()], ys));
    eval1(&g, &[("x", &x), ("y", &y)]).values
}

/// `f` of each element, as std computes it in f64.
fn std_map(xs: &[f64], f: fn(f64) -> f64) -> Vec<f64> {
    xs.iter().map(|&x| f(x)).collect()
}

#[test]
fn transcendental_functions_match_std_on_edge_values() {
    // Values that f32 inputs hold exactly, so that std sees the same operands.
    let xs = [0.0, -0.0, 1e-10f32 as f64, -1.0, 0.5, -0.75, 2.0, INF, -INF, NAN];
    type Reference = fn(f64) -> f64;
    let cases: [(UnaryOp, Reference); 11] = [
        (UnaryOp::Log1p, f64::ln_1p),
        (UnaryOp::Expm1, f64::exp_m1),
        (UnaryOp::Atan, f64::atan),
        (UnaryOp::Tan, f64::tan),
        (UnaryOp::Asin, f64::asin),
        (UnaryOp::Acos, f64::acos),
        (UnaryOp::Sinh, f64::sinh),
        (UnaryOp::Asinh, f64::asinh),
        (UnaryOp::Acosh, f64::acosh),
        (UnaryOp::Atanh, f64::atanh),
        (UnaryOp::Cosh, f64::cosh),
    ];
    for (op, f) in cases {
        assert_bits(&unary_f(op, &xs), &std_map(&xs, f));
    }
    // The points that matter, by hand: log1p(-1) = -inf, log1p keeps -0, expm1 is exact near 0,
    // atan(±inf) = ±pi/2, asin outside [-1, 1] is NaN.
    assert_bits(&unary_f(UnaryOp::Log1p, &[-1.0, -0.0, -2.0]), &[-INF, -0.0, NAN]);
    assert_bits(&unary_f(UnaryOp::Expm1, &[-0.0, -INF]), &[-0.0, -1.0]);
    let tiny = 1e-10f32 as f64;
    assert_close(&unary_f(UnaryOp::Expm1, &[tiny]), &[tiny + tiny * tiny / 2.0], 1e-25);
    let half_pi = std::f64::consts::FRAC_PI_2;
    assert_bits(&unary_f(UnaryOp::Atan, &[INF, -INF]), &[half_pi, -half_pi]);
    assert_bits(&unary_f(UnaryOp::Asin, &[2.0, -1.0]), &[NAN, -half_pi]);
    assert_bits(&unary_f(UnaryOp::Acos, &[1.0, 1.5]), &[0.0, NAN]);
    assert_bits(&unary_f(UnaryOp::Cosh, &[-INF]), &[INF]);
    // acosh below 1 and atanh outside [-1, 1] are NaN; atanh(±1) = ±inf.
    assert_bits(&unary_f(UnaryOp::Acosh, &[1.0, 0.5]), &[0.0, NAN]);
    assert_bits(&unary_f(UnaryOp::Atanh, &[1.0, -1.0, 2.0]), &[INF, -INF, NAN]);
    assert_bits(&unary_f(UnaryOp::Asinh, &[-INF, -0.0]), &[-INF, -0.0]);
}

#[test]
fn sign_is_zero_for_nan_and_both_zeros() {
    assert_bits(
        &unary_f(UnaryOp::Sign, &[NAN, -0.0, 0.0, -2.5, 3.0, -INF, 1e-45]),
        &[0.0, 0.0, 0.0, -1.0, 1.0, -1.0, 1.0],
    );
    let (dtype, v) = unary_on(UnaryOp::Sign, DType::I32, &[MIN, -7.0, 0.0, MAX]);
    assert_eq!(dtype, DType::I32, "sign of an int stays an int");
    assert_bits(&v, &[-1.0, -1.0, 0.0, 1.0]);
}

#[test]
fn round_takes_halfway_cases_to_even_and_keeps_signed_zeros() {
    // 0.49999997 is the f32 just below 0.5, 2.5000002 the one just above 2.5.
    let xs = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997f32 as f64, 2.5000002f32 as f64, -0.0, INF, -INF, NAN];
    let want = [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, 3.0, -0.0, INF, -INF, NAN];
    assert_bits(&unary_f(UnaryOp::Round, &xs), &want);
    assert_bits(&unary_f(UnaryOp::Round, &[4194304.5, 4194305.5, -4194304.5]), &[4194304.0, 4194306.0, -4194304.0]);
}

#[test]
fn trunc_and_ceil_round_toward_zero_and_up() {
    let xs = [-1.5, -0.5, 0.5, 1.5, -0.0, INF, NAN];
    assert_bits(&unary_f(UnaryOp::Trunc, &xs), &[-1.0, -0.0, 0.0, 1.0, -0.0, INF, NAN]);
    assert_bits(&unary_f(UnaryOp::Ceil, &xs), &[-1.0, -0.0, 1.0, 2.0, -0.0, INF, NAN]);
}

#[test]
fn rounding_an_int_is_the_int_itself() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::I32, shape(&[c(2)])).unwrap();
    for op in [UnaryOp::Round, UnaryOp::Trunc, UnaryOp::Ceil] {
        assert_eq!(b.unary(op, x).unwrap(), x, "{} of an i32 adds no node", op.name());
    }
}

#[test]
fn nan_and_infinity_tests_give_bools() {
    let xs = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0];
    for (op, want) in [
        (UnaryOp::IsNan, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        (UnaryOp::IsInf, [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]),
        (UnaryOp::IsFinite, [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]),
    ] {
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (out, v) = unary_on(op, dtype, &xs);
            assert_eq!(out, DType::Bool, "{} gives bool", op.name());
            assert_bits(&v, &want);
        }
        let (_, v) = unary_on(op, DType::F32, &[3.4e38, -1e-45]);
        assert_bits(&v, &[want[5]; 2]);
        // An int is never NaN or infinite (it is tested as the f32 it converts to).
        let (out, v) = unary_on(op, DType::I32, &[MIN, 0.0, MAX]);
        assert_eq!(out, DType::Bool);
        let finite = if op == UnaryOp::IsFinite { 1.0 } else { 0.0 };
        assert_bits(&v, &[finite; 3]);
    }
}

#[test]
fn atan2_matches_std_on_zeros_and_infinities() {
    let ys = [0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, INF, -INF, 1.0, NAN, 3.0];
    let xs = [0.0, 0.0, -0.0, -1.0, 0.0, 0.0, INF, -INF, 1.0, -INF, 1.0, -4.0];
    let want: Vec<f64> = ys.iter().zip(&xs).map(|(y, x)| y.atan2(*x)).collect();
    assert_bits(&binary_on(BinaryOp::Atan2, DType::F32, &ys, &xs), &want);
    let pi = std::f64::consts::PI;
    assert_bits(&want[..4], &[0.0, -0.0, pi, -pi]);
}

#[test]
fn float_remainder_has_the_sign_of_the_divisor() {
    let xs = [7.5, -7.5, 7.5, -7.5, 0.0, -0.0, -3.0, INF, 1.0, -1.0, 0.0, 3.0, -3.0, NAN];
    let ys = [2.0, 2.0, -2.0, -2.0, -3.0, 3.0, INF, 2.0, 0.0, 0.0, 0.0, INF, INF, 1.0];
    let want = [1.5, 0.5, -0.5, -1.5, 0.0, -0.0, INF, NAN, NAN, NAN, NAN, 3.0, INF, NAN];
    assert_bits(&binary_on(BinaryOp::Remainder, DType::F32, &xs, &ys), &want);
}

#[test]
fn float_fmod_has_the_sign_of_the_dividend() {
    let xs = [7.5, -7.5, 7.5, -7.5, -4.0, 4.0, 0.0, -0.0, -3.0, INF, 1.0, -1.0, 0.0, 3.0, -3.0, NAN, 5.0];
    let ys = [2.0, 2.0, -2.0, -2.0, 2.0, -2.0, -3.0, 3.0, INF, 2.0, 0.0, 0.0, 0.0, INF, -INF, 1.0, NAN];
    let want = [1.5, -1.5, 1.5, -1.5, -0.0, 0.0, 0.0, -0.0, -3.0, NAN, NAN, NAN, NAN, 3.0, -3.0, NAN, NAN];
    assert_bits(&binary_on(BinaryOp::Fmod, DType::F32, &xs, &ys), &want);
    // Exact, as C's fmod: the remainder of 0.1 (as f32) into 1 is not 1 - 9 * 0.1 rounded.
    let tenth = 0.1f32 as f64;
    assert_bits(&binary_on(BinaryOp::Fmod, DType::F32, &[1.0, -1.0], &[tenth, tenth]), &[1.0 % tenth, -(1.0 % tenth)]);
}

#[test]
fn hypot_is_exact_on_pythagorean_triples_and_inf_beats_nan() {
    let xs = [3.0, -3.0, 3.0, 0.0, -0.0, -0.0, INF, -INF, NAN, NAN, 2e38, 5.0];
    let ys = [4.0, 4.0, -4.0, 0.0, -0.0, 7.0, NAN, 1.0, -INF, 1.0, 2e38, -12.0];
    let got = binary_on(BinaryOp::Hypot, DType::F32, &xs, &ys);
    let big = (2e38f32 as f64).hypot(2e38f32 as f64);
    assert_bits(&got, &[5.0, 5.0, 5.0, 0.0, 0.0, 7.0, INF, INF, INF, NAN, big, 13.0]);
    // No overflow in the squares: above f32's largest value only by the factor sqrt(2).
    assert!(big > 2e38 && big < 3e38, "{big}");
}

#[test]
fn copysign_takes_the_sign_bit_of_zeros_and_nans() {
    let xs = [1.5, 1.5, -1.5, -1.5, 0.0, 0.0, -0.0, INF, NAN, 2.0, -2.0, -2.0];
    let ys = [2.0, -2.0, 3.0, -0.0, -0.0, -1.0, 0.0, -1.0, -1.0, -INF, NAN, -NAN];
    let got = binary_on(BinaryOp::Copysign, DType::F32, &xs, &ys);
    assert_bits(&got, &[1.5, -1.5, 1.5, -1.5, -0.0, -0.0, 0.0, -INF, NAN, -2.0, 2.0, -2.0]);
    assert!(got[8].is_nan() && got[8].is_sign_negative(), "copysign(nan, -1) is a negative NaN");
}

#[test]
fn float_floor_div_rounds_toward_minus_infinity() {
    let xs = [7.5, -7.5, 7.5, -7.5, 0.0, -0.0, -3.0, INF, 1.0, -1.0, 0.0, 3.0, -3.0, NAN];
    let ys = [2.0, 2.0, -2.0, -2.0, -3.0, 3.0, INF, 2.0, 0.0, 0.0, 0.0, INF, INF, 1.0];
    let want = [3.0, -4.0, -4.0, 3.0, -0.0, -0.0, -1.0, NAN, INF, -INF, NAN, 0.0, -1.0, NAN];
    assert_bits(&binary_on(BinaryOp::FloorDiv, DType::F32, &xs, &ys), &want);
}

#[test]
fn int_remainder_and_floor_div_wrap_and_define_division_by_zero() {
    let i = DType::I32;
    let xs = [5.0, -5.0, 5.0, -5.0, MIN, MIN, MAX, MIN, MAX, 7.0, -7.0, 0.0, MIN];
    let ys = [3.0, 3.0, -3.0, -3.0, -1.0, 3.0, -1.0, 7.0, -7.0, 0.0, 0.0, 0.0, MIN];
    assert_bits(
        &binary_on(BinaryOp::Remainder, i, &xs, &ys),
        &[2.0, 1.0, -1.0, -2.0, 0.0, 1.0, 0.0, 5.0, -6.0, 0.0, 0.0, 0.0, 0.0],
    );
    assert_bits(
        &binary_on(BinaryOp::FloorDiv, i, &xs, &ys),
        &[1.0, -2.0, -2.0, 1.0, MIN, -715827883.0, -MAX, -306783379.0, -306783379.0, 0.0, 0.0, 0.0, 1.0],
    );
}

#[test]
fn int_fmod_truncates_and_defines_division_by_zero() {
    let i = DType::I32;
    let xs = [5.0, -5.0, 5.0, -5.0, MIN, MIN, MAX, MIN, MAX, 7.0, -7.0, 0.0, MIN, -6.0];
    let ys = [3.0, 3.0, -3.0, -3.0, -1.0, 3.0, -1.0, 7.0, -7.0, 0.0, 0.0, 0.0, MIN, 3.0];
    // C's `%` (the sign of the dividend; `-6 % 3` is 0, ints have no -0); by 0 gives 0, MIN by -1 gives 0.
    assert_bits(
        &binary_on(BinaryOp::Fmod, i, &xs, &ys),
        &[2.0, -2.0, 2.0, -2.0, 0.0, -2.0, 0.0, -2.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    );
}

#[test]
fn bitwise_ops_on_ints_match_rust_operators() {
    let a = [-8, 5, i32::MIN, i32::MAX, -1, 0, 0x5555_5555];
    let b = [5, -8, -1, i32::MIN, 12345, -1, 0x3333_3333];
    let (af, bf): (Vec<f64>, Vec<f64>) = (a.map(f64::from).to_vec(), b.map(f64::from).to_vec());
    let zip = |f: fn(i32, i32) -> i32| -> Vec<f64> { a.iter().zip(&b).map(|(x, y)| f64::from(f(*x, *y))).collect() };
    assert_bits(&binary_on(BinaryOp::BitAnd, DType::I32, &af, &bf), &zip(|x, y| x & y));
    assert_bits(&binary_on(BinaryOp::BitOr, DType::I32, &af, &bf), &zip(|x, y| x | y));
    assert_bits(&binary_on(BinaryOp::BitXor, DType::I32, &af, &bf), &zip(|x, y| x ^ y));
    assert_bits(&binary_on(BinaryOp::BitAnd, DType::I32, &[-8.0], &[5.0]), &[0.0]);
    let (out, v) = unary_on(UnaryOp::BitNot, DType::I32, &af);
    assert_eq!(out, DType::I32);
    assert_bits(&v, &a.map(|x| f64::from(!x)));
    assert_bits(&v[..2], &[7.0, -6.0]);
}

#[test]
fn bitwise_ops_on_bools_are_the_logical_ops() {
    let (xs, ys) = ([0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 1.0]);
    assert_bits(&binary_on(BinaryOp::BitAnd, DType::Bool, &xs, &ys), &[0.0, 0.0, 0.0, 1.0]);
    assert_bits(&binary_on(BinaryOp::BitOr, DType::Bool, &xs, &ys), &[0.0, 1.0, 1.0, 1.0]);
    assert_bits(&binary_on(BinaryOp::BitXor, DType::Bool, &xs, &ys), &[0.0, 1.0, 1.0, 0.0]);
    assert_bits(&unary_on(UnaryOp::BitNot, DType::Bool, &xs).1, &[1.0, 1.0, 0.0, 0.0]);
    let mut b = GraphBuilder::new();
    let p = b.input("p", DType::Bool, shape(&[c(2)])).unwrap();
    let q = b.input("q", DType::Bool, shape(&[c(2)])).unwrap();
    for (op, logical) in
        [(BinaryOp::BitAnd, BinaryOp::And), (BinaryOp::BitOr, BinaryOp::Or), (BinaryOp::BitXor, BinaryOp::Ne)]
    {
        let n = b.binary(op, p, q).unwrap();
        assert_eq!(b.node(n).op, Op::Binary(logical, p, q));
    }
    let n = b.unary(UnaryOp::BitNot, p).unwrap();
    assert_eq!(b.node(n).op, Op::Unary(UnaryOp::Not, p));
}

#[test]
fn shifts_define_out_of_range_counts_as_pytorch_computes_them() {
    let a = [1.0, -8.0, 1.0, -8.0, 1.0, -8.0, 1.0, -8.0, 1.0, MIN, MAX, -1.0, 3.0];
    let n = [31.0, 31.0, 32.0, 32.0, -1.0, -1.0, 33.0, 40.0, 0.0, 1.0, 1.0, 31.0, MIN];
    assert_bits(
        &binary_on(BinaryOp::Shl, DType::I32, &a, &n),
        &[MIN, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, -2.0, MIN, 0.0],
    );
    assert_bits(
        &binary_on(BinaryOp::Shr, DType::I32, &a, &n),
        &[0.0, -1.0, 0.0, -1.0, 0.0, -1.0, 0.0, -1.0, 1.0, -1073741824.0, 1073741823.0, -1.0, 0.0],
    );
}

#[test]
fn fma_rounds_once_for_floats_and_wraps_for_ints() {
    let fma = |dtype: DType, a: &[f64], b: &[f64], c: &[f64]| {
        let g = graph1(|bld| {
            let n = sym(bld, "N");
            let x = bld.input("a", dtype, shape(&[n])).unwrap();
            let y = bld.input("b", dtype, shape(&[n])).unwrap();
            let z = bld.input("c", dtype, shape(&[n])).unwrap();
            bld.fma(x, y, z).unwrap()
        });
        let (ta, tb, tc) = (t(dtype, &[a.len()], a), t(dtype, &[b.len()], b), t(dtype, &[c.len()], c));
        eval1(&g, &[("a", &ta), ("b", &tb), ("c", &tc)]).values
    };
    let (a, b, c) = ([1.5, -2.0, INF, 0.0, -0.0], [2.0, 0.25, 0.0, 5.0, 1.0], [0.25, 0.5, 1.0, -0.0, -0.0]);
    assert_bits(&fma(DType::F32, &a, &b, &c), &[3.25, 0.0, NAN, 0.0, -0.0]);
    // f64's fused multiply-add: 0.1 * 10 - 1 is not 0 when rounded once.
    let tenth = 0.1f32 as f64;
    assert_bits(&fma(DType::F32, &[tenth], &[10.0], &[-1.0]), &[tenth.mul_add(10.0, -1.0)]);
    assert_bits(
        &fma(DType::I32, &[65536.0, MAX, MIN, -3.0], &[65536.0, 2.0, -1.0, 4.0], &[5.0, 3.0, 0.0, 2.0]),
        &[5.0, 1.0, MIN, -10.0],
    );
}

#[test]
fn floor_div_and_remainder_of_ints_stay_ints_and_atan2_of_ints_is_float() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::I32, shape(&[c(2)])).unwrap();
    let y = b.input("y", DType::I32, shape(&[c(2)])).unwrap();
    for op in [BinaryOp::Remainder, BinaryOp::Fmod, BinaryOp::FloorDiv, BinaryOp::BitAnd, BinaryOp::Shl, BinaryOp::Shr]
    {
        let n = b.binary(op, x, y).unwrap();
        assert_eq!(b.node(n).dtype, DType::I32, "{}", op.name());
    }
    for op in [BinaryOp::Atan2, BinaryOp::Hypot, BinaryOp::Copysign] {
        let n = b.binary(op, x, y).unwrap();
        assert_eq!(b.node(n).dtype, DType::F32, "{}", op.name());
    }
    let h = b.input("h", DType::F16, shape(&[c(2)])).unwrap();
    for op in [BinaryOp::FloorDiv, BinaryOp::Fmod, BinaryOp::Hypot, BinaryOp::Copysign] {
        let n = b.binary(op, h, x).unwrap();
        assert_eq!(b.node(n).dtype, DType::F16, "{}", op.name());
    }
}

#[test]
fn hypot_and_copysign_of_ints_compute_on_their_f32_casts() {
    let (xs, ys) = ([3.0, -5.0, 0.0, 7.0], [-4.0, 12.0, -1.0, 0.0]);
    assert_bits(&binary_on(BinaryOp::Hypot, DType::I32, &xs, &ys), &[5.0, 13.0, 1.0, 7.0]);
    assert_bits(&binary_on(BinaryOp::Copysign, DType::I32, &xs, &ys), &[-3.0, 5.0, -0.0, 7.0]);
}

/// `got` within `ulps` f64 epsilons of `want`, relative to `|want| + 1` (so that values near a
/// root are held to an absolute bound); infinities, zeros' signs and NaN exactly.
fn assert_ulps(got: &[f64], want: &[f64], ulps: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() {
            (g - w).abs() <= ulps * f64::EPSILON * (w.abs() + 1.0)
        } else {
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
        };
        assert!(ok, "element {i}: got {g:?}, want {w:?}");
    }
}

/// 2^-100 and 2^100: f32 holds them exactly.
const TINY: f64 = 7.888609052210118e-31;
const HUGE: f64 = 1.2676506002282294e30;

#[test]
fn lgamma_is_the_log_of_the_absolute_gamma_with_poles_at_the_non_positive_integers() {
    let xs = [1.0, 2.0, 3.0, 0.5, -0.5, -2.5, 10.0, 100.0, TINY, HUGE];
    let want = [
        0.0,
        0.0,
        std::f64::consts::LN_2,
        0.5723649429247001, // ln √π
        1.2655121234846454, // ln 2√π
        -0.05624371649767405,
        12.801827480081469, // ln 9!
        359.1342053695754,
        69.31471805599453, // -ln 2^-100, to f64's precision
        8.659919334810373e31,
    ];
    assert_ulps(&unary_f(UnaryOp::Lgamma, &xs), &want, 4.0);
    // +inf at 0, -0 and the negative integers (C's and PyTorch's), +inf at ±inf.
    assert_bits(&unary_f(UnaryOp::Lgamma, &[0.0, -0.0, -1.0, -2.0, -1e30f32 as f64]), &[INF; 5]);
    assert_bits(&unary_f(UnaryOp::Lgamma, &[INF, -INF, NAN]), &[INF, INF, NAN]);
}

#[test]
fn digamma_has_torchs_signed_infinities_at_zero_and_nan_at_the_negative_integers() {
    let xs = [1.0, 0.5, 10.0, -0.5, -2.5, 3.0, -3.75, TINY, 1.152921504606847e18];
    let want = [
        -0.5772156649015329, // -γ
        -1.9635100260214235, // -γ - 2 ln 2
        2.251752589066721,
        0.03648997397857652,
        1.103156640645243,
        0.9227843350984671,
        -1.6923885983113303,
        -HUGE,
        41.58883083359672, // ln 2^60, less 2^-61
    ];
    assert_ulps(&unary_f(UnaryOp::Digamma, &xs), &want, 8.0);
    // torch.digamma: +0 gives -inf, -0 +inf (the sign of the side approached), the negative
    // integers and -inf NaN, +inf +inf.
    assert_bits(&unary_f(UnaryOp::Digamma, &[0.0, -0.0, INF]), &[-INF, INF, INF]);
    assert_bits(&unary_f(UnaryOp::Digamma, &[-1.0, -2.0, -1e30f32 as f64, -INF, NAN]), &[NAN; 5]);
    // Just beside a pole the reflection keeps full precision (ψ(-1 + 2^-20) ≈ -2^20 + ψ(2)).
    assert_ulps(&unary_f(UnaryOp::Digamma, &[-1.0 + 2f64.powi(-20)]), &[-1048575.5772131425], 8.0);
}

#[test]
fn trigamma_is_polygamma_of_order_one_and_infinite_at_its_poles() {
    let pi2 = std::f64::consts::PI * std::f64::consts::PI;
    let xs = [1.0, 2.0, 0.5, -0.5, -2.5, -3.75, 10.0, TINY, 1.152921504606847e18];
    let want = [
        pi2 / 6.0,
        pi2 / 6.0 - 1.0,
        pi2 / 2.0,
        pi2 / 2.0 + 4.0,
        9.539246644989124,
        19.504980060599575,
        0.10516633568168575,
        1.6069380442589903e60, // 2^200
        8.673617379884035e-19, // 2^-60
    ];
    assert_ulps(&unary_f(UnaryOp::Trigamma, &xs), &want, 8.0);
    // +inf at the poles (0, -0 and the negative integers), 0 at +inf, NaN at -inf.
    assert_bits(&unary_f(UnaryOp::Trigamma, &[0.0, -0.0, -1.0, -3.0, -1e30f32 as f64]), &[INF; 5]);
    assert_bits(&unary_f(UnaryOp::Trigamma, &[INF, -INF, NAN]), &[0.0, NAN, NAN]);
}

#[test]
fn erfinv_inverts_erf_to_infinities_at_plus_minus_one_and_nan_beyond() {
    let (p9, p1) = (0.9f32 as f64, 0.1f32 as f64);
    let xs = [0.5, p9, -p9, p1, 0.25, 1.0 - 2f64.powi(-24), TINY];
    let want = [
        0.4769362762044699,
        1.1630870719457722,
        -1.1630870719457722,
        0.08885599182530649,
        0.2253120550121781,
        3.832506856900711,     // the largest f32 below 1
        6.991097746438969e-31, // √π / 2 · 2^-100
    ];
    assert_ulps(&unary_f(UnaryOp::Erfinv, &xs), &want, 4.0);
    assert_bits(&unary_f(UnaryOp::Erfinv, &[0.0, -0.0, 1.0, -1.0]), &[0.0, -0.0, INF, -INF]);
    assert_bits(&unary_f(UnaryOp::Erfinv, &[1.5, -2.0, INF, -INF, NAN]), &[NAN; 5]);
}

#[test]
fn erfc_keeps_full_relative_precision_in_the_tail_where_one_minus_erf_is_zero() {
    let xs = [0.5, 1.0, 2.0, 5.0, 10.0, 26.0, -0.5, -1.0, -3.0, TINY];
    let want = [
        0.4795001221869535,
        0.15729920705028513,
        0.004677734981047266,
        1.537459794428035e-12,
        2.088487583762545e-45,  // 1 - erf(10) is 0 in f64
        5.663192408856143e-296, // near the bottom of f64's normal range
        1.5204998778130465,
        1.8427007929497148,
        1.9999779095030015,
        1.0, // 1 - 2/√π · 2^-100 rounds to 1
    ];
    let got = unary_f(UnaryOp::Erfc, &xs);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        // Relative to the value itself: the tail's tiny values are held to f64's precision too.
        assert!((g - w).abs() <= 4.0 * f64::EPSILON * w.abs(), "element {i} (x = {}): got {g:?}, want {w:?}", xs[i]);
    }
    // The cancellation that erfc avoids: erf(10) is 1 in f64.
    assert_bits(&unary_f(UnaryOp::Erf, &[10.0]), &[1.0]);
    // 1 at ±0, 2 at -inf and where erf(x) rounds to -1, 0 at +inf and beyond f64's subnormals.
    assert_bits(
        &unary_f(UnaryOp::Erfc, &[0.0, -0.0, -6.0, -INF, INF, 30.0, NAN]),
        &[1.0, 1.0, 2.0, 2.0, 0.0, 0.0, NAN],
    );
}

#[test]
fn special_functions_of_ints_compute_on_their_f32_casts() {
    let xs = [1.0, 4.0, 0.0, -2.0];
    let (dtype, v) = unary_on(UnaryOp::Lgamma, DType::I32, &xs);
    assert_eq!(dtype, DType::F32);
    assert_ulps(&v, &[0.0, 6f64.ln(), INF, INF], 4.0);
    let (_, v) = unary_on(UnaryOp::Digamma, DType::I32, &xs);
    assert_ulps(&v, &[-0.5772156649015329, 1.2561176684318005, -INF, NAN], 8.0);
    let (_, v) = unary_on(UnaryOp::Trigamma, DType::I32, &xs);
    assert_ulps(&v, &[1.6449340668482264, 0.2838229557371153, INF, INF], 8.0);
    let (_, v) = unary_on(UnaryOp::Erfinv, DType::I32, &[0.0, 1.0, -1.0, 2.0]);
    assert_bits(&v, &[0.0, INF, -INF, NAN]);
    let (dtype, v) = unary_on(UnaryOp::Erfc, DType::I32, &[0.0, 1.0, -1.0, 10.0]);
    assert_eq!(dtype, DType::F32);
    assert_ulps(&v, &[1.0, 0.15729920705028513, 1.8427007929497148, 2.088487583762545e-45], 4.0);
    assert!((v[3] / 2.088487583762545e-45 - 1.0).abs() < 1e-14, "erfc(10) of an i32: {v:?}");
    // f16 and bf16 keep their dtype (computed in f64 here, in f32 on the GPU).
    for dtype in [DType::F16, DType::BF16] {
        for op in [UnaryOp::Lgamma, UnaryOp::Digamma, UnaryOp::Trigamma, UnaryOp::Erfinv, UnaryOp::Erfc] {
            let (out, v) = unary_on(op, dtype, &[0.5]);
            assert_eq!(out, dtype, "{}", op.name());
            assert!(v[0].is_finite(), "{}: {v:?}", op.name());
        }
    }
}

/// Comparisons of f16 and bf16 values compare them rounded to their dtype, as PyTorch does: `x *
/// 1.1` of an f16 `x = 1` is 1.1 unrounded inside the graph, but compares equal to f16's 1.1
/// (1.099609375), the value a program that stored it would read back.
#[test]
fn half_comparisons_compare_values_rounded_to_their_dtype() {
    for (dtype, stored) in [(DType::F16, 1.099609375), (DType::BF16, 1.1015625)] {
        let compare = |op: BinaryOp| {
            let g = graph1(|b| {
                let n = sym(b, "N");
                let x = b.input("x", dtype, shape(&[n])).unwrap();
                let c = b.input("c", dtype, shape(&[n])).unwrap();
                let k = b.constant(kfuse_ir::Literal::float(1.1), dtype);
                let y = b.binary(BinaryOp::Mul, x, k).unwrap();
                b.binary(op, y, c).unwrap()
            });
            let (x, c) = (t(dtype, &[2], &[1.0, 1.0]), t(dtype, &[2], &[stored, 1.0]));
            eval1(&g, &[("x", &x), ("c", &c)]).values
        };
        assert_eq!(compare(BinaryOp::Eq), [1.0, 0.0], "{dtype:?} ==");
        assert_eq!(compare(BinaryOp::Ne), [0.0, 1.0], "{dtype:?} !=");
        assert_eq!(compare(BinaryOp::Gt), [0.0, 1.0], "{dtype:?} >");
        assert_eq!(compare(BinaryOp::Le), [1.0, 0.0], "{dtype:?} <=");
    }
    // f32 values are compared as computed.
    assert_eq!(binary_on(BinaryOp::Eq, DType::F32, &[1.1, 2.0], &[1.1, 2.0]), [1.0, 1.0]);
}
