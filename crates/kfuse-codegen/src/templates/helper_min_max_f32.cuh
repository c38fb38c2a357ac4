//~ NaN-propagating f32 min/max (reviewed template; rendered by `cuda::helper_source`). On sm_80
//~ and later one min.NaN/max.NaN instruction: NaN when either operand is NaN (the canonical NaN,
//~ as `a + b` of a NaN gives on the GPU) and -0 below +0 in either operand order, measured on an
//~ H200 (bench/RESULTS.md), so the same values as the branch-free form below it, which spells that
//~ out: the hardware min/max, then the equal case (only zeros can differ in bits) merges sign
//~ bits, then NaN wins.
#ifndef KF_HELPER_MINMAX_F32
#define KF_HELPER_MINMAX_F32
// NaN-propagating min/max ordering -0 below +0, like torch.minimum/maximum.
__device__ __forceinline__ float kf_minf(float a, float b) {
#if __CUDA_ARCH__ >= 800
    float d;
    asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    const float m = (a == b) ? __int_as_float(__float_as_int(a) | __float_as_int(b)) : fminf(a, b);
    return (a != a || b != b) ? a + b : m;
#endif
}
__device__ __forceinline__ float kf_maxf(float a, float b) {
#if __CUDA_ARCH__ >= 800
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    const float m = (a == b) ? __int_as_float(__float_as_int(a) & __float_as_int(b)) : fmaxf(a, b);
    return (a != a || b != b) ? a + b : m;
#endif
}
#endif
