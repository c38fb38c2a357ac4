//~ A block-wide reduction of one double per thread in a fixed order (reviewed template; rendered
//~ by `cuda::helper_source`). {{name}}: sum, max, min or prod; {{upper}}: the same in capitals;
//~ {{combine}}: v combined with o; {{identity}}: the combine's identity.
#ifndef KF_HELPER_BLOCK_{{upper}}
#define KF_HELPER_BLOCK_{{upper}}
// Block-wide {{name}} of one double per thread, in a fixed order; the result is valid in thread 0.
// `smem` holds 32 doubles; every thread of the block must call this.
__device__ double kf_block_{{name}}(double v, double* smem) {
    const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
    for (int off = 16; off > 0; off >>= 1) { const double o = __shfl_down_sync(0xffffffffu, v, off); v = {{combine}}; }
    __syncthreads(); // smem may still be in use by the previous call
    if (lane == 0u) smem[warp] = v;
    __syncthreads();
    if (warp == 0u) {
        v = (lane < ((blockDim.x + 31u) >> 5)) ? smem[lane] : {{identity}};
        for (int off = 16; off > 0; off >>= 1) { const double o = __shfl_down_sync(0xffffffffu, v, off); v = {{combine}}; }
    }
    return v;
}
#endif
