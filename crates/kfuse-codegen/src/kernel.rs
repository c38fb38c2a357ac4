//! Kernel assembly: the grid-stride loop over a kernel's domain, its sinks grouped under shared
//! predicates, the deterministic two-stage full reduction with a self-resetting ticket, the
//! scalar epilogue, and the signature with one commented parameter per line.
//!
//! Index type: always 64-bit (`long long i`). Sizes are run-time values, so a plan cannot know
//! that a domain stays under 2^31 elements; the loop is memory-bound, and the 64-bit increment and
//! compare cost nothing measurable there, while a 32-bit index over a 64-bit count would be a
//! silent overflow. Coordinates are derived only when a broadcast operand needs them (never for
//! operands shaped like the domain, which use `i` directly), through `kf_div`/`kf_mod`: 32-bit
//! division when the index and divisor fit in 32 bits (decided at run time, a warp-uniform branch
//! in practice), 64-bit otherwise. In row mode (lengths masks) the row and column are loop
//! variables and no division happens per element.
//!
//! Not handled here: expression emission (see `emit`), the buffer list (see `lib`).

use std::fmt::Write as _;

use kfuse_ir::{BinaryOp, DType, Dim, Graph, GraphHash, InputId, NodeId, Op, ReduceOp, TernaryOp};

use crate::analysis::{full_reduce, Analysis, SinkKind};
use crate::cuda::{self, Helper};
use crate::emit::{reduce_identity, temp_dtype, Coord, Emitter, Mode};
use crate::plan::{GridSpec, Kernel, Launch, Param};
use crate::tail::{write_barrier_tail, write_reduction_tail};
use crate::{CodegenError, CodegenOptions};

/// Where each kind of buffer sits in `Plan::buffers`.
pub(crate) struct BufferIndex {
    pub outputs_base: usize,
    pub temps_base: usize,
    /// Per kernel: the (partials, counter) buffers, when it has full reductions; a rows-plan
    /// kernel always has a counter (its arrival word), and partials only for reductions other
    /// than the counts of its mask.
    pub reduction: Vec<Option<(Option<usize>, usize)>>,
    /// The one-pass masked gradient's buffers, when the plan uses one (kernel 0 fills the list).
    pub onepass: Option<crate::onepass::OnePassBuffers>,
}

/// An action of the loop body, run under its group's predicate (or its negation).
#[derive(Clone)]
pub(crate) enum Action {
    Update {
        op: ReduceOp,
        x: NodeId,
        mask: Option<NodeId>,
        xctx: Vec<Coord>,
        accs: Vec<String>,
    },
    Store {
        output: usize,
        values: Vec<(NodeId, Vec<Coord>)>,
    },
    /// Appends `(i, values)` to the block's one-pass list: slot `kf_ln + threadIdx.x` of a
    /// compaction drain (see `onepass`), in shared memory or past its capacity in the block's
    /// global segment.
    Append {
        values: Vec<(NodeId, Vec<Coord>)>,
    },
}

pub(crate) type Guard = Option<(NodeId, Vec<Coord>)>;

pub(crate) struct Group {
    pub guard: Guard,
    pub then: Vec<Action>,
    pub otherwise: Vec<Action>,
}

/// How the final reduction combines one slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    Sum,
    Max,
    Min,
}

pub(crate) fn emit_kernel(
    g: &Graph,
    an: &Analysis,
    k: usize,
    launched: usize,
    opts: &CodegenOptions,
    hash: &GraphHash,
    buffers: &BufferIndex,
) -> Result<Kernel, CodegenError> {
    let info = &an.kernels[k];
    let name = format!("kf_{}_{k}", hash.short());
    let dom: Vec<Coord> = (0..info.dims.len() as u32).map(Coord::Dom).collect();
    let mut em = Emitter::new(g, Some(an), Mode::Element { kernel: k }, info.dims.clone(), 0);

    // The one-pass plan's buffers (kernel 0 only), and the rows plan's counts of the mask, which
    // take no partial slot: the tail reads the count `kf_cntd` of the arrival word (see `rows`).
    let onepass = buffers.onepass.as_ref().filter(|_| k == 0);
    let mask_counts: &[NodeId] = onepass.map_or(&[], |b| &b.pass.counts);

    // Sinks become actions, grouped by the predicate that guards them; full reductions take
    // partial slots in sink order.
    let mut slots: Vec<(Combine, String, String)> = Vec::new(); // (combine, init, what)
    let mut groups: Vec<Group> = Vec::new();
    let mut slot_results = std::collections::HashMap::new();
    let mut sink_notes = Vec::new(); // the header's `// sink:` lines
    for sink in &info.sinks {
        let comps: Vec<Option<u64>> = match sink.comps {
            Some(c) => (0..u64::from(c)).map(Some).collect(),
            None => vec![None],
        };
        let ctx_of = |c: Option<u64>| {
            let mut ctx = dom.clone();
            ctx.extend(c.map(Coord::Const));
            ctx
        };
        match sink.kind {
            SinkKind::Reduce { node, .. } if mask_counts.contains(&node) => {
                slot_results.insert(node, vec!["kf_cntd".to_string()]);
                sink_notes.push(format!("full reduction n{}: the count of the mask, each block's sum of the clamped bounds (kf_cntd), no partial slot", node.0));
            }
            SinkKind::Reduce { node, .. } => {
                let (op, x, mask) = full_reduce(g, node)
                    .ok_or(CodegenError::Internal { node: node.0, what: "sink is not a reduction" })?;
                let xd = g.node(x).dtype;
                let slot = slots.len() as u32;
                let n_slots = crate::analysis::slots_of(op);
                let accs: Vec<String> = (slot..slot + n_slots).map(|s| format!("acc{s}")).collect();
                slot_results.insert(node, (slot..slot + n_slots).map(|s| format!("r{s}")).collect::<Vec<_>>());
                let what = match mask {
                    Some(m) => format!("{} n{} where n{} (n{})", op.name(), x.0, m.0, node.0),
                    None => format!("{} n{} (n{})", op.name(), x.0, node.0),
                };
                let combine = match op {
                    ReduceOp::Max => Combine::Max,
                    ReduceOp::Min => Combine::Min,
                    _ => Combine::Sum,
                };
                slots.push((combine, reduce_identity(op, xd), what.clone()));
                if op == ReduceOp::Mean {
                    slots.push((Combine::Sum, "0.0".into(), format!("count of {what}")));
                }
                sink_notes.push(format!(
                    "full reduction n{} into partial slot {slot}{}",
                    node.0,
                    comps_note(sink.comps)
                ));
                for c in comps {
                    let xctx = ctx_of(c);
                    let guard = em.reduce_guard(op, x, mask, &xctx);
                    group_for(&mut groups, guard).then.push(Action::Update { op, x, mask, xctx, accs: accs.clone() });
                }
            }
            SinkKind::Output { index } => {
                sink_notes.push(format!("output {}{}", g.outputs[index].name, comps_note(sink.comps)));
                let node = g.outputs[index].node;
                let selects: Vec<_> = comps
                    .iter()
                    .map(|&c| {
                        resolve_select(&em, g, node, ctx_of(c)).map(|(gd, a, b)| (em.canonical(gd.0, gd.1), a, b))
                    })
                    .collect();
                let first_guard = selects.first().and_then(|s| s.as_ref().map(|s| s.0.clone()));
                let shared =
                    first_guard.is_some() && selects.iter().all(|s| s.as_ref().map(|s| &s.0) == first_guard.as_ref());
                if shared {
                    let (then, otherwise): (Vec<_>, Vec<_>) = selects.into_iter().flatten().map(|s| (s.1, s.2)).unzip();
                    let grp = group_for(&mut groups, first_guard);
                    grp.then.push(Action::Store { output: index, values: then });
                    grp.otherwise.push(Action::Store { output: index, values: otherwise });
                } else {
                    let values = comps.iter().map(|&c| (node, ctx_of(c))).collect();
                    group_for(&mut groups, None).then.push(Action::Store { output: index, values });
                }
            }
        }
    }

    // One pass: this kernel also computes the masked output unscaled and lists it (see onepass).
    if let Some(bufs) = onepass {
        let pass = &bufs.pass;
        em.substitutions = pass.substitutions.iter().cloned().collect();
        let out = g.outputs[pass.output].node;
        let (mut then, mut otherwise, mut guard) = (Vec::new(), Vec::new(), None);
        for c in 0..u64::from(pass.comps) {
            let mut ctx = dom.clone();
            ctx.push(Coord::Const(c));
            let (gd, a, b) = resolve_select(&em, g, out, ctx)
                .ok_or(CodegenError::Internal { node: out.0, what: "one-pass output is not a select" })?;
            guard = Some(em.canonical(gd.0, gd.1));
            then.push(a);
            otherwise.push(b);
        }
        let grp = group_for(&mut groups, guard);
        grp.then.push(match pass.rows {
            true => Action::Store { output: pass.output, values: then },
            false => Action::Append { values: then },
        });
        grp.otherwise.push(Action::Store { output: pass.output, values: otherwise });
    }
    // The rows plan (see `rows`) or the compacted one; both are one cooperative launch.
    let rows_pass = onepass.filter(|b| b.pass.rows);
    let onepass = onepass.filter(|b| !b.pass.rows);
    let mut next_var = em.next_var();
    let rows_src = match rows_pass {
        Some(_) => {
            let (src, nv) = crate::rows::rows_loop(&mut em, g, an, k, &groups, mask_counts, next_var)?;
            next_var = nv;
            Some(src)
        }
        None => None,
    };

    // Inputs loaded outside any predicate branch (or by a predicate itself) are read for every
    // element; the others only where their branch's predicate holds.
    let mut unconditional: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    let row_bound = row_mode_bound(&em, g, &info.dims, &dom, &groups);
    let mut grouped_rows = false; // row mode with a group of lanes per row (see `write_row_groups`)
    let mut compacted = None; // one pass: the group whose elements are queued (see `onepass`)
    let last_dim = info.dims.last().copied();
    if rows_src.is_some() {
        // Emitted above.
    } else if let (Some((b, bctx)), Some(last_dim), [grp]) = (&row_bound, last_dim, groups.as_slice()) {
        // Row mode: the predicate is `col < bound(row)`, so each branch is a column range.
        em.row_mode = true;
        let bv = em.eval(*b, bctx)?;
        unconditional.extend(em.uses.inputs.iter().copied());
        let cols = em.dim(last_dim);
        em.push_stmt(format!("const long long kf_hi = {bv} < 0 ? 0ll : ((long long){bv} < {cols} ? (long long){bv} : {cols}); // columns where the predicate holds"));
        // Outputs that are all zero where the predicate fails: one byte range per row, zeroed
        // with 16-byte streaming stores. A warp per row fills first (the stores drain while the
        // valid columns compute); a one-pass kernel gives a row a group of lanes (every row in
        // one pass, see `write_row_groups`) and fills last, so that its loads are not queued
        // behind the stores.
        let (fills, rest): (Vec<&Action>, Vec<&Action>) =
            grp.otherwise.iter().partition(|a| zero_fill_bytes(&em, g, a).is_some());
        let fills: Vec<(usize, u64)> = fills
            .into_iter()
            .filter_map(|a| match (a, zero_fill_bytes(&em, g, a)) {
                (Action::Store { output, .. }, Some(esz)) => Some((*output, esz)),
                _ => None,
            })
            .collect();
        grouped_rows = grp.otherwise.is_empty() || (onepass.is_some() && rest.is_empty());
        let stride = if grouped_rows { "kf_g" } else { "32" };
        if !grouped_rows {
            for &(output, esz) in &fills {
                write_zero_fill(&mut em, g, output, esz, &cols, stride);
            }
        }
        em.open_column_loop(format!("for (long long col = lane; col < kf_hi; col += {stride}) {{"));
        em.push_stmt("const long long i = rowbase + col;".to_string());
        run_actions(&mut em, g, &grp.then)?;
        em.close();
        if grouped_rows {
            for &(output, esz) in &fills {
                write_zero_fill(&mut em, g, output, esz, &cols, stride);
            }
        }
        let rest: Vec<Action> = rest.into_iter().cloned().collect();
        if !rest.is_empty() {
            em.push_stmt("#pragma unroll 4".to_string());
            em.open_column_loop(format!("for (long long col = kf_hi + lane; col < {cols}; col += 32) {{"));
            em.push_stmt("const long long i = rowbase + col;".to_string());
            run_actions(&mut em, g, &rest)?;
            em.close();
        }
    } else {
        em.prefetch = Some(Vec::new());
        for (gi, grp) in groups.iter().enumerate() {
            match &grp.guard {
                None => {
                    run_actions(&mut em, g, &grp.then)?;
                    unconditional.extend(em.uses.inputs.iter().copied());
                }
                Some((m, mctx)) => {
                    let mv = em.eval(*m, mctx)?;
                    unconditional.extend(em.uses.inputs.iter().copied());
                    em.open_branch(&mv);
                    if onepass.is_some() && grp.then.iter().any(|a| matches!(a, Action::Append { .. })) {
                        // One pass: the element is queued; full sets of lanes compute it later.
                        em.push_stmt("kf_q[atomicAdd(&kf_qn, 1)] = i; // computed by kf_drain".to_string());
                        compacted = Some(gi);
                    } else {
                        // The first group's predicate is all the body computes before its
                        // branch, so the branch's loads can be issued (under it) with the
                        // batch's others.
                        em.prefetch_guard = (gi == 0).then(|| mv.clone());
                        run_actions(&mut em, g, &grp.then)?;
                        em.prefetch_guard = None;
                    }
                    em.close();
                    if !grp.otherwise.is_empty() {
                        em.open_else();
                        run_actions(&mut em, g, &grp.otherwise)?;
                        em.close();
                    }
                }
            }
        }
    }
    let row_mode = em.row_mode;
    // One pass: the queued group's work with direct loads, run by full sets of lanes.
    let mut drain = Vec::new();
    if rows_src.is_none() {
        next_var = em.next_var();
    }
    if let Some(gi) = compacted {
        let mut dem = Emitter::new(g, Some(an), Mode::Element { kernel: k }, info.dims.clone(), next_var);
        dem.substitutions = em.substitutions.clone();
        run_actions(&mut dem, g, &groups[gi].then)?;
        next_var = dem.next_var();
        let (lines, duses) = dem.into_lines();
        drain = lines;
        em.uses.absorb(duses);
    }
    // Row mode with nothing to do past a row's bound but zero fills in a one-pass kernel: a row
    // takes a group of fewer lanes (see `write_row_groups`), so more rows, each with a few valid
    // columns, are loaded at once.
    let row_groups = row_mode && grouped_rows;
    let rows_expr = em.product(&info.dims[..info.dims.len().saturating_sub(1)]);
    let cols_expr = match last_dim {
        Some(d) => em.dim(d),
        None => "1".to_string(),
    };
    let n_expr = em.product(&info.dims);
    let prefetch = em.prefetch.take().unwrap_or_default();
    let (body, mut uses) = em.into_lines();
    let lazy_inputs: Vec<InputId> =
        uses.inputs.iter().filter(|i| !unconditional.contains(i)).map(|&i| InputId(i)).collect();

    // The epilogue: scalar outputs and Temp values, computed once by one thread.
    let mut ep = Emitter::new(g, Some(an), Mode::Epilogue { kernel: k }, Vec::new(), next_var);
    ep.slot_results = slot_results;
    let mut outputs_written: Vec<usize> = info
        .sinks
        .iter()
        .filter_map(|s| if let SinkKind::Output { index } = s.kind { Some(index) } else { None })
        .collect();
    outputs_written.extend(onepass.or(rows_pass).map(|b| b.pass.output));
    for &o in &info.scalar_outputs {
        let node = g.outputs[o].node;
        let v = ep.eval(node, &[])?;
        let d = g.node(node).dtype;
        ep.note_conversion(d);
        // One pass: every block computes the epilogue past the grid barrier; block 0 writes.
        let only = if onepass.is_some() { "if (blockIdx.x == 0) " } else { "" };
        ep.push_stmt(format!("{only}out{o}[0] = {}; // output {}", cuda::store_conversion(d, &v), g.outputs[o].name));
        outputs_written.push(o);
    }
    let mut temps_written = Vec::new();
    for &n in &info.temp_writes {
        let t = *an.temps.get(&n).ok_or(CodegenError::Internal { node: n.0, what: "temp write without a temp" })?;
        // One pass: only the scale is read (after the grid barrier, from shared memory); the
        // others became literals.
        if rows_pass.is_some() {
            continue; // each block computes them from the count (see `rows`)
        }
        if let Some(b) = onepass {
            if b.pass.scale == n {
                let v = ep.eval(n, &[])?;
                ep.push_stmt(format!("kf_scale = {v}; // n{} for this block's rescale", n.0));
            }
            continue;
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
    let (epilogue, ep_uses) = ep.into_lines();
    uses.absorb(ep_uses);
    for (c, _, _) in &slots {
        // The rows plan folds with warp shuffles (see `rows::write_rows_tail`).
        if rows_src.is_none() {
            uses.helpers.insert(match c {
                Combine::Sum => Helper::BlockSum,
                Combine::Max => Helper::BlockMax,
                Combine::Min => Helper::BlockMin,
            });
        }
        if *c != Combine::Sum {
            uses.helpers.insert(Helper::MinMaxF64);
        }
    }

    // Parameters, in buffer order, then sizes.
    let mut params: Vec<(Param, String, String)> = Vec::new(); // (param, declaration, comment)
    for &i in &uses.inputs {
        let inp = &g.inputs[i as usize];
        let decl = format!("const {}* __restrict__ in{i}", cuda::storage_type(inp.dtype));
        params.push((
            Param::Buffer(i as usize),
            decl,
            format!("{} {}{}", inp.name, inp.dtype, g.shape_str(&inp.shape)),
        ));
    }
    outputs_written.sort_unstable();
    outputs_written.dedup();
    for &o in &outputs_written {
        let node = g.node(g.outputs[o].node);
        let decl = format!("{}* __restrict__ out{o}", cuda::storage_type(node.dtype));
        params.push((
            Param::Buffer(buffers.outputs_base + o),
            decl,
            format!("output {} {}{}", g.outputs[o].name, node.dtype, g.shape_str(&node.shape)),
        ));
    }
    let temp_nodes: Vec<(NodeId, usize)> = an.temps.iter().map(|(&n, &t)| (n, t)).collect();
    for (n, t) in temp_nodes {
        let d = temp_dtype(g.node(n).dtype);
        let (constness, note) = if temps_written.contains(&t) {
            ("", format!("n{} {} scalar, written here for a later kernel", n.0, d))
        } else if uses.temps_read.contains(&t) {
            ("const ", format!("n{} {} scalar from an earlier kernel", n.0, d))
        } else {
            continue;
        };
        let decl = format!("{constness}{}* __restrict__ tmp{t}", cuda::storage_type(d));
        params.push((Param::Buffer(buffers.temps_base + t), decl, note));
    }
    if let Some((index, values)) = onepass.and_then(|b| b.list) {
        params.push((
            Param::Buffer(index),
            "unsigned long long* __restrict__ list_index".into(),
            "flat indices of the entries past shared memory".into(),
        ));
        params.push((
            Param::Buffer(values),
            "float* __restrict__ list_values".into(),
            format!("their {} unscaled f32 values", onepass.map_or(0, |b| b.pass.comps)),
        ));
    }
    let n_slots = slots.len();
    if n_slots > 0 || rows_src.is_some() {
        let (p, c) = buffers.reduction[k]
            .ok_or(CodegenError::Internal { node: 0, what: "reduction kernel without its counter" })?;
        if let Some(p) = p {
            params.push((
                Param::Buffer(p),
                "double* __restrict__ partials".into(),
                format!("{n_slots} f64 partial slots per block, slot-major"),
            ));
        }
        let note = match (onepass, &rows_src) {
            (Some(_), _) => "grid barrier: [0] arrivals, [1] departures; 0 at launch, left at 0",
            (None, Some(_)) => "[0] ticket, [2, 4) the arrival word (count | arrivals << 40); 0 at launch, left at 0",
            (None, None) => "ticket: 0 at launch, left at 0",
        };
        params.push((Param::Buffer(c), "unsigned int* __restrict__ counter".into(), note.into()));
    }
    for &s in &uses.syms {
        params.push((Param::Size(s), format!("long long sz{}", s.0), format!("size {}", g.symbols[s.0 as usize])));
    }

    // The translation unit.
    let block = if rows_src.is_some() { crate::rows::ROWS_BLOCK } else { opts.block_size };
    let mut src = String::new();
    let _ = writeln!(src, "// Generated by kfuse-codegen; do not edit.");
    let _ = writeln!(src, "// kernel {name} ({} of {launched}) of graph {hash}", k + 1);
    let _ = writeln!(src, "// options: block_size={block}{}; reduction level {}", tuning_note(opts), info.level);
    let dom_str = g.shape_str(&kfuse_ir::Shape(info.dims.clone()));
    if rows_src.is_some() {
        let _ = writeln!(src, "// domain: {dom_str} elements as rows of the last axis, in tiles of rows per block (see kfuse-codegen's rows plan); only the columns below the row's bound are computed, the others zero-filled");
    } else if row_groups {
        let _ = writeln!(src, "// domain: {dom_str} elements as rows of the last axis, a group of 32 down to {MIN_ROW_LANES} lanes per row (grid-stride over rows); only the columns below the row's bound are computed");
    } else if row_mode {
        let _ = writeln!(src, "// domain: {dom_str} elements as rows of the last axis, one warp per row (grid-stride over rows); only the columns below the row's bound are computed");
    } else {
        let _ =
            writeln!(src, "// domain: {dom_str} elements, one per iteration of a grid-stride loop, 64-bit flat index");
    }
    for note in &sink_notes {
        let _ = writeln!(src, "// sink: {note}");
    }
    src.push('\n');
    for h in &uses.helpers {
        src.push_str(&cuda::helper_source(*h));
    }
    // Batched loops: at most 64 registers per thread (1024 threads per SM resident), and a grid of
    // exactly that many blocks per SM, so that every block is resident at once (one wave).
    let batched = !row_mode && !prefetch.is_empty();
    let resident_blocks =
        if batched { (opts.batched_threads_per_sm / block).max(1) } else { (2048 / block).clamp(1, 8) };
    let resident_blocks = if rows_src.is_some() { 2 } else { resident_blocks };
    let bounds = if batched || rows_src.is_some() { format!("{block}, {resident_blocks}") } else { block.to_string() };
    let _ = writeln!(src, "\nextern \"C\" __global__ void __launch_bounds__({bounds}) {name}(");
    for (j, (_, decl, comment)) in params.iter().enumerate() {
        let sep = if j + 1 < params.len() { "," } else { "" };
        let _ = writeln!(src, "    {decl}{sep} // {comment}");
    }
    src.push_str(")\n{\n");
    if rows_src.is_some() {
        // The rows loop declares its own sizes.
    } else if row_groups {
        let _ = writeln!(src, "    const long long rows = {rows_expr};");
        write_row_groups(&mut src);
    } else if row_mode {
        let _ = writeln!(src, "    const long long rows = {rows_expr};");
        src.push_str("    const long long lane = threadIdx.x & 31u;\n");
    } else {
        let _ = writeln!(src, "    const long long n = {n_expr};");
    }
    for (s, (_, init, what)) in slots.iter().enumerate() {
        let _ = writeln!(src, "    double acc{s} = {init}; // {what}");
    }
    if let Some(b) = onepass {
        crate::onepass::write_compaction_state(&mut src, block, opts.elems_per_thread, b.pass.comps, &drain);
    }
    if let Some(rs) = &rows_src {
        src.push_str(rs);
    } else if row_groups {
        src.push_str("    // One group of kf_g lanes per row; its lanes stride over the row's columns.\n");
        src.push_str("    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> kf_gs; row < rows; row += ((long long)gridDim.x * blockDim.x) >> kf_gs) {\n");
        let _ = writeln!(src, "        const long long rowbase = row * {cols_expr};");
        write_body(&mut src, &body, "        ");
        src.push_str("    }\n");
    } else if row_mode {
        src.push_str("    // One warp per row; its lanes stride over the row's columns.\n");
        src.push_str("    for (long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows; row += ((long long)gridDim.x * blockDim.x) >> 5) {\n");
        let _ = writeln!(src, "        const long long rowbase = row * {cols_expr};");
        write_body(&mut src, &body, "        ");
        src.push_str("    }\n");
    } else if prefetch.is_empty() {
        src.push_str("    #pragma unroll 4 // lets the compiler keep several iterations' loads in flight\n");
        src.push_str("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n");
        write_body(&mut src, &body, "        ");
        src.push_str("    }\n");
    } else {
        let queue = if onepass.is_some() { crate::onepass::QUEUE_DRAIN } else { &[] };
        write_batched_loop(&mut src, &prefetch, &body, block, opts.elems_per_thread, queue);
    }
    if rows_src.is_some() {
        crate::rows::write_rows_tail(&mut src, &slots, &epilogue);
    } else if n_slots > 0 {
        match onepass {
            Some(b) => {
                src.push_str(crate::onepass::FINAL_DRAIN);
                let rescale = crate::onepass::rescale_lines(g, &b.pass);
                write_barrier_tail(&mut src, &slots, &epilogue, &rescale);
            }
            None => write_reduction_tail(&mut src, &slots, &epilogue),
        }
    } else if !epilogue.is_empty() {
        src.push_str("    if (blockIdx.x == 0 && threadIdx.x == 0) {\n");
        for l in &epilogue {
            let _ = writeln!(src, "        {l}");
        }
        src.push_str("    }\n");
    }
    src.push_str("}\n");

    let (work, per_block) = if rows_src.is_some() {
        // A block per 8 rows at least, two per SM at most (then tiles of up to 64 rows).
        (size_expr(&info.dims[..info.dims.len() - 1])?, 8)
    } else if row_mode {
        // Row groups: blocks enough for the fewest lanes per row (a smaller grid, measured 25%
        // faster on a loss kernel over 16384 short rows than warps covering the rows in one pass).
        (size_expr(&info.dims[..info.dims.len() - 1])?, u64::from(block / if row_groups { MIN_ROW_LANES } else { 32 }))
    } else {
        (size_expr(&info.dims)?, u64::from(block))
    };
    Ok(Kernel {
        name,
        source: src,
        params: params.into_iter().map(|p| p.0).collect(),
        block,
        grid: GridSpec::Work { work, per_block, max_blocks_per_sm: resident_blocks },
        lazy_inputs,
        // The rows plan's compute warps wait for every block's arrival, as the compacted plan's barrier.
        launch: if onepass.is_some() || rows_src.is_some() { Launch::Cooperative } else { Launch::Plain },
    })
}

/// The header's note of a sink's components per element, if any.
fn comps_note(comps: Option<u32>) -> String {
    comps.map(|c| format!(" ({c} components per element)")).unwrap_or_default()
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
    note
}

/// The fewest lanes a row group of row mode may have (4 lanes x 16 bytes: two whole sectors).
const MIN_ROW_LANES: u32 = 4;

/// Row groups: a row takes `kf_g` lanes (32, 16, 8 or down to [`MIN_ROW_LANES`]), the most with
/// which the grid's threads cover every row in one pass (the fewest when they cannot); the grid is
/// sized for [`MIN_ROW_LANES`] lanes per row, so many rows take 4 lanes and few rows more. A grid of
/// warps that each take one row would otherwise walk its rows one after another, a load latency
/// (the bound) and another (the columns) per row. `kf_g` depends only on the row count and the
/// grid, so each thread's accumulation order, and the result, is fixed for a given grid.
fn write_row_groups(src: &mut String) {
    src.push_str("    // Lanes per row: the most of 32, 16, ... with which this grid covers every row in one pass.\n");
    src.push_str("    const long long kf_threads = (long long)gridDim.x * blockDim.x;\n");
    src.push_str("    int kf_gs = 5; // log2 of the lanes per row\n");
    let _ = writeln!(
        src,
        "    while (kf_gs > {} && rows > (kf_threads >> kf_gs)) --kf_gs;",
        MIN_ROW_LANES.trailing_zeros()
    );
    src.push_str("    const long long kf_g = 1ll << kf_gs;\n");
    src.push_str("    const long long lane = threadIdx.x & (kf_g - 1); // lane within the row's group\n");
}

fn write_body(src: &mut String, body: &[String], indent: &str) {
    for l in body {
        let _ = writeln!(src, "{indent}{l}");
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
    prefetch: &[crate::emit::Prefetch],
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
            write_body(src, prefix, "                ");
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
    write_body(src, body, "            ");
    src.push_str("        }\n");
    for l in after_batch {
        let _ = writeln!(src, "        {l}");
    }
    src.push_str("    }\n");
}

pub(crate) fn run_actions(em: &mut Emitter, g: &Graph, actions: &[Action]) -> Result<(), CodegenError> {
    for a in actions {
        match a {
            Action::Update { op, x, mask, xctx, accs } => em.reduce_update(*op, *x, *mask, xctx, accs)?,
            Action::Append { values } => {
                let mut vals = Vec::with_capacity(values.len());
                for (n, ctx) in values {
                    vals.push(em.eval(*n, ctx)?);
                }
                for l in crate::onepass::append_lines(&vals) {
                    em.push_stmt(l);
                }
            }
            Action::Store { output, values } => {
                let node = g.node(g.outputs[*output].node);
                let d = node.dtype;
                em.note_conversion(d);
                let mut vals = Vec::with_capacity(values.len());
                for (n, ctx) in values {
                    vals.push(em.eval(*n, ctx)?);
                }
                let name = &g.outputs[*output].name;
                if !has_component_axis(g, *output) {
                    em.push_stmt(format!("out{output}[i] = {}; // {name}", cuda::store_conversion(d, &vals[0])));
                } else if let Some(vty) = cuda::vector_type(d, vals.len() as u64) {
                    if em.row_mode && !em.plain_stores {
                        em.uses.helpers.insert(Helper::StoreStreaming);
                        em.push_stmt(format!(
                            "kf_st_cs(reinterpret_cast<{vty}*>(out{output}) + i, {}); // {name}",
                            cuda::vector_pack(d, &vals)
                        ));
                    } else {
                        em.push_stmt(format!(
                            "reinterpret_cast<{vty}*>(out{output})[i] = {}; // {name}",
                            cuda::vector_pack(d, &vals)
                        ));
                    }
                } else {
                    let c = vals.len();
                    for (k, v) in vals.iter().enumerate() {
                        em.push_stmt(format!(
                            "out{output}[i * {c} + {k}] = {}; // {name}",
                            cuda::store_conversion(d, v)
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

/// For a store of nothing but zero literals (all bits zero in storage) whose bytes per domain
/// element divide 16: those bytes.
pub(crate) fn zero_fill_bytes(em: &Emitter, g: &Graph, a: &Action) -> Option<u64> {
    let Action::Store { output, values } = a else { return None };
    let all_zero = values.iter().all(|(n, ctx)| {
        let (c, _) = em.canonical(*n, ctx.clone());
        matches!(g.node(c).op, Op::Const(l) if l.as_f64().to_bits() == 0)
    });
    let esz = values.len() as u64 * g.node(g.outputs[*output].node).dtype.size_bytes() as u64;
    (all_zero && esz > 0 && 16 % esz == 0 && (has_component_axis(g, *output) || values.len() == 1)).then_some(esz)
}

/// Row mode: zeroes the elements `[kf_hi, cols)` of the row of output `o` (`esz` bytes each) as
/// one byte range: 16-byte streaming stores over the whole 16-byte chunks, element stores for
/// the partial chunks at either end (fewer than 16 / `esz` elements each); the row's lanes take
/// every `stride`-th store (32: a warp per row; `kf_g`: a row group).
fn write_zero_fill(em: &mut Emitter, g: &Graph, o: usize, esz: u64, cols: &str, stride: &str) {
    em.uses.helpers.insert(Helper::StoreStreaming);
    let name = &g.outputs[o].name;
    em.push_stmt(format!("{{ // zero fill of {name} over columns [kf_hi, {cols}): 16-byte streaming stores"));
    em.push_stmt(format!("    const long long kf_za = rowbase + kf_hi, kf_zb = rowbase + {cols}; // elements"));
    for l in zero_fill_lines(o, esz, "lane", stride) {
        em.push_stmt(format!("    {l}"));
    }
    em.push_stmt("}".to_string());
}

/// The zero fill of output `o` (`esz` bytes per domain element, dividing 16) over the elements
/// `[kf_za, kf_zb)` declared by the caller: element stores for the partial 16-byte chunks at
/// either end, 16-byte streaming stores (`kf_st_cs`) between; thread `lane` of the filling
/// group takes every `stride`-th store.
pub(crate) fn zero_fill_lines(o: usize, esz: u64, lane: &str, stride: &str) -> Vec<String> {
    let per = 16 / esz;
    let chunks = |c: &str, from: &str, to: &str| {
        format!("for (long long {c} = {from} + {lane}; {c} < {to}; {c} += {stride}) kf_st_cs(reinterpret_cast<uint4*>(out{o}) + {c}, make_uint4(0u, 0u, 0u, 0u));")
    };
    if per == 1 {
        return vec!["#pragma unroll 4".to_string(), chunks("e", "kf_za", "kf_zb")];
    }
    let (ety, zero) = zero_element(esz);
    vec![
        format!("const long long kf_zc = (kf_za + {}) / {per}, kf_zd = kf_zb / {per}; // whole 16-byte chunks [kf_zc, kf_zd)", per - 1),
        format!("const long long kf_zh = kf_zc * {per} < kf_zb ? kf_zc * {per} : kf_zb; // head elements [kf_za, kf_zh)"),
        format!("const long long kf_zt = kf_zd * {per} > kf_zh ? kf_zd * {per} : kf_zh; // tail elements [kf_zt, kf_zb)"),
        format!("for (long long e = kf_za + {lane}; e < kf_zh; e += {stride}) reinterpret_cast<{ety}*>(out{o})[e] = {zero};"),
        format!("for (long long e = kf_zt + {lane}; e < kf_zb; e += {stride}) reinterpret_cast<{ety}*>(out{o})[e] = {zero};"),
        "#pragma unroll 4".to_string(),
        chunks("c", "kf_zc", "kf_zd"),
    ]
}

/// The C type of one `esz`-byte element of a zero fill (`esz` < 16, dividing 16) and its zero.
pub(crate) fn zero_element(esz: u64) -> (&'static str, &'static str) {
    match esz {
        1 => ("unsigned char", "(unsigned char)0"),
        2 => ("unsigned short", "(unsigned short)0"),
        4 => ("unsigned int", "0u"),
        _ => ("uint2", "make_uint2(0u, 0u)"),
    }
}

/// Whether output `o` was split into a domain and a small component axis.
fn has_component_axis(g: &Graph, o: usize) -> bool {
    crate::analysis::split_domain(g.node(g.outputs[o].node).shape.dims()).1.is_some()
}

/// The `where(c, a, b)` that decides a tensor output's value at `ctx`, looking through stacking
/// and component access: `(guard, then, else)` with their contexts.
#[allow(clippy::type_complexity)]
pub(crate) fn resolve_select(
    em: &Emitter,
    g: &Graph,
    mut n: NodeId,
    mut ctx: Vec<Coord>,
) -> Option<((NodeId, Vec<Coord>), (NodeId, Vec<Coord>), (NodeId, Vec<Coord>))> {
    loop {
        let node = g.node(n);
        let dims = node.shape.dims().to_vec();
        match node.op {
            Op::Ternary(TernaryOp::Select, c, a, b) => {
                let cc = em.operand_ctx(&dims, &ctx, c);
                let ac = em.operand_ctx(&dims, &ctx, a);
                let bc = em.operand_ctx(&dims, &ctx, b);
                return Some(((c, cc), (a, ac), (b, bc)));
            }
            Op::Stack(l) => {
                let Some(Coord::Const(k)) = ctx.last().cloned() else { return None };
                let p = *g.list(l).get(k as usize)?;
                let inner = &dims[..dims.len() - 1];
                ctx = em.operand_ctx(inner, &ctx[..ctx.len() - 1], p);
                n = p;
            }
            Op::Component { x, index } => {
                ctx.push(Coord::Const(u64::from(index)));
                n = x;
            }
            _ => return None,
        }
    }
}

/// Row mode applies when the domain has at least two axes and all sinks share one predicate of
/// the form `iota(last axis) < b` (what `mask(lengths)` lowers to) with an `i32` bound `b` that
/// does not depend on the last coordinate: `b` and its context, evaluated once per row.
pub(crate) fn row_mode_bound(
    em: &Emitter,
    g: &Graph,
    dims: &[Dim],
    dom: &[Coord],
    groups: &[Group],
) -> Option<(NodeId, Vec<Coord>)> {
    let [grp] = groups else { return None };
    let (m, mctx) = grp.guard.as_ref()?;
    if dims.len() < 2 || mctx.as_slice() != dom {
        return None;
    }
    let node = g.node(*m);
    let Op::Binary(BinaryOp::Lt, a, b) = node.op else { return None };
    let Op::Iota { axis } = g.node(a).op else { return None };
    let last = Coord::Dom(dims.len() as u32 - 1);
    let mdims = node.shape.dims();
    if em.operand_ctx(mdims, mctx, a).get(axis as usize) != Some(&last) {
        return None;
    }
    let bctx = em.operand_ctx(mdims, mctx, b);
    if bctx.contains(&last) || g.node(b).dtype != DType::I32 {
        return None;
    }
    Some((b, bctx))
}

fn group_for(groups: &mut Vec<Group>, guard: Guard) -> &mut Group {
    let pos = match groups.iter().position(|g| g.guard == guard) {
        Some(p) => p,
        None => {
            groups.push(Group { guard, then: Vec::new(), otherwise: Vec::new() });
            groups.len() - 1
        }
    };
    &mut groups[pos]
}

/// The element count of `dims` as a [`crate::SizeExpr`].
pub(crate) fn size_expr(dims: &[Dim]) -> Result<crate::SizeExpr, CodegenError> {
    let mut e = crate::SizeExpr::constant(1);
    for d in dims {
        match *d {
            Dim::Const(c) => e.constant = e.constant.checked_mul(c).ok_or(CodegenError::SizeOverflow { node: 0 })?,
            Dim::Sym(s) => e.symbols.push(s),
        }
    }
    Ok(e)
}
