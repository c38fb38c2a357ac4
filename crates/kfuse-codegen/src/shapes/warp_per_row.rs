//! The warp-per-row shape (row mode): every sink of the kernel shares a lengths mask
//! `col < bound(row)`, so one warp takes one row (grid-stride over rows) and its lanes stride
//! over the columns `[0, clamp(bound, 0, cols))` for the masked work and over the rest for the
//! `else` values: padding costs no predicate evaluation, no division. An all-zero `else` output
//! is one byte range per row, zeroed first with 16-byte streaming stores (see `fill`), so the
//! stores drain while the valid columns compute.
//!
//! The row body is shared with the row-group shape (see `row_groups`), which has no `else`
//! values and gives a row fewer lanes. Not handled here: the tail (see `tail`).

use std::collections::BTreeSet;

use kfuse_ir::{Dim, Graph, NodeId};

use crate::actions::{run_actions, Action, Group};
use crate::emit::{Coord, Emitter};
use crate::fill::{write_zero_fill, zero_fill_bytes};
use crate::text::write_lines;
use crate::CodegenError;

/// Emits the row body into `em` (row `row` at `rowbase`, lane `lane`): the bound `kf_hi`, the
/// zero fills of the padding, the valid columns (lanes `stride` apart: `32` for a warp, `kf_g`
/// for a row group) and the other `else` values. Inputs the bound loads go into
/// `unconditional`.
pub(crate) fn emit_row_body(
    em: &mut Emitter,
    g: &Graph,
    grp: &Group,
    (b, bctx): &(NodeId, Vec<Coord>),
    last_dim: Dim,
    stride: &str,
    unconditional: &mut BTreeSet<u32>,
) -> Result<(), CodegenError> {
    // Row mode: the predicate is `col < bound(row)`, so each branch is a column range.
    em.row_mode = true;
    let bv = em.eval(*b, bctx)?;
    unconditional.extend(em.uses.inputs.iter().copied());
    let cols = em.dim(last_dim);
    em.push_stmt(format!("const long long kf_hi = {bv} < 0 ? 0ll : ((long long){bv} < {cols} ? (long long){bv} : {cols}); // columns where the predicate holds"));
    // Outputs that are all zero where the predicate fails: one byte range per row, zeroed with
    // 16-byte streaming stores, first (the stores drain while the valid columns compute).
    let (fills, rest): (Vec<&Action>, Vec<&Action>) =
        grp.otherwise.iter().partition(|a| zero_fill_bytes(em, g, a).is_some());
    let fills: Vec<(usize, u64)> = fills
        .into_iter()
        .filter_map(|a| match (a, zero_fill_bytes(em, g, a)) {
            (Action::Store { output, .. }, Some(esz)) => Some((*output, esz)),
            _ => None,
        })
        .collect();
    for &(output, esz) in &fills {
        write_zero_fill(em, g, output, esz, &cols, stride);
    }
    em.open_column_loop(format!("for (long long col = lane; col < kf_hi; col += {stride}) {{"));
    em.push_stmt("const long long i = rowbase + col;".to_string());
    run_actions(em, g, &grp.then)?;
    em.close();
    let rest: Vec<Action> = rest.into_iter().cloned().collect();
    if !rest.is_empty() {
        em.push_stmt("#pragma unroll 4".to_string());
        em.open_column_loop(format!("for (long long col = kf_hi + lane; col < {cols}; col += 32) {{"));
        em.push_stmt("const long long i = rowbase + col;".to_string());
        run_actions(em, g, &rest)?;
        em.close();
    }
    Ok(())
}

/// The sizes of the warp-per-row loop (before the accumulators).
pub(crate) fn write_sizes(src: &mut String, rows: &str) {
    src.push_str(&format!("    const long long rows = {rows};\n"));
    src.push_str("    const long long lane = threadIdx.x & 31u;\n");
}

/// One warp per row, grid-stride over the rows of `cols` columns.
pub(crate) fn write_loop(src: &mut String, cols: &str, body: &[String]) {
    src.push_str("    // One warp per row; its lanes stride over the row's columns.\n");
    src.push_str("    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += ((long long)gridDim.x * blockDim.x) >> 5) {\n");
    src.push_str(&format!("        const long long rowbase = row * {cols};\n"));
    write_lines(src, body, "        ");
    src.push_str("    }\n");
}
