//~ The row-group shape (reviewed template; rendered by `shapes::row_groups`): {{rows}} rows of
//~ {{cols}} columns; a row takes the most of 32, 16, ... down to 2^{{min_log2}} lanes with which
//~ this grid covers every row in one pass; grid-stride over the rows. {{accumulators}}: the
//~ reductions' accumulators; {{body}}: the row body. Lines starting with `//~` are not emitted.
    const long long rows = {{rows}};
    // Lanes per row: the most of 32, 16, ... with which this grid covers every row in one pass.
    const long long kf_threads = (long long)gridDim.x * blockDim.x;
    int kf_gs = 5; // log2 of the lanes per row
    while (kf_gs > {{min_log2}} && rows > (kf_threads >> kf_gs)) --kf_gs;
    const long long kf_g = 1ll << kf_gs;
    const long long lane = threadIdx.x & (kf_g - 1); // lane within the row's group
{{accumulators}}
    // One group of kf_g lanes per row; its lanes stride over the row's columns.
    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> kf_gs; row < rows; row += ((long long)gridDim.x * blockDim.x) >> kf_gs) {
        const long long rowbase = row * {{cols}};
{{body}}
    }
