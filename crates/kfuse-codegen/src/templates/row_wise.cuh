//~ The row-wise shape's sizes and loop (reviewed template; rendered by `shapes::row_wise`):
//~ {{rows}} rows of {{cols}} columns; a row takes a group of kf_g lanes, the power of two from
//~ {{min_lanes}} up to the block that gives about {{cols_per_lane}} columns a lane (the host's
//~ `row_lanes` computes the same to size the grid; the register entry's groups are smaller, from
//~ one lane); grid-stride over the rows, blockDim.x / kf_g
//~ rows at a time. {{accumulators}}: the full reductions' accumulators; {{prologue}}: what goes
//~ before the loop (rows kept in registers: the loads of the first row); {{body}}: the row body;
//~ {{n_type}}: the type of the lanes' and columns' counts (`int` for rows kept in registers);
//~ {{fold_doubles}}: 32 doubles per reduction that a fold of one phase takes at once; {{spread}}:
//~ empty, or (a register entry of more than 16 columns a lane) a second line that gives the rows
//~ more lanes, for 16 columns a lane, when they are too few to fill the device; {{after}}: empty, or
//~ a newline and what follows the row loop (a kernel with column sums: the block's fold of them).
    const long long rows = {{rows}};
    const long long cols = {{cols}};
    // Lanes per row: the power of two from {{min_lanes}} up to the block with about {{cols_per_lane}} columns a lane.
    {{n_type}} kf_g = {{min_lanes}};
    while (kf_g < ({{n_type}})blockDim.x && kf_g * {{cols_per_lane}} < cols) kf_g <<= 1;{{spread}}
    const {{n_type}} lane = ({{n_type}})(threadIdx.x & (kf_g - 1)); // lane within the row's group
    const unsigned kf_lg = (unsigned)__ffs((int)kf_g) - 1u; // log2(kf_g): lanes divide by shifts
    const long long kf_gpb = (long long)(blockDim.x >> kf_lg); // rows a block takes at a time
    __shared__ double kf_rs[{{fold_doubles}}]; // the folds of a row's reductions over its lanes
{{accumulators}}
{{prologue}}
    // Every thread of the block runs every step (the folds wait for the whole block); a group past
    // the last row reads that row and stores nothing.
    for (long long kf_r0 = (long long)blockIdx.x * kf_gpb; kf_r0 < rows; kf_r0 += (long long)gridDim.x * kf_gpb) {
        const long long kf_rw = kf_r0 + (long long)(threadIdx.x >> kf_lg);
        const bool kf_live = kf_rw < rows;
        const long long row = kf_live ? kf_rw : rows - 1;
        const {{n_type}} kf_n = kf_live ? ({{n_type}})cols : 0; // the columns this group visits
        const long long rowbase = row * cols;
{{body}}
    }{{after}}
