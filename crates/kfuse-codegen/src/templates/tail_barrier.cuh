//~ The tail of a cooperative one-pass kernel (reviewed template; rendered by `tail`): block
//~ partials, a grid barrier on the arrivals alone (every block is resident), then every block
//~ folds all partials itself in the same fixed order, computes the scale into kf_scale and runs
//~ {{after}} (the rescale of its list). Lines starting with `//~` are not emitted. Generated
//~ blocks: {{block_reduce}}, {{partials}}, {{fold}}, {{epilogue}} as in tail_ticket.cuh.
    // Each block reduces its threads' accumulators in a fixed order and writes one partial per slot.
    __shared__ double kf_smem[32];
    __shared__ float kf_scale; // the gradient's scale, past the barrier
{{block_reduce}}
    if (threadIdx.x == 0) {
{{partials}}
        __threadfence(); // publish the partials before arriving
        atomicAdd(counter, 1u); // grid barrier: arrive, then wait for every block (all resident: cooperative launch)
        while (((volatile unsigned int*)counter)[0] < gridDim.x) { }
        __threadfence();
    }
    __syncthreads();
    // Every block folds all partials: thread t takes blocks t, t + blockDim.x, ... in order, then one block
    // reduction; no float atomics, so every block holds the same bit-identical results for a given grid size.
{{fold}}
    if (threadIdx.x == 0) {
{{epilogue}}
    }
    __syncthreads();
{{after}}
    // The last block to leave resets the barrier: the next launch needs no memset.
    if (threadIdx.x == 0 && atomicAdd(counter + 1, 1u) == gridDim.x - 1u) { counter[0] = 0u; counter[1] = 0u; }
