//~ Integer remainder, fmod, floor division and shifts of i64 (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_INT64_DIV_SHIFT
#define KF_HELPER_INT64_DIV_SHIFT
// torch.remainder / torch.floor_divide of i64, as the interpreter computes them: a divisor of 0
// gives 0 (no trap), and -1 is taken apart so that LLONG_MIN / -1 (undefined in C++) wraps.
__device__ __forceinline__ long long kf_rem_i64(long long a, long long b) {
    if (b == 0 || b == -1) return 0;
    const long long r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ long long kf_floordiv_i64(long long a, long long b) {
    if (b == 0) return 0;
    if (b == -1) return (long long)(0ull - (unsigned long long)a);
    const long long q = a / b;
    const long long r = a % b;
    return (r != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// torch.fmod of i64: the truncated remainder (the sign of the dividend), with the same two
// definitions: a divisor of 0 gives 0, and LLONG_MIN % -1 (undefined in C++) gives 0.
__device__ __forceinline__ long long kf_fmod_i64(long long a, long long b) {
    return (b == 0 || b == -1) ? 0 : a % b;
}
// torch.bitwise_left_shift / bitwise_right_shift of i64: a count outside 0..63 gives 0 (left)
// or the sign fill a >> 63 (right), where C++ would leave it undefined.
__device__ __forceinline__ long long kf_shl_i64(long long a, long long n) {
    return ((unsigned long long)n < 64ull) ? (long long)((unsigned long long)a << n) : 0;
}
__device__ __forceinline__ long long kf_shr_i64(long long a, long long n) {
    return a >> (((unsigned long long)n < 64ull) ? n : 63);
}
#endif
