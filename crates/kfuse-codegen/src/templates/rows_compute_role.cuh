//~ The rows plan's steps 3 and 4, the compute warps (reviewed template; rendered by
//~ `shapes::rows`). Lines starting with `//~` are notes for the reader and are not emitted.
//~ {{count_bits}}: the bits of the arrival word that hold the count. Generated blocks:
//~ {{further_bound}} (the bound of row kf_r into kf_b), {{prefetch_decls}} (a register array per
//~ hoisted load), {{prefetch_loads}} (their loads of element i, or nothing), {{crossing}} (thread
//~ 0 computes the crossing scalars from kf_cntd), {{tile_bound}} (the bound of row
//~ kf_r0 + threadIdx.x into kf_b), {{body}} (the then-branch of element i, its loads from kf_pf).
    // 3. Compute warps: the block's count joins the grid's arrival word (count in the low bits, one arrival
    //    above them); once every block has arrived (all resident: cooperative launch), the count gives the
    //    crossing scalars. The first tile's first elements are loaded meanwhile.
    const int kf_cn = 32 * kf_cw; // compute threads [0, kf_cn)
    unsigned long long* kf_arrive = reinterpret_cast<unsigned long long*>(counter + 2); // count | arrivals << {{count_bits}}
    double kf_cntd = 0.0; // the count of the mask (thread 0): the crossing scalars' and the tail's
    {
        long long kf_n = 0; // rows past the first tile
        for (long long kf_r = kf_ra + kf_nr0 + threadIdx.x; kf_r < kf_rb; kf_r += kf_cn) {
            int kf_b = 0;
{{further_bound}}
            kf_n += kf_b;
        }
        if (kf_ra + kf_nr0 < kf_rb) { // several tiles: the compute warps' sums, in warp order
            for (int o = 16; o > 0; o >>= 1) kf_n += __shfl_xor_sync(0xffffffffu, kf_n, o);
            if (kf_l == 0) kf_wn[kf_w] = kf_n;
{{further_sync}}
            kf_n = 0;
            for (int w = 0; w < kf_cw; ++w) kf_n += kf_wn[w];
            kf_bar(1, kf_cn);
        }
        if (threadIdx.x == 0) atomicAdd(kf_arrive, (1ull << {{count_bits}}) | (unsigned long long)(kf_n + kf_hp[kf_nr0]));
    }
    // Element v of a tile is column v - kf_hp[r] of its row r whose range holds it; KF_U of them per compute
    // thread and step, their loads issued together.
    int kf_tr[KF_U]; // the element's row in the tile, -1 past the end
    int kf_tc[KF_U]; // its column (below its bound, an i32)
{{prefetch_decls}}
    auto kf_load = [&](long long kf_r0, int kf_nr, long long kf_v, long long kf_v0) {
        #pragma unroll
        for (int kf_u = 0; kf_u < KF_U; ++kf_u) {
            const long long kf_e = kf_v0 + (long long)kf_u * kf_cn;
            kf_tr[kf_u] = -1;
            if (kf_e < kf_v) {
                int lo = 0, hi = kf_nr - 1; // the last row whose range starts at or before kf_e
                while (lo < hi) { const int m = (lo + hi + 1) >> 1; if (kf_hp[m] <= kf_e) lo = m; else hi = m - 1; }
                kf_tr[kf_u] = lo;
                kf_tc[kf_u] = (int)(kf_e - kf_hp[lo]);
{{prefetch_loads}}
            }
        }
    };
    kf_load(kf_ra, kf_nr0, kf_hp[kf_nr0], threadIdx.x); // in flight while the count completes
    if (threadIdx.x == 0) {
        unsigned long long kf_x;
        do { kf_x = *(volatile unsigned long long*)kf_arrive; } while ((kf_x >> {{count_bits}}) < gridDim.x);
        kf_cntd = (double)(long long)(kf_x & ((1ull << {{count_bits}}) - 1ull));
{{crossing}}
    }
    kf_bar(1, kf_cn); // the scalars are shared
    // 4. Each tile's valid elements.
    for (long long kf_r0 = kf_ra; kf_r0 < kf_rb; kf_r0 += KF_T) {
        const int kf_nr = (int)(kf_rb - kf_r0 < KF_T ? kf_rb - kf_r0 : KF_T);
        if (kf_r0 != kf_ra) { // a later tile: its bounds and their prefix
            if ((int)threadIdx.x < kf_nr) {
                int kf_b = 0;
{{tile_bound}}
                kf_hc[threadIdx.x] = kf_b;
            }
            kf_bar(1, kf_cn);
            if (kf_w == 0) kf_prefix(kf_nr);
            kf_bar(1, kf_cn);
        }
        const long long kf_v = kf_hp[kf_nr];
        for (long long kf_v0 = threadIdx.x; kf_v0 < kf_v; kf_v0 += KF_U * kf_cn) {
            if (kf_r0 != kf_ra || kf_v0 != threadIdx.x) kf_load(kf_r0, kf_nr, kf_v, kf_v0); // the first step's are loaded
            #pragma unroll
            for (int kf_u = 0; kf_u < KF_U; ++kf_u) {
                if (kf_tr[kf_u] < 0) continue;
                const long long row = kf_r0 + kf_tr[kf_u], col = kf_tc[kf_u], i = row * cols + col;
{{body}}
            }
        }
        kf_bar(1, kf_cn); // kf_hc and kf_hp are rewritten by the next tile
    }
