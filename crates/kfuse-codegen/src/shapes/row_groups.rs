//! The row-group shape: row mode (see `warp_per_row`) when nothing is done past a row's bound,
//! a row taking a group of `kf_g` lanes (32, 16, 8 or down to [`MIN_ROW_LANES`]), the most with
//! which the grid's threads cover every row in one pass (the fewest when they cannot). The grid
//! is sized for [`MIN_ROW_LANES`] lanes per row, so many rows take 4 lanes and few rows more. A
//! grid of warps that each take one row would otherwise walk its rows one after another, a load
//! latency (the bound) and another (the columns) per row. `kf_g` depends only on the row count and
//! the grid, so each thread's accumulation order, and the result, is fixed for a given grid.
//!
//! Not handled here: the row body (see `warp_per_row`), the tail (see `tail`).

use std::fmt::Write as _;

use crate::text::write_lines;

/// The fewest lanes a row group may have (4 lanes x 16 bytes: two whole sectors).
pub(crate) const MIN_ROW_LANES: u32 = 4;

/// The row count and the lanes per row (before the accumulators).
pub(crate) fn write_sizes(src: &mut String, rows: &str) {
    let _ = writeln!(src, "    const long long rows = {rows};");
    src.push_str("    // Lanes per row: the most of 32, 16, ... with which this grid covers every row in one pass.\n");
    src.push_str("    const long long kf_threads = (long long)gridDim.x * blockDim.x;\n");
    src.push_str("    int kf_gs = 5; // log2 of the lanes per row\n");
    let _ = writeln!(
        src,
        "    while (kf_gs > {} && rows > (kf_threads >> kf_gs)) --kf_gs;",
        MIN_ROW_LANES.trailing_zeros()
    );
    src.push_str("    const long long kf_g = 1ll << kf_gs;\n");
    src.push_str("    const long long lane = threadIdx.x & (kf_g - 1); // lane within the row's group\n");
}

/// One group of `kf_g` lanes per row, grid-stride over the rows of `cols` columns.
pub(crate) fn write_loop(src: &mut String, cols: &str, body: &[String]) {
    src.push_str("    // One group of kf_g lanes per row; its lanes stride over the row's columns.\n");
    src.push_str("    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> kf_gs; row < rows; row += ((long long)gridDim.x * blockDim.x) >> kf_gs) {\n");
    let _ = writeln!(src, "        const long long rowbase = row * {cols};");
    write_lines(src, body, "        ");
    src.push_str("    }\n");
}
