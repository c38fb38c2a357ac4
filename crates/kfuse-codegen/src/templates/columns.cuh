//~ The columns shape's sizes and block coordinates (reviewed template; rendered by
//~ `shapes::columns`): {{cols}} columns (the domain's flat elements) in tiles of {{tile}}, each
//~ tile's {{rows}} rows split in kf_s chunks, a block per tile and chunk (the host's grid is
//~ exactly tiles x chunks); a block's threads are {{tile}} columns by {{lanes}} row lanes.
//~ {{body}}: the pass, the folds, the ticket and the tile's last block's body.
    const long long cols = {{cols}};
    const long long rows = {{rows}};
    if (cols == 0) return; // no column: nothing to write
    const long long kf_tiles = (cols + {{tile}} - 1) / {{tile}};
    const long long kf_s = (long long)gridDim.x / kf_tiles; // chunks of rows per tile
    const long long kf_tile = (long long)blockIdx.x / kf_s, kf_chunk = (long long)blockIdx.x % kf_s;
    const long long kf_c = threadIdx.x % {{tile}}, kf_lane = threadIdx.x / {{tile}};
    const long long kf_lanes = {{lanes}};
    const long long kf_per = (rows + kf_s - 1) / kf_s; // rows per chunk
    const long long kf_r0 = kf_chunk * kf_per < rows ? kf_chunk * kf_per : rows;
    const long long kf_r1 = kf_r0 + kf_per < rows ? kf_r0 + kf_per : rows;
    const long long kf_i = kf_tile * {{tile}} + kf_c;
    const bool kf_live = kf_i < cols;
    const long long i = kf_live ? kf_i : cols - 1; // a column past the end reads the last one and stores nothing
    __shared__ double kf_cs[{{lanes}}][{{tile}}]; // the row lanes' accumulators, folded in lane order
{{body}}
