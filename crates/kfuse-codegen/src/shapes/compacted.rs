//! The compacted shape: kernel 0 of a one-pass masked gradient under a general predicate (see
//! `onepass`), one cooperative launch. Its grid-stride loop (see `grid_stride`) queues the
//! elements whose predicate holds in shared memory; full sets of lanes compute them
//! (`kf_drain`) and list their unscaled values; past the grid barrier (see `tail`) each block
//! rescales the entries it listed.
//!
//! Not handled here: recognising the plan (`onepass`), the loop (`grid_stride`), the barrier
//! (`tail`).

use std::fmt::Write as _;

use kfuse_ir::{Dim, Graph, NodeId};

use crate::actions::{run_actions, Action};
use crate::analysis::Analysis;
use crate::cuda;
use crate::emit::{Emitter, Mode, Uses};
use crate::onepass::OnePass;
use crate::text::render;
use crate::CodegenError;

/// Entries of a block's one-pass list held in shared memory; more go to its global segment.
const LIST_SHARED: u32 = 256;

/// Inside the batched loop, after each batch: full sets of `blockDim.x` queued elements are
/// computed at once (block-uniform: every thread reads the same queue length between barriers).
pub(crate) const QUEUE_DRAIN: &[&str] = &[
    "__syncthreads(); // the batch's queue appends are visible",
    "while (kf_qn >= (int)blockDim.x) kf_drain((int)blockDim.x);",
    "__syncthreads(); // every thread has read kf_qn before the next batch appends",
];

/// After the batched loop: the queue's rest.
pub(crate) const FINAL_DRAIN: &str =
    "    __syncthreads();\n    if (kf_qn > 0) kf_drain(kf_qn); // the rest of the queue (block-uniform)\n";

/// The compaction's state: a reviewed template.
const COMPACTION_STATE: &str = include_str!("../templates/compaction_state.cuh");

/// The compaction's shared state, the block's global list segment and `kf_drain` (whose body is
/// `drain`: the queued group's work for element `i`, loads direct). Block `b`'s global segment
/// starts at the count of elements the threads of blocks `< b` own in the grid-stride loop
/// (`S` threads in all, `T = b * block`; thread `t` owns `n / S` elements, one more when
/// `t < n % S`), so its entries always fit there.
pub(crate) fn write_compaction_state(src: &mut String, block: u32, batch: u32, comps: u32, drain: &[String]) {
    let mut drain_lines = String::new();
    for l in drain {
        let _ = writeln!(drain_lines, "            {l}");
    }
    src.push_str(&render(
        COMPACTION_STATE,
        &[
            ("list_cap", &LIST_SHARED.to_string()),
            ("queue", &(block * (batch + 1)).to_string()),
            ("comps", &comps.to_string()),
            ("drain", &drain_lines),
        ],
    ));
}

/// The code after a one-pass kernel's grid barrier: the block writes `out[index] = s * h` for
/// the entries of its own list (shared memory, then its global segment), with the scale `s`
/// (`kf_scale`) that every block computed past the barrier.
pub(crate) fn rescale_lines(g: &Graph, pass: &OnePass) -> Vec<String> {
    let o = pass.output;
    let d = g.node(g.outputs[o].node).dtype;
    let c = pass.comps as usize;
    let vals: Vec<String> = (0..c).map(|k| format!("kf_s * kf_h[{k}]")).collect();
    let mut lines = vec![
        format!(
            "// After the barrier: the scale n{} is final; each block rescales the entries it listed.",
            pass.scale.0
        ),
        "const float kf_s = kf_scale;".to_string(),
        "for (int kf_j = threadIdx.x; kf_j < kf_ln; kf_j += blockDim.x) {".to_string(),
        "    long long i;".to_string(),
        format!("    float kf_h[{c}];"),
        "    if (kf_j < KF_LCAP) {".to_string(),
        "        i = kf_li[kf_j];".to_string(),
    ];
    lines.extend((0..c).map(|k| format!("        kf_h[{k}] = kf_lv[kf_j * {c} + {k}];")));
    lines.push("    } else {".to_string());
    lines.push("        const long long j = kf_list_base + (kf_j - KF_LCAP);".to_string());
    lines.push("        i = (long long)list_index[j];".to_string());
    lines.extend((0..c).map(|k| format!("        kf_h[{k}] = list_values[j * {c} + {k}];")));
    lines.push("    }".to_string());
    match cuda::vector_type(d, c as u64) {
        Some(vty) => lines.push(format!(
            "    reinterpret_cast<{vty}*>(out{o})[i] = {}; // {}",
            cuda::vector_pack(d, &vals),
            g.outputs[o].name
        )),
        None => {
            for (k, v) in vals.iter().enumerate() {
                lines.push(format!("    out{o}[i * {c} + {k}] = {};", cuda::store_conversion(d, v)));
            }
        }
    }
    lines.push("}".to_string());
    lines
}

/// The queued group's work (`then`, the actions of element `i` with direct loads) as the body
/// of `kf_drain`, numbered from `first_var`: its lines, what they use, and the next free value
/// number.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_drain(
    g: &Graph,
    an: &Analysis,
    k: usize,
    dims: &[Dim],
    substitutions: &std::collections::HashMap<NodeId, String>,
    then: &[Action],
    first_var: u32,
) -> Result<(Vec<String>, Uses, u32), CodegenError> {
    let mut dem = Emitter::new(g, Some(an), Mode::Element { kernel: k }, dims.to_vec(), first_var);
    dem.substitutions = substitutions.clone();
    run_actions(&mut dem, g, then)?;
    let next_var = dem.next_var();
    let (lines, uses) = dem.into_lines();
    Ok((lines, uses, next_var))
}
