//~ A softmax's row statistics in one pass (reviewed template; rendered by `cuda::helper_source`):
//~ a running maximum m of the row's values and the sum s of exp(x - m) over them, the sum rescaled
//~ when the maximum grows; then the fold of the lanes' pairs over each row group of a row-wise
//~ kernel, as `kf_row_<op>` folds one value.
#ifndef KF_HELPER_ROW_ONLINE
#define KF_HELPER_ROW_ONLINE
// One value v into (m, s), with one exp and no branch: d is exp(smaller - larger) of v and m; a
// larger v scales the sum by d and adds its own 1 ((v - v) + 1: NaN for +inf, as exp(inf - inf)
// in a second pass). m ends as kf_maxf's maximum (NaN propagates). An element equal to a -inf
// maximum counts 1, which the first finite maximum then scales to 0, so a row that begins with
// -inf (a masked score) sums what a second pass would.
__device__ __forceinline__ void kf_online_add(float& m, float& s, float v) {
    const float d = (v == m && v == __int_as_float(0xff800000)) ? 1.0f : expf(-fabsf(v - m));
    s = (v > m) ? fmaf(s, d, (v - v) + 1.0f) : s + d;
    m = kf_maxf(m, v);
}
// Two pairs as one (commutative: both lanes of a shuffle get the same bits).
__device__ __forceinline__ void kf_online_merge(float& m, float& s, float om, float os) {
    const float n = kf_maxf(m, om);
    s = (m == n ? s : s * expf(m - n)) + (om == n ? os : os * expf(om - n));
    m = n;
}
// The pairs folded over each aligned group of `g` lanes (a power of two up to blockDim.x), the same
// bits in every lane of the group: xor shuffles within the warp, then each lane folds its group's
// per-warp pairs in order. Every thread of the block calls it with the same `g`; `smem` holds 32
// doubles (32 pairs of floats).
__device__ void kf_row_online(float& m, float& s, long long g, double* smem) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        if (off < g) {
            const float om = __shfl_xor_sync(0xffffffffu, m, off), os = __shfl_xor_sync(0xffffffffu, s, off);
            kf_online_merge(m, s, om, os);
        }
    }
    if (g > 32) {
        float2* pairs = reinterpret_cast<float2*>(smem);
        const unsigned warp = threadIdx.x >> 5, first = (threadIdx.x & ~(unsigned)(g - 1)) >> 5;
        __syncthreads(); // smem may still be read by the previous fold
        if ((threadIdx.x & 31u) == 0u) pairs[warp] = make_float2(m, s);
        __syncthreads();
        m = pairs[first].x;
        s = pairs[first].y;
        for (unsigned w = 1; w < (unsigned)(g >> 5); ++w) kf_online_merge(m, s, pairs[first + w].x, pairs[first + w].y);
    }
}
#endif
