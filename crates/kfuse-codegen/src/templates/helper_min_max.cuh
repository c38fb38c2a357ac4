//~ NaN-propagating min/max of one type (reviewed template; rendered by `cuda::helper_source`).
//~ {{tag}}: the guard suffix, {{ty}}: the C type, {{min}}/{{max}}: the names, {{as_bits}}/{{from_bits}}:
//~ the bit casts, {{hw_min}}/{{hw_max}}: the hardware min/max. (f32: helper_min_max_f32.cuh.)
#ifndef KF_HELPER_MINMAX_{{tag}}
#define KF_HELPER_MINMAX_{{tag}}
// NaN-propagating min/max ordering -0 below +0, like torch.minimum/maximum.
__device__ __forceinline__ {{ty}} {{min}}({{ty}} a, {{ty}} b) {
    const {{ty}} m = (a == b) ? {{from_bits}}({{as_bits}}(a) | {{as_bits}}(b)) : {{hw_min}}(a, b);
    return (a != a || b != b) ? a + b : m;
}
__device__ __forceinline__ {{ty}} {{max}}({{ty}} a, {{ty}} b) {
    const {{ty}} m = (a == b) ? {{from_bits}}({{as_bits}}(a) & {{as_bits}}(b)) : {{hw_max}}(a, b);
    return (a != a || b != b) ? a + b : m;
}
#endif
