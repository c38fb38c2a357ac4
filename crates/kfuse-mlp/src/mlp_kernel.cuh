// kfuse fully fused MLP: the kernel (hand-written, reviewed; embedded by kfuse-mlp after the
// generated constants, activations, mlp_prelude.cuh and the generated kf_forward()).
//
// Work split: persistent warps. Each warp owns tiles of KF_WARP_ROWS = 16 * KF_R consecutive
// rows, taking tiles warp_id, warp_id + total_warps, ... until the batch is done. Warps of a
// block share only the weights; after the block stages them (one __syncthreads), each warp runs
// its own pipeline and synchronises with __syncwarp only, so warps drift apart and some are
// always loading while others compute.
//
// Per-warp pipeline, two stages deep: while the warp computes tile t, the cp.async copy of its
// next tile into the other stage buffer is in flight. Memory-bound models (64 -> ... -> 16) need
// every SM to keep tens of KB of loads outstanding; KF_WARPS warps x one tile ahead does that.
//
// Shared memory (dynamic), in this order:
//   [0, KF_PARAM_BYTES)                 weights (fragment order) and f32 biases, all layers
//   per warp, KF_WARP_SMEM bytes:
//     stage 0, stage 1 (KF_STAGE_BYTES each)   the next / current input tile
//     fragment buffer (KF_FRAG_BYTES, generic input path only)
//     output tile (KF_OUT_TILE_BYTES)
// Input tiles in the fast path (input dtype = weight dtype, width a multiple of 8) are copied
// straight into padded rows of KF_ROW_STRIDE bytes; the 16-byte pad per row puts the 8 rows that
// one ldmatrix phase reads into 8 different bank groups (no conflicts). Other inputs (f32, the
// other 16-bit dtype, odd widths) are copied raw (the tile is one contiguous, 16-byte aligned
// byte range) and converted into the padded fragment buffer by the warp.

// Issues this lane's cp.async copies of tile `tile` into the stage buffer at shared address `dst`.
__device__ __forceinline__ void kf_load_tile(const unsigned char* __restrict__ input, long long rows, long long tile,
                                             unsigned dst, int lane) {
    const long long row0 = tile * KF_WARP_ROWS;
#if KF_FAST_INPUT
    constexpr int CHUNKS = KF_IN * 2 / 16;  // 16-byte chunks per row
    for (int i = lane; i < KF_WARP_ROWS * CHUNKS; i += 32) {
        const int r = i / CHUNKS;  // constant divisor: a multiply-shift
        const int c = i - r * CHUNKS;
        const long long row = row0 + r;
        const bool valid = row < rows;
        const unsigned char* src = input + (valid ? row : 0) * (long long)(KF_IN * 2) + c * 16;
        kf_cp_async16(dst + r * KF_ROW_STRIDE + c * 16, src, valid ? 16u : 0u);  // rows past the end: zeros
    }
#else
    const long long left = rows - row0;
    const int valid_rows = left < KF_WARP_ROWS ? (int)left : KF_WARP_ROWS;
    const int bytes = valid_rows * KF_IN * KF_IN_BYTES;
    const unsigned char* src = input + row0 * (long long)(KF_IN * KF_IN_BYTES);  // 16-byte aligned
    for (int i = lane; i * 16 < bytes; i += 32) {
        const int n = bytes - i * 16;
        kf_cp_async16(dst + i * 16, src + i * 16, n < 16 ? (unsigned)n : 16u);
    }
#endif
}

#if !KF_FAST_INPUT
// Converts the raw tile (KF_WARP_ROWS x KF_IN elements of KF_IN_KIND, row-major, unpadded) into
// compute-dtype pairs in the padded fragment buffer; columns past KF_IN become zeros.
__device__ __forceinline__ void kf_repack_tile(const unsigned char* __restrict__ raw, unsigned char* __restrict__ frag,
                                               int lane) {
    constexpr int PAIRS = KF_IN_PAD / 2;
    for (int i = lane; i < KF_WARP_ROWS * PAIRS; i += 32) {
        const int r = i / PAIRS;
        const int c = 2 * (i - r * PAIRS);
        const float v0 = c < KF_IN ? kf_load_elem<KF_IN_KIND>(raw + (r * KF_IN + c) * KF_IN_BYTES) : 0.f;
        const float v1 = c + 1 < KF_IN ? kf_load_elem<KF_IN_KIND>(raw + (r * KF_IN + c + 1) * KF_IN_BYTES) : 0.f;
        *reinterpret_cast<unsigned*>(frag + r * KF_ROW_STRIDE + c * 2) = kf_pack2(v0, v1);
    }
}
#endif

// Copies this warp's finished output tile to global memory: the valid rows of a tile are one
// contiguous, 16-byte aligned byte range of the row-major output, so whole 16-byte chunks go
// out coalesced and only the last few bytes (a masked tail tile) go element by element.
__device__ __forceinline__ void kf_store_tile(unsigned char* __restrict__ output, long long rows, long long tile,
                                              const unsigned char* __restrict__ out_tile, int lane) {
    const long long row0 = tile * KF_WARP_ROWS;
    const long long left = rows - row0;
    const int valid_rows = left < KF_WARP_ROWS ? (int)left : KF_WARP_ROWS;
    const int bytes = valid_rows * KF_OUT * KF_OUT_BYTES;
    unsigned char* dst = output + row0 * (long long)(KF_OUT * KF_OUT_BYTES);
    const int chunks = bytes >> 4;
    for (int i = lane; i < chunks; i += 32) {
        reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(out_tile)[i];
    }
    const int tail = (bytes - chunks * 16) / KF_OUT_BYTES;  // elements after the last whole chunk
    if (lane < tail) {
        const int e = chunks * 16 / KF_OUT_BYTES + lane;
        if (KF_OUT_BYTES == 4) {
            reinterpret_cast<float*>(dst)[e] = reinterpret_cast<const float*>(out_tile)[e];
        } else {
            reinterpret_cast<unsigned short*>(dst)[e] = reinterpret_cast<const unsigned short*>(out_tile)[e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(KF_THREADS, 1)
KF_KERNEL_NAME(const unsigned char* __restrict__ input,  // [rows, KF_IN] row-major, KF_IN_KIND elements, 16-byte aligned
               unsigned char* __restrict__ output,       // [rows, KF_OUT] row-major, KF_OUT_KIND elements, 16-byte aligned
               const uint4* __restrict__ params,         // KF_PARAM_BYTES: packed weights + f32 biases (host layout = smem layout)
               long long rows)                           // batch size; any value >= 0
{
    extern __shared__ __align__(16) unsigned char kf_smem[];
    const int lane = threadIdx.x & 31;  // lane in the warp: selects fragment rows/columns
    const int warp = threadIdx.x >> 5;  // warp in the block: selects its shared-memory slice

    // Weights and biases to shared memory once per block; the block then stays resident and
    // loops over tiles, so they are read from L2 once per SM, not once per tile.
    for (int i = threadIdx.x; i < KF_PARAM_BYTES / 16; i += KF_THREADS) {
        reinterpret_cast<uint4*>(kf_smem)[i] = params[i];
    }
#if KF_WGMMA
    // wgmma layers read their weights in another order (mlp_wgmma.cuh): rewritten after the
    // copy, and made visible to the tensor cores' (async proxy) reads before the barrier below.
    __syncthreads();
    kf_stage_wgmma(reinterpret_cast<const unsigned*>(params), kf_smem);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    unsigned char* const slice = kf_smem + KF_PARAM_BYTES + warp * KF_WARP_SMEM;
    // Stage s of this warp is at slice + s * KF_STAGE_BYTES (computed, not a pointer array: a
    // run-time index into a local array would live in local memory).
#if !KF_FAST_INPUT
    unsigned char* const frag = slice + 2 * KF_STAGE_BYTES;  // the converted tile (generic input path)
#endif
    unsigned char* const out_tile = slice + 2 * KF_STAGE_BYTES + KF_FRAG_BYTES;
    // Zero both stages once: the padding columns (KF_IN .. KF_IN_PAD) are never written by the
    // copies and must read as 0, since 0 * NaN would poison a row.
    for (int i = lane; i < 2 * KF_STAGE_BYTES / 16; i += 32) {
        reinterpret_cast<uint4*>(slice)[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();

    const long long tiles = (rows + KF_WARP_ROWS - 1) / KF_WARP_ROWS;
    const long long step = (long long)gridDim.x * KF_WARPS;
    long long tile = (long long)blockIdx.x * KF_WARPS + warp;
#if KF_WGMMA
    // The four warps of a warpgroup take four consecutive tiles and run in lockstep (every wgmma
    // is a warpgroup instruction): they loop while the group's first tile exists; a warp past the
    // batch computes on whatever its stage holds and stores nothing. The warpgroup's index goes
    // through a shuffle so that ptxas knows it is warp-uniform (else it treats the loop as
    // divergent and serialises every wgmma).
    long long lead = ((long long)blockIdx.x * (KF_WARPS / 4) + __shfl_sync(0xffffffffu, warp >> 2, 0)) * 4;
#define KF_TILE_LOOP_ON (lead < tiles)
#define KF_TILE_LOOP_STEP (tile += step, lead += step)
#else
#define KF_TILE_LOOP_ON (tile < tiles)
#define KF_TILE_LOOP_STEP (tile += step)
#endif
    if (tile < tiles) kf_load_tile(input, rows, tile, kf_smem_addr(slice), lane);
    kf_cp_async_commit();
    int s = 0;
    for (; KF_TILE_LOOP_ON; KF_TILE_LOOP_STEP, s ^= 1) {
        // Prefetch the next tile into the other stage (an empty group when there is none, so
        // that "wait for all but the newest group" always means "this tile has landed").
        if (tile + step < tiles) kf_load_tile(input, rows, tile + step, kf_smem_addr(slice + (s ^ 1) * KF_STAGE_BYTES), lane);
        kf_cp_async_commit();
        kf_cp_async_wait<1>();
        __syncwarp();  // every lane's copies of this tile are visible to the whole warp
#if KF_FAST_INPUT
        const unsigned src = kf_smem_addr(slice + s * KF_STAGE_BYTES);
#else
        kf_repack_tile(slice + s * KF_STAGE_BYTES, frag, lane);
        __syncwarp();
        const unsigned src = kf_smem_addr(frag);
#endif
        unsigned x[KF_R][KF_KT0][4];
#pragma unroll
        for (int r = 0; r < KF_R; ++r) {
#pragma unroll
            for (int kk = 0; kk < KF_KT0; ++kk) {
                kf_ldmatrix_x4(x[r][kk], src + (16 * r + (lane & 15)) * KF_ROW_STRIDE + kk * 32 + (lane >> 4) * 16);
            }
        }
        kf_forward(x, out_tile, kf_smem, lane);
        __syncwarp();  // the output tile is complete; also: this stage's reads are done before it is refilled
        if (tile < tiles) kf_store_tile(output, rows, tile, out_tile, lane);
        __syncwarp();  // the output tile is free for the next tile
    }
    kf_cp_async_wait<0>();
}
