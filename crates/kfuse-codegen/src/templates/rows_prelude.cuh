//~ The rows plan's prelude and step 1 (reviewed template; rendered by `shapes::rows`). Lines
//~ starting with `//~` are notes for the reader and are not emitted. Placeholders: {{rows}},
//~ {{cols}} (size expressions), {{block}}, {{tile_rows}}, {{batch}}, {{valid_cost}},
//~ {{pad_bytes}}, {{min_compute_warps}} (integers), and the generated blocks {{decls}} (the
//~ crossing scalars' shared declarations) and {{first_bound}} (the bound of row
//~ kf_ra + threadIdx.x into kf_b); {{bar_or}} and {{first_sync}}: see `shapes::rows` (the checks' or of
//~ kf_bad over the threads that share the bounds).
    const long long rows = {{rows}}, cols = {{cols}};
    constexpr int KF_B = {{block}}, KF_W = KF_B / 32, KF_T = {{tile_rows}}, KF_U = {{batch}}; // threads (the launch's block), warps, most rows per tile, valid elements per compute thread and step
    const int kf_w = threadIdx.x >> 5, kf_l = threadIdx.x & 31;
    // The block's rows: a contiguous, balanced share, in tiles of up to KF_T rows.
    const long long kf_ra = rows * blockIdx.x / gridDim.x, kf_rb = rows * (blockIdx.x + 1) / gridDim.x;
    __shared__ int kf_hc[KF_T], kf_hf[KF_T]; // the tile's clamped bounds: the compute warps' copy, the fill warps' copy
    __shared__ long long kf_hp[KF_T + 1]; // the exclusive prefix of kf_hc; kf_hp[rows of the tile] is its valid elements
    __shared__ int kf_cws; // the block's compute warps
    __shared__ long long kf_wn[KF_W]; // the compute warps' counts of the rows past the first tile
{{decls}}
    auto kf_cl = [&](int v) -> long long { return v < 0 ? 0ll : ((long long)v < cols ? (long long)v : cols); };
    auto kf_prefix = [&](int nr) { // warp 0: kf_hp from kf_hc[0, nr), two rows a lane
        const long long a = 2 * kf_l < nr ? kf_hc[2 * kf_l] : 0, b = 2 * kf_l + 1 < nr ? kf_hc[2 * kf_l + 1] : 0;
        long long x = a + b;
        for (int o = 1; o < 32; o <<= 1) { const long long y = __shfl_up_sync(0xffffffffu, x, o); if (kf_l >= o) x += y; }
        if (2 * kf_l < nr) kf_hp[2 * kf_l] = x - a - b;
        if (2 * kf_l + 1 < nr) kf_hp[2 * kf_l + 1] = x - b;
        if (kf_l == 31) kf_hp[nr] = x;
        return x; // the total, in every lane past the last row's pair
    };
    auto kf_bar = [](int id, int n) { asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(n) : "memory"); }; // a role's named barrier
{{bar_or}}
    // 1. The first tile's bounds; warp 0 sums them and splits the warps: compute warps [0, kf_cw) in
    //    proportion to the tile's work, valid elements costing KF_VC chunks of padding (at least KF_MINCW of
    //    them, and one fill warp at least while there is padding), fill warps [kf_cw, KF_W).
    constexpr long long KF_VC = {{valid_cost}}, KF_PB = {{pad_bytes}}; // KF_PB: bytes stored per padding element
    constexpr int KF_MINCW = {{min_compute_warps}};
    const int kf_nr0 = (int)((kf_rb - kf_ra) < KF_T ? (kf_rb - kf_ra) : KF_T);
    if ((int)threadIdx.x < kf_nr0) {
        int kf_b = 0;
{{first_bound}}
        kf_hc[threadIdx.x] = kf_b;
        kf_hf[threadIdx.x] = kf_b;
    }
{{first_sync}}
    if (kf_w == 0) {
        const long long kf_v = kf_prefix(kf_nr0), kf_p = (((long long)kf_nr0 * cols - kf_v) * KF_PB + 15) / 16; // valid elements, padding chunks (any padding: one at least)
        if (kf_l == 31) {
            const float kf_work = (float)(KF_VC * kf_v + kf_p); // in f32: a heuristic, no 64-bit division
            int kf_c = kf_work > 0.0f ? (int)ceilf(KF_W * (float)(KF_VC * kf_v) / kf_work) : 0;
            kf_c = kf_c < KF_MINCW ? KF_MINCW : (kf_c > KF_W ? KF_W : kf_c);
            kf_cws = kf_p > 0 && kf_c > KF_W - 1 ? KF_W - 1 : kf_c;
        }
    }
    __syncthreads();
    const int kf_cw = kf_cws;
