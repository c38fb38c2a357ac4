//~ digamma and trigamma of f32 (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_POLYGAMMA
#define KF_HELPER_POLYGAMMA
// torch.digamma in f32, the interpreter's steps: +0 gives -inf and -0 +inf, the negative integers
// and -inf NaN. Below 0 the reflection psi(x) = psi(1 - x) - pi cot(pi x) (cospif and sinpif
// reduce their argument exactly), then psi(x) = psi(x + 1) - 1/x up to x >= 6 and the asymptotic
// series ln x - 1/(2x) - sum B_2k / (2k x^2k) to k = 4 (the next term is below 1e-9 at x = 6).
__device__ __forceinline__ float kf_digammaf(float x) {
    if (x == 0.0f) return copysignf(__int_as_float(0x7f800000), -x);
    float acc = 0.0f;
    if (x < 0.0f) {
        if (x == truncf(x)) return __int_as_float(0x7fc00000);
        acc = -3.14159265f * cospif(x) / sinpif(x);
        x = 1.0f - x;
    }
    while (x < 6.0f) {
        acc -= 1.0f / x;
        x += 1.0f;
    }
    const float z = 1.0f / (x * x);
    const float series = z * (1.0f / 12.0f - z * (1.0f / 120.0f - z * (1.0f / 252.0f - z * (1.0f / 240.0f))));
    return acc + logf(x) - 0.5f / x - series;
}
// torch.special.polygamma(1, x) in f32, the interpreter's steps: +inf at 0 and the negative
// integers (its poles), NaN at -inf, 0 at +inf. Below 1/2 the reflection
// psi'(x) = pi^2 / sin^2(pi x) - psi'(1 - x), then psi'(x) = psi'(x + 1) + 1/x^2 up to x >= 6 and
// the asymptotic series 1/x + 1/(2x^2) + sum B_2k / x^(2k+1) to k = 4.
__device__ __forceinline__ float kf_trigammaf(float x) {
    float sign = 1.0f, acc = 0.0f;
    if (x < 0.5f) {
        const float c = 3.14159265f / sinpif(x);
        acc = -(c * c);
        sign = -1.0f;
        x = 1.0f - x;
    }
    while (x < 6.0f) {
        acc += 1.0f / (x * x);
        x += 1.0f;
    }
    const float z = 1.0f / (x * x);
    const float b = 1.0f / 6.0f - z * (1.0f / 30.0f - z * (1.0f / 42.0f - z * (1.0f / 30.0f)));
    return sign * (acc + (1.0f + 0.5f / x + z * b) / x);
}
#endif
