//! The shape of a generated kernel: how its threads cover the domain. It is chosen once per
//! kernel ([`KernelShape::choose`], from the analysis, the one-pass plan and the predicates of
//! its sinks); each shape's loop, prelude and state live in a module of their own. The kernel's
//! assembly (`kernel`) matches on it.
//!
//! Not handled here: the element body's actions (`actions`), the tails (`tail`).

pub(crate) mod columns;
pub(crate) mod compacted;
pub(crate) mod grid_stride;
pub(crate) mod row_groups;
pub(crate) mod row_wise;
pub(crate) mod rows;
pub(crate) mod warp_per_row;

use kfuse_ir::Dim;

use crate::actions::Group;
use crate::buffers::size_expr;
use crate::onepass::OnePass;
use crate::plan::{Launch, SizeExpr, WIDE_INDEX_OPTION};
use crate::{CodegenError, CodegenOptions};

/// How a kernel's threads cover its domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KernelShape {
    /// A grid-stride loop over the flat domain, batched when its loads can be hoisted (see
    /// `grid_stride`).
    GridStride,
    /// The grid-stride loop of a one-pass masked gradient under a general predicate: valid
    /// elements queued and computed by full sets of lanes, a grid barrier, a rescale (see
    /// `compacted`). A cooperative launch.
    Compacted,
    /// Row mode: one warp per row of a lengths mask (see `warp_per_row`).
    WarpPerRow,
    /// Row mode with nothing past a row's bound: a group of 32 down to 4 lanes per row (see
    /// `row_groups`).
    RowGroups,
    /// The rows plan: a loss over a lengths mask and its scaled gradient, fill and compute warps,
    /// a grid-wide arrival word (see `rows`). A cooperative launch.
    Rows,
    /// Rows whose reductions along the last axis are used again in the row: each row's group of
    /// lanes computes them once, then the body (see `row_wise`).
    RowWise,
    /// Reductions over the leading axis of an operand shaped like the rows times the domain,
    /// split over chunks of rows and folded in order by each tile's last block (see `columns`).
    Columns,
}

impl KernelShape {
    /// The shape of a kernel whose sinks form `groups`, given its one-pass plan (kernel 0 only),
    /// whether its single predicate is a row bound (see `actions::row_mode_bound`), whether it
    /// reads row reductions that the row-wise shape computes once per row (`row_wise::detect`),
    /// and its domain's last axis.
    pub(crate) fn choose(
        onepass: Option<&OnePass>,
        row_bound: bool,
        row_wise: bool,
        columns: bool,
        last_dim: Option<Dim>,
        groups: &[Group],
    ) -> KernelShape {
        match onepass {
            // Row reductions used again in their rows: computed once per row, whatever else holds.
            None if row_wise => KernelShape::RowWise,
            None if columns => KernelShape::Columns,
            Some(p) if p.rows => KernelShape::Rows,
            // A lengths mask is a row bound, and under one the one-pass plan is the rows plan.
            Some(_) => KernelShape::Compacted,
            None => match groups {
                [grp] if row_bound && last_dim.is_some() => {
                    if grp.otherwise.is_empty() {
                        KernelShape::RowGroups
                    } else {
                        KernelShape::WarpPerRow
                    }
                }
                _ => KernelShape::GridStride,
            },
        }
    }

    /// Threads per block (the rows plan's is fixed; `plan` refuses another non-default size).
    pub(crate) fn block(self, opts: &CodegenOptions) -> u32 {
        match self {
            KernelShape::Rows => rows::ROWS_BLOCK,
            _ => opts.block_size,
        }
    }

    /// How the executor launches it: the shapes that wait for every block are cooperative.
    pub(crate) fn launch(self) -> Launch {
        match self {
            KernelShape::Compacted | KernelShape::Rows => Launch::Cooperative,
            KernelShape::GridStride
            | KernelShape::WarpPerRow
            | KernelShape::RowGroups
            | KernelShape::RowWise
            | KernelShape::Columns => Launch::Plain,
        }
    }

    /// The header's line of the domain (`dom`, its shape as text).
    pub(crate) fn domain_note(self, dom: &str) -> String {
        match self {
            KernelShape::Rows => format!("// domain: {dom} elements as rows of the last axis, in tiles of rows per block (see kfuse-codegen's rows plan); only the columns below the row's bound are computed, the others zero-filled"),
            KernelShape::RowGroups => format!("// domain: {dom} elements as rows of the last axis, a group of 32 down to {} lanes per row (grid-stride over rows); only the columns below the row's bound are computed", row_groups::MIN_ROW_LANES),
            KernelShape::WarpPerRow => format!("// domain: {dom} elements as rows of the last axis, one warp per row (grid-stride over rows); only the columns below the row's bound are computed"),
            KernelShape::GridStride => format!("// domain: {dom} elements, one per iteration of a grid-stride loop, 32-bit flat index (64-bit when built with {WIDE_INDEX_OPTION})"),
            KernelShape::Compacted | KernelShape::RowWise | KernelShape::Columns => format!("// domain: {dom} elements, one per iteration of a grid-stride loop, 64-bit flat index"),
        }
    }

    /// What the kernel's counter buffer holds, for its parameter's comment.
    pub(crate) fn counter_note(self) -> &'static str {
        match self {
            KernelShape::Compacted => "grid barrier: [0] arrivals, [1] departures; 0 at launch, left at 0",
            KernelShape::Rows => "[0] ticket, [2, 4) the arrival word (count | arrivals << 40); 0 at launch, left at 0",
            KernelShape::Columns => "a ticket per tile of 32 columns: 0 at launch, left at 0",
            KernelShape::GridStride | KernelShape::WarpPerRow | KernelShape::RowGroups | KernelShape::RowWise => {
                "ticket: 0 at launch, left at 0"
            }
        }
    }

    /// The blocks a launch wants: `(work, per_block)` of [`crate::GridSpec::Work`], for a domain
    /// `dims` and blocks of `block` threads.
    pub(crate) fn grid_work(self, dims: &[Dim], block: u32) -> Result<(SizeExpr, u64), CodegenError> {
        let rows = &dims[..dims.len().saturating_sub(1)];
        Ok(match self {
            // A block per 8 rows at least, two per SM at most (then tiles of up to 64 rows).
            KernelShape::Rows => (size_expr(rows)?, 8),
            KernelShape::WarpPerRow => (size_expr(rows)?, u64::from(block / 32)),
            // Blocks enough for the fewest lanes per row (a smaller grid, measured 25% faster on a
            // loss kernel over 16384 short rows than warps covering the rows in one pass).
            KernelShape::RowGroups => (size_expr(rows)?, u64::from(block / row_groups::MIN_ROW_LANES)),
            // (Row-wise and column kernels' grids follow their rows: `row_wise::grid`, `columns::grid`.)
            KernelShape::GridStride | KernelShape::Compacted | KernelShape::RowWise | KernelShape::Columns => {
                (size_expr(dims)?, u64::from(block))
            }
        })
    }

    /// Blocks resident per multiprocessor that the launch bounds promise and the grid fills, and
    /// whether the bounds state them: a batched loop (`batched`) caps its registers to have
    /// `opts.batched_threads_per_sm` threads resident; the rows plan runs two blocks per SM.
    pub(crate) fn resident_blocks(self, opts: &CodegenOptions, block: u32, batched: bool) -> (u32, bool) {
        match self {
            KernelShape::Rows => (2, true),
            _ if batched => ((opts.batched_threads_per_sm / block).max(1), true),
            _ => ((2048 / block).clamp(1, 8), false),
        }
    }
}
