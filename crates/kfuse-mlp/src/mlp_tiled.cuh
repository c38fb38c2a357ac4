// kfuse MLP tiled fallback: one layer, y = act(x · Wᵀ + b), for models too wide to fuse whole
// (hand-written, reviewed; embedded by kfuse-mlp, which defines before it KF_TILED_NAME, the
// layer's widths KF_K / KF_N, element kinds KF_X_KIND / KF_Y_KIND (0 f32, 1 f16, 2 bf16),
// KF_W_BF16, KF_HAS_BIAS, and `kf_act(float)`).
//
// Correct for any width, not fast: a plain 16x16 shared-memory tiled product on the CUDA cores,
// f32 accumulation, one launch per layer, f32 intermediates in global memory.

__device__ __forceinline__ float kf_tiled_load(const unsigned char* p, long long i, int kind) {
    if (kind == 0) return reinterpret_cast<const float*>(p)[i];
    const unsigned short h = reinterpret_cast<const unsigned short*>(p)[i];
    float f;
    if (kind == 1) {
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    } else {
        asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((unsigned)h) << 16));
    }
    return f;
}

__device__ __forceinline__ void kf_tiled_store(unsigned char* p, long long i, int kind, float v) {
    if (kind == 0) {
        reinterpret_cast<float*>(p)[i] = v;
        return;
    }
    unsigned w;
    if (kind == 1) {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(0.f), "f"(v));
    } else {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(0.f), "f"(v));
    }
    reinterpret_cast<unsigned short*>(p)[i] = (unsigned short)(w & 0xffffu);
}

extern "C" __global__ void __launch_bounds__(256)
KF_TILED_NAME(const unsigned char* __restrict__ x,      // [rows, KF_K] row-major, KF_X_KIND elements
              unsigned char* __restrict__ y,            // [rows, KF_N] row-major, KF_Y_KIND elements
              const unsigned char* __restrict__ w,      // [KF_N, KF_K] row-major f16/bf16 (PyTorch layout)
              const float* __restrict__ bias,           // [KF_N] f32, unused without bias
              long long rows)
{
    __shared__ float xs[16][17];  // +1 column: the column-wise reads below hit 16 different banks
    __shared__ float ws[16][17];
    const int tx = threadIdx.x & 15;  // output column within the block's 16x16 tile
    const int ty = threadIdx.x >> 4;  // output row within the tile
    const long long n_tiles = (KF_N + 15) / 16;
    const long long row0 = (long long)(blockIdx.x / n_tiles) * 16;
    const int n0 = (int)(blockIdx.x % n_tiles) * 16;
    const long long row = row0 + ty;
    const int n = n0 + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < KF_K; k0 += 16) {
        const int k = k0 + tx;
        xs[ty][tx] = (row < rows && k < KF_K) ? kf_tiled_load(x, row * KF_K + k, KF_X_KIND) : 0.f;
        ws[ty][tx] = (n0 + ty < KF_N && k < KF_K) ? kf_tiled_load(w, (long long)(n0 + ty) * KF_K + k, KF_W_BF16 ? 2 : 1) : 0.f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; ++kk) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();
    }
    if (row < rows && n < KF_N) {
        const float z = acc + (KF_HAS_BIAS ? bias[n] : 0.f);
        kf_tiled_store(y, row * KF_N + n, KF_Y_KIND, kf_act(z));
    }
}
