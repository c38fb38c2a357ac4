// kfuse MLP benchmark ceilings (hand-written, reviewed): the two rates a fused MLP is measured
// against, taken on the same card in the same run.

// Device-to-device copy: the achievable memory bandwidth (bytes read + bytes written).
// 16-byte accesses, grid-stride, coalesced; `n16` counts 16-byte chunks.
extern "C" __global__ void __launch_bounds__(256)
kf_bench_copy(const uint4* __restrict__ src,  // n16 chunks to read
              uint4* __restrict__ dst,        // n16 chunks to write
              long long n16)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += stride) dst[i] = src[i];
}

// mma.sync throughput: each warp runs `iters` rounds of 8 independent m16n8k16 f16 mmas with f32
// accumulation on register operands (8 chains hide the mma latency), the instruction the fused
// MLP uses; 4096 flops each. The sums go to `sink` so nothing is optimised away.
extern "C" __global__ void __launch_bounds__(256)
kf_bench_mma(float* __restrict__ sink,  // one float per thread
             int iters)
{
    unsigned a[4] = {threadIdx.x, threadIdx.x ^ 1u, threadIdx.x ^ 2u, threadIdx.x ^ 3u};
    const unsigned b0 = 0x3c003c00u ^ blockIdx.x, b1 = 0x3c003c00u;
    float acc[8][4];
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
        }
    }
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < 8; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
    sink[(long long)blockIdx.x * blockDim.x + threadIdx.x] = s;
}
