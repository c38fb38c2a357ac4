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
//   * biases: f32 in shared memory, zero-padded to the padded width.
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
//           packed into one compute-dtype pair
// kf_hidden_layer_at is its body, with the weights at `wp` and the biases at `bias` (run-time
// addresses in shared memory, for kf_hidden_loop); kf_hidden_layer (below) the compile-time form.
template <int KT, int NT16, int N_REAL, int HAS_BIAS, class Act>
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
        const int col = 16 * j + 2 * quad;  // tile 2j: col, col + 1; tile 2j + 1: col + 8, col + 9
        float2 b_lo = make_float2(0.f, 0.f), b_hi = make_float2(0.f, 0.f);
        if (HAS_BIAS) {
            b_lo = *reinterpret_cast<const float2*>(bias + col);
            b_hi = *reinterpret_cast<const float2*>(bias + col + 8);
        }
        float acc[KF_R][2][4];
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            acc[r][0][0] = acc[r][0][2] = b_lo.x;
            acc[r][0][1] = acc[r][0][3] = b_lo.y;
            acc[r][1][0] = acc[r][1][2] = b_hi.x;
            acc[r][1][1] = acc[r][1][3] = b_hi.y;
        }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            const uint4 b = w[(j * KT + kk) * 32];
#pragma unroll
            for (int r = 0; r < KF_R; ++r) {
                kf_mma(acc[r][0], a[r][kk], b.x, b.y);
                kf_mma(acc[r][1], a[r][kk], b.z, b.w);
            }
        }
        // Accumulator layout: acc[.][t][0..1] row (lane / 4), acc[.][t][2..3] row (lane / 4 + 8),
        // columns col + 8t and col + 8t + 1 -- the same thread owns the same elements of the next
        // layer's A fragment for k-chunk j: {row g lo cols, row g+8 lo cols, row g hi, row g+8 hi}.
        // Columns past N_REAL (only in the last chunk, known at compile time) are zeroed after
        // the activation, since act(0) need not be 0.
        unsigned mask_lo = 0xffffffffu, mask_hi = 0xffffffffu;
        if (16 * j + 16 > N_REAL) {
            mask_lo = (col < N_REAL ? 0x0000ffffu : 0u) | (col + 1 < N_REAL ? 0xffff0000u : 0u);
            mask_hi = (col + 8 < N_REAL ? 0x0000ffffu : 0u) | (col + 9 < N_REAL ? 0xffff0000u : 0u);
        }
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            h[r][j][0] = Act::pack(acc[r][0][0], acc[r][0][1]) & mask_lo;
            h[r][j][1] = Act::pack(acc[r][0][2], acc[r][0][3]) & mask_lo;
            h[r][j][2] = Act::pack(acc[r][1][0], acc[r][1][1]) & mask_hi;
            h[r][j][3] = Act::pack(acc[r][1][2], acc[r][1][3]) & mask_hi;
        }
    }
}

template <int KT, int NT16, int W_OFF, int B_OFF, int N_REAL, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_hidden_layer(const unsigned (&a)[KF_R][KT][4], unsigned (&h)[KF_R][NT16][4],
                                                const unsigned char* __restrict__ smem, int lane) {
    kf_hidden_layer_at<KT, NT16, N_REAL, HAS_BIAS, Act>(a, h, smem + W_OFF, reinterpret_cast<const float*>(smem + B_OFF), lane);
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
template <int KT, int COUNT, int W_OFF, int STRIDE, int B_REL, int N_REAL, int HAS_BIAS, class Act>
__device__ __forceinline__ void kf_hidden_loop(unsigned (&h)[KF_R][KT][4], const unsigned char* __restrict__ smem, int lane) {
#pragma unroll 1
    for (int l = 0; l < COUNT; ++l) {
        const unsigned char* wp = smem + W_OFF + l * STRIDE;
        unsigned t[KF_R][KT][4];
        kf_hidden_layer_at<KT, KT, N_REAL, HAS_BIAS, Act>(h, t, wp, reinterpret_cast<const float*>(wp + B_REL), lane);
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
        float2 bb = make_float2(0.f, 0.f);
        if (HAS_BIAS) bb = *reinterpret_cast<const float2*>(bias + col);
        float acc[KF_R][4];
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
            acc[r][0] = acc[r][2] = bb.x;  // the bias is the accumulators' starting value
            acc[r][1] = acc[r][3] = bb.y;
        }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
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
