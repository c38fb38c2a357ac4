// kfuse generic MLP kernel: the quick-to-compile stand-in of tiered compilation (hand-written,
// reviewed; embedded by kfuse-mlp's generic.rs after the generated constants, the layer table and
// the activation dispatchers).
//
// Its CODE does not depend on the model's widths or depth: every layer runs through one run-time
// loop (layers) over run-time loops (n8 tiles of the output, k16 steps of the input), with the
// layer's shape read from the table `kg_table` in constant memory. So NVRTC compiles about the
// same amount of code for every model; only the dtypes and the set of activation functions change
// the code. It reads the optimised kernel's parameter blob unchanged (generic.rs checks the layout).
//
// The generator defines before this file:
//   KG_COMPUTE_BF16  1 for bf16 weights, 0 for f16
//   KG_IN_KIND, KG_IN_BYTES, KG_OUT_KIND, KG_OUT_BYTES   element kinds (0 f32, 1 f16, 2 bf16)
//   KG_NAME          the kernel's name
//   kg_table         __constant__ int[]: KG_HEAD ints of header, then KG_FIELDS ints per layer
//   kg_hidden_act(int id, float lo, float hi) -> unsigned   hidden activation of two adjacent
//                    columns, packed into a compute-dtype pair (id from the layer's table entry)
//   kg_last_act(int id, float x) -> float                   the last layer's activation
//
// Work split: persistent warps; each warp takes 16-row tiles warp_id, warp_id + total warps, ...
// Per tile: the input rows are converted into the warp's activation buffer 0 (compute dtype,
// row-major, padded to 16 columns with zeros), then each layer reads its input's A fragments from
// one buffer with ldmatrix and writes its activated output into the other (ping-pong); the last
// layer writes its f32 results, converted, straight to global memory.
//
// Shared memory (dynamic): [0, param bytes) the parameter blob (weights in fragment order, f32
// biases), then per warp two buffers of 16 rows x row stride bytes. The row stride is the widest
// padded layer input x 2 + 16 bytes: an odd multiple of 16 modulo 128, so the 8 rows of an
// ldmatrix phase fall into 8 different bank groups.
//
// Parameter layout (the optimised kernel's; see mlp_prelude.cuh): for n8 tile t of a layer with
// KT k16 chunks, grouped G = 2^GS tiles per fetch (2 for hidden layers, 1 for the last), lane l's
// B fragment {b0, b1} of k chunk kk is the 8 bytes at
//   W_OFF + (((t >> GS) * KT + kk) * 32 + l) * 8 * G + (t & (G - 1)) * 8;
// the f32 biases of columns c, c + 1 (c even) are the float2 at B_OFF + 4 * c * B_MULT (B_MULT 2 for
// the quad layout {b[c], b[c+1], b[c], b[c+1]}, 1 for column order).

// Table: header, then per layer KG_FIELDS ints.
#define KG_HEAD 8
#define KG_FIELDS 8
#define KG_H_LAYERS 0       // number of layers
#define KG_H_PARAM16 1      // parameter bytes / 16
#define KG_H_IN 2           // input width
#define KG_H_IN_PAIRS 3     // padded input width / 2
#define KG_H_OUT 4          // output width
#define KG_H_STRIDE 5       // activation buffer row stride, bytes
#define KG_H_WARP_SMEM 6    // shared bytes per warp (two buffers)
#define KG_L_KT 0           // k16 chunks of the input
#define KG_L_NT8 1          // n8 tiles of the (padded) output
#define KG_L_GS 2           // log2 of n8 tiles per weight fetch
#define KG_L_W_OFF 3        // weights' byte offset
#define KG_L_B_OFF 4        // biases' byte offset, -1 without bias
#define KG_L_B_MULT 5       // bias floats per column (1 or 2)
#define KG_L_N_REAL 6       // real output width (padding columns are forced to 0)
#define KG_L_ACT 7          // activation id for kg_hidden_act / kg_last_act

// ---------------------------------------------------------------------------------------------
// PTX helpers (header-free; the same instructions as mlp_prelude.cuh's, kept separate so that
// this kernel does not depend on the optimised kernel's compile-time constants).
// ---------------------------------------------------------------------------------------------

__device__ __forceinline__ unsigned kg_smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Shared memory is addressed by 32-bit shared addresses throughout (generic pointers into shared
// memory made NVRTC at --Ofast-compile=mid emit generic loads with an address-space conversion on
// every access). Volatile with a memory clobber: never moved across the warp's synchronisation.
__device__ __forceinline__ uint2 kg_lds64(unsigned addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ float2 kg_lds64f(unsigned addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0,%1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void kg_sts32(unsigned addr, unsigned v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void kg_sts128(unsigned addr, uint4 v) {
    asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// Two floats to a packed pair, round to nearest even; `lo` is element 0.
__device__ __forceinline__ unsigned kg_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned kg_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ unsigned kg_pack2(float lo, float hi) {
#if KG_COMPUTE_BF16
    return kg_bf16x2(lo, hi);
#else
    return kg_f16x2(lo, hi);
#endif
}
// ReLU fused into the conversion (exact, as in the optimised kernel).
__device__ __forceinline__ unsigned kg_pack2_relu(float lo, float hi) {
    unsigned r;
#if KG_COMPUTE_BF16
    asm("cvt.rn.relu.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.relu.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
// SiLU in f32 as x * rcp(1 + exp(-x)) (approximate exp and reciprocal).
__device__ __forceinline__ float kg_silu_f32(float x) {
    const float e = __expf(-x);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
    return x * r;
}
// SiLU from h = x / 2 (the host halved the layer's weights and bias): h + h * tanh(h), on a packed
// f16 pair saturated to the f16 range (f16 models), or in f32 (ActivationMath::TanhF32).
__device__ __forceinline__ unsigned kg_silu_half_f16x2(float hlo, float hhi) {
    unsigned h, t, y;
    asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(hhi), "f"(hlo));
    asm("tanh.approx.f16x2 %0, %1;" : "=r"(t) : "r"(h));
    asm("fma.rn.f16x2 %0, %1, %2, %1;" : "=r"(y) : "r"(h), "r"(t));
    return y;
}
__device__ __forceinline__ float kg_silu_half_f32(float h) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(h));
    return __fmaf_rn(h, t, h);
}

// One element of kind KIND at p (global memory) as f32 (0 f32, 1 f16, 2 bf16).
template <int KIND>
__device__ __forceinline__ float kg_load_elem(const unsigned char* p) {
    if (KIND == 0) return *reinterpret_cast<const float*>(p);
    const unsigned short bits = *reinterpret_cast<const unsigned short*>(p);
    float f;
    if (KIND == 1) {
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    } else {
        asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((unsigned)bits) << 16));
    }
    return f;
}

// Output columns c and c + 1 of one row (`row_out` points at the row's first element, global
// memory); columns at or past `out_w` are skipped.
template <int KIND>
__device__ __forceinline__ void kg_store_pair(unsigned char* row_out, int c, int out_w, float v0, float v1) {
    if (KIND == 0) {
        float* p = reinterpret_cast<float*>(row_out) + c;
        if (c < out_w) p[0] = v0;
        if (c + 1 < out_w) p[1] = v1;
    } else {
        const unsigned w = (KIND == 1) ? kg_f16x2(v0, v1) : kg_bf16x2(v0, v1);
        unsigned short* p = reinterpret_cast<unsigned short*>(row_out) + c;
        if (c < out_w) p[0] = (unsigned short)(w & 0xffffu);
        if (c + 1 < out_w) p[1] = (unsigned short)(w >> 16);
    }
}

// The generator puts kg_hidden_act and kg_last_act here (they use the helpers above).
// KG_DISPATCH

// Converts this warp's 16 input rows from row0 on into compute-dtype pairs in the buffer at shared
// address `buf` (row stride `stride`); columns past the input width and rows past `rows` become 0.
__device__ __forceinline__ void kg_load_input(const unsigned char* __restrict__ input, long long rows, long long row0,
                                              unsigned buf, int stride, int lane) {
    const int in_w = kg_table[KG_H_IN];
    const int pairs = kg_table[KG_H_IN_PAIRS];
    // Element (r, p) of the 16 x pairs grid for i = r * pairs + p = lane, lane + 32, ...: r and p
    // advance without a division (pairs >= 8, so p wraps at most 4 times per step).
    int r = 0, p = lane;
    while (p >= pairs) { p -= pairs; ++r; }
#pragma unroll 1
    while (r < 16) {
        const int c = 2 * p;
        const long long row = row0 + r;
        float v0 = 0.f, v1 = 0.f;
        if (row < rows) {
            const unsigned char* src = input + (row * in_w + c) * KG_IN_BYTES;
            if (c < in_w) v0 = kg_load_elem<KG_IN_KIND>(src);
            if (c + 1 < in_w) v1 = kg_load_elem<KG_IN_KIND>(src + KG_IN_BYTES);
        }
        kg_sts32(buf + r * stride + c * 2, kg_pack2(v0, v1));
        p += 32;
        while (p >= pairs) { p -= pairs; ++r; }
    }
}

// One n8 tile's accumulators and its weights, as scalars: at --Ofast-compile=mid NVRTC leaves
// small arrays (float acc[4]) in local memory; scalars stay in registers.
struct KgTile {
    float c0, c1, c2, c3;  // rows group (c0, c1) and group + 8 (c2, c3), columns c, c + 1
    unsigned w;            // shared address of this lane's B fragment of k chunk 0
    int c;                 // this lane's first column
};

// Tile `tile` of layer entry `t` (parameters at shared address `params`): its weights, and the
// bias as its accumulators' start.
__device__ __forceinline__ KgTile kg_tile_start(const int* t, unsigned params, int tile, int lane) {
    const int kt = t[KG_L_KT], gs = t[KG_L_GS], b_off = t[KG_L_B_OFF];
    KgTile d;
    d.c = 8 * tile + 2 * (lane & 3);
    d.w = params + t[KG_L_W_OFF] + ((tile >> gs) * kt * 32 + lane) * (8 << gs) + (tile & ((1 << gs) - 1)) * 8;
    float2 b = make_float2(0.f, 0.f);
    if (b_off >= 0) b = kg_lds64f(params + b_off + 4 * d.c * t[KG_L_B_MULT]);
    d.c0 = d.c2 = b.x;
    d.c1 = d.c3 = b.y;
    return d;
}

// d += a * b on the tile, m16n8k16, f32 accumulate; a from ldmatrix at `a_addr`, b this lane's B
// fragment at `b_addr` (shared addresses).
__device__ __forceinline__ void kg_tile_step(KgTile& d, unsigned a_addr, unsigned b_addr) {
    unsigned a0, a1, a2, a3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(a_addr)
                 : "memory");
    const uint2 b = kg_lds64(b_addr);
#if KG_COMPUTE_BF16
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d.c0), "+f"(d.c1), "+f"(d.c2), "+f"(d.c3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d.c0), "+f"(d.c1), "+f"(d.c2), "+f"(d.c3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
#endif
}

// All layers for one 16-row tile whose input is in the buffer at shared address `buf0` (the other
// buffer at `buf1`); the result goes to `output`. Parameters at shared address `params`.
// One n8 tile (8 output columns) at a time, its k16 steps in a loop: every piece of the layer
// code exists once (more tiles at a time, sharing each A fragment, cost NVRTC 40-60% more time
// for a faster kernel that only serves until the optimised one is ready).
__device__ __forceinline__ void kg_forward(unsigned buf0, unsigned buf1, unsigned char* __restrict__ output, long long rows,
                                           long long row0, unsigned params, int stride, int lane) {
    const int layers = kg_table[KG_H_LAYERS];
    const int out_w = kg_table[KG_H_OUT];
    const int group = lane >> 2;  // this thread's rows: group and group + 8
    const long long r0 = row0 + group;
    unsigned src = buf0, dst = buf1;
#pragma unroll 1
    for (int l = 0; l < layers; ++l) {
        const int* t = kg_table + KG_HEAD + KG_FIELDS * l;
        const int kt = t[KG_L_KT], nt8 = t[KG_L_NT8], n_real = t[KG_L_N_REAL], act = t[KG_L_ACT];
        const bool last = l + 1 == layers;
        const unsigned a_addr = src + (lane & 15) * stride + (lane >> 4) * 16;
        const unsigned row_g = dst + group * stride, row_g8 = dst + (group + 8) * stride;
        const int k_step = 256 << t[KG_L_GS];  // bytes between a tile's fragments of consecutive k chunks
#pragma unroll 1
        for (int tile = 0; tile < nt8; ++tile) {
            KgTile d = kg_tile_start(t, params, tile, lane);
#pragma unroll 1
            for (int kk = 0; kk < kt; ++kk) kg_tile_step(d, a_addr + kk * 32, d.w + kk * k_step);
            // Accumulators: (c0, c1) row `group`, (c2, c3) row `group + 8`, columns c and c + 1.
            if (!last) {
                // Padding columns (c >= n_real) are forced to 0: act(0) need not be 0.
                const unsigned mask = (d.c < n_real ? 0x0000ffffu : 0u) | (d.c + 1 < n_real ? 0xffff0000u : 0u);
                kg_sts32(row_g + d.c * 2, kg_hidden_act(act, d.c0, d.c1) & mask);
                kg_sts32(row_g8 + d.c * 2, kg_hidden_act(act, d.c2, d.c3) & mask);
            } else {
                if (r0 < rows) kg_store_pair<KG_OUT_KIND>(output + r0 * out_w * KG_OUT_BYTES, d.c, out_w, kg_last_act(act, d.c0), kg_last_act(act, d.c1));
                if (r0 + 8 < rows) kg_store_pair<KG_OUT_KIND>(output + (r0 + 8) * out_w * KG_OUT_BYTES, d.c, out_w, kg_last_act(act, d.c2), kg_last_act(act, d.c3));
            }
        }
        __syncwarp();  // this layer's output is visible to the whole warp; its input may be overwritten
        const unsigned done = src;
        src = dst;
        dst = done;
    }
}

extern "C" __global__ void __launch_bounds__(512, 1)
KG_NAME(const unsigned char* __restrict__ input,  // [rows, in] row-major, KG_IN_KIND elements
        unsigned char* __restrict__ output,       // [rows, out] row-major, KG_OUT_KIND elements
        const uint4* __restrict__ params,         // the parameter blob (host layout = smem layout)
        long long rows)                           // batch size; any value >= 0
{
    extern __shared__ __align__(16) unsigned char kg_smem[];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = blockDim.x >> 5;
    const unsigned base = kg_smem_addr(kg_smem);
    const int param16 = kg_table[KG_H_PARAM16];
    for (int i = threadIdx.x; i < param16; i += blockDim.x) {
        kg_sts128(base + 16 * i, params[i]);
    }
    const int stride = kg_table[KG_H_STRIDE];
    const unsigned buf0 = base + param16 * 16 + warp * kg_table[KG_H_WARP_SMEM];
    const unsigned buf1 = buf0 + 16 * stride;
    __syncthreads();
    // Shifts, not divisions: at --Ofast-compile=mid a 64-bit division by 16 became a library call.
    const long long tiles = (rows + 15) >> 4;
    const long long step = (long long)gridDim.x * warps;
#pragma unroll 1
    for (long long tile = (long long)blockIdx.x * warps + warp; tile < tiles; tile += step) {
        kg_load_input(input, rows, tile << 4, buf0, stride, lane);
        __syncwarp();  // every lane's input pairs are visible to the warp's ldmatrix
        kg_forward(buf0, buf1, output, rows, tile << 4, base, stride, lane);
    }
}
