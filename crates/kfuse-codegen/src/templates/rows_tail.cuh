//~ The rows plan's step 5 (reviewed template; rendered by `shapes::rows`): the compute warps'
//~ reductions in warp order, the ticket of warp 0, and the last block's fold, epilogue (lane 0)
//~ and reset of the ticket and the arrival word. Lines starting with `//~` are not emitted.
//~ Generated blocks, empty when the kernel has no partial slot: {{warp_sums}} (each warp's
//~ shuffle sums into kf_wr), {{block_sums}} (lane 0 of warp 0 folds the warps' sums in order and
//~ writes the block's partials), {{fold}} (the last block's warp 0 folds every block's partials
//~ into r<s>); {{what}} names what the fence publishes; {{epilogue}}: scalar outputs.
    // 5. The compute warps' sums, in warp order; warp 0 publishes the block's and takes the ticket.
{{warp_sums}}
    if (kf_w != 0) return;
    bool kf_last = false;
    if (kf_l == 0) {
{{block_sums}}
        __threadfence(); // {{what}} before taking a ticket
        kf_last = atomicAdd(counter, 1u) == gridDim.x - 1u;
    }
    if (!__shfl_sync(0xffffffffu, kf_last, 0)) return;
    __threadfence();
{{fold}}
    if (kf_l == 0) {
{{epilogue}}
        counter[0] = 0u; // the ticket and the arrival word: the next launch needs no memset
        *kf_arrive = 0ull;
    }
