//~ The compacted shape's state (reviewed template; rendered by `shapes::compacted`), after the
//~ accumulators and before the grid-stride loop. Lines starting with `//~` are notes for the
//~ reader and are not emitted. {{list_cap}}: list entries in shared memory; {{queue}}: the
//~ queue's capacity (a batch's worth and a drain's rest, block * (elems_per_thread + 1));
//~ {{comps}}: values per entry; {{drain}}: the queued group's work for element i (loads direct).
//~ Block b's global segment starts at the count of elements the threads of blocks < b own in the
//~ grid-stride loop (S threads in all, T = b * block; thread t owns n / S elements, one more when
//~ t < n % S), so its entries always fit there.
    // One pass, compacted: an element whose predicate holds is queued (kf_q) and computed later by a full
    // set of lanes (kf_drain), so that the few valid elements do not idle the other lanes of their warps; its
    // unscaled values are listed in shared memory (kf_li, kf_lv), past KF_LCAP entries in the block's global segment.
    constexpr int KF_LCAP = {{list_cap}};
    __shared__ long long kf_q[{{queue}}]; // queued flat indices: at most a batch's worth and a drain's rest
    __shared__ int kf_qn, kf_ln; // queued, listed
    __shared__ long long kf_li[KF_LCAP];
    __shared__ float kf_lv[KF_LCAP * {{comps}}];
    if (threadIdx.x == 0) { kf_qn = 0; kf_ln = 0; }
    __syncthreads();
    const long long kf_list_s = (long long)gridDim.x * blockDim.x, kf_list_t = (long long)blockIdx.x * blockDim.x;
    const long long kf_list_r = n % kf_list_s;
    const long long kf_list_base = kf_list_t * (n / kf_list_s) + (kf_list_t < kf_list_r ? kf_list_t : kf_list_r); // elements of the threads before this block
    // Threads [0, kf_count) compute the last kf_count queued elements; every thread of the block calls it.
    auto kf_drain = [&](int kf_count) {
        const int kf_q0 = kf_qn - kf_count;
        if ((int)threadIdx.x < kf_count) {
            const long long i = kf_q[kf_q0 + (int)threadIdx.x];
{{drain}}
        }
        __syncthreads();
        if (threadIdx.x == 0) { kf_qn = kf_q0; kf_ln += kf_count; }
        __syncthreads();
    };
