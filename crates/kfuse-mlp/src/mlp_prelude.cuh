// kfuse fully fused MLP: device helpers and layer templates (hand-written, reviewed; embedded in
// every generated MLP kernel by kfuse-mlp's emitter with include_str!).
//
// The generator defines, before this file, every KF_* constant (widths, dtypes, tile sizes,
// shared-memory layout) as a compile-time constant, and one `KfActN` struct per layer: for a
// hidden layer its static `pack(float, float)` applies the activation to two columns and packs
// them into the compute dtype; for the last layer its static `apply(float)` is the activation.
// ReLU and SiLU use the hand-written helpers below; other activations are .kf expressions
// compiled by kfuse-codegen.
//
// Data layout on chip (one warp's view; a warp owns KF_R row tiles of 16 rows):
//   * activations of the current layer: A fragments of mma.m16n8k16 in registers,
//     `unsigned a[KF_R][K/16][4]` (two f16/bf16 values per register). They never leave the
//     registers between layers: the f32 accumulator (C) fragment of two adjacent n8 tiles has
//     exactly the thread/element mapping of an A fragment of a k16 chunk, so a layer's output is
//     packed in place into the next layer's input.
//   * weights: in shared memory, pre-arranged on the host in "fragment order": for the last
//     layer, the B fragment (k16 x n8) of n-tile j and k-chunk kk for lane l is the 8 bytes at
//     ((j * KT + kk) * 32 + l) * 8 (one LDS.64); for hidden layers, n-tiles come in pairs and
//     lane l's 16 bytes for pair j are at ((j * KT + kk) * 32 + l) * 16 (one LDS.128). A warp
//     reads contiguous bytes, so there are no bank conflicts and no ldmatrix/swizzle bookkeeping.
//   * biases: f32 in shared memory, zero-padded to the padded width; with KF_BIAS_QUADS, per n8
//     tile t and lane quad q (lane & 3) the 16 bytes {b[c], b[c + 1], b[c], b[c + 1]}, c = 8t + 2q,
//     at (t * 4 + q) * 16: the C operand of the tile's first mma (one LDS.128, no moves); else
//     in column order (one LDS.64 per tile, copied into each accumulator).
//
// Padding: widths are padded to 16 (k and hidden n) or 8 (the last layer's n). Padded weights and
// biases are zero and padded activations are forced to zero, so padding never changes a result
// (even for activations with act(0) != 0, or act(0) = inf).

// ---------------------------------------------------------------------------------------------
// PTX helpers. Inline PTX keeps the source header-free (NVRTC has no cuda_fp16.h / mma.h).
// ---------------------------------------------------------------------------------------------

// The 32-bit shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned kf_smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Asynchronous 16-byte global -> shared copy (sm_80+), bypassing L1 (.cg: inputs are streamed
// once). Bytes past `src_bytes` are zero-filled, which masks the tail of the last tile.
__device__ __forceinline__ void kf_cp_async16(unsigned dst, const void* src, unsigned src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void kf_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void kf_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// Four 8x8 b16 matrices from shared memory: with lane l pointing at row (l & 15), column
// 8 * (l >> 4) of a 16x16 tile, the result is that tile's A fragment {a0a1, a2a3, a4a5, a6a7}.
__device__ __forceinline__ void kf_ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a * b on the tensor cores: m16n8k16, A row-major, B column-major (= PyTorch's [out, in]
// weight layout), f32 accumulate. Not volatile: the compiler may interleave independent mmas.
__device__ __forceinline__ void kf_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
#if KF_COMPUTE_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// d = a * b + c on the tensor cores, c read from other registers than d: the first k step of
// a chain, with c the bias quad {b[col], b[col + 1], b[col], b[col + 1]} of this lane's n8 tile
// straight from one LDS.128 (KF_BIAS_QUADS; every row tile of the warp reads the same quad), so
// no register moves build the accumulators' start.
__device__ __forceinline__ void kf_mma_c(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1, const float4& c) {
#if KF_COMPUTE_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c.x), "f"(c.y), "f"(c.z), "f"(c.w));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c.x), "f"(c.y), "f"(c.z), "f"(c.w));
#endif
}

// Two floats to packed f16x2 / bf16x2, round to nearest even; `lo` goes to the low half
// (element 0). cvt puts its first source operand in the upper half.
__device__ __forceinline__ unsigned kf_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned kf_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
// Two floats in the compute dtype (the dtype of the weights and of on-chip activations).
__device__ __forceinline__ unsigned kf_pack2(float lo, float hi) {
#if KF_COMPUTE_BF16
    return kf_bf16x2(lo, hi);
#else
    return kf_f16x2(lo, hi);
#endif
}

// ReLU fused into the conversion: one cvt.relu per pair (negative -> +0, NaN stays NaN). Exact:
// rounding is monotone and keeps 0, so relu-then-round equals round-then-relu.
__device__ __forceinline__ unsigned kf_pack2_relu(float lo, float hi) {
    unsigned r;
#if KF_COMPUTE_BF16
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// SiLU in f32, x * sigmoid(x) as x * rcp(1 + 2^(-x log2 e)): two MUFU ops, relative error near
// 2^-21 (far under the f16/bf16 storage rounding). x -> -inf gives -0 (x = -inf itself: NaN,
// like x * sigmoid(x) evaluated in any precision).
__device__ __forceinline__ float kf_silu_f32(float x) {
    const float e = __expf(-x);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    return x * r;
}

// SiLU of a pair from accumulators that hold h = x / 2: silu(x) = x * sigmoid(x) = h + h * tanh(h).
// The host halves the layer's weights and bias (exact for f16 values above 2^-13 and for f32
// biases; subnormal f16 weights lose at most one bit, 2^-25 absolute), so no multiply by 1/2 here.
//
// Packed f16 (f16 models, ActivationMath::Packed): h is rounded to f16 saturating (|h| > 65504
// becomes +-65504, so silu of a huge negative value is 0 rather than -inf + inf), one
// tanh.approx.f16x2 (two MUFU.TANH.F16 on sm_90, no packed form) and one f16x2 FMA. Error:
// tanh.approx's (about 2^-11 absolute near +-1) scaled by |h|, i.e. at most a few f16 ulps of the
// row's scale (largest relative to the value itself in the far negative tail, where silu is tiny).
__device__ __forceinline__ unsigned kf_silu_half_f16x2(float hlo, float hhi) {
    unsigned h, t, y;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hhi), "f"(hlo));
    asm("tanh.approx.f16x2 %0, %1;" : "=r"(t) : "r"(h));
    asm("fma.rn.f16x2 %0, %1, %2, %1;" : "=r"(y) : "r"(h), "r"(t));
    return y;
}
// The same pair on the FMA and integer pipes, no MUFU (ActivationMath::PackedFma*: the kernel
// sends a compile-time share of a layer's pairs here so that the SFU, which runs tanh.approx.f16x2
// as two MUFU ops, is less of a bottleneck; 15 f16x2/integer instructions instead of 2 MUFU + 1).
// With a = min(|h|, KF_SF_AMAX) (so that 2^n below stays a normal f16):
//   E = e^(-2a) = 2^u, u = -a * 2 log2(e) = n + f: n = round(u) from the rounding of
//       r = 1039 + u (f16 spacing 1 in [1024, 2048); 1039 = 1024 + 15, the f16 exponent bias),
//       f = u - n in [-1/2, 1/2] by one fma (exact up to the last rounding);
//       2^f by a degree-2 polynomial (relative error 2.0e-3); 2^n added to its exponent bits:
//       r's bits << 10 put n + 15 into each half's exponent field (and the constant 0x190 into the
//       high half's low bits, both removed by the final subtraction; no carry crosses halves);
//   tanh(a) = (1 - E) / (1 + E) by a degree-4 polynomial in E on [0, 1], fitted for the error of
//       h * tanh(h) (weight a; 1.7e-4), its constant term exactly 1 (tanh -> 1 for large a);
//   tanh(h) = copysign(tanh(a), h), silu = h + h * tanh(h) as in kf_silu_half_f16x2.
// Every constant is an f16 pair; kernel.rs's host transcription reads these #defines, and its test
// checks every f16 input against silu in f64 (max error 1.1e-3 of max(|silu|, 1), final f16
// rounding included; rms 2.9e-4 for h ~ N(0, 1), against 1.4e-4 for the exactly rounded tanh).
#define KF_SF_AMAX 0x44DA44DAu   // 4.8515625: u >= -14
#define KF_SF_NEG_K 0xC1C5C1C5u  // -2.884765625 = -2 log2(e) in f16
#define KF_SF_MAGIC 0x640F640Fu  // 1039
#define KF_SF_ONE 0x3C003C00u    // 1
#define KF_SF_C1 0x39A039A0u     // 2^f ~ 1 + C1 f + C2 f^2: 0.703125
#define KF_SF_C2 0x33B033B0u     // 0.240234375
#define KF_SF_D1 0xBFFABFFAu     // tanh(a) ~ 1 + D1 E + D2 E^2 + D3 E^3 + D4 E^4: -1.994140625
#define KF_SF_D2 0x3F8E3F8Eu     // 1.888671875
#define KF_SF_D3 0xBD85BD85u     // -1.3798828125
#define KF_SF_D4 0x37F337F3u     // 0.496826171875
#define KF_SF_EXP_BIAS 0x3D903C00u  // (15 << 10 | 0x190) << 16 | 15 << 10
__device__ __forceinline__ unsigned kf_hfma2(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ unsigned kf_silu_half_f16x2_fma(float hlo, float hhi) {
    unsigned h, a, nf;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hhi), "f"(hlo));
    asm("abs.f16x2 %0, %1;" : "=r"(a) : "r"(h));
    asm("min.f16x2 %0, %1, %2;" : "=r"(a) : "r"(a), "r"(KF_SF_AMAX));
    const unsigned r = kf_hfma2(a, KF_SF_NEG_K, KF_SF_MAGIC);  // 1039 + n, n in [-14, 0]
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(nf) : "r"(KF_SF_MAGIC), "r"(r));  // -n, exact
    const unsigned f = kf_hfma2(a, KF_SF_NEG_K, nf);
    const unsigned p = kf_hfma2(kf_hfma2(f, KF_SF_C2, KF_SF_C1), f, KF_SF_ONE);  // 2^f
    const unsigned e = p + (r << 10) - KF_SF_EXP_BIAS;                            // 2^n * 2^f
    unsigned t = kf_hfma2(kf_hfma2(kf_hfma2(kf_hfma2(KF_SF_D4, e, KF_SF_D3), e, KF_SF_D2), e, KF_SF_D1), e, KF_SF_ONE);
    t = (t & 0x7FFF7FFFu) | (h & 0x80008000u);  // copysign(tanh(a), h)
    return kf_hfma2(h, t, h);
}
// The same in f32 (ActivationMath::TanhF32, any compute dtype): one MUFU.TANH (f32) and one FFMA
// per element, then one conversion per pair; error about 2^-11 relative to |h|.
__device__ __forceinline__ float kf_silu_half_f32(float h) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
    return __fmaf_rn(h, t, h);
}

// One 16-bit value (low half of `bits`) to f32.
__device__ __forceinline__ float kf_f16_to_f32(unsigned short bits) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}
__device__ __forceinline__ float kf_bf16_to_f32(unsigned short bits) {
    float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((unsigned)bits) << 16));
    return f;
}

// Element kinds of inputs and outputs (KF_IN_KIND, KF_OUT_KIND).
#define KF_KIND_F32 0
#define KF_KIND_F16 1
#define KF_KIND_BF16 2

// Reads one element of kind KIND at p (shared or global) as f32.
template <int KIND>
__device__ __forceinline__ float kf_load_elem(const unsigned char* p) {
    if (KIND == KF_KIND_F32) return *reinterpret_cast<const float*>(p);
    if (KIND == KF_KIND_F16) return kf_f16_to_f32(*reinterpret_cast<const unsigned short*>(p));
    return kf_bf16_to_f32(*reinterpret_cast<const unsigned short*>(p));
}

// Two adjacent output elements of kind KIND (row-major, `cols` per row) at (row, col) and
// (row, col + 1) of a shared-memory tile; elements at col >= KF_OUT are padding and skipped.
template <int KIND>
__device__ __forceinline__ void kf_store_pair(unsigned char* tile, int row, int col, float v0, float v1) {
    const int e = row * KF_OUT + col;
    if (KIND == KF_KIND_F32) {
        float* p = reinterpret_cast<float*>(tile) + e;
        if ((KF_OUT % 2) == 0 && col + 1 < KF_OUT) {
            *reinterpret_cast<float2*>(p) = make_float2(v0, v1);  // 8-byte aligned: e is even
        } else {
            if (col < KF_OUT) p[0] = v0;
            if (col + 1 < KF_OUT) p[1] = v1;
        }
    } else {
        const unsigned w = (KIND == KF_KIND_F16) ? kf_f16x2(v0, v1) : kf_bf16x2(v0, v1);
        unsigned short* p = reinterpret_cast<unsigned short*>(tile) + e;
        if ((KF_OUT % 2) == 0 && col + 1 < KF_OUT) {
            *reinterpret_cast<unsigned*>(p) = w;  // 4-byte aligned: e is even
        } else {
            if (col < KF_OUT) p[0] = (unsigned short)(w & 0xffffu);
            if (col + 1 < KF_OUT) p[1] = (unsigned short)(w >> 16);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layers. Loops over compile-time widths are fully unrolled, so every register array below is
// indexed by constants only and stays in registers (no local memory).
// ---------------------------------------------------------------------------------------------

// A hidden layer for this warp's KF_R row tiles: h = act(a · Wᵀ + b), written as the next
// layer's A fragments.
//   KT      k16 chunks of the input (padded input width / 16)
//   NT16    k16 chunks of the output (padded output width / 16): pairs of n8 tiles
//   W_OFF   byte offset of this layer's weights in shared memory, in "pair fragment order": the
//           B fragments of n8 tiles 2j and 2j + 1 for k-chunk kk and lane l are the 16 bytes at
//           ((j * KT + kk) * 32 + l) * 16 (one conflict-free LDS.128 per lane feeds 2 * KF_R mmas)
//   B_OFF   byte offset of its f32 biases (ignored without bias)
//   N_REAL  the real output width; columns at or past it are padding, forced to zero
//   Act     `static unsigned pack(float lo, float hi)`: the activation of two adjacent columns,
//           packed into one compute-dtype pair (and, when FMA_Q > 0, `pack_fma`: the same on
//           the FMA pipe, see kf_silu_half_f16x2_fma)
//   FMA_Q   how many of every 8 packed pairs take Act::pack_fma (0..=8): pair c of k16 chunk j has
//           slot (j & 1) + 2 * rank(c), rank = 0, 2, 1, 3 for c = 0..3, and slots below FMA_Q do
//           (all KF_R row tiles alike), so a share q/8 is spread evenly over chunks and n8 tiles
// kf_hidden_layer_at is its body, with the weights at `wp` and the biases at `bias` (run-time
// addresses in shared memory, for kf_hidden_loop); kf_hidden_layer (below) the compile-time form.
// Chooses pack or pack_fma; the primary template never names pack_fma, so activations without
// one (FMA_Q = 0) compile.
template <bool FMA, class Act>
struct KfPackSel {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) { return Act::pack(lo, hi); }
};
template <class Act>
struct KfPackSel<true, Act> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) { return Act::pack_fma(lo, hi); }
};
// Pair c of k16 chunk j of a layer with FMA_Q: whether it takes the FMA form (constant once the
// loops are unrolled).
template <int FMA_Q>
__device__ __forceinline__ bool kf_fma_slot(int j, int c) {
    return (j & 1) + 2 * (((c & 1) << 1) | (c >> 1)) < FMA_Q;
}
template <int FMA_Q, class Act>
__device__ __forceinline__ unsigned kf_pack_at(int j, int c, float lo, float hi) {
    return kf_fma_slot<FMA_Q>(j, c) ? KfPackSel<(FMA_Q > 0), Act>::pack(lo, hi) : Act::pack(lo, hi);
}

// Masks of this lane's columns of output k16 chunk j that are padding (at or past N_REAL, which
// only the last chunk has): `lo` for n8 tile 2j, `hi` for 2j + 1, each over the f16/bf16 pair of
// columns 2 * quad, 2 * quad + 1 of its tile. Padding is zeroed after the activation, since
// act(0) need not be 0.
template <int N_REAL>
__device__ __forceinline__ uint2 kf_pad_masks(int j, int quad) {
    const int col = 16 * j + 2 * quad;
    if (16 * j + 16 <= N_REAL) return make_uint2(0xffffffffu, 0xffffffffu);
    return make_uint2((col < N_REAL ? 0x0000ffffu : 0u) | (col + 1 < N_REAL ? 0xffff0000u : 0u),
                      (col + 8 < N_REAL ? 0x0000ffffu : 0u) | (col + 9 < N_REAL ? 0xffff0000u : 0u));
}
// The activation of output k16 chunk j from its two n8 tiles' f32 accumulators (`lo`: tile 2j,
// `hi`: tile 2j + 1, each {row g cols c, c + 1, row g + 8 cols c, c + 1}) into the next layer's A
// fragment registers h = {row g lo, row g + 8 lo, row g hi, row g + 8 hi}, padding zeroed.
template <int N_REAL, int FMA_Q, class Act>
__device__ __forceinline__ void kf_act_chunk(unsigned (&h)[4], const float* lo, const float* hi, int j, int quad) {
    const uint2 m = kf_pad_masks<N_REAL>(j, quad);
    h[0] = kf_pack_at<FMA_Q, Act>(j, 0, lo[0], lo[1]) & m.x;
    h[1] = kf_pack_at<FMA_Q, Act>(j, 1, lo[2], lo[3]) & m.x;
    h[2] = kf_pack_at<FMA_Q, Act>(j, 2, hi[0], hi[1]) & m.y;
    h[3] = kf_pack_at<FMA_Q, Act>(j, 3, hi[2], hi[3]) & m.y;
}

template <int KT, int NT16, int N_REAL, int HAS_BIAS, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_hidden_layer_at(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                   const unsigned char* __restrict__ wp, const float* __restrict__ bias, int lane) {
    const uint4* w = reinterpret_cast<const uint4*>(wp) + lane;
    const int quad = lane & 3;  // this thread's column pair (2 * quad, 2 * quad + 1) in an n8 tile
#pragma unroll
    for (int j = 0; j < NT16; ++j) {
        // n-outer, k-inner: one output k16 chunk's accumulators (two n8 tiles) live at a time,
        // 8 * KF_R floats, which leaves registers for the input and output fragments; the
        // 2 * KF_R accumulator chains are independent, so the mmas of one k step overlap.
        // The bias is the accumulators' starting value.
        float acc[KF_R][2][4];
#if KF_BIAS_QUADS
        // The bias quads of tiles 2j and 2j + 1 are the first mma's C operands (kf_mma_c).
        float4 c_lo = make_float4(0.f, 0.f, 0.f, 0.f), c_hi = c_lo;
        if (HAS_BIAS) {
            c_lo = reinterpret_cast<const float4*>(bias)[(2 * j) * 4 + quad];
            c_hi = reinterpret_cast<const float4*>(bias)[(2 * j + 1) * 4 + quad];
        }
        {
            const uint4 b = w[(j * KT) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) {
                kf_mma_c(acc[r][0], a[r][0], b.x, b.y, c_lo);
                kf_mma_c(acc[r][1], a[r][0], b.z, b.w, c_hi);
            }
        }
        constexpr int KK0 = 1;
#else
        const int col = 16 * j + 2 * quad;  // tile 2j: col, col + 1; tile 2j + 1: col + 8, col + 9
        float2 b_lo = make_float2(0.f, 0.f), b_hi = make_float2(0.f, 0.f);
        if (HAS_BIAS) {
            b_lo = *reinterpret_cast<const float2*>(bias + col);
            b_hi = *reinterpret_cast<const float2*>(bias + col + 8);
        }
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            acc[r][0][0] = acc[r][0][2] = b_lo.x;
            acc[r][0][1] = acc[r][0][3] = b_lo.y;
            acc[r][1][0] = acc[r][1][2] = b_hi.x;
            acc[r][1][1] = acc[r][1][3] = b_hi.y;
        }
        constexpr int KK0 = 0;
#endif
#pragma unroll
        for (int kk = KK0; kk < KT; ++kk) {
            const uint4 b = w[(j * KT + kk) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) {
                kf_mma(acc[r][0], a[r][kk], b.x, b.y);
                kf_mma(acc[r][1], a[r][kk], b.z, b.w);
            }
        }
        // Accumulator layout: acc[.][t][0..1] row (lane / 4), acc[.][t][2..3] row (lane / 4 + 8),
        // columns col + 8t and col + 8t + 1 -- the same thread owns the same elements of the next
        // layer's A fragment for k-chunk j (kf_act_chunk).
#pragma unroll
        for (int r = 0; r < KF_R; ++r) kf_act_chunk<N_REAL, FMA_Q, Act>(h[r][j], acc[r][0], acc[r][1], j, quad);
    }
}

template <int KT, int NT16, int W_OFF, int B_OFF, int N_REAL, int HAS_BIAS, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_hidden_layer(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                const unsigned char* __restrict__ smem, int lane) {
    kf_hidden_layer_at<KT, NT16, N_REAL, HAS_BIAS, Act, FMA_Q>(a, h, smem + W_OFF, reinterpret_cast<const float*>(smem + B_OFF), lane);
}

// Copies a fragment array (the input of a kf_hidden_loop, which works in place).
template <int KT>
__device__ __forceinline__ void kf_copy_frags(const unsigned (&src)[KF_R][KT][4], unsigned (&dst)[KF_R][KT][4]) {
#pragma unroll
    for (int r = 0; r < KF_R; ++r) {
#pragma unroll
        for (int k = 0; k < KT; ++k) {
#pragma unroll
            for (int c = 0; c < 4; ++c) dst[r][k][c] = src[r][k][c];
        }
    }
}

// COUNT identical square hidden layers (same width KT * 16 in and out, N_REAL, bias presence and
// activation) whose parameters follow each other STRIDE bytes apart from W_OFF (biases at W_OFF +
// B_REL of each), applied in place to `h` in a run-time loop: one copy of the layer's code instead
// of COUNT unrolled ones (NVRTC's time grows with the unrolled code). The register arrays are
// still indexed by constants only: the layer's own loops are unrolled, and the result is moved
// back into `h` element by element.
template <int KT, int COUNT, int W_OFF, int STRIDE, int B_REL, int N_REAL, int HAS_BIAS, class Act, int FMA_Q = 0>
__device__ __forceinline__ void kf_hidden_loop(unsigned (&h)[KF_R][KT][4], const unsigned char* __restrict__ smem, int lane) {
#pragma unroll 1
    for (int l = 0; l < COUNT; ++l) {
        const unsigned char* wp = smem + W_OFF + l * STRIDE;
        unsigned t[KF_R][KT][4];
        kf_hidden_layer_at<KT, KT, N_REAL, HAS_BIAS, Act, FMA_Q>(h, t, wp, reinterpret_cast<const float*>(wp + B_REL), lane);
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
#pragma unroll
            for (int k = 0; k < KT; ++k) {
#pragma unroll
                for (int c = 0; c < 4; ++c) h[r][k][c] = t[r][k][c];
            }
        }
    }
}

// The last layer: y = act(a · Wᵀ + b) in f32, converted to the output kind and written to this
// warp's output tile in shared memory ([16 * KF_R rows][KF_OUT] row-major, the global layout),
// from where it is copied out with 16-byte coalesced stores.
//   NT8     n8 tiles of the output (KF_OUT padded to 8, / 8)
template <int KT, int NT8, int W_OFF, int B_OFF, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_output_layer(const unsigned (&a)[KF_R][KT][4], unsigned char* __restrict__ out_tile,
                                                const unsigned char* __restrict__ smem, int lane) {
    const uint2* w = reinterpret_cast<const uint2*>(smem + W_OFF) + lane;
    const float* bias = reinterpret_cast<const float*>(smem + B_OFF);
    const int group = lane >> 2;  // this thread's rows in a 16-row tile: group and group + 8
    const int quad = lane & 3;
#pragma unroll
    for (int j = 0; j < NT8; ++j) {
        const int col = 8 * j + 2 * quad;
        float acc[KF_R][4];
#if KF_BIAS_QUADS
        float4 c = make_float4(0.f, 0.f, 0.f, 0.f);  // the bias quad: the first mma's C operand
        if (HAS_BIAS) c = reinterpret_cast<const float4*>(bias)[j * 4 + quad];
        {
            const uint2 b = w[(j * KT) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) kf_mma_c(acc[r], a[r][0], b.x, b.y, c);
        }
        constexpr int KK0 = 1;
#else
        float2 bb = make_float2(0.f, 0.f);
        if (HAS_BIAS) bb = *reinterpret_cast<const float2*>(bias + col);
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            acc[r][0] = acc[r][2] = bb.x;  // the bias is the accumulators' starting value
            acc[r][1] = acc[r][3] = bb.y;
        }
        constexpr int KK0 = 0;
#endif
#pragma unroll
        for (int kk = KK0; kk < KT; ++kk) {
            const uint2 b = w[(j * KT + kk) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) kf_mma(acc[r], a[r][kk], b.x, b.y);
        }
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            kf_store_pair<KF_OUT_KIND>(out_tile, 16 * r + group, col, Act::apply(acc[r][0]), Act::apply(acc[r][1]));
            kf_store_pair<KF_OUT_KIND>(out_tile, 16 * r + group + 8, col, Act::apply(acc[r][2]), Act::apply(acc[r][3]));
        }
    }
}
