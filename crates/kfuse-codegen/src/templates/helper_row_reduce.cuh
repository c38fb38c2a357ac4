//~ A reduction of one double per lane over each row group of a row-wise kernel (reviewed
//~ template; rendered by `cuda::helper_source`). {{name}}: sum, max, min or prod; {{upper}}: the same
//~ in capitals; {{combine}}: v combined with o (commutative, so both lanes of a pair get the same
//~ bits).
#ifndef KF_HELPER_ROW_{{upper}}
#define KF_HELPER_ROW_{{upper}}
// The {{name}} of one double over each aligned group of `g` lanes (a power of two up to blockDim.x),
// the same bits in every lane of the group: xor shuffles within the warp, then each lane folds its
// group's per-warp values in order. Every thread of the block calls it with the same `g`; `smem`
// holds 32 doubles.
__device__ double kf_row_{{name}}(double v, long long g, double* smem) {
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        if (off < g) { const double o = __shfl_xor_sync(0xffffffffu, v, off); v = {{combine}}; } // g: the same in the whole block
    }
    if (g > 32) {
        const unsigned warp = threadIdx.x >> 5, first = (threadIdx.x & ~(unsigned)(g - 1)) >> 5;
        __syncthreads(); // smem may still be read by the previous call
        if ((threadIdx.x & 31u) == 0u) smem[warp] = v;
        __syncthreads();
        v = smem[first];
        for (unsigned w = 1; w < (unsigned)(g >> 5); ++w) { const double o = smem[first + w]; v = {{combine}}; }
    }
    return v;
}
#endif
