//! The row-group shape: row mode (see `warp_per_row`) when nothing is done past a row's bound,
//! a row taking a group of `kf_g` lanes (32, 16, 8 or down to [`MIN_ROW_LANES`]), the most with
//! which the grid's threads cover every row in one pass (the fewest when they cannot). The grid
//! is sized for [`MIN_ROW_LANES`] lanes per row, so many rows take 4 lanes and few rows more. A
//! grid of warps that each take one row would otherwise walk its rows one after another, a load
//! latency (the bound) and another (the columns) per row. `kf_g` depends only on the row count and
//! the grid, so each thread's accumulation order, and the result, is fixed for a given grid.
//!
//! Not handled here: the row body (see `warp_per_row`), the tail (see `tail`).

use crate::text::{render, write_lines};

/// The fewest lanes a row group may have (4 lanes x 16 bytes: two whole sectors).
pub(crate) const MIN_ROW_LANES: u32 = 4;

/// The shape's template.
const ROW_GROUPS: &str = include_str!("../templates/row_groups.cuh");

/// The row count, the lanes per row, the `accumulators` and one group of `kf_g` lanes per row,
/// grid-stride over the `rows` rows of `cols` columns, running `body`.
pub(crate) fn write(src: &mut String, rows: &str, cols: &str, accumulators: &str, body: &[String]) {
    let mut body_lines = String::new();
    write_lines(&mut body_lines, body, "        ");
    src.push_str(&render(
        ROW_GROUPS,
        &[
            ("rows", rows),
            ("cols", cols),
            ("min_log2", &MIN_ROW_LANES.trailing_zeros().to_string()),
            ("accumulators", accumulators),
            ("body", &body_lines),
        ],
    ));
}
