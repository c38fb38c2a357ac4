//! Elementwise ops: the meaning of every unary, binary and ternary op and of casts, per compute
//! kind, and the parallel drivers that apply them over whole broadcast tensors.
//!
//! Value representation (shared by the whole interpreter): every element is an `f64`. Floats are
//! the f64 value itself (never rounded to their storage dtype inside the graph); `i32` values are
//! exact integers in `i32` range; `i64` values are their two's-complement bits reinterpreted as an
//! f64 ([`enc_i64`], [`dec_i64`]: every i64 is kept exactly, and moving values, as broadcasts,
//! stacks, components and `where` do, copies bits); `bool` is 0.0 or 1.0. `i32` arithmetic is done
//! in `i64` and wrapped to `i32` after every op, which is exactly two's-complement `i32` arithmetic
//! (as on the GPU); `i64` arithmetic wraps at 64 bits. Division, `pow`, `atan2`, `hypot` and
//! `copysign` never see integers: the builder casts them to `f32` first. Integer `remainder`,
//! `fmod` and `floor_div` by zero give 0 (on the GPU too), rather than trapping.
//!
//! Does not handle reductions or layout ops (see `reduce` and `layout`).

use rayon::prelude::*;

use kfuse_ir::{BinaryOp, DType, Kind, UnaryOp};

use crate::broadcast::BroadcastView;
use crate::special;
use crate::InterpError;

/// Output elements per parallel task. Fixed, so that chunking never depends on the thread count.
pub(crate) const CHUNK: usize = 1 << 13;

/// An `i64` value as the interpreter stores it (its bits in an f64 slot).
pub(crate) fn enc_i64(v: i64) -> f64 {
    f64::from_bits(v as u64)
}

/// The `i64` value stored by [`enc_i64`].
pub(crate) fn dec_i64(v: f64) -> i64 {
    v.to_bits() as i64
}

/// Wraps an integer result to `i32` (two's complement) and stores it as f64.
pub(crate) fn wrap_i32(v: i64) -> f64 {
    v as i32 as f64
}

fn truth(v: f64) -> f64 {
    if v != 0.0 {
        1.0
    } else {
        0.0
    }
}

/// PyTorch's `torch.minimum`: NaN if either operand is NaN; `-0.0` is below `+0.0`.
pub(crate) fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a < b || (a == b && a.is_sign_negative()) {
        a
    } else {
        b
    }
}

/// PyTorch's `torch.maximum`: NaN if either operand is NaN; `+0.0` is above `-0.0`.
pub(crate) fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b || (a == b && a.is_sign_positive()) {
        a
    } else {
        b
    }
}

/// The logistic function, in the form that cannot overflow for either sign of `x`.
fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Converts one value from `from`'s kind to `to`'s: float to int truncates toward zero and
/// saturates at the `i32` range (NaN gives 0, as the GPU's `cvt.rzi` does); anything to bool is
/// `!= 0` (so NaN is true); bool to a number is 0 or 1; float to float is exact (no rounding).
pub(crate) fn cast_value(v: f64, from: Kind, to: Kind) -> f64 {
    match (from, to) {
        (Kind::Float, Kind::Int) => v as i32 as f64,
        (_, Kind::Bool) => truth(v),
        _ => v,
    }
}

/// Converts one stored value of `from` to `to` (see [`cast_value`]; `i64` is stored as bits):
/// a float to `i64` truncates toward zero and saturates at the `i64` range (NaN gives 0), an
/// `i64` to `i32` keeps the low 32 bits (wraps, as PyTorch's `.to(torch.int32)` does), an `i64` to
/// a float rounds to nearest.
pub(crate) fn cast_dtype(v: f64, from: DType, to: DType) -> f64 {
    match (from, to) {
        (DType::I64, DType::I64) => v,
        (DType::I64, _) => match to.kind() {
            Kind::Int => wrap_i32(dec_i64(v)),
            Kind::Bool => flag(dec_i64(v) != 0),
            Kind::Float => dec_i64(v) as f64,
        },
        (_, DType::I64) => enc_i64(v as i64),
        _ => cast_value(v, from.kind(), to.kind()),
    }
}

/// Writes `f` of every element of a broadcast view into `out` (every element is overwritten).
pub(crate) fn map1(out: &mut [f64], a: &BroadcastView, f: impl Fn(f64) -> f64 + Sync) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let a = a.chunk(c * CHUNK, dst.len());
        for (d, &x) in dst.iter_mut().zip(a.iter()) {
            *d = f(x);
        }
    });
}

fn map2(out: &mut [f64], a: &BroadcastView, b: &BroadcastView, f: impl Fn(f64, f64) -> f64 + Sync) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let (a, b) = (a.chunk(c * CHUNK, dst.len()), b.chunk(c * CHUNK, dst.len()));
        for ((d, &x), &y) in dst.iter_mut().zip(a.iter()).zip(b.iter()) {
            *d = f(x, y);
        }
    });
}

/// Writes `f` of three broadcast operands into `out` (every element is overwritten).
pub(crate) fn map3(
    out: &mut [f64],
    a: &BroadcastView,
    b: &BroadcastView,
    c: &BroadcastView,
    f: impl Fn(f64, f64, f64) -> f64 + Sync,
) {
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, dst)| {
        let start = i * CHUNK;
        let (a, b, c) = (a.chunk(start, dst.len()), b.chunk(start, dst.len()), c.chunk(start, dst.len()));
        for (((d, &x), &y), &z) in dst.iter_mut().zip(a.iter()).zip(b.iter()).zip(c.iter()) {
            *d = f(x, y, z);
        }
    });
}

fn flag(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// `torch.sign`: -1, 0 or 1; 0 for NaN and for both zeros.
fn sign(v: f64) -> f64 {
    if v > 0.0 {
        1.0
    } else if v < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// `torch.remainder` of floats: `fmod`, moved by one divisor when its sign differs from the
/// divisor's (so `-0.0` stays `-0.0`, and division by zero is NaN).
pub(crate) fn remainder_f(a: f64, b: f64) -> f64 {
    let m = a % b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        m + b
    } else {
        m
    }
}

/// `torch.floor_divide` of floats, PyTorch's (and Python's) algorithm: the quotient of
/// `a - fmod(a, b)` by `b`, which is nearly whole, snapped to the nearest integer below or at it.
/// Division by zero is `a / b` (±inf or NaN); a zero quotient carries the sign of `a / b`.
pub(crate) fn floor_div_f(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && (b < 0.0) != (m < 0.0) {
        div -= 1.0;
    }
    if div == 0.0 {
        return 0.0f64.copysign(a / b);
    }
    let f = div.floor();
    if div - f > 0.5 {
        f + 1.0
    } else {
        f
    }
}

/// `torch.remainder` of `i32` (the sign of the divisor); `x % 0` is 0.
pub(crate) fn remainder_i(a: i32, b: i32) -> i32 {
    // Exact in 64 bits; the result lies between 0 and `b`.
    remainder_i64(a.into(), b.into()) as i32
}

/// `torch.floor_divide` of `i32`; `x // 0` is 0 and `i32::MIN // -1` wraps to `i32::MIN`.
pub(crate) fn floor_div_i(a: i32, b: i32) -> i32 {
    // Exact in 64 bits, then wrapped (only `i32::MIN // -1` leaves the range).
    floor_div_i64(a.into(), b.into()) as i32
}

/// `torch.remainder` of `i64` (the sign of the divisor); `x % 0` is 0.
pub(crate) fn remainder_i64(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let r = a.wrapping_rem(b);
    if r != 0 && (r < 0) != (b < 0) {
        r + b
    } else {
        r
    }
}

/// `torch.floor_divide` of `i64`; `x // 0` is 0 and `i64::MIN // -1` wraps to `i64::MIN`.
pub(crate) fn floor_div_i64(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let (q, r) = (a.wrapping_div(b), a.wrapping_rem(b));
    if r != 0 && (a < 0) != (b < 0) {
        q - 1
    } else {
        q
    }
}

/// `torch.bitwise_left_shift` of `i64`: bits shifted out are lost; 0 for `n < 0` or `n >= 64`.
pub(crate) fn shl_i64(a: i64, n: i64) -> i64 {
    if (0..64).contains(&n) {
        ((a as u64) << n) as i64
    } else {
        0
    }
}

/// `torch.bitwise_right_shift` of `i64` (arithmetic): `a >> 63` for `n < 0` or `n >= 64`.
pub(crate) fn shr_i64(a: i64, n: i64) -> i64 {
    if (0..64).contains(&n) {
        a >> n
    } else {
        a >> 63
    }
}

/// `torch.bitwise_left_shift` of `i32`: bits shifted out are lost; 0 for `n < 0` or `n >= 32`.
pub(crate) fn shl_i(a: i32, n: i32) -> i32 {
    if (0..32).contains(&n) {
        ((a as u32) << n) as i32
    } else {
        0
    }
}

/// `torch.bitwise_right_shift` of `i32` (arithmetic): `a >> 31` for `n < 0` or `n >= 32`.
pub(crate) fn shr_i(a: i32, n: i32) -> i32 {
    if (0..32).contains(&n) {
        a >> n
    } else {
        a >> 31
    }
}

/// An `i32` op on two values stored as f64 (exact integers in `i32` range).
fn int2(f: fn(i32, i32) -> i32) -> impl Fn(f64, f64) -> f64 + Sync {
    move |x, y| f(x as i32, y as i32) as f64
}

/// An `i64` op on two stored `i64` values.
fn long2(f: fn(i64, i64) -> i64) -> impl Fn(f64, f64) -> f64 + Sync {
    move |x, y| enc_i64(f(dec_i64(x), dec_i64(y)))
}

/// An `i64` op on one stored `i64` value.
fn long1(f: fn(i64) -> i64) -> impl Fn(f64) -> f64 + Sync {
    move |x| enc_i64(f(dec_i64(x)))
}

/// An `i64` comparison of two stored `i64` values.
fn long_cmp(f: fn(&i64, &i64) -> bool) -> impl Fn(f64, f64) -> f64 + Sync {
    move |x, y| flag(f(&dec_i64(x), &dec_i64(y)))
}

/// `clamp(x, lo, hi)` of stored `i64` values (`max` then `min`, as for every dtype).
pub(crate) fn clamp_i64(x: f64, lo: f64, hi: f64) -> f64 {
    enc_i64(dec_i64(x).max(dec_i64(lo)).min(dec_i64(hi)))
}

/// `fma(x, y, z)` of stored `i64` values, wrapping.
pub(crate) fn fma_i64(x: f64, y: f64, z: f64) -> f64 {
    enc_i64(dec_i64(x).wrapping_mul(dec_i64(y)).wrapping_add(dec_i64(z)))
}

/// A unary op on operands of `dtype`, written into `out`.
pub(crate) fn unary(
    node: u32,
    op: UnaryOp,
    dtype: DType,
    out: &mut [f64],
    x: &BroadcastView,
) -> Result<(), InterpError> {
    let unsupported = || InterpError::Unsupported { node, op: op.name(), dtype };
    match (dtype.kind(), op) {
        (Kind::Bool, UnaryOp::Not) => map1(out, x, |v| if v != 0.0 { 0.0 } else { 1.0 }),
        (Kind::Bool, _) | (_, UnaryOp::Not) => return Err(unsupported()),
        (Kind::Int, op) if dtype == DType::I64 => match op {
            UnaryOp::Neg => map1(out, x, long1(i64::wrapping_neg)),
            UnaryOp::Abs => map1(out, x, long1(i64::wrapping_abs)),
            UnaryOp::Sign => map1(out, x, long1(i64::signum)),
            UnaryOp::BitNot => map1(out, x, long1(|v| !v)),
            _ => return Err(unsupported()),
        },
        (Kind::Int, UnaryOp::Neg) => map1(out, x, |v| wrap_i32(-(v as i64))),
        (Kind::Int, UnaryOp::Abs) => map1(out, x, |v| wrap_i32((v as i64).abs())),
        (Kind::Int, UnaryOp::Sign) => map1(out, x, sign),
        (Kind::Int, UnaryOp::BitNot) => map1(out, x, |v| f64::from(!(v as i32))),
        (Kind::Int, _) => return Err(unsupported()),
        (Kind::Float, op) => match op {
            UnaryOp::Neg => map1(out, x, |v| -v),
            UnaryOp::Abs => map1(out, x, f64::abs),
            UnaryOp::Exp => map1(out, x, f64::exp),
            UnaryOp::Log => map1(out, x, f64::ln),
            UnaryOp::Sqrt => map1(out, x, f64::sqrt),
            UnaryOp::Rsqrt => map1(out, x, |v| 1.0 / v.sqrt()),
            UnaryOp::Sigmoid => map1(out, x, sigmoid),
            UnaryOp::Tanh => map1(out, x, f64::tanh),
            UnaryOp::Erf => map1(out, x, libm::erf),
            UnaryOp::Sin => map1(out, x, f64::sin),
            UnaryOp::Cos => map1(out, x, f64::cos),
            UnaryOp::Floor => map1(out, x, f64::floor),
            UnaryOp::Log1p => map1(out, x, f64::ln_1p),
            UnaryOp::Expm1 => map1(out, x, f64::exp_m1),
            UnaryOp::Sign => map1(out, x, sign),
            UnaryOp::Round => map1(out, x, f64::round_ties_even),
            UnaryOp::Trunc => map1(out, x, f64::trunc),
            UnaryOp::Ceil => map1(out, x, f64::ceil),
            UnaryOp::IsNan => map1(out, x, |v| flag(v.is_nan())),
            UnaryOp::IsInf => map1(out, x, |v| flag(v.is_infinite())),
            UnaryOp::IsFinite => map1(out, x, |v| flag(v.is_finite())),
            UnaryOp::Atan => map1(out, x, f64::atan),
            UnaryOp::Tan => map1(out, x, f64::tan),
            UnaryOp::Asin => map1(out, x, f64::asin),
            UnaryOp::Acos => map1(out, x, f64::acos),
            UnaryOp::Sinh => map1(out, x, f64::sinh),
            UnaryOp::Asinh => map1(out, x, f64::asinh),
            UnaryOp::Acosh => map1(out, x, f64::acosh),
            UnaryOp::Atanh => map1(out, x, f64::atanh),
            UnaryOp::Lgamma => map1(out, x, libm::lgamma),
            UnaryOp::Digamma => map1(out, x, special::digamma),
            UnaryOp::Trigamma => map1(out, x, special::trigamma),
            UnaryOp::Erfinv => map1(out, x, special::erfinv),
            UnaryOp::Erfc => map1(out, x, libm::erfc),
            UnaryOp::Cosh => map1(out, x, f64::cosh),
            UnaryOp::Detach => map1(out, x, |v| v),
            UnaryOp::Rounded => map1(out, x, |v| dtype.round(v)),
            UnaryOp::Not | UnaryOp::BitNot => return Err(unsupported()),
        },
    }
    Ok(())
}

/// A binary op on two broadcast operands of `operand_dtype`'s kind (they share it), written into
/// `out`.
pub(crate) fn binary(
    node: u32,
    op: BinaryOp,
    operand_dtype: DType,
    out: &mut [f64],
    a: &BroadcastView,
    b: &BroadcastView,
) -> Result<(), InterpError> {
    let unsupported = || InterpError::Unsupported { node, op: op.name(), dtype: operand_dtype };
    let b2 = |x: bool| if x { 1.0 } else { 0.0 };
    // Comparisons mean the same for every kind: ints and bools are exact in f64 (`i64` is decoded).
    if operand_dtype == DType::I64 && op.is_comparison() {
        match op {
            BinaryOp::Eq => map2(out, a, b, long_cmp(i64::eq)),
            BinaryOp::Ne => map2(out, a, b, long_cmp(i64::ne)),
            BinaryOp::Lt => map2(out, a, b, long_cmp(i64::lt)),
            BinaryOp::Le => map2(out, a, b, long_cmp(i64::le)),
            BinaryOp::Gt => map2(out, a, b, long_cmp(i64::gt)),
            _ => map2(out, a, b, long_cmp(i64::ge)),
        }
        return Ok(());
    }
    // f16 and bf16 values are compared as stored, rounded to their dtype (as PyTorch compares
    // them): a value computed (unrounded) in one program then equals the same value that another
    // program stored (a backward's operand against the maximum the forward saved).
    let r = |v: f64| operand_dtype.round(v);
    match op {
        BinaryOp::Eq => map2(out, a, b, |x, y| b2(r(x) == r(y))),
        BinaryOp::Ne => map2(out, a, b, |x, y| b2(r(x) != r(y))),
        BinaryOp::Lt => map2(out, a, b, |x, y| b2(r(x) < r(y))),
        BinaryOp::Le => map2(out, a, b, |x, y| b2(r(x) <= r(y))),
        BinaryOp::Gt => map2(out, a, b, |x, y| b2(r(x) > r(y))),
        BinaryOp::Ge => map2(out, a, b, |x, y| b2(r(x) >= r(y))),
        _ => {}
    }
    if op.is_comparison() {
        return Ok(());
    }
    match (operand_dtype.kind(), op) {
        (Kind::Bool, BinaryOp::And) => map2(out, a, b, |x, y| b2(x != 0.0 && y != 0.0)),
        (Kind::Bool, BinaryOp::Or) => map2(out, a, b, |x, y| b2(x != 0.0 || y != 0.0)),
        (Kind::Bool, _) | (_, BinaryOp::And | BinaryOp::Or) => return Err(unsupported()),
        (Kind::Int, op) if operand_dtype == DType::I64 => match op {
            BinaryOp::Add => map2(out, a, b, long2(i64::wrapping_add)),
            BinaryOp::Sub => map2(out, a, b, long2(i64::wrapping_sub)),
            BinaryOp::Mul => map2(out, a, b, long2(i64::wrapping_mul)),
            BinaryOp::Min => map2(out, a, b, long2(i64::min)),
            BinaryOp::Max => map2(out, a, b, long2(i64::max)),
            BinaryOp::Remainder => map2(out, a, b, long2(remainder_i64)),
            // torch.fmod: the truncated remainder; `x % 0` and `MIN % -1` are 0.
            BinaryOp::Fmod => map2(out, a, b, long2(|x, y| x.checked_rem(y).unwrap_or(0))),
            BinaryOp::FloorDiv => map2(out, a, b, long2(floor_div_i64)),
            BinaryOp::BitAnd => map2(out, a, b, long2(|x, y| x & y)),
            BinaryOp::BitOr => map2(out, a, b, long2(|x, y| x | y)),
            BinaryOp::BitXor => map2(out, a, b, long2(|x, y| x ^ y)),
            BinaryOp::Shl => map2(out, a, b, long2(shl_i64)),
            BinaryOp::Shr => map2(out, a, b, long2(shr_i64)),
            _ => return Err(unsupported()),
        },
        (Kind::Int, BinaryOp::Add) => map2(out, a, b, |x, y| wrap_i32(x as i64 + y as i64)),
        (Kind::Int, BinaryOp::Sub) => map2(out, a, b, |x, y| wrap_i32(x as i64 - y as i64)),
        (Kind::Int, BinaryOp::Mul) => map2(out, a, b, |x, y| wrap_i32(x as i64 * y as i64)),
        (Kind::Int, BinaryOp::Min) => map2(out, a, b, f64::min),
        (Kind::Int, BinaryOp::Max) => map2(out, a, b, f64::max),
        (Kind::Int, BinaryOp::Remainder) => map2(out, a, b, int2(remainder_i)),
        (Kind::Int, BinaryOp::Fmod) => map2(out, a, b, int2(|x, y| x.checked_rem(y).unwrap_or(0))),
        (Kind::Int, BinaryOp::FloorDiv) => map2(out, a, b, int2(floor_div_i)),
        (Kind::Int, BinaryOp::BitAnd) => map2(out, a, b, int2(|x, y| x & y)),
        (Kind::Int, BinaryOp::BitOr) => map2(out, a, b, int2(|x, y| x | y)),
        (Kind::Int, BinaryOp::BitXor) => map2(out, a, b, int2(|x, y| x ^ y)),
        (Kind::Int, BinaryOp::Shl) => map2(out, a, b, int2(shl_i)),
        (Kind::Int, BinaryOp::Shr) => map2(out, a, b, int2(shr_i)),
        (Kind::Int, _) => return Err(unsupported()),
        (Kind::Float, BinaryOp::Add) => map2(out, a, b, |x, y| x + y),
        (Kind::Float, BinaryOp::Sub) => map2(out, a, b, |x, y| x - y),
        (Kind::Float, BinaryOp::Mul) => map2(out, a, b, |x, y| x * y),
        (Kind::Float, BinaryOp::Div) => map2(out, a, b, |x, y| x / y),
        (Kind::Float, BinaryOp::Pow) => map2(out, a, b, f64::powf),
        (Kind::Float, BinaryOp::Min) => map2(out, a, b, min_nan),
        (Kind::Float, BinaryOp::Max) => map2(out, a, b, max_nan),
        (Kind::Float, BinaryOp::Atan2) => map2(out, a, b, f64::atan2),
        (Kind::Float, BinaryOp::Remainder) => map2(out, a, b, remainder_f),
        // C's fmod (exact, the sign of the dividend; NaN for a zero divisor or an infinite dividend).
        (Kind::Float, BinaryOp::Fmod) => map2(out, a, b, |x, y| x % y),
        (Kind::Float, BinaryOp::Hypot) => map2(out, a, b, f64::hypot),
        (Kind::Float, BinaryOp::Copysign) => map2(out, a, b, f64::copysign),
        (Kind::Float, BinaryOp::FloorDiv) => map2(out, a, b, floor_div_f),
        (Kind::Float, _) => return Err(unsupported()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_and_max_propagate_nan_and_order_signed_zeros() {
        assert!(min_nan(f64::NAN, 1.0).is_nan() && min_nan(1.0, f64::NAN).is_nan());
        assert!(max_nan(f64::NAN, 1.0).is_nan() && max_nan(1.0, f64::NAN).is_nan());
        assert!(min_nan(0.0, -0.0).is_sign_negative() && min_nan(-0.0, 0.0).is_sign_negative());
        assert!(max_nan(0.0, -0.0).is_sign_positive() && max_nan(-0.0, 0.0).is_sign_positive());
        assert_eq!(min_nan(2.0, -3.0), -3.0);
        assert_eq!(max_nan(2.0, -3.0), 2.0);
    }

    #[test]
    fn casts_truncate_saturate_and_test_nonzero() {
        assert_eq!(cast_value(-2.7, Kind::Float, Kind::Int), -2.0);
        assert_eq!(cast_value(2.7, Kind::Float, Kind::Int), 2.0);
        assert_eq!(cast_value(f64::NAN, Kind::Float, Kind::Int), 0.0);
        assert_eq!(cast_value(1e12, Kind::Float, Kind::Int), i32::MAX as f64);
        assert_eq!(cast_value(f64::NAN, Kind::Float, Kind::Bool), 1.0);
        assert_eq!(cast_value(-0.0, Kind::Float, Kind::Bool), 0.0);
        assert_eq!(cast_value(0.1, Kind::Float, Kind::Float), 0.1);
    }

    #[test]
    fn floor_div_snaps_a_nearly_whole_quotient_as_python_does() {
        // 1 / 0.1 rounds to 10.0, but 0.1 (as f64) goes into 1 only 9 times: Python's 1.0 // 0.1.
        assert_eq!(floor_div_f(1.0, 0.1), 9.0);
        assert_eq!(remainder_f(1.0, 0.1), 1.0 % 0.1);
        assert_eq!(floor_div_f(-1.0, 0.1), -10.0);
        assert_eq!(floor_div_f(1e300, 1e-300), 1e300 / 1e-300);
    }

    #[test]
    fn sigmoid_is_stable_at_both_ends() {
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert!((sigmoid(0.5) - 1.0 / (1.0 + (-0.5f64).exp())).abs() < 1e-16);
    }
}
