// Checks the conventions kfuse-mlp's wgmma layers rely on (H100, sm_90a), against a CPU product:
//   * wgmma.mma_async m64n32k16 f32 += f16 * f16 with A from registers in the mma.m16n8k16 A-fragment
//     layout (warp w of the warpgroup holds rows 16w..16w+15) and D in the m16n8 C layout per n8 tile;
//   * B [N, K] row-major (PyTorch's weight) in shared memory as K-major core matrices of 8 rows x 16 bytes:
//     byte (kk * N * 32) + (n / 8) * 256 + ((k % 16) / 8) * 128 + (n % 8) * 16 + (k % 8) * 2, descriptor
//     LBO (between the two core matrices along K) = 128, SBO (between 8-row groups along N) = 256.
// Variant 1 swaps LBO and SBO, to tell which is which if variant 0 fails.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 wgmma_check.cu -o /tmp/wgc && /tmp/wgc
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <cuda_fp16.h>

constexpr int M = 64, N = 32, K = 64, KT = K / 16;

__device__ unsigned long long desc_of(const void* p, unsigned lbo, unsigned sbo) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32);
}

__global__ void k(const __half* A, const __half* B, float* D, int variant) {
    __shared__ __align__(128) unsigned char sb[N * K * 2];
    // B in the core-matrix layout
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
        int n = i / K, kx = i % K;
        int off = (kx / 16) * N * 32 + (n / 8) * 256 + ((kx % 16) / 8) * 128 + (n % 8) * 16 + (kx % 8) * 2;
        *reinterpret_cast<__half*>(sb + off) = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int r0 = 16 * warp;
    auto pk = [&](int r, int c) {
        __half2 h = __halves2half2(A[r * K + c], A[r * K + c + 1]);
        return *reinterpret_cast<unsigned*>(&h);
    };
    float d[16];
    for (int i = 0; i < 16; ++i) d[i] = 0.f;
    unsigned lbo = variant == 0 ? 128 : 256, sbo = variant == 0 ? 256 : 128;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        unsigned a0 = pk(r0 + g, 16 * kk + 2 * q), a1 = pk(r0 + g + 8, 16 * kk + 2 * q);
        unsigned a2 = pk(r0 + g, 16 * kk + 8 + 2 * q), a3 = pk(r0 + g + 8, 16 * kk + 8 + 2 * q);
        unsigned long long desc = desc_of(sb + kk * N * 32, lbo, sbo);
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
            : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15])
            : "r"(a0),"r"(a1),"r"(a2),"r"(a3),"l"(desc));
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    for (int t = 0; t < N / 8; ++t) {
        D[(r0 + g) * N + 8 * t + 2 * q] = d[4 * t];
        D[(r0 + g) * N + 8 * t + 2 * q + 1] = d[4 * t + 1];
        D[(r0 + g + 8) * N + 8 * t + 2 * q] = d[4 * t + 2];
        D[(r0 + g + 8) * N + 8 * t + 2 * q + 1] = d[4 * t + 3];
    }
}

int main() {
    __half *hA, *hB, *dA, *dB; float *hD, *dD;
    hA = (__half*)malloc(M * K * 2); hB = (__half*)malloc(N * K * 2); hD = (float*)malloc(M * N * 4);
    srand(7);
    for (int i = 0; i < M * K; ++i) hA[i] = __float2half((rand() % 17 - 8) / 8.f);
    for (int i = 0; i < N * K; ++i) hB[i] = __float2half((rand() % 17 - 8) / 8.f);
    cudaMalloc(&dA, M * K * 2); cudaMalloc(&dB, N * K * 2); cudaMalloc(&dD, M * N * 4);
    cudaMemcpy(dA, hA, M * K * 2, cudaMemcpyHostToDevice); cudaMemcpy(dB, hB, N * K * 2, cudaMemcpyHostToDevice);
    for (int variant = 0; variant < 2; ++variant) {
        cudaMemset(dD, 0xff, M * N * 4);
        k<<<1, 128>>>(dA, dB, dD, variant);
        cudaError_t e = cudaDeviceSynchronize();
        cudaMemcpy(hD, dD, M * N * 4, cudaMemcpyDeviceToHost);
        double worst = 0;
        for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) {
            double s = 0; for (int x = 0; x < K; ++x) s += (double)__half2float(hA[m * K + x]) * __half2float(hB[n * K + x]);
            double err = fabs(s - hD[m * N + n]); if (!(err <= worst)) worst = err;  // NaN counts
        }
        printf("wgmma_check variant %d (LBO %d, SBO %d): %s, worst abs error %g -> %s\n", variant, variant ? 256 : 128, variant ? 128 : 256,
               cudaGetErrorString(e), worst, worst < 1e-3 ? "PASS" : "FAIL");
    }
    return 0;
}
