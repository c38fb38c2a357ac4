//! Kernel assembly: a kernel's sinks become grouped actions (`sinks`), its shape is chosen once
//! (`shapes::KernelShape`), the shape's loop body, the epilogue (`epilogue`) and the parameters
//! (`signature`) are emitted, and the translation unit is written: header, helpers, signature
//! with one commented parameter per line, the shape's prelude and loop, and its tail (`tail`).
//!
//! Index type: a grid-stride kernel's flat index `i` is a `kf_index`, 32-bit in the source as
//! built by default and 64-bit when built with [`crate::plan::WIDE_INDEX_OPTION`]. Sizes are
//! run-time values, so a plan cannot know that a domain stays small: the executor launches the
//! 32-bit build where the domain and every buffer the kernel indexes hold fewer than 2^30
//! elements ([`Kernel::narrow_fits`]; a step of the grid stride past that still fits in 31 bits),
//! and the 64-bit build, compiled when first needed, otherwise. The 64-bit index held for every
//! element of a batch took registers from bodies with many live values: on an H200 the CIoU
//! loss's backward spilled, and its 32-bit build took 18% less time, the box losses' other kernels
//! 2-5% less (bench/RESULTS.md). The other shapes index with 64 bits. Coordinates are derived only
//! when a broadcast operand needs them (never for operands shaped like the domain, which use `i`
//! directly), through `kf_div`/`kf_mod`: 32-bit
//! division when the index and divisor fit in 32 bits (decided at run time, a warp-uniform branch
//! in practice), 64-bit otherwise. In row mode (lengths masks, row-wise kernels, elementwise
//! work over rows of a wide last axis) the row and column are loop variables and no division
//! happens per element: measured on an H200, the division made a GELU over [16384, 4096]
//! instruction-bound (bf16 as slow as f32, 2.5x slower than by rows).
//!
//! Not handled here: expression emission (see `emit`), the buffer list (see `lib`).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kfuse_ir::{Graph, GraphHash, InputId, NodeId};

use crate::actions::{row_mode_bound, Combine};
use crate::analysis::{Analysis, SinkKind};
use crate::buffers::BufferIndex;
use crate::cuda::{self, Helper};
use crate::emit::{Coord, Emitter, Mode};
use crate::epilogue::{emit_epilogue, EpilogueRun};
use crate::plan::{GridSpec, Kernel, RegisterRows};
use crate::shapes::{columns, compacted, grid_stride, row_groups, row_wise, rows, warp_per_row, KernelShape};
use crate::signature::{params, SignatureParts};
use crate::tail::{write_barrier_tail, write_plain_tail};
use crate::{check, sinks, CodegenError, CodegenOptions};

/// The row-wise plan without reductions that kernel `k` takes when the planner gave it no other
/// (see `row_wise::elementwise`): elementwise work over rows of a wide last axis, so that no
/// element derives its coordinates by division and the rows that fit the lanes' registers move
/// as vectors. Decided before any kernel is emitted (not under a one-pass plan), so that a column
/// kernel can fold sums this kernel takes as it goes (see `columns::fuse`).
pub(crate) fn elementwise_rows(g: &Graph, an: &Analysis, k: usize) -> Result<Option<row_wise::RowWise>, CodegenError> {
    let info = &an.kernels[k];
    let dom: Vec<Coord> = (0..info.dims.len() as u32).map(Coord::Dom).collect();
    let mut em = Emitter::new(g, Some(an), Mode::Element { kernel: k }, info.dims.clone(), 0);
    let sinks = sinks::collect(&mut em, g, info, &dom, &[])?;
    let row_bound = row_mode_bound(&em, g, &info.dims, &dom, &sinks.groups);
    let shape = KernelShape::choose(None, row_bound.is_some(), false, false, info.dims.last().copied(), &sinks.groups);
    Ok(row_wise::elementwise(g, info, shape, sinks.slots.len(), em.checks))
}

pub(crate) fn emit_kernel(
    g: &Graph,
    (an, row_wise, column_wise): (&Analysis, Option<&row_wise::RowWise>, Option<&columns::Columns>),
    k: usize,
    launched: usize,
    opts: &CodegenOptions,
    hash: &GraphHash,
    buffers: &BufferIndex,
) -> Result<Kernel, CodegenError> {
    let info = &an.kernels[k];
    // A column kernel's fold entry (see `columns::fuse`) is named after the kernel.
    let fold = if column_wise.is_some_and(|c| c.from.is_some()) { "_fold" } else { "" };
    let name = format!("kf_{}_{k}{fold}", hash.short());
    let dom: Vec<Coord> = (0..info.dims.len() as u32).map(Coord::Dom).collect();
    let mut em = Emitter::new(g, Some(an), Mode::Element { kernel: k }, info.dims.clone(), 0);

    // The one-pass plan's buffers (kernel 0 only), and the rows plan's counts of the mask, which
    // take no partial slot: the tail reads the count `kf_cntd` of the arrival word (see `shapes::rows`).
    let onepass = buffers.onepass.as_ref().filter(|_| k == 0);
    let mask_counts: &[NodeId] = onepass.map_or(&[], |b| &b.pass.counts);

    // Sinks become actions, grouped by the predicate that guards them; full reductions take
    // partial slots in sink order. One pass: this kernel also computes the masked output.
    let sinks::Sinks { slots, mut groups, row_groups, slot_results, notes: sink_notes } =
        sinks::collect(&mut em, g, info, &dom, mask_counts)?;
    if let Some(bufs) = onepass {
        sinks::add_one_pass(&mut em, g, &dom, &bufs.pass, &mut groups)?;
    }
    let last_dim = info.dims.last().copied();
    let row_bound = row_mode_bound(&em, g, &info.dims, &dom, &groups);
    let shape = KernelShape::choose(
        onepass.map(|b| &b.pass),
        row_bound.is_some(),
        row_wise.is_some(),
        column_wise.is_some(),
        last_dim,
        &groups,
    );
    let block = shape.block(opts);

    // The loop body. Inputs loaded outside any predicate branch (or by a predicate itself) are
    // read for every element; the others only where their branch's predicate holds.
    let mut unconditional: BTreeSet<u32> = BTreeSet::new();
    let mut next_var = em.next_var();
    let mut rows_src = String::new();
    let mut queued = None; // the compacted shape: the group whose elements are queued
    let mut row_sizes = None; // the row-wise shape: its row count and length
    let mut column_sizes = None; // the columns shape: its column and row counts
    match (shape, &row_bound, last_dim) {
        (KernelShape::Columns, _, _) => {
            let plan = column_wise.ok_or(CodegenError::Internal { node: 0, what: "columns without a plan" })?;
            em.stored_outputs = columns::stored_operands(g, an, k, plan);
            column_sizes = Some(columns::emit_body(&mut em, g, plan, &info.dims, &groups, &mut unconditional)?);
        }
        (KernelShape::RowWise, _, _) => {
            let plan = row_wise.as_ref().ok_or(CodegenError::Internal { node: 0, what: "row-wise without rows" })?;
            let all = (groups.as_slice(), row_groups.as_slice());
            row_sizes = Some(row_wise::emit_body(&mut em, g, (an, k), plan, &info.dims, all, &mut unconditional)?);
        }
        (KernelShape::Rows, _, _) => {
            let (src, nv) = rows::rows_loop(&mut em, g, an, k, &groups, mask_counts, next_var)?;
            rows_src = src;
            next_var = nv;
        }
        (KernelShape::WarpPerRow, Some(bound), Some(last)) => {
            warp_per_row::emit_row_body(&mut em, g, &groups[0], bound, last, "32", &mut unconditional)?;
        }
        (KernelShape::RowGroups, Some(bound), Some(last)) => {
            warp_per_row::emit_row_body(&mut em, g, &groups[0], bound, last, "kf_g", &mut unconditional)?;
        }
        (KernelShape::Compacted, _, _) => {
            queued = grid_stride::emit_groups(&mut em, g, &groups, &mut unconditional, true)?;
        }
        (KernelShape::GridStride, _, _) => {
            // Work under no predicate first, so that a predicate's branch (a masked loss summed
            // beside its gradient) reuses the values it shares with it instead of computing
            // them again.
            groups.sort_by_key(|grp| grp.guard.is_some());
            grid_stride::emit_groups(&mut em, g, &groups, &mut unconditional, true)?;
        }
        _ => return Err(CodegenError::Internal { node: 0, what: "row shape without a row bound" }),
    }
    if !row_groups.is_empty()
        && (shape != KernelShape::RowWise || row_wise.is_none_or(|p| p.case != row_wise::RowCase::Elements))
    {
        return Err(CodegenError::Internal { node: 0, what: "a row result deferred into a kernel that has no rows" });
    }
    if shape != KernelShape::Rows {
        next_var = em.next_var();
    }
    // The compacted shape: the queued group's work with direct loads, run by full sets of lanes.
    let mut drain = Vec::new();
    if let Some(gi) = queued {
        let (lines, duses, nv) =
            compacted::emit_drain(g, an, k, &info.dims, &em.substitutions, &groups[gi].then, next_var)?;
        drain = lines;
        next_var = nv;
        em.uses.absorb(duses);
    }
    let rows_expr = em.product(&info.dims[..info.dims.len().saturating_sub(1)]);
    let cols_expr = match last_dim {
        Some(d) => em.dim(d),
        None => "1".to_string(),
    };
    let n_expr = em.product(&info.dims);
    // Checks: kernel 0 checks the offsets inputs and the lengths inputs it does not read itself.
    let checked = em.checks;
    let loop_checks = if checked && k == 0 { loop_check_inputs(&mut em, g) } else { Vec::new() };
    let prefetch = em.prefetch.take().unwrap_or_default();
    let (body, mut uses) = em.into_lines();
    let lazy_inputs: Vec<InputId> =
        uses.inputs.iter().filter(|i| !unconditional.contains(i)).map(|&i| InputId(i)).collect();

    // The epilogue: scalar outputs and Temp values, computed once by one thread.
    let compacted_pass = onepass.filter(|_| shape == KernelShape::Compacted);
    let run = match (shape, compacted_pass) {
        (KernelShape::Rows, _) => EpilogueRun::RowsPlan,
        (_, Some(b)) => EpilogueRun::EveryBlock { pass: &b.pass },
        _ => EpilogueRun::LastBlock,
    };
    let mut outputs_written: Vec<usize> = info
        .sinks
        .iter()
        .filter_map(|s| if let SinkKind::Output { index } = s.kind { Some(index) } else { None })
        .collect();
    outputs_written.extend(onepass.map(|b| b.pass.output));
    let ep = emit_epilogue(g, an, k, info, next_var, slot_results, run, &mut outputs_written)?;
    let epilogue = ep.lines;
    uses.absorb(ep.uses);
    for (c, _, _) in &slots {
        // The rows plan folds with warp shuffles (see `rows::write_rows_tail`).
        if shape != KernelShape::Rows {
            uses.helpers.insert(match c {
                Combine::Sum => Helper::BlockSum,
                Combine::Max => Helper::BlockMax,
                Combine::Min => Helper::BlockMin,
                Combine::Prod => Helper::BlockProd,
            });
        }
        if c.uses_min_max() {
            uses.helpers.insert(Helper::MinMaxF64);
        }
    }
    let mut temps_written = ep.temps_written.clone();
    temps_written.extend(row_sizes.iter().flat_map(|r| r.temps_written.iter().copied()));
    let params = params(
        g,
        an,
        buffers,
        SignatureParts {
            k,
            shape,
            uses: &uses,
            outputs_written,
            temps_written: &temps_written,
            list: compacted_pass.and_then(|b| b.list.map(|l| (l, b.pass.comps))),
            n_slots: slots.len(),
            checked,
            // The row kernel writes the column partial sums; the column kernel's fold entry reads them.
            column_partials: match (column_wise, buffers.column_partials[k]) {
                (Some(c), Some(b)) => c.from.map(|f| (b, Some(f.kernel))),
                (None, Some(b)) => Some((b, None)),
                _ => None,
            },
        },
    )?;

    // The translation unit.
    let mut src = String::new();
    let _ = writeln!(src, "// Generated by kfuse-codegen; do not edit.");
    let _ = writeln!(src, "// kernel {name} ({} of {launched}) of graph {hash}", k + 1);
    let _ = writeln!(src, "// options: block_size={block}{}; reduction level {}", tuning_note(opts), info.level);
    let dom_str = g.shape_str(&kfuse_ir::Shape(info.dims.clone()));
    // The entry point for rows in registers promises `batched_threads_per_sm` threads resident
    // too: without a bound its unrolled slots took up to 80 registers (3 blocks of 256 a
    // multiprocessor), too few warps to hide the latency of each row's loads and folds. Its
    // blocks may grow, for rows longer than `block` lanes hold, up to that many threads (at most
    // 1024), with the same registers a thread; not with column sums, whose shared array is
    // sized by the block.
    let cached = row_sizes.as_ref().and_then(|r| r.cached.as_ref());
    let register_block = register_max_block(block, opts.batched_threads_per_sm, cached.map_or(0, |c| c.sums));
    let domain_note = match (shape, &row_wise, column_wise) {
        (KernelShape::RowWise, Some(plan), _) => {
            row_wise::domain_note(plan, &dom_str, cached.map(|c| (block, register_block, c.strided_rows.as_slice())))
        }
        (KernelShape::Columns, _, Some(plan)) => columns::domain_note(plan, &dom_str),
        _ => shape.domain_note(&dom_str),
    };
    let _ = writeln!(src, "{domain_note}");
    for note in &sink_notes {
        let _ = writeln!(src, "// sink: {note}");
    }
    // A column kernel's own entry, when its sums may be folded instead.
    if let Some(c) = column_wise.filter(|c| c.from.is_none() && buffers.column_partials[k].is_some()) {
        let _ = writeln!(
            src,
            "// entry {name}_fold instead, where the rows' kernel takes its entry for rows in registers: it folds the {} column sum(s) that entry took as it went, reading no row",
            c.reductions.len()
        );
    }
    if let Some(plan) = row_wise.filter(|p| !p.column_sums.is_empty()) {
        let operands: Vec<String> = plan.column_sums.iter().map(|n| format!("n{}", n.0)).collect();
        let _ = writeln!(
            src,
            "// sink: column sums of {} over the rows by the entry for rows in registers, a row of partial sums per block, for a later kernel's fold entry",
            operands.join(", ")
        );
    }
    src.push('\n');
    for &h in &uses.helpers {
        let h = if h == Helper::MinMaxF32 && shape == KernelShape::Rows { Helper::MinMaxF32Bits } else { h };
        src.push_str(&cuda::helper_source(h));
    }
    // Batched loops: at most 64 registers per thread (1024 threads per SM resident), and a grid of
    // exactly that many blocks per SM, so that every block is resident at once (one wave).
    let (resident_blocks, bounded) = shape.resident_blocks(opts, block, !prefetch.is_empty());
    let bounds = if bounded { format!("{block}, {resident_blocks}") } else { block.to_string() };
    // The entry point's signature and its checks (a row-wise kernel may have two entries).
    let register_bounds = format!("{register_block}, {}", (opts.batched_threads_per_sm / register_block).max(1));
    let entry_head = |entry: &str, bounds: &str| {
        let mut head = String::new();
        let _ = writeln!(head, "\nextern \"C\" __global__ void __launch_bounds__({bounds}) {entry}(");
        for (j, (_, decl, comment)) in params.iter().enumerate() {
            let sep = if j + 1 < params.len() { "," } else { "" };
            let _ = writeln!(head, "    {decl}{sep} // {comment}");
        }
        head.push_str(")\n{\n");
        if checked {
            head.push_str(check::BAD_DECL);
            head.push_str(&check::loop_checks(&loop_checks));
        }
        head
    };
    // The header and helpers open the second entry point's translation unit too.
    let prelude_len = src.len();
    src.push_str(&entry_head(&name, &bounds));
    let poison = if checked { check::poison_accumulators(slots.len(), "    ") } else { String::new() };
    let mut accumulators = String::new();
    for (s, (_, init, what)) in slots.iter().enumerate() {
        let _ = writeln!(accumulators, "    double acc{s} = {init}; // {what}");
    }
    // The elements a batched loop (grid-stride or compacted) takes per iteration.
    let batch = grid_stride::batch(&prefetch, opts.elems_per_thread);
    match shape {
        KernelShape::GridStride => {
            src.push_str(NARROW_INDEX);
            let _ = writeln!(src, "    const kf_index n = (kf_index)({n_expr});");
            src.push_str(&accumulators);
            grid_stride::write_loop(&mut src, &prefetch, &body, block, batch, &[]);
            src.push_str(&poison);
            write_plain_tail(&mut src, &slots, &epilogue);
        }
        KernelShape::Compacted => {
            let pass =
                &compacted_pass.ok_or(CodegenError::Internal { node: 0, what: "compacted without one pass" })?.pass;
            src.push_str("    typedef long long kf_index;\n");
            let _ = writeln!(src, "    const long long n = {n_expr};");
            src.push_str(&accumulators);
            compacted::write_compaction_state(&mut src, block, batch, pass.comps, &drain);
            grid_stride::write_loop(&mut src, &prefetch, &body, block, batch, compacted::QUEUE_DRAIN);
            if slots.is_empty() {
                write_plain_tail(&mut src, &slots, &epilogue);
            } else {
                src.push_str(compacted::FINAL_DRAIN);
                src.push_str(&poison);
                let mut rescale = String::new();
                compacted::write_rescale(&mut rescale, g, pass);
                write_barrier_tail(&mut src, &slots, &epilogue, &rescale);
            }
        }
        KernelShape::WarpPerRow => {
            warp_per_row::write(&mut src, &rows_expr, &cols_expr, &accumulators, &body);
            src.push_str(&poison);
            write_plain_tail(&mut src, &slots, &epilogue);
        }
        KernelShape::RowGroups => {
            row_groups::write(&mut src, &rows_expr, &cols_expr, &accumulators, &body);
            src.push_str(&poison);
            write_plain_tail(&mut src, &slots, &epilogue);
        }
        KernelShape::Columns => {
            let sizes =
                column_sizes.as_ref().ok_or(CodegenError::Internal { node: 0, what: "columns without sizes" })?;
            // Its scalar outputs and Temp values read no reduction of its own (a column kernel
            // takes no partial slot): one thread writes them first, before any block returns
            // (a constant `ones` beside a product's gradient, or no column at all).
            if !slots.is_empty() {
                return Err(CodegenError::Internal { node: 0, what: "a column kernel with full reductions" });
            }
            write_plain_tail(&mut src, &slots, &epilogue);
            columns::write(&mut src, sizes, block, &body);
        }
        KernelShape::RowWise => {
            let sizes =
                row_sizes.as_ref().ok_or(CodegenError::Internal { node: 0, what: "row-wise without row sizes" })?;
            row_wise::write(&mut src, sizes, &accumulators, (&[], &body, &[]), None);
            src.push_str(&poison);
            write_plain_tail(&mut src, &slots, &epilogue);
        }
        KernelShape::Rows => {
            // The rows loop declares its own sizes.
            src.push_str(&accumulators);
            src.push_str(&rows_src);
            src.push_str(&poison);
            rows::write_rows_tail(&mut src, &slots, &epilogue);
        }
    }
    src.push_str("}\n");
    // Rows that fit the lanes' registers: a second entry point, allocated its own registers, in a
    // translation unit of its own so that NVRTC compiles the two entries in parallel.
    let register_rows = match (shape, row_sizes.as_ref().and_then(|r| r.cached.as_ref())) {
        (KernelShape::RowWise, Some(cached)) => {
            let entry = format!("{name}_regs");
            let mut regs = src[..prelude_len].to_string();
            regs.push_str(&entry_head(&entry, &register_bounds));
            let sizes =
                row_sizes.as_ref().ok_or(CodegenError::Internal { node: 0, what: "register rows without sizes" })?;
            let mut prologue = row_wise::column_sums_prologue(cached.sums, cached.slots, block);
            prologue.extend(cached.prologue.iter().cloned());
            let after = row_wise::column_fold(cached.sums);
            row_wise::write(&mut regs, sizes, &accumulators, (&prologue, &cached.body, &after), Some(cached.slots));
            regs.push_str(&poison);
            write_plain_tail(&mut regs, &slots, &epilogue);
            regs.push_str("}\n");
            let aligned = cached
                .vectors
                .iter()
                .map(|(ptr, bytes)| {
                    params.iter().position(|p| p.1.ends_with(&format!(" {ptr}"))).map(|i| (i, *bytes)).ok_or(
                        CodegenError::Internal { node: 0, what: "a vector access of a buffer that is not a parameter" },
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            Some(RegisterRows {
                source: regs,
                entry,
                cols_per_lane: u64::from(cached.slots),
                vector: u64::from(cached.width),
                aligned,
                max_block: register_block,
                strided_rows: cached.strided_rows.iter().map(|&k| kfuse_ir::InputId(k)).collect(),
            })
        }
        _ => None,
    };

    let grid = match (shape, &row_wise, column_wise) {
        // An entry for rows in registers that sums columns as it goes writes a row of partial
        // sums per block: its grid fills the `batched_threads_per_sm` threads a multiprocessor
        // its bounds promise, one wave. The kernel's own residency (2048 threads) ran it in two
        // waves and wrote twice the partials for the fold to read (ncu: 1056 blocks of which 4 a
        // multiprocessor were resident). One wave, H100, the backend's backward regions at
        // [8192, 1024] f32: layer norm 52.3 against 58.3 µs, RMSNorm 48.2 against 51.0. The
        // kernel's other entry (rows that do not fit, unaligned buffers) strides over the rows of
        // the same grid.
        (KernelShape::RowWise, Some(plan), _) => {
            let sums = cached.is_some_and(|c| c.sums > 0);
            let resident = if sums { (opts.batched_threads_per_sm / block).max(1) } else { resident_blocks };
            row_wise::grid(plan, &info.dims, block, resident)?
        }
        (KernelShape::Columns, _, Some(plan)) => columns::grid(plan, &info.dims, block)?,
        _ => {
            let (work, per_block) = shape.grid_work(&info.dims, block)?;
            GridSpec::Work { work, per_block, max_blocks_per_sm: resident_blocks }
        }
    };
    Ok(Kernel {
        name,
        source: src,
        params: params.into_iter().map(|p| p.0).collect(),
        block,
        grid,
        lazy_inputs,
        launch: shape.launch(),
        register_rows,
        fold: None,
        narrow_index: shape == KernelShape::GridStride,
        recompute: uses.recompute,
        recomputed: uses.recomputed.iter().map(|n| n.0).collect(),
    })
}

/// A grid-stride kernel's index type: 32-bit unless built with [`crate::plan::WIDE_INDEX_OPTION`] (the
/// executor launches the narrow build only where [`Kernel::narrow_fits`]).
const NARROW_INDEX: &str = "#ifdef KF_WIDE_INDEX
    typedef long long kf_index;
#else
    typedef int kf_index; // every count this launch indexes is below 2^30
#endif
";

/// The most threads a block of a row-wise kernel's entry for rows in registers takes: `block`
/// doubled while it stays within `threads_per_sm` and 1024 (the same registers a thread as
/// `block` threads, `threads_per_sm` of them resident a multiprocessor); `block` itself with
/// column sums (their shared array holds a block's row groups) or a block that is not a power of
/// two (the row groups are powers of two).
fn register_max_block(block: u32, threads_per_sm: u32, sums: usize) -> u32 {
    let mut b = block;
    while sums == 0 && block.is_power_of_two() && b * 2 <= threads_per_sm.min(1024) {
        b *= 2;
    }
    b
}

/// The header's note of non-default tuning (so default kernels keep their bytes).
pub(crate) fn tuning_note(opts: &CodegenOptions) -> String {
    let default = CodegenOptions::default();
    let mut note = String::new();
    if opts.elems_per_thread != default.elems_per_thread {
        let _ = write!(note, ", elems_per_thread={}", opts.elems_per_thread);
    }
    if opts.batched_threads_per_sm != default.batched_threads_per_sm {
        let _ = write!(note, ", batched_threads_per_sm={}", opts.batched_threads_per_sm);
    }
    if !opts.strided_inputs.is_empty() {
        let inputs: Vec<String> = opts.strided_inputs.iter().map(|i| format!("in{i}")).collect();
        let _ = write!(note, ", strided inputs {}", inputs.join(" "));
    }
    note
}

/// The inputs kernel 0 checks with its loop: every offsets input, and every lengths input that
/// it does not read (and check) itself; their loads and sizes join the emitter's uses.
fn loop_check_inputs(em: &mut Emitter, g: &Graph) -> Vec<check::LoopCheck> {
    let mut out = Vec::new();
    for &c in &g.constraints {
        let input = c.input().0;
        if matches!(c, kfuse_ir::Constraint::Lengths { .. }) && em.uses.inputs.contains(&input) {
            continue;
        }
        em.uses.inputs.insert(input);
        em.uses.helpers.insert(Helper::Report);
        let inp = &g.inputs[input as usize];
        let count = em.product(&inp.shape.0);
        let bound = em.dim(c.dim());
        out.push(check::LoopCheck { input, name: inp.name.clone(), constraint: c, count, bound });
    }
    out
}
