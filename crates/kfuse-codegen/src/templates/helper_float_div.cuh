//~ Float remainder and floor division (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_FLOAT_DIV
#define KF_HELPER_FLOAT_DIV
// torch.remainder of floats: fmod, moved by one divisor when its sign differs from the divisor's.
__device__ __forceinline__ float kf_remf(float a, float b) {
    const float m = fmodf(a, b);
    return (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) ? m + b : m;
}
// torch.floor_divide of floats (PyTorch's algorithm): (a - fmod(a, b)) / b is nearly whole and
// is snapped to the integer at or below it; division by zero is a / b.
__device__ __forceinline__ float kf_floordivf(float a, float b) {
    if (b == 0.0f) return a / b;
    const float m = fmodf(a, b);
    float div = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) div -= 1.0f;
    if (div == 0.0f) return copysignf(0.0f, a / b);
    const float f = floorf(div);
    return (div - f > 0.5f) ? f + 1.0f : f;
}
#endif
