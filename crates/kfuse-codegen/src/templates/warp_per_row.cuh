//~ The warp-per-row shape's sizes and loop (reviewed template; rendered by
//~ `shapes::warp_per_row`): {{rows}} rows of {{cols}} columns, one warp per row, grid-stride over
//~ the rows; {{accumulators}}: the reductions' accumulators; {{body}}: the row body.
    const long long rows = {{rows}};
    const long long lane = threadIdx.x & 31u;
{{accumulators}}
    // One warp per row; its lanes stride over the row's columns.
    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += ((long long)gridDim.x * blockDim.x) >> 5) {
        const long long rowbase = row * {{cols}};
{{body}}
    }
