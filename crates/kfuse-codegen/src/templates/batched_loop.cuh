//~ The batched grid-stride loop (reviewed template; rendered by `shapes::grid_stride`). Lines
//~ starting with `//~` are not emitted. {{batch}}: elements per thread and iteration; {{block}}:
//~ threads per block; {{rot_step}}: 32 * batch. Generated blocks: {{prefetch_decls}} (a register
//~ array per hoisted load), {{loads}} (the loads needed by every element), {{guarded_loads}}
//~ (batched_loop_guarded.cuh, or nothing), {{body}} (element i, its loads from kf_pf) and
//~ {{after_batch}} (the compacted shape's queue drain, or nothing).
    const kf_index kf_stride = (kf_index)gridDim.x * (kf_index)blockDim.x;
    // {{batch}} elements per thread and iteration: their loads are all in flight before the first use.
    // The block's elements at each step are rotated by one warp per step (kf_rot), so columns that a grid
    // stride multiple of the row length would pin to one warp (e.g. the valid first boxes) spread over all warps.
    unsigned kf_rot = 0u; // in [0, {{block}})
    for (kf_index kf_i0 = (kf_index)blockIdx.x * (kf_index)blockDim.x; kf_i0 < n; kf_i0 += {{batch}} * kf_stride, kf_rot = (kf_rot + {{rot_step}}u) % {{block}}u) {
{{prefetch_decls}}
        #pragma unroll
        for (int kf_u = 0; kf_u < {{batch}}; ++kf_u) {
            const kf_index i = kf_i0 + kf_u * kf_stride + (kf_index)((threadIdx.x + kf_rot + 32u * kf_u) % {{block}}u);
            if (i < n) {
{{loads}}
            }
        }
{{guarded_loads}}
        #pragma unroll
        for (int kf_u = 0; kf_u < {{batch}}; ++kf_u) {
            const kf_index i = kf_i0 + kf_u * kf_stride + (kf_index)((threadIdx.x + kf_rot + 32u * kf_u) % {{block}}u);
            if (i >= n) break;
{{body}}
        }
{{after_batch}}
    }
