//~ Index division helpers (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_DIVMOD
#define KF_HELPER_DIVMOD
// Index division for non-negative operands: 32-bit when both fit (a uniform branch in practice;
// about a quarter of the instructions of the 64-bit sequence), 64-bit otherwise.
__device__ __forceinline__ long long kf_div(long long a, long long b) {
    return (((unsigned long long)a | (unsigned long long)b) >> 32) == 0ull ? (long long)((unsigned int)a / (unsigned int)b) : a / b;
}
__device__ __forceinline__ long long kf_mod(long long a, long long b) {
    return (((unsigned long long)a | (unsigned long long)b) >> 32) == 0ull ? (long long)((unsigned int)a % (unsigned int)b) : a % b;
}
#endif
