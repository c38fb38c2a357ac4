//! The grid-stride shape: the kernel loops over its flat domain with a `kf_index` (32-bit by
//! default, 64-bit with `WIDE_INDEX_OPTION`; the compacted shape's is always 64-bit), its sinks
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
use crate::text::{render, write_lines};
use crate::CodegenError;

/// Emits every group's actions into `em` (the body of one element `i`), a predicate's branch
/// around the actions it guards; when `batched`, the body's loads are prefetched (those of the
/// first group's branch under it). Inputs loaded outside any branch go into `unconditional`. A
/// group with a one-pass `Append` (the compacted shape) queues its elements instead: its index
/// is returned, for `kf_drain`.
pub(crate) fn emit_groups(
    em: &mut Emitter,
    g: &Graph,
    groups: &[Group],
    unconditional: &mut BTreeSet<u32>,
    batched: bool,
) -> Result<Option<usize>, CodegenError> {
    let mut compacted = None;
    if batched {
        em.prefetch = Some(Vec::new());
    }
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

/// The elements a batched loop takes per iteration: `requested` (the elements per thread of the
/// options) for loads of up to 4 registers an element, halved while the batch's loads would hold
/// more than `4 * requested` registers. All of a batch's loads are live until the body uses them,
/// so two float4 inputs at 4 elements held 32 registers of the 64 a thread has at 1024 threads a
/// multiprocessor: on an H100 the backend's CIoU gradient kernel spilled 48 bytes and took
/// 258 µs where 2 elements took 137 µs (`bench/ab/run`, bench/RESULTS.md). The loads in flight
/// a multiprocessor stay at 64 KB, which the count of a box batch's valid boxes (one float4 an
/// element, 4 elements) reads at 88% of copy bandwidth.
pub(crate) fn batch(prefetch: &[Prefetch], requested: u32) -> u32 {
    let per_element: u32 = prefetch.iter().map(|p| p.regs).sum();
    let mut b = requested;
    while b > 1 && b * per_element > 4 * requested {
        b /= 2;
    }
    b
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
        src.push_str("    for (kf_index i = (kf_index)blockIdx.x * (kf_index)blockDim.x + (kf_index)threadIdx.x; i < n; i += (kf_index)gridDim.x * (kf_index)blockDim.x) {\n");
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
    let (block_s, batch_s) = (block.to_string(), batch.to_string());
    let mut prefetch_decls = String::new();
    let (mut loads, mut guarded) = (String::new(), String::new());
    for (k, p) in prefetch.iter().enumerate() {
        let _ = writeln!(prefetch_decls, "        {} kf_pf{k}[{batch}]; // {}", p.ty, p.note);
        match p.guard {
            None => {
                let _ = writeln!(loads, "                kf_pf{k}[kf_u] = {};", p.load);
            }
            Some(_) => {
                let _ = writeln!(guarded, "                    kf_pf{k}[kf_u] = {};", p.load);
            }
        }
    }
    // Loads under the first branch: its predicate (the body's lines before the branch, all
    // `const` values of the loads above) decides which are issued, still before the first use.
    let mut guarded_loads = String::new();
    if let Some(cond) = prefetch.iter().find_map(|p| p.guard.clone()) {
        let open = format!("if ({cond}) {{");
        // The branch always opens at the top level of the body; were it not found, the loads
        // would be issued for every element (correct, only more bytes).
        let (prefix, open) = match body.iter().position(|l| *l == open) {
            Some(at) => (&body[..at], open),
            None => (&body[..0], "if (true) {".to_string()),
        };
        let mut prefix_lines = String::new();
        write_lines(&mut prefix_lines, prefix, "                ");
        let open = format!("                {open}\n");
        guarded_loads = render(
            BATCHED_GUARDED,
            &[
                ("batch", &batch_s),
                ("block", &block_s),
                ("prefix", &prefix_lines),
                ("open", &open),
                ("loads", &guarded),
            ],
        );
    }
    let mut body_lines = String::new();
    write_lines(&mut body_lines, body, "            ");
    let mut after = String::new();
    for l in after_batch {
        let _ = writeln!(after, "        {l}");
    }
    src.push_str(&render(
        BATCHED,
        &[
            ("batch", &batch_s),
            ("block", &block_s),
            ("rot_step", &(batch * 32).to_string()),
            ("prefetch_decls", &prefetch_decls),
            ("loads", &loads),
            ("guarded_loads", &guarded_loads),
            ("body", &body_lines),
            ("after_batch", &after),
        ],
    ));
}

/// The batched loop and its loads under the first branch: reviewed templates.
const BATCHED: &str = include_str!("../templates/batched_loop.cuh");
const BATCHED_GUARDED: &str = include_str!("../templates/batched_loop_guarded.cuh");
