// kfuse fully fused MLP: hidden layers on Hopper's asynchronous warpgroup MMA (wgmma, sm_90a;
// hand-written, reviewed; embedded by kfuse-mlp's emitter after mlp_prelude.cuh only when
// MlpKernelOptions select TensorInstructions::Wgmma, so other kernels' sources do not change).
//
// Why: with mma.sync a warp issues every tensor-core step itself and waits on it, so the SFU work
// of the activation (MUFU) and the products of the next columns overlap only as far as ptxas
// interleaves one warp's instruction stream (SiLU bench model, H100: tensor pipe and MUFU each
// ~63% busy). wgmma.mma_async runs a warpgroup's product (64 rows per instruction) on the tensor
// cores while the warps go on: here the products of output chunk c + 1 are in flight while the
// activation of chunk c runs.
//
// Operands:
//   * A from registers: a warp's mma.m16n8k16 A fragments (the layer input `a[KF_R][KT][4]`),
//     warp w of the warpgroup holding rows 16w..16w+15 of each 64-row instruction, row tile r of
//     the warp in the r-th instruction of a step;
//   * B from shared memory, K-major "core matrices" of 8 rows (output columns n) x 16 bytes
//     (8 consecutive k), no swizzle: element (n, k) of a layer of padded width N at byte
//       (k / 16) * N * 32 + (n / 8) * 256 + ((k % 16) / 8) * 128 + (n % 8) * 16 + (k % 8) * 2
//     of the layer's region, so one k16 step's B for columns [32c, 32c + 32) starts at
//     (k / 16) * N * 32 + c * 1024, with 128 bytes between the two core matrices along k (LBO)
//     and 256 between 8-column groups (SBO). The host blob keeps the mma.sync fragment order
//     (the generic fast form reads the same blob); kf_stage_wgmma_layer rewrites a layer's
//     region in this order once per block, from the blob in global memory.
//   * D: f32 accumulators in the m16n8 C layout per n8 tile t of the chunk (d[4t..4t+3]: row g,
//     columns 8t + 2q, +1; row g + 8, the same columns), i.e. exactly kf_hidden_layer's acc[t];
//     they start as the bias quads (one LDS.128 per tile, KF_BIAS_QUADS layout) or zeros.
//
// Every warp of a warpgroup must execute the same wgmma instructions: the kernel (mlp_kernel.cuh,
// KF_WGMMA) runs a warpgroup's four warps over consecutive tiles in lockstep.

// The shared-memory matrix descriptor of a no-swizzle K-major B operand at shared address `addr`
// (16-byte aligned, below 256 KiB): start address, LBO = 128 bytes, SBO = 256 bytes (each >> 4).
__device__ __forceinline__ unsigned long long kf_wg_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) | (8ull << 16) | (16ull << 32);
}
__device__ __forceinline__ void kf_wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void kf_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void kf_wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }
// Ties accumulator registers to the volatile wgmma instructions around them: the compiler may
// not read them before the wait nor write them after the issue.
template <int NV>
__device__ __forceinline__ void kf_wg_fence_regs(float (&d)[NV]) {
#pragma unroll
    for (int i = 0; i < NV; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#if KF_COMPUTE_BF16
#define KF_WG_TYPES "f32.bf16.bf16"
#else
#define KF_WG_TYPES "f32.f16.f16"
#endif

// d += A(64 x 16, registers) * B(16 x NC, shared memory at `desc`), NC = 32 or 16 columns (the
// chunked form; the row form's whole-width KfWgmma<N> are generated per model by kernel.rs).
template <int NC>
struct KfWgmmaChunk;
template <>
struct KfWgmmaChunk<32> {
    static __device__ __forceinline__ void mma(float (&d)[16], const unsigned (&a)[4], unsigned long long desc) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n32k16." KF_WG_TYPES
                     " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
                       "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                     : "memory");
    }
};
template <>
struct KfWgmmaChunk<16> {
    static __device__ __forceinline__ void mma(float (&d)[16], const unsigned (&a)[4], unsigned long long desc) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n16k16." KF_WG_TYPES " {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
                     : "memory");
    }
};

// Rewrites the weights of one hidden layer (KT k16 chunks in, NT16 k16 chunks out) at byte W_OFF
// of shared memory from the blob's fragment order (read from `params` in global memory) into the
// core-matrix order above. Each 4-byte word is a pair of consecutive k of one column n. The
// caller orders these stores (fence.proxy.async + barrier) before the first wgmma.
template <int KT, int NT16, int W_OFF>
__device__ __forceinline__ void kf_stage_wgmma_layer(const unsigned* __restrict__ params, unsigned char* __restrict__ smem) {
    constexpr int WORDS = NT16 * KT * 32 * 4;
    constexpr int N = NT16 * 16;
    for (int w = threadIdx.x; w < WORDS; w += KF_THREADS) {
        // Blob word w: 16-byte unit u = ((j * KT + kk) * 32 + l), word e: e & 2 -> tile 2j + 1
        // (column + 8), e & 1 -> k + 8 (see pack_params in kernel.rs).
        const int e = w & 3, u = w >> 2;
        const int l = u & 31, jk = u >> 5;
        const int j = jk / KT, kk = jk - j * KT;
        const int n = 16 * j + (l >> 2) + ((e & 2) ? 8 : 0);
        const int k = 2 * (l & 3) + ((e & 1) ? 8 : 0);  // within the k16 chunk kk
        const int off = kk * N * 32 + (n >> 3) * 256 + (k >> 3) * 128 + (n & 7) * 16 + (k & 7) * 2;
        *reinterpret_cast<unsigned*>(smem + W_OFF + off) = params[W_OFF / 4 + w];
    }
}

// Starts an n8 tile's four accumulators d[0..3] at its bias quad at shared address `addr` (or 0).
// The load is volatile, so that the same quad for several row tiles stays one LDS.128 each
// instead of one load and register copies (an LDS.128 fills 4 accumulators, a copy 1).
template <int HAS_BIAS>
__device__ __forceinline__ void kf_wg_bias_quad(float* d, unsigned addr) {
    if (HAS_BIAS) {
        asm volatile("ld.volatile.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) : "r"(addr));
    } else {
        d[0] = d[1] = d[2] = d[3] = 0.f;
    }
}

// Chunk c (32 columns, or 16 for the last of an odd NT16) of a wgmma hidden layer: its
// accumulators start at the bias quads (or 0), then KT k16 steps for each of the KF_R row tiles,
// committed as one group.
template <int KT, int NT16, int W_OFF, int B_OFF, int HAS_BIAS>
__device__ __forceinline__ void kf_wg_chunk_issue(float (&d)[KF_R][16], const unsigned (&a)[KF_R][KT][4], unsigned long long desc0,
                                                  const unsigned char* __restrict__ smem, int c, int quad) {
    const int tiles = (2 * c + 1 < NT16) ? 4 : 2;  // n8 tiles in this chunk
    const unsigned bias = kf_smem_addr(smem + B_OFF) + quad * 16;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        if (t < tiles) {
#pragma unroll
            for (int r = 0; r < KF_R; ++r) kf_wg_bias_quad<HAS_BIAS>(d[r] + 4 * t, bias + (4 * c + t) * 64);
        }
    }
#pragma unroll
    for (int r = 0; r < KF_R; ++r) kf_wg_fence_regs(d[r]);
    kf_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        const unsigned long long desc = desc0 + (unsigned long long)((W_OFF + kk * NT16 * 16 * 32 + c * 1024) >> 4);
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            if (tiles == 4) {
                KfWgmmaChunk<32>::mma(d[r], a[r][kk], desc);
            } else {
                KfWgmmaChunk<16>::mma(d[r], a[r][kk], desc);
            }
        }
    }
    kf_wg_commit();
}

// A hidden layer on wgmma: the parameters of kf_hidden_layer (mlp_prelude.cuh), with `desc0` the
// descriptor of shared address 0 of the dynamic shared memory (kf_wg_desc of its base). Chunks of
// 32 output columns are issued one ahead of the activation: chunk c + 1's products run while
// chunk c's accumulators go through Act into h.
template <int KT, int NT16, int W_OFF, int B_OFF, int N_REAL, int HAS_BIAS, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_hidden_layer_wg(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                   const unsigned char* __restrict__ smem, unsigned long long desc0, int lane) {
    constexpr int NC = (NT16 + 1) / 2;
    const int quad = lane & 3;
    float acc[2][KF_R][16];
#pragma unroll
    for (int c = 0; c <= NC; ++c) {
        if (c < NC) kf_wg_chunk_issue<KT, NT16, W_OFF, B_OFF, HAS_BIAS>(acc[c & 1], a, desc0, smem, c, quad);
        if (c > 0) {
            if (c < NC) {
                kf_wg_wait<1>();
            } else {
                kf_wg_wait<0>();
            }
            const int p = c - 1;  // the finished chunk
#pragma unroll
            for (int r = 0; r < KF_R; ++r) kf_wg_fence_regs(acc[p & 1][r]);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int j = 2 * p + half;  // the next layer's k16 chunk
                if (j < NT16) {
#pragma unroll
                    for (int r = 0; r < KF_R; ++r) {
                        const float* d = acc[p & 1][r] + 8 * half;  // n8 tiles 2j (d[0..3]) and 2j + 1 (d[4..7])
                        kf_act_chunk<N_REAL, FMA_Q, Act>(h[r][j], d, d + 4, j, quad);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The row form (KF_R = 2, every hidden layer on wgmma): the generated kf_forward pipelines the
// warp's two row tiles across layers instead of chunking columns. One commit group is one layer's
// whole-width product for one row tile; the sequence is
//   issue(L0, r0) issue(L0, r1)
//   wait<1> act(L0, r0) issue(L1, r0)   -- act(L0, r0) overlaps the products of (L0, r1)
//   wait<1> act(L0, r1) issue(L1, r1)   -- act(L0, r1) overlaps the products of (L1, r0)
//   ...
// so the SFU work of one row tile always has the other's products in flight, including at layer
// boundaries (where the chunked form has nothing left to overlap), and ptxas cannot sink an
// activation past the next wait: the next issue, which precedes that wait, reads its result.
// KfWgmma<N> (d += A * B for all N padded columns, N / 2 accumulators) is generated.
template <int N>
struct KfWgmma;

// Issues layer (KT, NT16, W_OFF, B_OFF) for one row tile: accumulators = bias quads (or 0), then KT
// k16 steps over the whole width, one commit group.
template <int KT, int NT16, int W_OFF, int B_OFF, int HAS_BIAS>
__device__ __forceinline__ void kf_wg_issue(float (&d)[NT16 * 8], const unsigned (&a)[KT][4], const unsigned char* __restrict__ smem,
                                            unsigned long long desc0, int lane) {
    const unsigned bias = kf_smem_addr(smem + B_OFF) + (lane & 3) * 16;
#pragma unroll
    for (int t = 0; t < 2 * NT16; ++t) kf_wg_bias_quad<HAS_BIAS>(d + 4 * t, bias + t * 64);
    kf_wg_fence_regs(d);
    kf_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        KfWgmma<NT16 * 16>::mma(d, a[kk], desc0 + (unsigned long long)((W_OFF + kk * NT16 * 16 * 32) >> 4));
    }
    kf_wg_commit();
}

// The activation of one row tile's finished layer (after the wait that completes its group) into
// the next layer's A fragments (FMA_Q: the share of SiLU pairs on the FMA pipe, as in
// kf_hidden_layer); padding columns are zeroed after it.
template <int NT16, int N_REAL, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_wg_act(float (&d)[NT16 * 8], unsigned (&h)[NT16][4], int lane) {
    kf_wg_fence_regs(d);
#pragma unroll
    for (int j = 0; j < NT16; ++j) kf_act_chunk<N_REAL, FMA_Q, Act>(h[j], d + 8 * j, d + 8 * j + 4, j, lane & 3);
}
