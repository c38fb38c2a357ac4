//! The grid-stride shape: the kernel loops over its flat domain with a 64-bit index, its sinks
//! grouped under shared predicates. When the body loads inputs at the flat index outside any
//! branch, the loop is batched (`elems_per_thread` elements per iteration, their loads issued
//! first); otherwise it is a plain loop, unrolled 4 times.
//!
//! Not handled here: the compacted queue's work (see `compacted`), the tail (see `tail`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kfuse_ir::Graph;

use crate::actions::{run_actions, Action, Group};
use crate::emit::{Emitter, Prefetch};
use crate::text::write_lines;
use crate::CodegenError;

/// Emits every group's actions into `em` (the body of one element `i`), a predicate's branch
/// around the actions it guards; the loads of the first group's branch are prefetched under it.
/// Inputs loaded outside any branch go into `unconditional`. A group with a one-pass `Append`
/// (the compacted shape) queues its elements instead: its index is returned, for `kf_drain`.
pub(crate) fn emit_groups(
    em: &mut Emitter,
    g: &Graph,
    groups: &[Group],
    unconditional: &mut BTreeSet<u32>,
) -> Result<Option<usize>, CodegenError> {
    let mut compacted = None;
    em.prefetch = Some(Vec::new());
    for (gi, grp) in groups.iter().enumerate() {
        match &grp.guard {
            None => {
                run_actions(em, g, &grp.then)?;
                unconditional.extend(em.uses.inputs.iter().copied());
            }
            Some((m, mctx)) => {
                let mv = em.eval(*m, mctx)?;
                unconditional.extend(em.uses.inputs.iter().copied());
                em.open_branch(&mv);
                if grp.then.iter().any(|a| matches!(a, Action::Append { .. })) {
                    // One pass: the element is queued; full sets of lanes compute it later.
                    em.push_stmt("kf_q[atomicAdd(&kf_qn, 1)] = i; // computed by kf_drain".to_string());
                    compacted = Some(gi);
                } else {
                    // The first group's predicate is all the body computes before its
                    // branch, so the branch's loads can be issued (under it) with the
                    // batch's others.
                    em.prefetch_guard = (gi == 0).then(|| mv.clone());
                    run_actions(em, g, &grp.then)?;
                    em.prefetch_guard = None;
                }
                em.close();
                if !grp.otherwise.is_empty() {
                    em.open_else();
                    run_actions(em, g, &grp.otherwise)?;
                    em.close();
                }
            }
        }
    }
    Ok(compacted)
}

/// The loop over `[0, n)`: plain when nothing was prefetched, batched otherwise (`after_batch`
/// runs after each batch: the compacted shape's queue drain).
pub(crate) fn write_loop(
    src: &mut String,
    prefetch: &[Prefetch],
    body: &[String],
    block: u32,
    batch: u32,
    after_batch: &[&str],
) {
    if prefetch.is_empty() {
        src.push_str("    #pragma unroll 4 // lets the compiler keep several iterations' loads in flight\n");
        src.push_str("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n");
        write_lines(src, body, "        ");
        src.push_str("    }\n");
    } else {
        write_batched_loop(src, prefetch, body, block, batch, after_batch);
    }
}

/// The grid-stride loop with batched loads: each iteration takes `batch` steps of the grid
/// stride; at each step the block covers its `block` consecutive elements (coalesced, as in the
/// plain loop) but rotated by one more warp per step, so a column of a row whose length divides
/// the stride does not always fall to the same warp (a few warps would otherwise see every valid
/// box of a padded batch and serialise on its loads). Every prefetched load of the thread's
/// elements is issued first, then the body runs for each in turn. The mapping depends only on
/// the grid, so results are bit-identical from run to run for a given grid.
fn write_batched_loop(
    src: &mut String,
    prefetch: &[Prefetch],
    body: &[String],
    block: u32,
    batch: u32,
    after_batch: &[&str],
) {
    let _ = writeln!(src, "    const long long kf_stride = (long long)gridDim.x * blockDim.x;");
    let _ = writeln!(
        src,
        "    // {batch} elements per thread and iteration: their loads are all in flight before the first use."
    );
    let _ = writeln!(
        src,
        "    // The block's elements at each step are rotated by one warp per step (kf_rot), so columns that a grid"
    );
    let _ = writeln!(src, "    // stride multiple of the row length would pin to one warp (e.g. the valid first boxes) spread over all warps.");
    let _ = writeln!(src, "    unsigned kf_rot = 0u; // in [0, {block})");
    let _ = writeln!(src, "    for (long long kf_i0 = (long long)blockIdx.x * blockDim.x; kf_i0 < n; kf_i0 += {batch}ll * kf_stride, kf_rot = (kf_rot + {}u) % {block}u) {{", batch * 32);
    for (k, p) in prefetch.iter().enumerate() {
        let _ = writeln!(src, "        {} kf_pf{k}[{batch}]; // {}", p.ty, p.note);
    }
    let _ = writeln!(src, "        #pragma unroll");
    let _ = writeln!(src, "        for (int kf_u = 0; kf_u < {batch}; ++kf_u) {{");
    let _ = writeln!(src, "            const long long i = kf_i0 + kf_u * kf_stride + (long long)((threadIdx.x + kf_rot + 32u * kf_u) % {block}u);");
    src.push_str("            if (i < n) {\n");
    for (k, p) in prefetch.iter().enumerate().filter(|(_, p)| p.guard.is_none()) {
        let _ = writeln!(src, "                kf_pf{k}[kf_u] = {};", p.load);
    }
    src.push_str("            }\n        }\n");
    // Loads under the first branch: its predicate (the body's lines before the branch, all
    // `const` values of the loads above) decides which are issued, still before the first use.
    if let Some(cond) = prefetch.iter().find_map(|p| p.guard.clone()) {
        let open = format!("if ({cond}) {{");
        // The branch always opens at the top level of the body; were it not found, the loads
        // would be issued for every element (correct, only more bytes).
        let (prefix, open) = match body.iter().position(|l| *l == open) {
            Some(at) => (&body[..at], open),
            None => (&body[..0], "if (true) {".to_string()),
        };
        {
            src.push_str("        // Loads needed only where the predicate holds: issued for all the elements before the first use.\n");
            let _ = writeln!(src, "        #pragma unroll");
            let _ = writeln!(src, "        for (int kf_u = 0; kf_u < {batch}; ++kf_u) {{");
            let _ = writeln!(src, "            const long long i = kf_i0 + kf_u * kf_stride + (long long)((threadIdx.x + kf_rot + 32u * kf_u) % {block}u);");
            src.push_str("            if (i < n) {\n");
            write_lines(src, prefix, "                ");
            let _ = writeln!(src, "                {open}");
            for (k, p) in prefetch.iter().enumerate().filter(|(_, p)| p.guard.is_some()) {
                let _ = writeln!(src, "                    kf_pf{k}[kf_u] = {};", p.load);
            }
            src.push_str("                }\n            }\n        }\n");
        }
    }
    let _ = writeln!(src, "        #pragma unroll");
    let _ = writeln!(src, "        for (int kf_u = 0; kf_u < {batch}; ++kf_u) {{");
    let _ = writeln!(src, "            const long long i = kf_i0 + kf_u * kf_stride + (long long)((threadIdx.x + kf_rot + 32u * kf_u) % {block}u);");
    src.push_str("            if (i >= n) break;\n");
    write_lines(src, body, "            ");
    src.push_str("        }\n");
    for l in after_batch {
        let _ = writeln!(src, "        {l}");
    }
    src.push_str("    }\n");
}
