// kfuse fully fused MLP: alternative hidden-layer forms (hand-written, reviewed; embedded by
// kfuse-mlp's emitter after mlp_prelude.cuh, and only when MlpKernelOptions select one of them,
// so that the default kernel's source does not change).
//
//   * f16 accumulators (HiddenAccumulator::F16, f16 models): `mma ... .f16.f16.f16.f16`. The
//     accumulator of an n8 tile is two f16x2 registers, {row g, row g + 8} x columns (2q, 2q + 1)
//     (g = lane / 4, q = lane % 4), which are already the next layer's A-fragment registers:
//     no f32 -> f16 conversion, half the accumulator registers. The activation works on the
//     packed pair (`Act::pack16(unsigned)`). Cost: each k16 step rounds the running sum to f16
//     (K / 16 roundings per output instead of one), and sums beyond 65504 overflow to inf.
//     Biases: f16, per k16 output chunk j and lane quad q the 16 bytes {p(2j), p(2j), p(2j + 1),
//     p(2j + 1)} at (j * 4 + q) * 16, p(t) the f16 pair of columns 8t + 2q, 8t + 2q + 1: one
//     LDS.128 gives the C operands of both n8 tiles' first mmas (both rows share the bias).
//   * pipelined chunks (ChunkOrder::Pipelined, f32 accumulators): the mmas of output chunk j + 1
//     come before the activation of chunk j in source order, so the conversions and MUFU ops of
//     one chunk sit between independent mmas even where the compiler would not move them.
//     It takes an FMA share (FMA_Q, see kf_hidden_layer) like the sequential form. (Source
//     order alone changes little: the layers are fully unrolled, so ptxas schedules one
//     dependence graph; a form that alternated the k steps of chunks j and j + 1 compiled to
//     the same SASS as this one, sm_90, NVRTC 13.0.)

// d += a * b with f16 accumulators (see above).
__device__ __forceinline__ void kf_mma_h(unsigned (&d)[2], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
        : "+r"(d[0]), "+r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d = a * b + c with f16 accumulators, c = {c0, c1} (the bias pair twice: rows g and g + 8).
__device__ __forceinline__ void kf_mma_h_c(unsigned (&d)[2], const unsigned (&a)[4], unsigned b0, unsigned b1, unsigned c0,
                                           unsigned c1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};"
        : "=r"(d[0]), "=r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c0), "r"(c1));
}
// SiLU's packed form on an f16 pair h = x/2 (as kf_silu_half_f16x2, without the conversion).
__device__ __forceinline__ unsigned kf_silu_half_h2(unsigned h) {
    unsigned t, y;
    asm("tanh.approx.f16x2 %0, %1;" : "=r"(t) : "r"(h));
    asm("fma.rn.f16x2 %0, %1, %2, %1;" : "=r"(y) : "r"(h), "r"(t));
    return y;
}
// ReLU on an f16 pair (NaN stays NaN, as kf_pack2_relu).
__device__ __forceinline__ unsigned kf_relu_h2(unsigned h) {
    unsigned y;
    asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(y) : "r"(h), "r"(0u));
    return y;
}

// A hidden layer with f16 accumulators: the parameters of kf_hidden_layer_at (mlp_prelude.cuh),
// the biases in the f16 layout above, Act with `pack16(unsigned)`.
template <int KT, int NT16, int N_REAL, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_hidden_layer_h_at(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                     const unsigned char* __restrict__ wp, const unsigned char* __restrict__ bias,
                                                     int lane) {
    const uint4* w = reinterpret_cast<const uint4*>(wp) + lane;
    const int quad = lane & 3;
#pragma unroll
    for (int j = 0; j < NT16; ++j) {
        unsigned acc[KF_R][2][2];
        uint4 c = make_uint4(0u, 0u, 0u, 0u);
        if (HAS_BIAS) c = reinterpret_cast<const uint4*>(bias)[j * 4 + quad];
        {
            const uint4 b = w[(j * KT) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) {
                kf_mma_h_c(acc[r][0], a[r][0], b.x, b.y, c.x, c.y);
                kf_mma_h_c(acc[r][1], a[r][0], b.z, b.w, c.z, c.w);
            }
        }
#pragma unroll
        for (int kk = 1; kk < KT; ++kk) {
            const uint4 b = w[(j * KT + kk) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) {
                kf_mma_h(acc[r][0], a[r][kk], b.x, b.y);
                kf_mma_h(acc[r][1], a[r][kk], b.z, b.w);
            }
        }
        // acc[r][t] = {row g, row g + 8} of n8 tile 2j + t: A-fragment registers t * 2 + {0, 1}
        // of k-chunk j. Padding columns (last chunk only) are zeroed after the activation.
        const uint2 m = kf_pad_masks<N_REAL>(j, quad);
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            h[r][j][0] = Act::pack16(acc[r][0][0]) & m.x;
            h[r][j][1] = Act::pack16(acc[r][0][1]) & m.x;
            h[r][j][2] = Act::pack16(acc[r][1][0]) & m.y;
            h[r][j][3] = Act::pack16(acc[r][1][1]) & m.y;
        }
    }
}

template <int KT, int NT16, int W_OFF, int B_OFF, int N_REAL, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_hidden_layer_h(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                  const unsigned char* __restrict__ smem, int lane) {
    kf_hidden_layer_h_at<KT, NT16, N_REAL, HAS_BIAS, Act>(a, h, smem + W_OFF, smem + B_OFF, lane);
}

// kf_hidden_loop (mlp_prelude.cuh) for f16-accumulating layers.
template <int KT, int COUNT, int W_OFF, int STRIDE, int B_REL, int N_REAL, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_hidden_loop_h(unsigned (&h)[KF_R][KT][4], const unsigned char* __restrict__ smem, int lane) {
#pragma unroll 1
    for (int l = 0; l < COUNT; ++l) {
        const unsigned char* wp = smem + W_OFF + l * STRIDE;
        unsigned t[KF_R][KT][4];
        kf_hidden_layer_h_at<KT, KT, N_REAL, HAS_BIAS, Act>(h, t, wp, wp + B_REL, lane);
        kf_copy_frags<KT>(t, h);
    }
}

// Pieces of the f32-accumulator forms below: kf_hidden_layer's body split at its phases, for one
// output k16 chunk j (two n8 tiles per row tile) with accumulators d.
// k step kk of chunk j: d += a[.][kk] * B(j, kk).
template <int KT>
__device__ __forceinline__ void kf_chunk_step(float (&d)[KF_R][2][4], const unsigned (&a)[KF_R][KT][4], const uint4* w, int j, int kk) {
    const uint4 b = w[(j * KT + kk) * 32];
#pragma unroll
    for (int r = 0; r < KF_R; ++r) {
        kf_mma(d[r][0], a[r][kk], b.x, b.y);
        kf_mma(d[r][1], a[r][kk], b.z, b.w);
    }
}
// The bias and k step 0: with KF_BIAS_QUADS the bias quads are the first mma's C operands, else
// the bias pairs are copied into the accumulators first.
template <int KT, int HAS_BIAS>
__device__ __forceinline__ void kf_chunk_start(float (&d)[KF_R][2][4], const unsigned (&a)[KF_R][KT][4], const uint4* w,
                                               const float* __restrict__ bias, int j, int quad) {
#if KF_BIAS_QUADS
    float4 c_lo = make_float4(0.f, 0.f, 0.f, 0.f), c_hi = c_lo;
    if (HAS_BIAS) {
        c_lo = reinterpret_cast<const float4*>(bias)[(2 * j) * 4 + quad];
        c_hi = reinterpret_cast<const float4*>(bias)[(2 * j + 1) * 4 + quad];
    }
    const uint4 b = w[(j * KT) * 32];
#pragma unroll
    for (int r = 0; r < KF_R; ++r) {
        kf_mma_c(d[r][0], a[r][0], b.x, b.y, c_lo);
        kf_mma_c(d[r][1], a[r][0], b.z, b.w, c_hi);
    }
#else
    const int col = 16 * j + 2 * quad;
    float2 b_lo = make_float2(0.f, 0.f), b_hi = make_float2(0.f, 0.f);
    if (HAS_BIAS) {
        b_lo = *reinterpret_cast<const float2*>(bias + col);
        b_hi = *reinterpret_cast<const float2*>(bias + col + 8);
    }
#pragma unroll
    for (int r = 0; r < KF_R; ++r) {
        d[r][0][0] = d[r][0][2] = b_lo.x;
        d[r][0][1] = d[r][0][3] = b_lo.y;
        d[r][1][0] = d[r][1][2] = b_hi.x;
        d[r][1][1] = d[r][1][3] = b_hi.y;
    }
    kf_chunk_step<KT>(d, a, w, j, 0);
#endif
}
// The activation of chunk j into the next layer's A fragments h[.][j]; padding columns (last
// chunk only) are zeroed after it.
template <int NT16, int N_REAL, int FMA_Q, class Act>
__device__ __forceinline__ void kf_chunk_act(const float (&d)[KF_R][2][4], unsigned (&h)[KF_R][NT16][4], int j, int quad) {
#pragma unroll
    for (int r = 0; r < KF_R; ++r) kf_act_chunk<N_REAL, FMA_Q, Act>(h[r][j], d[r][0], d[r][1], j, quad);
}

// A hidden layer with f32 accumulators, pipelined over its output chunks (see the top): the
// parameters of kf_hidden_layer (mlp_prelude.cuh), the biases as KF_BIAS_QUADS says.
template <int KT, int NT16, int W_OFF, int B_OFF, int N_REAL, int HAS_BIAS, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_hidden_layer_p(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                  const unsigned char* __restrict__ smem, int lane) {
    const uint4* w = reinterpret_cast<const uint4*>(smem + W_OFF) + lane;
    const float* bias = reinterpret_cast<const float*>(smem + B_OFF);
    const int quad = lane & 3;
    float acc[2][KF_R][2][4];  // chunk j in acc[j & 1]; indices stay compile-time after unrolling
#pragma unroll
    for (int j = 0; j <= NT16; ++j) {
        if (j < NT16) {
            kf_chunk_start<KT, HAS_BIAS>(acc[j & 1], a, w, bias, j, quad);
#pragma unroll
            for (int kk = 1; kk < KT; ++kk) kf_chunk_step<KT>(acc[j & 1], a, w, j, kk);
        }
        if (j > 0) kf_chunk_act<NT16, N_REAL, FMA_Q, Act>(acc[(j - 1) & 1], h, j - 1, quad);
    }
}
