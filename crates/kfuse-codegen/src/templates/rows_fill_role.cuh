//~ The rows plan's step 2, the fill warps (reviewed template; rendered by `shapes::rows`). Lines
//~ starting with `//~` are notes for the reader and are not emitted. Generated blocks:
//~ {{fill_setup}} (rows_fill_setup.cuh per zero-filled output), {{later_bound}} (the bound of row
//~ kf_r0 + kf_ft into kf_b), {{fills}} (rows_fill.cuh or rows_fill_16.cuh per zero-filled
//~ output) and {{other}} (the other else-branch stores, per element, or nothing).
    // 2. Fill warps: the else-branch over the padding of every tile, nothing else; they never wait for the count.
    if (kf_w >= kf_cw) {
        const int kf_ft = (int)threadIdx.x - 32 * kf_cw, kf_fn = KF_B - 32 * kf_cw; // this thread among the fill threads, their number
        if (cols == 0) return;
{{fill_setup}}
        for (long long kf_r0 = kf_ra; kf_r0 < kf_rb; kf_r0 += KF_T) {
            const long long kf_r1 = kf_r0 + KF_T < kf_rb ? kf_r0 + KF_T : kf_rb;
            if (kf_r0 != kf_ra) { // a later tile: the fill warps load their own copy of its bounds
                if (kf_ft < kf_r1 - kf_r0) {
                    int kf_b = 0;
{{later_bound}}
                    kf_hf[kf_ft] = kf_b;
                }
{{later_sync}}
            }
            const long long kf_za = kf_r0 * cols, kf_zb = kf_r1 * cols; // the tile's elements
{{fills}}
{{other}}
            kf_bar(2, kf_fn); // kf_hf is rewritten by the next tile
        }
        return;
    }
