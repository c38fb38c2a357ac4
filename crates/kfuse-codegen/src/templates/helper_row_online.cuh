//~ A softmax's row maximum and exp-sum in one pass (reviewed template; rendered by
//~ `cuda::helper_source`; uses kf_maxf). Each lane keeps (m, s): the maximum of its values so far
//~ and the sum of exp(x - m) over them (0.0 while every value is -inf); merging two pairs rescales
//~ both sums to the larger maximum. The merge is commutative (both lanes of a pair get the same
//~ bits), and the order of the merges is fixed, so the result is the same bits on every run.
#ifndef KF_HELPER_ROW_ONLINE
#define KF_HELPER_ROW_ONLINE
// Adds one value x to a lane's (m, s).
__device__ __forceinline__ void kf_online_add(float& m, double& s, float x) {
    const float mm = kf_maxf(m, x);
    if (mm == __int_as_float(0xff800000)) return; // every value so far is -inf: nothing to add yet
    s = (s == 0.0 ? 0.0 : s * (double)expf(m - mm)) + (double)expf(x - mm);
    m = mm;
}
// Merges the pair (om, os) into (m, s).
__device__ __forceinline__ void kf_online_merge(float& m, double& s, float om, double os) {
    const float mm = kf_maxf(m, om);
    const double a = s == 0.0 ? 0.0 : s * (double)expf(m - mm);
    const double b = os == 0.0 ? 0.0 : os * (double)expf(om - mm);
    m = mm;
    s = a + b;
}
// Merges the pairs of each aligned group of `g` lanes (a power of two up to blockDim.x), the same
// bits in every lane of the group: xor shuffles within the warp, then each lane merges its group's
// per-warp pairs in order. Every thread of the block calls it with the same `g`; `smem` holds 64
// doubles.
__device__ void kf_row_online(float& m, double& s, long long g, double* smem) {
    for (int off = (int)(g < 32 ? g : 32) >> 1; off > 0; off >>= 1) {
        const float om = __shfl_xor_sync(0xffffffffu, m, off);
        const double os = __shfl_xor_sync(0xffffffffu, s, off);
        kf_online_merge(m, s, om, os);
    }
    if (g > 32) {
        const unsigned warp = threadIdx.x >> 5, first = (threadIdx.x & ~(unsigned)(g - 1)) >> 5;
        __syncthreads(); // smem may still be read by the previous fold
        if ((threadIdx.x & 31u) == 0u) {
            smem[warp] = (double)m;
            smem[32 + warp] = s;
        }
        __syncthreads();
        m = (float)smem[first];
        s = smem[32 + first];
        for (unsigned w = 1; w < (unsigned)(g >> 5); ++w) kf_online_merge(m, s, (float)smem[first + w], smem[32 + first + w]);
    }
}
#endif
