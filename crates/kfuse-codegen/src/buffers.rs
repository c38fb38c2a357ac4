//! Where each buffer of a plan sits, and element counts as size expressions.

use kfuse_ir::Dim;

use crate::onepass::OnePassBuffers;
use crate::CodegenError;

/// Where each kind of buffer sits in `Plan::buffers`.
pub(crate) struct BufferIndex {
    pub outputs_base: usize,
    pub temps_base: usize,
    /// Per kernel: the (partials, counter) buffers, when it has full reductions; a rows-plan
    /// kernel always has a counter (its arrival word), and partials only for reductions other
    /// than the counts of its mask.
    pub reduction: Vec<Option<(Option<usize>, usize)>>,
    /// The one-pass masked gradient's buffers, when the plan uses one (kernel 0 fills the list).
    pub onepass: Option<OnePassBuffers>,
    /// Per kernel: the column partial sums it writes (a row-wise kernel) or folds (its column
    /// kernel), when a column kernel's sums are taken by a row-wise kernel.
    pub column_partials: Vec<Option<usize>>,
}

/// The element count of `dims` as a [`crate::SizeExpr`].
pub(crate) fn size_expr(dims: &[Dim]) -> Result<crate::SizeExpr, CodegenError> {
    crate::SizeExpr::of(dims).ok_or(CodegenError::SizeOverflow { node: 0 })
}
