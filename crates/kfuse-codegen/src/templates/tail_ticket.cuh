//~ The tail of a kernel with full reductions (reviewed template; rendered by `tail`). Lines
//~ starting with `//~` are notes for the reader and are not emitted. Generated blocks, one line
//~ per partial slot s: {{block_reduce}} (acc<s> = kf_block_<op>(acc<s>, kf_smem)), {{partials}}
//~ (thread 0 writes the block's partial of slot s), {{fold}} (the last block's fixed-order fold
//~ of every block's partials into r<s>), {{epilogue}} (thread 0: scalar outputs, Temp values).
    // Each block reduces its threads' accumulators in a fixed order and writes one partial per slot.
    __shared__ double kf_smem[32];
    __shared__ bool kf_last_block;
{{block_reduce}}
    if (threadIdx.x == 0) {
{{partials}}
        __threadfence(); // publish the partials before taking a ticket
        kf_last_block = atomicAdd(counter, 1u) == gridDim.x - 1u;
    }
    __syncthreads();
    if (!kf_last_block) return;
    __threadfence();
    // The last block folds all partials: thread t takes blocks t, t + blockDim.x, ... in order, then one
    // block reduction; no float atomics, so the result is bit-identical for a given grid size.
{{fold}}
    if (threadIdx.x == 0) {
{{epilogue}}
        *counter = 0u; // self-resetting ticket: the next launch needs no memset
    }
