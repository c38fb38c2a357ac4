//! kfuse-codegen: fusion planning and CUDA C++ generation. Pure Rust: no GPU, no I/O.
//!
//! [`plan()`] turns a verified [`Graph`] into a [`Plan`]: the device buffers a run needs and the
//! kernels to launch in order, each a header-free CUDA C++ translation unit (compile with NVRTC for
//! sm_80 or newer). [`emit_device_function`] turns a scalar graph (an MLP activation) into a
//! `__device__` function to inline into another kernel.
//!
//! # What the generated kernels do
//! - The graph is fused into as few kernels as its data dependencies allow: one per (reduction
//!   level, domain). A full reduction whose result feeds element work again (`x / sum(x)`) ends a
//!   level; its scalar crosses to the next kernel through a one-element Temp buffer.
//! - Each kernel runs a grid-stride loop over its domain with a flat index: 32-bit in the default
//!   build, which the executor launches where the domain and every buffer hold fewer than 2^30
//!   elements, 64-bit in the build with `WIDE_INDEX_OPTION` (compiled when first needed). When the body
//!   loads inputs at the flat index outside any branch, the loop is batched: each thread takes 4
//!   elements per iteration (a block's elements at each stride step rotated by one warp per step,
//!   so columns that a stride multiple of the row would pin to a few warps spread over all of
//!   them), issues all their loads first,
//!   then runs the body for each; such kernels cap registers at 64 (`__launch_bounds__(block,
//!   1024 / block)`) and launch exactly the blocks that are resident at once. A small
//!   constant last axis (≤ 8, e.g. the 4 box coordinates of `[B, N, 4]`) is kept per thread as
//!   components and moved as one vector load/store (`float4` for f32 × 4, `uint2` for f16 × 4).
//! - Sinks guarded by the same predicate (masked reductions, `count(m)`, outputs that are
//!   `where(m, a, b)`) share one `if (m)`; loads needed only inside it are issued inside it, so
//!   padded elements cost only the read of what the predicate needs.
//! - Last-axis reductions loop over the row in the thread that owns the row (one pass per
//!   reduction; `softmax`-like chains re-read the row).
//! - Full reductions: per-thread f64 accumulators, a block reduction in a fixed order (warp
//!   shuffles), one f64 partial per slot per block, a `__threadfence` + ticket (`atomicAdd` on a
//!   counter): the last block folds all partials in a fixed order, computes the scalar epilogue
//!   (e.g. `sum / max(count, 1)`), writes scalar outputs and resets the counter to 0. No float
//!   atomics: results are bit-identical from run to run for a given grid size. f64 is used from
//!   the first addition on, so float sums lose nothing to the accumulation order.
//! - Row mode: when every sink of a kernel shares a lengths mask `iota(last) < b[.., None]`
//!   (`mask(lengths)`), one warp takes one row (grid-stride over rows; a kernel with nothing to
//!   do past a row's bound gives a row 32 down to 4 lanes instead, the most with which the grid
//!   covers every row in one pass), its lanes stride over
//!   `[0, clamp(b, 0, N))` for the masked work and over the rest for the `else` values: padding
//!   costs no predicate evaluation, no division. An all-zero `else` output (a gradient's padding)
//!   is one byte range per row, zeroed first with 16-byte streaming stores across elements.
//! - One pass: a masked output `where(m, s * h, 0)` that needs a scale `s` from full reductions
//!   is computed unscaled in the reduction kernel and listed (index, h) where `m` holds; after a
//!   grid-wide barrier (a cooperative launch) each block rescales the entries it listed, so a
//!   loss and its gradient are one launch (see `onepass`).
//! - Index division for broadcast operands is 32-bit whenever the flat index and divisor fit.
//! - Float arithmetic is f32 whatever the storage dtype; f16/bf16 are read and written directly
//!   with inline-PTX conversions; `min`/`max` propagate NaN; i32 arithmetic wraps.
//! - Stages: a reduction along axes other than the last whose result is read back at the
//!   elements it reduces (`x - mean(x, axis: 0, keepdim: true)`, a batch norm's statistics) is
//!   computed once by kernels of its own and stored (see `stages`); the kernels after it read it.
//!
//! # Where things live
//! - `stages` splits a graph with reductions to store into graphs planned one after another;
//!   `analysis` splits a graph into kernels and sinks; `onepass` recognises a loss and its
//!   scaled gradient that can be one launch.
//! - `kernel` assembles one kernel: its sinks become grouped actions (`sinks`, `actions`), its
//!   shape is chosen once (`shapes::KernelShape`: grid-stride, compacted, warp per row, row
//!   groups, rows), then the shape's module in `shapes/` writes its loop; the epilogue
//!   (`epilogue`), parameters (`signature`), zero fills (`fill`) and reduction tails (`tail`) are
//!   shared. No two modules import each other.
//! - `emit` turns expressions into CUDA statements; `cuda` spells types, literals and helpers.
//! - `scale` is the one fixed kernel outside plans: a gradient scaled in place by its loss's
//!   upstream gradient, skipped on the device when that is 1 (the fused loss + gradient's backward).
//! - Fixed CUDA lives in reviewed templates under `src/templates/*.cuh`, embedded with
//!   `include_str!` and rendered by `text::render` (`{{name}}` placeholders; lines starting with
//!   `//~` are notes for the reader and are not emitted).
//!
//! A reduction along the last axis that an emitted kernel reads again at every element (read
//! back in a kernel that does not run over its rows, `transpose(mean(transpose(x), axis: -1))`)
//! is named by that kernel ([`Kernel::recomputed`]) and stored the same way, planning again.
//! [`Kernel::recompute`] counts what is left (`kfuse check --plan` warns of kernels where it is
//! large); no program is known to leave any.
#![forbid(unsafe_code)]

mod actions;
mod analysis;
mod buffers;
mod check;
mod cuda;
mod emit;
mod epilogue;
mod error;
mod fill;
mod kernel;
mod onepass;
mod plan;
mod row_cache;
mod scale;
mod shapes;
mod signature;
mod sinks;
mod stages;
mod tail;
mod text;

use kfuse_ir::{verify, Graph, Kind, NodeId, Op};

pub use analysis::MAX_COMPONENTS;
pub use error::CodegenError;
pub use plan::{
    column_chunks, row_lanes, BufferDecl, BufferKind, CodegenOptions, ElemType, FoldEntry, GridSpec, Kernel, Launch,
    LengthsGradient, Param, Plan, RegisterRows, SizeExpr, ViolationKind, COLUMN_BLOCKS_PER_SM, COLUMN_MIN_CHUNK_ROWS,
    ERROR_RECORD_WORDS, NARROW_INDEX_LIMIT, ROW_COLS_PER_LANE, ROW_MIN_LANES, WIDE_INDEX_OPTION,
};
pub use scale::{scale_by_upstream_source, SCALE_BLOCK};
pub use stages::{Stages, RECOMPUTED_EXTENT_LIMIT};

use emit::{temp_dtype, Emitter, Mode};

/// The most named values (`v<k>`, about one per node and place it is computed at) one kernel's
/// code may have: about 100 MB of CUDA source. Past it, planning stops with
/// [`CodegenError::TooLarge`] instead of using ever more time and memory.
pub const MAX_KERNEL_VALUES: u32 = 2_000_000;

/// The graph whose kernels compute `graph`'s outputs, where it differs: an output that is a
/// reshape of a tensor computed in the graph stores that tensor instead (the same elements in the
/// same row-major order, so the same bytes in the output's buffer), so that its kernel's domain is
/// the tensor's shape (a softmax over attention heads keeps its rows, written as one row of the
/// merged heads). `None` when no output is such a reshape.
fn stores_through_reshapes(graph: &Graph) -> Option<Graph> {
    let through = |node: NodeId| match graph.node(node).op {
        Op::Reshape(x) if !graph.node(x).shape.is_scalar() && !graph.node(node).shape.is_scalar() => Some(x),
        _ => None,
    };
    if graph.outputs.iter().all(|o| through(o.node).is_none()) {
        return None;
    }
    let mut g = graph.clone();
    for o in &mut g.outputs {
        if let Some(x) = through(o.node) {
            o.node = x;
        }
    }
    Some(g)
}

/// Plans and generates the kernels that compute every output of `graph`.
///
/// The same graph and options always give the same plan, byte for byte.
pub fn plan(graph: &Graph, opts: &CodegenOptions) -> Result<Plan, CodegenError> {
    Ok(plan_storing(graph, opts)?.0)
}

/// The stages [`plan`] plans `graph` in: its graph split into graphs, each computing values
/// stored for the next (see [`Stages`]); `None` when it stores nothing. Run through the
/// interpreter one after another, they give the graph's outputs (what the tests check).
pub fn stage_graphs(graph: &Graph, opts: &CodegenOptions) -> Result<Option<Stages>, CodegenError> {
    let forced = plan_storing(graph, opts)?.1;
    Ok(stages::split(graph, &forced))
}

/// [`plan`] (its checks done) and the reductions it stores beyond those `stages::split` finds.
///
/// Reductions computed where they are used that a kernel reads again at every element are
/// stored once (see `stages`): those `stages::split` finds in the graph, then any the emitted
/// kernels report (a last-axis reduction read back in a kernel over other rows), planning again
/// until none is left or none can be stored.
fn plan_storing(
    graph: &Graph,
    opts: &CodegenOptions,
) -> Result<(Plan, std::collections::BTreeSet<kfuse_ir::NodeId>), CodegenError> {
    verify(graph)?;
    if graph.outputs.is_empty() {
        return Err(CodegenError::NoOutputs);
    }
    if !opts.block_size.is_multiple_of(32) || !(32..=1024).contains(&opts.block_size) {
        return Err(CodegenError::BadBlockSize { block_size: opts.block_size });
    }
    let t = opts.batched_threads_per_sm;
    if !t.is_multiple_of(opts.block_size) || !(opts.block_size..=2048).contains(&t) {
        return Err(CodegenError::BadThreadsPerSm { threads: t, block_size: opts.block_size });
    }
    if !(1..=16).contains(&opts.elems_per_thread) {
        return Err(CodegenError::BadElemsPerThread { elems_per_thread: opts.elems_per_thread });
    }
    let mut forced = std::collections::BTreeSet::new();
    loop {
        let plan = plan_stages(graph, opts, &forced)?;
        let more: Vec<kfuse_ir::NodeId> = plan
            .kernels
            .iter()
            .flat_map(|k| k.recomputed.iter())
            .map(|&n| kfuse_ir::NodeId(n))
            .filter(|n| n.index() < graph.nodes.len() && stages::storable(graph, *n) && !forced.contains(n))
            .collect();
        if more.is_empty() {
            return Ok((plan, forced));
        }
        forced.extend(more);
    }
}

/// Plans `graph` in stages (see `stages`), storing the reductions `split` finds and `forced`.
fn plan_stages(
    graph: &Graph,
    opts: &CodegenOptions,
    forced: &std::collections::BTreeSet<kfuse_ir::NodeId>,
) -> Result<Plan, CodegenError> {
    match stages::split(graph, forced) {
        None => plan_stage(graph, opts),
        Some(stages) => {
            let early = stages
                .early
                .iter()
                .map(|(g, outs)| Ok((plan_stage(g, opts)?, outs.clone())))
                .collect::<Result<Vec<_>, CodegenError>>()?;
            let last = stages.last.as_ref().map(|g| plan_stage(g, opts)).transpose()?;
            Ok(stages::merge(graph, &stages, early, last, opts.strided_inputs.clone()))
        }
    }
}

/// Plans one stage (see `stages`): a graph with no reduction to store.
fn plan_stage(graph: &Graph, opts: &CodegenOptions) -> Result<Plan, CodegenError> {
    let (interface, hash) = (kfuse_ir::Interface::of(graph), graph.stable_hash());
    let stored = stores_through_reshapes(graph);
    let graph = stored.as_ref().unwrap_or(graph);
    for (k, &input) in opts.strided_inputs.iter().enumerate() {
        let why = match graph.inputs.get(input as usize) {
            _ if k > 0 && opts.strided_inputs[k - 1] >= input => "the list is not in ascending order",
            None => "the graph has no such input",
            Some(_) if graph.constraints.iter().any(|c| c.input().0 == input) => {
                "it holds lengths or offsets, which the kernels read as one contiguous array"
            }
            Some(_) => continue,
        };
        return Err(CodegenError::StridedInput { input, why });
    }
    let mut an = analysis::analyse(graph, analysis::Defer { rows: true, full: false }, &opts.strided_inputs)?;

    let mut buffers = Vec::new();
    for (i, inp) in graph.inputs.iter().enumerate() {
        let elems = buffers::size_expr(inp.shape.dims())?;
        buffers.push(BufferDecl {
            kind: BufferKind::Input(kfuse_ir::InputId(i as u32)),
            elem: ElemType::Tensor(inp.dtype),
            elems,
        });
    }
    let outputs_base = buffers.len();
    for (o, out) in graph.outputs.iter().enumerate() {
        let node = graph.node(out.node);
        let elems =
            buffers::size_expr(node.shape.dims()).map_err(|_| CodegenError::SizeOverflow { node: out.node.0 })?;
        buffers.push(BufferDecl { kind: BufferKind::Output(o), elem: ElemType::Tensor(node.dtype), elems });
    }
    let mut pass = onepass::detect(graph, &an, opts.lengths_gradient);
    if pass.is_none() {
        // No one-pass plan: a full reduction moves into the element kernel after it where that
        // kernel reads its inputs anyway.
        an = analysis::analyse(graph, analysis::Defer { rows: true, full: true }, &opts.strided_inputs)?;
    }
    let mut rows = shapes::row_wise::plan_rows(graph, &mut an, pass.is_some());
    // A row result deferred into a kernel that does not compute its rows once per row (the
    // one-pass plan took it, or an earlier kernel stores those rows' reductions) stays in a
    // kernel of its own: plan again without deferring.
    let computes_rows = |r: &shapes::row_wise::KernelRows| {
        r.plan.as_ref().is_some_and(|p| p.case == shapes::row_wise::RowCase::Elements)
    };
    if an.kernels.iter().zip(&rows).any(|(info, r)| analysis::has_row_results(graph, info) && !computes_rows(r)) {
        an = analysis::analyse(graph, analysis::Defer { rows: false, full: pass.is_none() }, &opts.strided_inputs)?;
        pass = onepass::detect(graph, &an, opts.lengths_gradient);
        rows = shapes::row_wise::plan_rows(graph, &mut an, pass.is_some());
    }
    // Kernels without row reductions may reduce columns (not kernel 0 under a one-pass plan).
    let column_plans: Vec<Option<shapes::columns::Columns>> = an
        .kernels
        .iter()
        .zip(&rows)
        .enumerate()
        .map(|(k, (info, r))| match (&r.plan, k == 0 && pass.is_some()) {
            (None, false) => shapes::columns::detect(graph, info, &r.evaluated),
            _ => None,
        })
        .collect();
    // Elementwise kernels over rows of a wide last axis take the row-wise shape without
    // reductions (see `row_wise::elementwise`), decided here so that their sums can be fused below.
    if pass.is_none() {
        for (k, r) in rows.iter_mut().enumerate() {
            if r.plan.is_none() && column_plans[k].is_none() {
                r.plan = kernel::elementwise_rows(graph, &an, k)?;
            }
        }
    }
    // A column kernel whose sums an earlier row kernel can take as it goes folds its partial sums
    // instead of reading the rows again (not under a one-pass plan, whose kernel 0 runs alone).
    let mut column_partials = vec![None; an.kernels.len()];
    let mut folds: Vec<Option<shapes::columns::Columns>> = vec![None; an.kernels.len()];
    for c in 0..an.kernels.len() {
        let Some(plan) = column_plans[c].as_ref().filter(|_| pass.is_none()) else { continue };
        let Some((a, operands)) = shapes::columns::fuse(graph, &an, &rows, c, plan) else { continue };
        // The row kernel's shared array holds its row groups' sums: at most 32 KiB.
        if operands.len() as u64 * u64::from(opts.block_size) > 512 {
            continue;
        }
        let Some(row_plan) = rows[a].plan.as_mut().filter(|p| p.column_sums.is_empty()) else { continue };
        let mut elems = buffers::size_expr(&an.kernels[c].dims)?;
        elems.constant =
            elems.constant.checked_mul(operands.len() as u64).ok_or(CodegenError::SizeOverflow { node: 0 })?;
        buffers.push(BufferDecl {
            kind: BufferKind::ColumnPartials { kernel: a },
            elem: ElemType::Tensor(kfuse_ir::DType::F32),
            elems,
        });
        let buffer = buffers.len() - 1;
        row_plan.column_sums = operands;
        column_partials[a] = Some(buffer);
        column_partials[c] = Some(buffer);
        folds[c] =
            Some(shapes::columns::Columns { from: Some(shapes::columns::FromRows { kernel: a }), ..plan.clone() });
    }
    let temps_base = buffers.len();
    let mut temps: Vec<(usize, kfuse_ir::NodeId)> = an.temps.iter().map(|(&n, &t)| (t, n)).collect();
    temps.sort();
    for (_, n) in temps {
        let node = graph.node(n);
        let elems = buffers::size_expr(node.shape.dims()).map_err(|_| CodegenError::SizeOverflow { node: n.0 })?;
        buffers.push(BufferDecl { kind: BufferKind::Temp, elem: ElemType::Tensor(temp_dtype(node.dtype)), elems });
    }
    // The rows plan's blocks have a fixed size; the default block size stands for it.
    let rows_block = shapes::rows::ROWS_BLOCK;
    if pass.as_ref().is_some_and(|p| p.rows)
        && opts.block_size != rows_block
        && opts.block_size != CodegenOptions::default().block_size
    {
        return Err(CodegenError::RowsPlanBlockSize { block_size: opts.block_size, rows_block });
    }
    let mut reduction = Vec::new();
    for (k, info) in an.kernels.iter().enumerate() {
        // The rows plan's counts of the mask have no slot: they come from its arrival word.
        let counted = match &pass {
            Some(p) if k == 0 => p.counts.len() as u32,
            _ => 0,
        };
        let slots = info.slots.saturating_sub(counted);
        let rows = k == 0 && pass.as_ref().is_some_and(|p| p.rows);
        if let Some(c) = &column_plans[k] {
            // A column kernel: partials per block (an accumulator's 32 columns after another)
            // and a ticket per tile of 32 columns (one counter per column is enough).
            buffers.push(BufferDecl {
                kind: BufferKind::Partials { kernel: k, slots_per_block: c.accs * shapes::columns::TILE },
                elem: ElemType::F64,
                elems: SizeExpr::constant(u64::from(c.accs * shapes::columns::TILE)),
            });
            buffers.push(BufferDecl {
                kind: BufferKind::Counter { kernel: k },
                elem: ElemType::U32,
                elems: buffers::size_expr(&info.dims)?,
            });
            reduction.push(Some((Some(buffers.len() - 2), buffers.len() - 1)));
            continue;
        }
        if slots == 0 && !rows {
            reduction.push(None);
            continue;
        }
        // A compacted one-pass kernel 0 is cooperative: its counter is the grid barrier's pair.
        // A rows-plan kernel's is its ticket, a spare word, and its 64-bit arrival word.
        let counters = match &pass {
            Some(p) if k == 0 => {
                if p.rows {
                    4
                } else {
                    2
                }
            }
            _ => 1,
        };
        let p = (slots > 0).then(|| {
            buffers.push(BufferDecl {
                kind: BufferKind::Partials { kernel: k, slots_per_block: slots },
                elem: ElemType::F64,
                elems: SizeExpr::constant(u64::from(slots)),
            });
            buffers.len() - 1
        });
        buffers.push(BufferDecl {
            kind: BufferKind::Counter { kernel: k },
            elem: ElemType::U32,
            elems: SizeExpr::constant(counters),
        });
        reduction.push(Some((p, buffers.len() - 1)));
    }
    let onepass = match pass {
        // The rows plan lists nothing.
        Some(pass) if pass.rows => Some(onepass::OnePassBuffers { pass, list: None }),
        Some(pass) => {
            let dims = &an.kernels[0].dims;
            let elems = buffers::size_expr(dims)?;
            let mut values = elems.clone();
            values.constant =
                values.constant.checked_mul(u64::from(pass.comps)).ok_or(CodegenError::SizeOverflow { node: 0 })?;
            let first = buffers.len();
            buffers.push(BufferDecl { kind: BufferKind::Scratch { kernel: 0 }, elem: ElemType::U64, elems });
            buffers.push(BufferDecl {
                kind: BufferKind::Scratch { kernel: 0 },
                elem: ElemType::Tensor(kfuse_ir::DType::F32),
                elems: values,
            });
            if reduction[0].is_none() {
                return Err(CodegenError::Internal { node: pass.scale.0, what: "one-pass kernel 0 without partials" });
            }
            Some(onepass::OnePassBuffers { pass, list: Some((first, first + 1)) })
        }
        None => None,
    };
    let index = buffers::BufferIndex { outputs_base, temps_base, reduction, onepass, column_partials };
    // One pass: kernel 0 also does kernel 1's work, after its grid barrier.
    let launched = if index.onepass.is_some() { 1 } else { an.kernels.len() };
    let mut kernels = (0..launched)
        .map(|k| {
            kernel::emit_kernel(
                graph,
                (&an, rows[k].plan.as_ref(), column_plans[k].as_ref()),
                k,
                launched,
                opts,
                &hash,
                &index,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    // Column kernels whose sums a row kernel's entry for rows in registers takes: their entry
    // that folds those sums.
    for (k, fold) in folds.iter().enumerate().take(launched) {
        let Some(fold) = fold else { continue };
        let after = fold.from.map_or(0, |f| f.kernel);
        let f = kernel::emit_kernel(graph, (&an, None, Some(fold)), k, launched, opts, &hash, &index)?;
        kernels[k].fold = Some(FoldEntry { source: f.source, entry: f.name, params: f.params, after });
    }
    Ok(Plan { graph_hash: hash, interface, buffers, kernels, strided_inputs: opts.strided_inputs.clone() })
}

/// Emits `__device__ __forceinline__ float fn_name(float in0, ...)` computing the single scalar
/// float output of a graph whose inputs are all scalar floats (one parameter per input, in
/// declaration order). The text is header-free; the helpers it needs are included under
/// `#ifndef` guards, so several such functions can share one translation unit.
pub fn emit_device_function(graph: &Graph, fn_name: &str) -> Result<String, CodegenError> {
    verify(graph)?;
    let valid_name = fn_name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && fn_name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_name {
        return Err(CodegenError::BadFunctionName { name: fn_name.to_string() });
    }
    for inp in &graph.inputs {
        if !inp.shape.is_scalar() || !inp.dtype.is_float() {
            return Err(CodegenError::DeviceFunctionInput {
                name: inp.name.clone(),
                dtype: inp.dtype.to_string(),
                shape: graph.shape_str(&inp.shape),
            });
        }
    }
    let [out] = graph.outputs.as_slice() else {
        return Err(CodegenError::DeviceFunctionOutputs { count: graph.outputs.len() });
    };
    let node = graph.node(out.node);
    if !node.shape.is_scalar() || node.dtype.kind() != Kind::Float {
        return Err(CodegenError::DeviceFunctionOutput {
            name: out.name.clone(),
            dtype: node.dtype.to_string(),
            shape: graph.shape_str(&node.shape),
        });
    }
    let mut em = Emitter::new(graph, None, Mode::DeviceFn, Vec::new(), 0);
    let v = em.eval(out.node, &[])?;
    em.push_stmt(format!("return {v};"));
    let (lines, uses) = em.into_lines();
    let mut src = String::new();
    for h in &uses.helpers {
        src.push_str(&cuda::helper_source(*h));
    }
    let params: Vec<String> =
        graph.inputs.iter().enumerate().map(|(i, inp)| format!("float in{i} /* {} */", inp.name)).collect();
    src.push_str(&format!("// kfuse device function for graph {}: output {}\n", graph.stable_hash(), out.name));
    src.push_str(&format!("__device__ __forceinline__ float {fn_name}({}) {{\n", params.join(", ")));
    for l in lines {
        src.push_str(&format!("    {l}\n"));
    }
    src.push_str("}\n");
    Ok(src)
}
