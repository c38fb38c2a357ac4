//! A kernel's epilogue: its scalar outputs and the scalars it passes to a later kernel (Temp
//! buffers), computed once from the folded reductions (`r<slot>`). A compacted kernel computes
//! it in every block past its grid barrier (block 0 writes the outputs; the scale goes to
//! `kf_scale`); the rows plan computes its crossing scalars from the count instead (see
//! `shapes::rows`).
//!
//! Not handled here: where the epilogue runs (see `tail`).

use std::collections::HashMap;

use kfuse_ir::{Graph, NodeId};

use crate::analysis::{Analysis, KernelInfo};
use crate::cuda;
use crate::emit::{temp_dtype, Emitter, Mode, Uses};
use crate::onepass::OnePass;
use crate::CodegenError;

/// Who computes a kernel's epilogue.
#[derive(Clone, Copy)]
pub(crate) enum EpilogueRun<'a> {
    /// One thread of the last block; Temp values are stored for a later kernel.
    LastBlock,
    /// Every block of a compacted one-pass kernel: block 0 writes the scalar outputs, the scale
    /// of `pass` goes to `kf_scale` (the other crossing scalars became literals).
    EveryBlock { pass: &'a OnePass },
    /// The rows plan: the crossing scalars are computed from the count, not here.
    RowsPlan,
}

/// The epilogue's lines and what they use.
pub(crate) struct Epilogue {
    pub lines: Vec<String>,
    pub uses: Uses,
    /// The Temp buffers it stores.
    pub temps_written: Vec<usize>,
}

/// The epilogue of kernel `k` (`info`), its values numbered from `first_var`; the scalar
/// outputs it writes are added to `outputs_written`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_epilogue(
    g: &Graph,
    an: &Analysis,
    k: usize,
    info: &KernelInfo,
    first_var: u32,
    slot_results: HashMap<NodeId, Vec<String>>,
    run: EpilogueRun,
    outputs_written: &mut Vec<usize>,
) -> Result<Epilogue, CodegenError> {
    let mut ep = Emitter::new(g, Some(an), Mode::Epilogue { kernel: k }, Vec::new(), first_var);
    ep.slot_results = slot_results;
    for &o in &info.scalar_outputs {
        let node = g.outputs[o].node;
        let v = ep.eval(node, &[])?;
        let d = g.node(node).dtype;
        ep.note_conversion(d);
        // One pass: every block computes the epilogue past the grid barrier; block 0 writes.
        let only = if matches!(run, EpilogueRun::EveryBlock { .. }) { "if (blockIdx.x == 0) " } else { "" };
        ep.push_stmt(format!("{only}out{o}[0] = {}; // output {}", cuda::store_conversion(d, &v), g.outputs[o].name));
        outputs_written.push(o);
    }
    let mut temps_written = Vec::new();
    for &n in &info.temp_writes {
        let t = *an.temps.get(&n).ok_or(CodegenError::Internal { node: n.0, what: "temp write without a temp" })?;
        match run {
            // Each block computes them from the count (see `shapes::rows`).
            EpilogueRun::RowsPlan => continue,
            // One pass: only the scale is read (after the grid barrier, from shared memory); the
            // others became literals.
            EpilogueRun::EveryBlock { pass } => {
                if pass.scale == n {
                    let v = ep.eval(n, &[])?;
                    ep.push_stmt(format!("kf_scale = {v}; // n{} for this block's rescale", n.0));
                }
                continue;
            }
            EpilogueRun::LastBlock => {}
        }
        let reader = "a later kernel";
        let v = ep.eval(n, &[])?;
        ep.push_stmt(format!(
            "tmp{t}[0] = {}; // n{} for {reader}",
            cuda::store_conversion(temp_dtype(g.node(n).dtype), &v),
            n.0
        ));
        temps_written.push(t);
    }
    let (lines, uses) = ep.into_lines();
    Ok(Epilogue { lines, uses, temps_written })
}
