//! Special functions that neither std nor libm has, in f64, with PyTorch's values at the poles
//! and outside the domains: `digamma`, `trigamma` (`torch.special.polygamma(1, x)`) and `erfinv`.
//! Each is accurate to a few ulps (relative to `|f(x)| + 1` near digamma's roots); the GPU's f32
//! versions (`kf_digammaf`, `kf_trigammaf` in the codegen's templates) take the same steps, with
//! a lower threshold for the series and fewer of its terms.

use std::f64::consts::{FRAC_2_SQRT_PI, PI};

/// `torch.digamma`: ψ(x) = Γ'(x) / Γ(x). `±0` give `∓inf`; the negative integers and `-inf` give
/// NaN, as PyTorch (and SciPy) define them.
///
/// Below 0 the reflection ψ(x) = ψ(1 - x) - π cot(πx), with the cotangent taken at `x`'s distance
/// to the nearest integer (exact, so that no multiple of π is rounded); then the recurrence
/// ψ(x) = ψ(x + 1) - 1/x up to x ≥ 10 and the asymptotic series
/// ln x - 1/(2x) - Σ B₂ₖ / (2k x²ᵏ) to k = 7 (the next term is below 1e-16 at x = 10).
pub(crate) fn digamma(x: f64) -> f64 {
    if x == 0.0 {
        return f64::INFINITY.copysign(-x);
    }
    let mut x = x;
    let mut acc = 0.0;
    if x < 0.0 {
        if x == x.trunc() {
            return f64::NAN;
        }
        acc = -PI / (PI * (x - x.round())).tan();
        x = 1.0 - x;
    }
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let z = 1.0 / (x * x);
    let series = z
        * (1.0 / 12.0
            - z * (1.0 / 120.0
                - z * (1.0 / 252.0 - z * (1.0 / 240.0 - z * (1.0 / 132.0 - z * (691.0 / 32760.0 - z / 12.0))))));
    acc + x.ln() - 0.5 / x - series
}

/// `torch.special.polygamma(1, x)`: ψ'(x), digamma's derivative. `+inf` at 0 and the negative
/// integers (its poles, where PyTorch's rounded `sin(πx)` gives a huge finite value instead),
/// NaN at `-inf`, 0 at `+inf`.
///
/// Below 1/2 the reflection ψ'(x) = π² / sin²(πx) - ψ'(1 - x) (the sine taken at `x`'s distance
/// to the nearest integer, exact); then the recurrence ψ'(x) = ψ'(x + 1) + 1/x² up to x ≥ 20 and
/// the asymptotic series 1/x + 1/(2x²) + Σ B₂ₖ / x²ᵏ⁺¹ to k = 7.
pub(crate) fn trigamma(x: f64) -> f64 {
    let mut x = x;
    let (mut sign, mut acc) = (1.0, 0.0);
    if x < 0.5 {
        let c = PI / (PI * (x - x.round())).sin();
        acc = -(c * c);
        sign = -1.0;
        x = 1.0 - x;
    }
    while x < 20.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    let z = 1.0 / (x * x);
    let b = 1.0 / 6.0
        - z * (1.0 / 30.0
            - z * (1.0 / 42.0 - z * (1.0 / 30.0 - z * (5.0 / 66.0 - z * (691.0 / 2730.0 - z * 7.0 / 6.0)))));
    sign * (acc + (1.0 + 0.5 / x + z * b) / x)
}

/// `torch.erfinv`: the `y` with `erf(y) = x`. `±1` give `±inf`, `|x| > 1` and NaN give NaN, and
/// `-0` stays `-0`.
///
/// The rational initial estimate PyTorch uses (Pavlis's, relative error below 1e-4), then two
/// Halley steps on `erf(y) = |x|` (cubic, so the estimate's error is cubed twice): near ±1 the
/// residual is `(1 - |x|) - erfc(y)`, where `1 - |x|` is exact and `erf(y) - |x|` would cancel.
pub(crate) fn erfinv(x: f64) -> f64 {
    const A: [f64; 4] = [0.886226899, -1.645349621, 0.914624893, -0.140543331];
    const B: [f64; 4] = [-2.118377725, 1.442710462, -0.329097515, 0.012229801];
    const C: [f64; 4] = [-1.970840454, -1.624906493, 3.429567803, 1.641345311];
    const D: [f64; 2] = [3.543889200, 1.637067800];
    let a = x.abs();
    if a.is_nan() || a > 1.0 {
        return f64::NAN;
    }
    if a == 1.0 || a == 0.0 {
        return if a == 0.0 { x } else { f64::INFINITY.copysign(x) };
    }
    let mut y = if a <= 0.7 {
        let z = a * a;
        a * (((A[3] * z + A[2]) * z + A[1]) * z + A[0]) / ((((B[3] * z + B[2]) * z + B[1]) * z + B[0]) * z + 1.0)
    } else {
        let z = (-((1.0 - a) / 2.0).ln()).sqrt();
        (((C[3] * z + C[2]) * z + C[1]) * z + C[0]) / ((D[1] * z + D[0]) * z + 1.0)
    };
    for _ in 0..2 {
        let residual = if a <= 0.5 { libm::erf(y) - a } else { (1.0 - a) - libm::erfc(y) };
        // Newton's step u = f / f', bent by f'' / f' = -2y into Halley's.
        let u = residual / (FRAC_2_SQRT_PI * (-y * y).exp());
        y -= u / (1.0 + y * u);
    }
    y.copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `got` within `ulps` f64 epsilons of `want`, relative to `|want| + 1`; NaN and infinities
    /// exactly.
    fn close(got: f64, want: f64, ulps: f64) -> bool {
        if want.is_nan() || want.is_infinite() {
            return got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan());
        }
        (got - want).abs() <= ulps * f64::EPSILON * (want.abs() + 1.0)
    }

    #[test]
    fn digamma_matches_known_values() {
        // SciPy's `scipy.special.digamma` (and the closed forms: -γ at 1, -γ - 2 ln 2 at 1/2).
        for (x, want) in [
            (1.0, -0.5772156649015329),
            (0.5, -1.9635100260214235),
            (10.0, 2.251752589066721),
            (-0.5, 0.03648997397857652),
            (2.0, 0.42278433509846713),
            (-2.5, 1.103156640645243),
            (100.0, 4.600161852738087),
            (1e15, 34.538776394910684),
            (1e-30, -1e30),
        ] {
            assert!(close(digamma(x), want, 4.0), "digamma({x}) = {}, want {want}", digamma(x));
        }
        let inf = f64::INFINITY;
        for (x, want) in [(0.0, -inf), (-0.0, inf), (-1.0, f64::NAN), (-7.0, f64::NAN), (inf, inf), (-inf, f64::NAN)] {
            assert!(close(digamma(x), want, 0.0), "digamma({x}) = {}, want {want}", digamma(x));
        }
        assert!(digamma(f64::NAN).is_nan());
    }

    #[test]
    fn trigamma_matches_known_values() {
        // π²/6 at 1, π²/2 at 1/2, π²/2 + 4 at -1/2; the rest SciPy's `polygamma(1, x)`.
        let pi2 = PI * PI;
        for (x, want) in [
            (1.0, pi2 / 6.0),
            (0.5, pi2 / 2.0),
            (-0.5, pi2 / 2.0 + 4.0),
            (2.0, pi2 / 6.0 - 1.0),
            (10.0, 0.10516633568168575),
            (-2.5, 9.539246644989124),
            (100.0, 0.010050166663333571),
            (1e15, 1.0000000000000005e-15),
            (1e-30, 1e60),
        ] {
            assert!(close(trigamma(x), want, 4.0), "trigamma({x}) = {}, want {want}", trigamma(x));
        }
        let inf = f64::INFINITY;
        for (x, want) in [(0.0, inf), (-0.0, inf), (-1.0, inf), (-5.0, inf), (inf, 0.0), (-inf, f64::NAN)] {
            assert!(close(trigamma(x), want, 0.0), "trigamma({x}) = {}, want {want}", trigamma(x));
        }
        assert!(trigamma(f64::NAN).is_nan());
    }

    #[test]
    fn erfinv_matches_known_values_and_inverts_erf() {
        // SciPy's `scipy.special.erfinv`.
        for (x, want) in [
            (0.5, 0.4769362762044699),
            (-0.9, -1.1630871536766742),
            (0.1, 0.08885599049425769),
            (0.999999, 3.458910737275499),
            (1e-10, 8.86226925452758e-11),
            (1.0 - f64::EPSILON / 2.0, 5.863584748755168),
        ] {
            assert!(close(erfinv(x), want, 4.0), "erfinv({x}) = {}, want {want}", erfinv(x));
        }
        let inf = f64::INFINITY;
        for (x, want) in [(1.0, inf), (-1.0, -inf), (1.5, f64::NAN), (-2.0, f64::NAN), (inf, f64::NAN), (0.0, 0.0)] {
            assert!(close(erfinv(x), want, 0.0), "erfinv({x}) = {}, want {want}", erfinv(x));
        }
        assert!(erfinv(-0.0).is_sign_negative() && erfinv(-0.0) == 0.0);
        assert!(erfinv(f64::NAN).is_nan());
        // erf(erfinv(x)) = x over the whole interval, both halves of the residual's choice.
        for i in -999..1000 {
            let x = f64::from(i) / 1000.0;
            assert!((libm::erf(erfinv(x)) - x).abs() <= 2.0 * f64::EPSILON, "erf(erfinv({x}))");
        }
    }
}
