//~ Integer remainder, fmod, floor division and shifts (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_INT_DIV_SHIFT
#define KF_HELPER_INT_DIV_SHIFT
// torch.remainder / torch.floor_divide of i32, as the interpreter computes them: a divisor of 0
// gives 0 (no trap), and -1 is taken apart so that INT_MIN / -1 (undefined in C++) wraps.
__device__ __forceinline__ int kf_rem_i32(int a, int b) {
    if (b == 0 || b == -1) return 0;
    const int r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ int kf_floordiv_i32(int a, int b) {
    if (b == 0) return 0;
    if (b == -1) return (int)(0u - (unsigned int)a);
    const int q = a / b;
    const int r = a % b;
    return (r != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
// torch.fmod of i32: the truncated remainder (the sign of the dividend), with the same two
// definitions: a divisor of 0 gives 0, and INT_MIN % -1 (undefined in C++) gives 0.
__device__ __forceinline__ int kf_fmod_i32(int a, int b) {
    return (b == 0 || b == -1) ? 0 : a % b;
}
// torch.bitwise_left_shift / bitwise_right_shift of i32: a count outside 0..31 gives 0 (left)
// or the sign fill a >> 31 (right), where C++ would leave it undefined.
__device__ __forceinline__ int kf_shl_i32(int a, int n) {
    return ((unsigned int)n < 32u) ? (int)((unsigned int)a << n) : 0;
}
__device__ __forceinline__ int kf_shr_i32(int a, int n) {
    return a >> (((unsigned int)n < 32u) ? n : 31);
}
#endif
