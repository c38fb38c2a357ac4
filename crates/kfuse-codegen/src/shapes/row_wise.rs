//! The row-wise shape: a kernel whose work reads a reduction along the last axis of its own rows
//! (softmax, log-softmax, layer and RMS norm, cross-entropy and their gradients) computes that
//! reduction once per row, by the group of lanes that owns the row, instead of once per element
//! that uses it (a serial loop over the row in every thread: O(cols^2) per row).
//!
//! Each row takes a group of `kf_g` lanes, a power of two from [`crate::ROW_MIN_LANES`] up to the
//! block, about [`crate::ROW_COLS_PER_LANE`] columns a lane ([`crate::row_lanes`]); the block
//! takes `blockDim.x / kf_g` rows at a time, grid-stride over the rows. For each row:
//!
//! 1. The row reductions, in *phases*: a phase holds the reductions that read only earlier
//!    phases' results (softmax: the maximum, then the sum of `exp(x - max)`), and is one pass of
//!    the group's lanes over the row (`j<l> = lane, lane + kf_g, …`) updating each reduction's
//!    f64 accumulators (a row kept in registers: a lane adds its columns of a float sum in f32,
//!    then converts its partial sum once), then one fold of each accumulator over the group (`kf_row_<op>`: xor
//!    shuffles within a warp, then per-warp values folded in order through shared memory), which
//!    leaves the same bits in every lane. The result is bound once per row and read from there by
//!    every later use. The row is read once per phase; later passes are served by the caches.
//!    In the entry for any row, a softmax's sum of `exp(x - max)` joins the phase of its maximum
//!    ([`RowWise::online`]): each lane keeps a running maximum and rescales its sum when the
//!    maximum grows (one exp an element), and the lanes' (maximum, sum) pairs fold as one
//!    (`kf_row_online`), so a log-softmax reads its row once where it read it twice. A row in
//!    registers keeps the two phases ([`RowWise::register_phases`]): the second pass reads
//!    registers, and its exps do not wait on each other.
//! 2. The body: the kernel's sinks (stores, full reductions) at each element of the row
//!    ([`RowCase::Elements`]: the domain is the rows times the reduced axis), or once per row by
//!    the group's lane 0 ([`RowCase::Results`]: the domain is the rows, e.g. a per-row loss summed
//!    into a mean).
//!
//! A row reduction that a later kernel also needs (layer norm's mean and variance in the kernel of
//! its weight gradients, the row maximum and sum in a cross-entropy's gradient kernel) is stored
//! by the first row-wise kernel that computes it, one value per row (a Temp buffer shaped like the
//! rows), and loaded at its row by the later kernels, which never reduce that row again
//! ([`plan_rows`], `Analysis::row_values`).
//!
//! A kernel with row-shaped inputs has a second entry point, `<name>_regs`, for rows that fit
//! its lanes' registers (see `row_cache`): each lane loads its columns of each row-shaped input
//! once, a vector (4 columns, or 8 of 2-byte dtypes) at a time, the passes read them from
//! registers, and the body runs the columns in groups of a vector with one vector load per weight
//! and one vector store per output. The executor launches it where the row length is a multiple
//! of the vector's columns, at most 16 columns a lane (32 with one row-shaped input), and
//! the buffers it accesses by vectors are aligned ([`crate::RegisterRows`]). A row longer than
//! the kernel's block holds so takes a larger block, up to 1024 threads with the same registers a
//! thread (`RegisterRows::max_block`): a cross-entropy's row of 32,000 f32 logits is read once
//! by 1024 lanes instead of once per phase by the other entry; two entry points
//! keep each one's registers its own (one kernel with both loops took the larger count for
//! both, measured slower for long rows). Its row groups are the fewest lanes, from one, that hold
//! the row at 16 columns a lane: a row of 16 columns is one lane's and folds nothing, and fewer
//! lanes share each fold (cross-entropy forward + backward on an H100: 1.4-2.8x faster at 16 and
//! 1000 classes than with the groups of the other entry point).
//!
//! The entry for rows in registers may also sum, per column, the operands of a later column
//! kernel's sums (`RowWise::column_sums`, see `columns::fuse`): each group of columns adds its
//! values to the block's shared array `kf_cps` a float4 at a time, and after the row loop the
//! block folds its row groups in order into its row of partial sums (`kf_colp`). The entry for
//! any row sums nothing (adding in place to global memory was measured 1.3-1.7x slower): the
//! column kernel then reads the rows itself.
//!
//! A dead group (past the last row, in the block's last step) reads the last row and stores
//! nothing, so that every thread of the block reaches every fold. The accumulation order depends
//! on the row length and the block size only: results are the same bits from run to run.
//!
//! Not handled here: reductions the detection leaves out (another row length, a broadcast
//! operand) stay serial loops (see `emit`); the tail (see `tail`).

use std::collections::{BTreeMap, BTreeSet};

use kfuse_ir::{BinaryOp, Dim, Graph, NodeId, Op, ReduceAxis, ReduceOp, UnaryOp};

use crate::actions::{Action, Combine, Group};
use crate::analysis::{counts_every_element, full_reduce, Analysis, KernelInfo, SinkKind, MAX_COMPONENTS};
use crate::buffers::size_expr;
use crate::cuda::{self, Helper};
use crate::emit::{finish_reduce, temp_dtype, Coord, Emitter};
use crate::plan::GridSpec;
use crate::row_cache::{Group as RowGroup, RowCache, ROW_CACHE_SLOTS, ROW_CACHE_SLOTS_ONE_INPUT, ROW_SPREAD_THREADS};
use crate::shapes::{grid_stride, KernelShape};
use crate::text::{render, write_lines};
use crate::CodegenError;

/// How many columns of a row pass a lane's loops unroll, so that as many loads of each lane are in
/// flight at once (a loop's accumulation still adds them in column order).
const UNROLL: u32 = 4;

/// Which axes the kernel's domain shares with the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowCase {
    /// The domain is `[rows.., cols]`: the reductions' operands are shaped like it, and the body
    /// runs at every element of the row.
    Elements,
    /// The domain is `[rows..]`: the reductions' operands are `[rows.., cols]`, and the body runs
    /// once per row.
    Results,
}

/// The row reductions of a kernel, found by [`detect`].
#[derive(Clone, Debug)]
pub(crate) struct RowWise {
    pub case: RowCase,
    /// The reductions in phases: each reads only the results of earlier phases (node order
    /// within a phase).
    pub phases: Vec<Vec<NodeId>>,
    /// The row length: the reduced axis.
    pub cols: Dim,
    /// [`RowCase::Results`]: the inputs shaped like the rows that the kernel reads (a label),
    /// which every lane loads at its row before the passes, so that their latency hides behind
    /// the row's instead of following the last fold.
    pub row_inputs: Vec<NodeId>,
    /// [`RowCase::Elements`]: the operands of a later kernel's column sums (see
    /// `columns::fuse`), which this kernel's entry for rows in registers evaluates at each
    /// element and sums per column as it goes, into one row of partial sums per block (`kf_colp`,
    /// the sums' rows one after another). Its entry for any row does not: the later kernel then
    /// reads the rows itself.
    pub column_sums: Vec<NodeId>,
    /// (maximum, sum) pairs of a softmax's statistics that one pass computes together: a row's
    /// maximum of `x` and its sum of `exp(x - maximum)` (see [`softmax_sum_of`]), in the same
    /// phase, with a running maximum that rescales the sum when it grows (`kf_online_add`).
    /// Only the entry for any row does so (it reads its row once where it read it twice).
    pub online: Vec<(NodeId, NodeId)>,
    /// The phases of the entry for rows in registers: as `phases` without the online pairs (a
    /// softmax's sum in the phase after its maximum). Its row is in registers, so a second pass
    /// reads no memory, and the exps against the row's maximum wait on nothing; the running
    /// maximum's chain of dependent exps measured 1.18-1.27× slower on an H200 (a cross-entropy
    /// over 67,108 × 1000 f32 logits, forward and backward, `kfuse bench`).
    pub register_phases: Vec<Vec<NodeId>>,
}

impl RowWise {
    /// The domain axes that number the rows.
    fn row_axes(&self, dims: &[Dim]) -> usize {
        match self.case {
            RowCase::Elements => dims.len() - 1,
            RowCase::Results => dims.len(),
        }
    }
}

/// The nodes kernel `info`'s element work evaluates: from its sinks through operands, stopping
/// at scalars computed elsewhere (epilogues), at full reductions and at `leaves` (values read
/// from an earlier kernel).
fn evaluated(g: &Graph, an: &Analysis, info: &KernelInfo, leaves: &BTreeMap<NodeId, usize>) -> Vec<bool> {
    let elsewhere = |n: NodeId| an.home[n.index()].is_some() && g.node(n).shape.is_scalar();
    let mut seen = vec![false; g.nodes.len()];
    let mut stack: Vec<NodeId> = Vec::new();
    for s in &info.sinks {
        match s.kind {
            SinkKind::Reduce { node, .. } => {
                if let Some((_, x, mask)) = full_reduce(g, node) {
                    stack.push(x);
                    stack.extend(mask);
                }
            }
            SinkKind::Output { index } => stack.push(g.outputs[index].node),
        }
    }
    while let Some(n) = stack.pop() {
        if seen[n.index()] || elsewhere(n) || full_reduce(g, n).is_some() {
            continue;
        }
        seen[n.index()] = true;
        if !leaves.contains_key(&n) {
            g.node(n).op.for_each_operand(&g.lists, |x| stack.push(x));
        }
    }
    seen
}

/// The row-wise plan of one kernel and the nodes its element work evaluates (see [`evaluated`],
/// with the row values of earlier kernels as leaves), which the column shape's detection reads too.
pub(crate) struct KernelRows {
    pub plan: Option<RowWise>,
    pub evaluated: Vec<bool>,
}

/// Plans the row-wise kernels of a graph: for each kernel (in launch order; kernel 0 not when it
/// runs the one-pass plan, `onepass0`), its row reductions ([`detect`]); a row reduction that a
/// later kernel also evaluates is stored by the first kernel that computes it, one value per row,
/// and read by the later ones (recorded in `an.row_values`, its buffer appended to `an.temps`).
pub(crate) fn plan_rows(g: &Graph, an: &mut Analysis, onepass0: bool) -> Vec<KernelRows> {
    let none = BTreeMap::new();
    let reached: Vec<Vec<bool>> = an.kernels.iter().map(|info| evaluated(g, an, info, &none)).collect();
    let mut plans = Vec::with_capacity(an.kernels.len());
    for k in 0..an.kernels.len() {
        let seen = evaluated(g, an, &an.kernels[k], &an.row_values);
        let plan = match k == 0 && onepass0 {
            true => None,
            false => detect(g, an, &an.kernels[k], &seen),
        };
        for n in plan.iter().flat_map(|p| p.phases.iter().flatten()) {
            if reached[k + 1..].iter().any(|e| e[n.index()]) && !an.row_values.contains_key(n) {
                an.row_values.insert(*n, k);
                let t = an.temps.len();
                an.temps.insert(*n, t);
            }
        }
        plans.push(KernelRows { plan, evaluated: seen });
    }
    plans
}

/// The row reductions of kernel `info` that this shape computes once per row: reductions along
/// the last axis, among the nodes its element work evaluates (`seen`, see [`evaluated`]) and not
/// stored by an earlier kernel, whose operand is the kernel's rows times a row length that is not
/// a small constant (a component axis, cheap to loop over). `None` when there are none.
fn detect(g: &Graph, an: &Analysis, info: &KernelInfo, seen: &[bool]) -> Option<RowWise> {
    let dims = &info.dims;
    let evaluates = |n: NodeId| seen[n.index()] && !an.row_values.contains_key(&n);
    let mut found: Vec<(NodeId, RowCase, Dim)> = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let n = NodeId(i as u32);
        // A count of every element is the row length: no pass (see `analysis::counts_every_element`).
        if !evaluates(n) || counts_every_element(g, n) {
            continue;
        }
        if let Op::Reduce { axis: ReduceAxis::Last, x, .. } = node.op {
            let xd = g.node(x).shape.dims();
            let Some((&cols, rows)) = xd.split_last() else { continue };
            if xd == &dims[..] && !dims.is_empty() {
                found.push((n, RowCase::Elements, cols));
            } else if rows == &dims[..] && !matches!(cols, Dim::Const(c) if c <= MAX_COMPONENTS) {
                found.push((n, RowCase::Results, cols));
            }
        }
    }
    // One row length per kernel: the element rows when there are any, else the first found.
    let (case, cols) =
        found.iter().find(|f| f.1 == RowCase::Elements).or(found.first()).map(|&(_, case, cols)| (case, cols))?;
    let chosen: BTreeSet<NodeId> = found.iter().filter(|f| f.1 == case && f.2 == cols).map(|f| f.0).collect();
    // A softmax's sum of exp(x - max) joins the pass of its maximum (one of each per maximum).
    let mut online: Vec<(NodeId, NodeId)> = Vec::new();
    for &s in &chosen {
        if let Some(m) = softmax_sum_of(g, s).filter(|m| chosen.contains(m) && !online.iter().any(|p| p.0 == *m)) {
            online.push((m, s));
        }
    }
    // Phases: one more than the latest phase of a chosen reduction its operands read (operands
    // have lower node ids, so one pass in node order settles every node); an online sum, its
    // maximum's.
    let phases_with = |online: &[(NodeId, NodeId)]| {
        let mut reach = vec![0u32; g.nodes.len()];
        let mut phases: Vec<Vec<NodeId>> = Vec::new();
        for i in 0..g.nodes.len() {
            let n = NodeId(i as u32);
            if !evaluates(n) {
                continue;
            }
            let mut r = 0;
            g.node(n).op.for_each_operand(&g.lists, |x| r = r.max(reach[x.index()]));
            if let Some(&(m, _)) = online.iter().find(|p| p.1 == n) {
                r = reach[m.index()];
                phases[r as usize - 1].push(n);
            } else if chosen.contains(&n) {
                r += 1;
                if phases.len() < r as usize {
                    phases.resize(r as usize, Vec::new());
                }
                phases[r as usize - 1].push(n);
            }
            reach[i] = r;
        }
        phases
    };
    let (phases, register_phases) = (phases_with(&online), phases_with(&[]));
    let row_inputs = match case {
        RowCase::Results => (0..g.nodes.len())
            .filter(|&i| seen[i] && matches!(g.nodes[i].op, Op::Input(_)) && g.nodes[i].shape.dims() == &dims[..])
            .map(|i| NodeId(i as u32))
            .collect(),
        RowCase::Elements => Vec::new(),
    };
    Some(RowWise { case, phases, cols, row_inputs, column_sums: Vec::new(), online, register_phases })
}

/// The row maximum `m` when `s` is a softmax's sum along the row of `exp(x - m)`, `m` the
/// maximum of the same `x` along the row (as `softmax` and `log_softmax` build them: the maximum
/// detached and kept as an axis of size 1), both unmasked.
fn softmax_sum_of(g: &Graph, s: NodeId) -> Option<NodeId> {
    let Op::Reduce { op: ReduceOp::Sum, axis: ReduceAxis::Last, x: e, mask: None } = g.node(s).op else { return None };
    let Op::Unary(UnaryOp::Exp, z) = g.node(e).op else { return None };
    let Op::Binary(BinaryOp::Sub, x, mut shift) = g.node(z).op else { return None };
    // Through the detach and the kept axis: the maximum broadcast along the row.
    loop {
        shift = match g.node(shift).op {
            Op::Unary(UnaryOp::Detach, y) | Op::ExpandLast(y) => y,
            Op::Unsqueeze { x: y, axes } if axes == 1 << g.node(y).shape.rank() => y,
            _ => break,
        };
    }
    let Op::Reduce { op: ReduceOp::Max, axis: ReduceAxis::Last, x: mx, mask: None } = g.node(shift).op else {
        return None;
    };
    (mx == x && g.node(x).dtype.is_float() && g.node(z).shape == g.node(x).shape).then_some(shift)
}

/// The row-wise plan without reductions of an elementwise kernel that would otherwise take the
/// grid-stride shape (`shape`): a domain of two or more axes whose last one is not a small
/// constant (a component axis), no full reductions (`slots`) and no lengths/offsets `checks`.
/// Its rows need no per-element division (the column is a loop variable), and rows of at most
/// [`ROW_CACHE_SLOTS`](crate::row_cache::ROW_CACHE_SLOTS) columns a lane take the register entry,
/// which loads and stores them a vector at a time.
pub(crate) fn elementwise(
    g: &Graph,
    info: &KernelInfo,
    shape: KernelShape,
    slots: usize,
    checks: bool,
) -> Option<RowWise> {
    let &cols = info.dims.last()?;
    let wide = !matches!(cols, Dim::Const(c) if c <= MAX_COMPONENTS);
    let plain = shape == KernelShape::GridStride && slots == 0 && !checks && info.dims.len() >= 2;
    // Some output is shaped like the domain (the rows are worth a group of lanes each).
    let rows_out = g.outputs.iter().any(|o| g.node(o.node).shape.dims() == &info.dims[..]);
    (wide && plain && rows_out).then_some(RowWise {
        case: RowCase::Elements,
        phases: Vec::new(),
        cols,
        row_inputs: Vec::new(),
        column_sums: Vec::new(),
        online: Vec::new(),
        register_phases: Vec::new(),
    })
}

/// The row count and row length of the kernel's template, as C expressions, the Temp buffers
/// the kernel stores row values into, and the rows kept in registers (`None` when no input is
/// shaped like the rows).
pub(crate) struct RowSizes {
    pub rows: String,
    pub cols: String,
    pub temps_written: Vec<usize>,
    pub cached: Option<RegisterBody>,
    /// The doubles of the folds' shared array `kf_rs` (see [`fold_lines`]).
    pub fold_doubles: usize,
}

/// The body of the entry point for rows kept in registers, and the buffers it reads or writes a
/// vector at a time with the vector's bytes (see `row_cache`).
pub(crate) struct RegisterBody {
    /// Before the row loop: the prefetch arrays and the loads of the thread's first row.
    pub prologue: Vec<String>,
    pub body: Vec<String>,
    pub vectors: Vec<(String, u64)>,
    /// The inputs read through their launch strides that it keeps (see
    /// `row_cache::RowCache::with_strides`).
    pub strided_rows: Vec<u32>,
    /// The columns of a vector (see `row_cache::RowCache::width`).
    pub width: u32,
    /// The columns a lane keeps, at most (see `row_cache::RowCache::slots`).
    pub slots: u32,
    /// The column sums it adds to (see [`column_sums_prologue`]).
    pub sums: usize,
}

/// Emits the row body into `em`: each phase's pass and folds, then the sinks' `groups` (at each
/// column, or once per row). Inputs read outside the sinks' predicates go into `unconditional`.
///
/// Rows of at most [`ROW_CACHE_SLOTS`](crate::row_cache::ROW_CACHE_SLOTS) columns a lane have a body of their own, returned in
/// [`RowSizes::cached`], that keeps the row-shaped inputs in registers (see `row_cache`) and
/// goes into an entry point of its own; any row can take the body emitted into `em`, which
/// re-reads them each pass.
pub(crate) fn emit_body(
    em: &mut Emitter,
    g: &Graph,
    (an, kernel): (&Analysis, usize),
    plan: &RowWise,
    dims: &[Dim],
    groups: (&[Group], &[Group]),
    unconditional: &mut BTreeSet<u32>,
) -> Result<RowSizes, CodegenError> {
    let k = plan.row_axes(dims);
    em.row_mode = plan.case == RowCase::Elements;
    em.row_base = Some((k, plan.cols));
    let rows = em.product(&dims[..k]);
    let cols = em.dim(plan.cols);
    let mut sizes = RowSizes { rows, cols, temps_written: Vec::new(), cached: None, fold_doubles: fold_slots(plan, g) };
    let mark = em.mark();
    // Each row axis's (product of the row axes after it, size): where a strided input's row starts.
    let leading: Vec<(String, String)> = (0..k).map(|a| (em.product(&dims[a + 1..k]), em.dim(dims[a]))).collect();
    // The body of rows in registers with `slots` columns a lane: the cache's state and the lines.
    let mut cached = |em: &mut Emitter, slots: u32, sizes: &mut RowSizes| {
        em.open_row_block();
        em.row_cache = Some(RowCache::for_graph(g, slots).with_strides(an.strided.clone(), leading.clone()));
        emit_passes(em, g, (an, kernel), plan, k, groups, unconditional, sizes)?;
        let cache = em
            .row_cache
            .take()
            .ok_or(CodegenError::Internal { node: 0, what: "the row cache went missing while its body was emitted" })?;
        Ok::<_, CodegenError>((cache, em.take_row_block()))
    };
    let (mut cache, mut lines) = cached(em, ROW_CACHE_SLOTS, &mut sizes)?;
    // One row-shaped input kept by a kernel with row reductions: again, with more columns a lane
    // (see `ROW_CACHE_SLOTS_ONE_INPUT`; elementwise rows have no folds to save).
    // (Not with column sums: their shared array holds a row group's sums at every column.)
    if cache.inputs.len() == 1 && !plan.phases.is_empty() && plan.column_sums.is_empty() {
        (cache, lines) = cached(em, ROW_CACHE_SLOTS_ONE_INPUT, &mut sizes)?;
    }
    if cache.inputs.is_empty() {
        em.renumber(mark);
        sizes.temps_written.clear();
    } else {
        // Rows without passes load the next row ahead (see `RowCache::preload`); with column
        // sums they load in place, as the kernels with passes that take sums do.
        let (prologue, mut body) = cache.preload(g, plan.phases.is_empty() && plan.column_sums.is_empty());
        body.extend(lines);
        let sums = plan.column_sums.len();
        sizes.cached = Some(RegisterBody {
            prologue,
            body,
            strided_rows: cache.strided_rows(),
            vectors: cache.vectors,
            width: cache.width,
            slots: cache.slots,
            sums,
        });
    }
    emit_passes(em, g, (an, kernel), plan, k, groups, unconditional, &mut sizes)?;
    sizes.temps_written.sort_unstable();
    sizes.temps_written.dedup();
    em.row_base = None;
    Ok(sizes)
}

/// Emits the phases' passes and folds and the body, reading rows through the row cache when the
/// emitter has one.
#[allow(clippy::too_many_arguments)]
fn emit_passes(
    em: &mut Emitter,
    g: &Graph,
    (an, kernel): (&Analysis, usize),
    plan: &RowWise,
    k: usize,
    (groups, row_groups): (&[Group], &[Group]),
    unconditional: &mut BTreeSet<u32>,
    sizes: &mut RowSizes,
) -> Result<(), CodegenError> {
    let ctx: Vec<Coord> = (0..k as u32).map(Coord::Dom).collect();
    if plan.case == RowCase::Results {
        em.push_stmt("const long long i = row; // the row's element of the domain".to_string());
        for &n in &plan.row_inputs {
            em.eval(n, &ctx)?;
        }
    }
    let registers = em.row_cache.is_some();
    let phases = if registers { &plan.register_phases } else { &plan.phases };
    for phase in phases {
        // The phase's accumulators, one pass over the row, then each accumulator's fold.
        let online: Vec<(NodeId, NodeId)> = match registers {
            true => Vec::new(),
            false => plan.online.iter().filter(|p| phase.contains(&p.0)).copied().collect(),
        };
        let paired = |n: NodeId| online.iter().any(|&(m, s)| n == m || n == s);
        let mut pairs = Vec::with_capacity(online.len());
        for &(m, s) in &online {
            let Op::Reduce { x, .. } = g.node(m).op else {
                return Err(CodegenError::Internal { node: m.0, what: "an online maximum that does not reduce" });
            };
            let (am, asum) = (em.fresh("om"), em.fresh("os"));
            em.push_stmt(format!(
                "float {am} = __int_as_float(0xff800000), {asum} = 0.0f; // n{} and n{} in one pass",
                m.0, s.0
            ));
            em.uses.helpers.insert(Helper::MinMaxF32);
            em.uses.helpers.insert(Helper::RowOnline);
            pairs.push((m, s, x, am, asum));
        }
        let mut reductions = Vec::with_capacity(phase.len());
        for &n in phase.iter().filter(|&&n| !paired(n)) {
            let Op::Reduce { op, x, mask, .. } = g.node(n).op else {
                return Err(CodegenError::Internal {
                    node: n.0,
                    what: "a row phase holds a node that does not reduce",
                });
            };
            let accs = em.declare_accumulators(em.depth(), op, g.node(x).dtype);
            // A lane adds its columns of a float sum in f32, in order (at most 32 of a row in
            // registers; a row re-read from memory, its columns a group's lanes apart), and only
            // its partial sum is converted for the f64 fold: a conversion to f64 per element
            // issues at a quarter of the rate of an f32 add, and f64 adds wait longer. Measured
            // on an H200 (`kfuse bench`): a cross-entropy forward over rows of 128,256 f32 (the
            // entry for any row) 114 µs against 225 µs with an f64 add and a count per element.
            let partial = (matches!(op, ReduceOp::Sum | ReduceOp::Mean) && g.node(x).dtype.is_float())
                .then(|| em.declare_lane_partial(em.depth()));
            reductions.push((n, op, x, mask, accs, partial));
        }
        let l = em.open_row_loop("lane", "kf_n", "kf_g", UNROLL);
        for (_, _, x, am, asum) in &pairs {
            let mut xctx = ctx.clone();
            xctx.push(Coord::Loop(l));
            let v = em.eval(*x, &xctx)?;
            em.push_stmt(format!("kf_online_add({am}, {asum}, {v});"));
        }
        for (_, op, x, mask, accs, partial) in &reductions {
            let mut xctx = ctx.clone();
            xctx.push(Coord::Loop(l));
            let mut added = accs.clone();
            if let Some(p) = partial {
                added[0] = p.clone();
            }
            match (op, mask) {
                // An unmasked mean counts every column of the row: only its sum is accumulated.
                (ReduceOp::Mean, None) => em.reduce_update_guarded(ReduceOp::Sum, *x, None, &xctx, &added[..1])?,
                _ => em.reduce_update_guarded(*op, *x, *mask, &xctx, &added)?,
            }
        }
        em.close();
        for (_, _, _, _, accs, partial) in &reductions {
            if let Some(p) = partial {
                em.push_stmt(format!("{} = (double){p}; // the lane's columns, added in f32", accs[0]));
            }
        }
        let mut folds: Vec<(String, Combine)> = Vec::new();
        for &(_, op, _, mask, ref accs, _) in &reductions {
            let combine = Combine::of(op);
            em.uses.helpers.insert(match combine {
                Combine::Sum => Helper::RowSum,
                Combine::Max => Helper::RowMax,
                Combine::Min => Helper::RowMin,
                Combine::Prod => Helper::RowProd,
            });
            if combine.uses_min_max() {
                em.uses.helpers.insert(Helper::MinMaxF64);
            }
            for (s, a) in accs.iter().enumerate() {
                if s == 1 && op == ReduceOp::Mean && mask.is_none() {
                    em.push_stmt(format!("{a} = (double)kf_n; // the row's columns"));
                } else {
                    folds.push((a.clone(), if s == 1 { Combine::Sum } else { combine }));
                }
            }
        }
        for line in fold_lines(&folds) {
            em.push_stmt(line);
        }
        for (_, _, _, am, asum) in &pairs {
            em.push_stmt(format!("kf_row_online({am}, {asum}, kf_g, kf_rs); // over the row's lanes"));
        }
        let mut bound: Vec<(NodeId, String, String)> = pairs
            .into_iter()
            .flat_map(|(m, s, _, am, asum)| {
                [(m, am, "maximum".to_string()), (s, asum, format!("sum of exp(x - n{})", m.0))]
            })
            .collect();
        for (n, op, x, _, accs, _) in reductions {
            bound.push((n, finish_reduce(op, g.node(x).dtype, &accs), op.name().to_string()));
        }
        for (n, e, what) in bound {
            let v = em.bind_here(n, ctx.clone(), e, &format!("n{} {what} along the row, once per row", n.0));
            // A later kernel reads it: one store per row.
            if let (Some(&w), Some(&t)) = (an.row_values.get(&n), an.temps.get(&n)) {
                if w == kernel {
                    let d = temp_dtype(g.node(n).dtype);
                    let value = cuda::store_conversion(d, &v);
                    em.push_stmt(format!("if (kf_live && lane == 0) tmp{t}[row] = {value}; // for a later kernel"));
                    sizes.temps_written.push(t);
                }
            }
        }
    }
    // Row results deferred to this kernel: once per row, by the group's lane 0.
    if !row_groups.is_empty() {
        em.open_branch("kf_live && lane == 0");
        let stores = row_groups.iter().flat_map(|g| g.then.iter().chain(&g.otherwise));
        if stores.into_iter().any(|a| matches!(a, Action::Store { .. })) {
            em.push_stmt("const long long i = row; // the row's element of the rows' outputs".to_string());
        }
        grid_stride::emit_groups(em, g, row_groups, unconditional, false)?;
        em.close();
    }
    // The body: the sinks at each column of the row, or once per row.
    let element: Vec<Coord> = (0..=k as u32).map(Coord::Dom).collect();
    match (plan.case, em.row_cache.is_some()) {
        (RowCase::Elements, true) => emit_groups_cached(em, g, groups, unconditional, (&plan.column_sums, &element))?,
        (RowCase::Elements, false) => {
            em.open_columns(format!("#pragma unroll {UNROLL}\nfor (long long col = lane; col < kf_n; col += kf_g) {{"));
            em.push_stmt("const long long i = rowbase + col;".to_string());
            grid_stride::emit_groups(em, g, groups, unconditional, false)?;
            em.close();
        }
        (RowCase::Results, _) => {
            em.open_branch("kf_live && lane == 0");
            grid_stride::emit_groups(em, g, groups, unconditional, false)?;
            em.close();
        }
    }
    Ok(())
}

/// The folds of one phase's accumulators over the row's lanes (`kf_row_<op>`, see the helper). One
/// accumulator calls the helper; several share its two barriers: each is folded within the warp
/// (the helper over at most 32 lanes), then every warp's values go through `kf_rs` together
/// (a slice of 32 doubles each, [`fold_slots`]) and each lane folds its group's in order, as the
/// helper does, so the bits are the helper's.
fn fold_lines(folds: &[(String, Combine)]) -> Vec<String> {
    match folds {
        [] => return Vec::new(), // the phase's one pass folds its online pair alone
        [(a, combine)] => {
            return vec![format!("{a} = kf_row_{}({a}, kf_g, kf_rs); // over the row's lanes", combine.name())]
        }
        _ => {}
    }
    let mut lines = vec![format!("// The phase's {} folds over the row's lanes: within each warp, then the group's warps through one barrier pair.", folds.len())];
    for (a, combine) in folds {
        lines.push(format!("{a} = kf_row_{}({a}, kf_g < 32 ? kf_g : 32, kf_rs);", combine.name()));
    }
    let stores: Vec<String> =
        folds.iter().enumerate().map(|(k, (a, _))| format!("kf_rs[{}kf_warp] = {a};", slice(k))).collect();
    let firsts: Vec<String> =
        folds.iter().enumerate().map(|(k, (a, _))| format!("{a} = kf_rs[{}kf_first];", slice(k))).collect();
    let rest: Vec<String> = folds
        .iter()
        .enumerate()
        .map(|(k, (a, combine))| combine.update(a, &format!("kf_rs[{}kf_first + w]", slice(k))))
        .collect();
    lines.extend([
        "if (kf_g > 32) {".to_string(),
        "    const unsigned kf_warp = threadIdx.x >> 5, kf_first = (threadIdx.x & ~(unsigned)(kf_g - 1)) >> 5;"
            .to_string(),
        "    __syncthreads(); // kf_rs may still be read by the previous fold".to_string(),
        format!("    if ((threadIdx.x & 31u) == 0u) {{ {} }}", stores.join(" ")),
        "    __syncthreads();".to_string(),
        format!("    {}", firsts.join(" ")),
        format!("    for (unsigned w = 1; w < (unsigned)(kf_g >> 5); ++w) {{ {} }}", rest.join(" ")),
        "}".to_string(),
    ]);
    lines
}

/// The offset of fold `k`'s slice of `kf_rs` (32 doubles each) as a C prefix.
fn slice(k: usize) -> String {
    match k {
        0 => String::new(),
        k => format!("{} + ", 32 * k),
    }
}

/// The doubles `kf_rs` holds: 32 per accumulator of the phase with the most.
fn fold_slots(plan: &RowWise, g: &Graph) -> usize {
    let per_phase = |p: &Vec<NodeId>| -> u32 {
        p.iter()
            .map(|&n| match g.node(n).op {
                Op::Reduce { op, .. } => crate::analysis::slots_of(op),
                _ => 0,
            })
            .sum()
    };
    32 * plan.phases.iter().chain(&plan.register_phases).map(per_phase).max().unwrap_or(1).max(1) as usize
}

/// The body of a cached row: the lane's columns in groups of consecutive ones, each column's
/// sinks in a block of its own, then the group's stores of the outputs kept for it (see
/// `row_cache::Group`).
fn emit_groups_cached(
    em: &mut Emitter,
    g: &Graph,
    groups: &[Group],
    unconditional: &mut BTreeSet<u32>,
    (sums, element): (&[NodeId], &[Coord]),
) -> Result<(), CodegenError> {
    let Some((groups_n, width)) = em.row_cache.as_ref().map(|c| (c.groups(), c.width)) else { return Ok(()) };
    for v in 0..groups_n {
        let (header, first) = match em.row_cache.as_ref() {
            Some(c) => c.group_header(v),
            None => return Ok(()),
        };
        em.open_columns(header);
        em.push_stmt(first);
        for s in 0..sums.len() {
            em.push_stmt(format!("float kf_cg{s}[{width}]; // column sum {s} at the group's columns"));
        }
        let depth = em.depth();
        for q in 0..width {
            em.open_columns("{".to_string());
            for l in RowCache::column_start(q) {
                em.push_stmt(l);
            }
            let column_depth = em.depth();
            if let Some(cache) = em.row_cache.as_mut() {
                cache.body = Some((width * v + q).to_string());
                let outputs = cache.group.take().map(|gr| gr.outputs).unwrap_or_default();
                cache.group = Some(RowGroup { q, depth, column_depth, outputs });
            }
            grid_stride::emit_groups(em, g, groups, unconditional, false)?;
            for (s, &x) in sums.iter().enumerate() {
                let mut value = em.eval(x, element)?;
                // An output's sum adds the values as stored (rounded to its dtype), as the sum of
                // the tensor PyTorch holds would (see `columns::stored_operands`).
                if g.outputs.iter().any(|o| o.node == x) {
                    let dtype = g.node(x).dtype;
                    em.note_conversion(dtype);
                    value = cuda::load_conversion(dtype, &cuda::store_conversion(dtype, &value));
                }
                em.push_stmt(format!("kf_cg{s}[{q}] = (float){value};"));
            }
            unconditional.extend(em.uses.inputs.iter().copied());
            em.close();
        }
        let kept = em.row_cache.as_mut().and_then(|c| c.group.take()).map(|gr| gr.outputs).unwrap_or_default();
        for (o, dtype) in kept {
            em.note_conversion(dtype);
            let lines = em.row_cache.as_mut().map(|c| c.group_stores(o, dtype, &g.outputs[o].name)).unwrap_or_default();
            for l in lines {
                em.push_stmt(l);
            }
        }
        for l in group_sums(sums.len(), width) {
            em.push_stmt(l);
        }
        em.close();
    }
    Ok(())
}

/// The entry point for rows in registers, with `sums` column sums: before the row loop, the
/// shared array `kf_cps` of the block's row groups' sums (`[group][sum][column]`), zeroed; a
/// block of `block` threads with `slots` columns a lane holds at most `block * slots` columns at
/// a time (a row of at most `kf_g * slots` columns, times `kf_gpb` groups). Each lane adds its
/// group of columns' values there a vector at a time (see [`emit_groups_cached`]), so that its
/// registers hold no sums.
pub(crate) fn column_sums_prologue(sums: usize, slots: u32, block: u32) -> Vec<String> {
    if sums == 0 {
        return Vec::new();
    }
    vec![
        format!(
            "__shared__ __align__(16) float kf_cps[{}]; // the row groups' column sums: [group][sum][column]",
            block as usize * slots as usize * sums
        ),
        format!("const int kf_cb = (int)((long long)(threadIdx.x >> kf_lg) * {sums} * cols); // its row group's sums in kf_cps"),
        format!("for (long long c = threadIdx.x; c < kf_gpb * {sums} * cols; c += blockDim.x) kf_cps[c] = 0.0f;"),
        "__syncthreads();".to_string(),
    ]
}

/// After the row loop of the entry point for rows in registers, with `sums` column sums: the
/// block folds its row groups' sums in group order into its row of partial sums.
pub(crate) fn column_fold(sums: usize) -> Vec<String> {
    if sums == 0 {
        return Vec::new();
    }
    vec![
        "// The block's column sums: its row groups' folded in group order into its row of partial sums.".to_string(),
        "__syncthreads();".to_string(),
        format!("for (long long c = threadIdx.x; c < {sums} * cols; c += blockDim.x) {{"),
        "    float v = kf_cps[c];".to_string(),
        format!("    for (long long h = 1; h < kf_gpb; ++h) v += kf_cps[h * {sums} * cols + c];"),
        format!("    kf_colp[(long long)blockIdx.x * {sums} * cols + c] = v;"),
        "}".to_string(),
    ]
}

/// The lines that add a group's `width` column values `kf_cg<s>` of each of `sums` sums to the
/// row group's sums in `kf_cps`, four at a time where the width allows.
fn group_sums(sums: usize, width: u32) -> Vec<String> {
    let mut lines = Vec::new();
    for s in 0..sums {
        let at = match s {
            0 => "kf_cb + kf_j".to_string(),
            s => format!("kf_cb + {s} * (int)cols + kf_j"),
        };
        if width.is_multiple_of(4) {
            for c in (0..width).step_by(4) {
                let fields = ["x", "y", "z", "w"];
                let adds: Vec<String> =
                    (0..4).map(|q| format!("kf_t.{} += kf_cg{s}[{}];", fields[q as usize], c + q)).collect();
                lines.push(format!(
                    "{{ float4* kf_q = reinterpret_cast<float4*>(kf_cps + {at} + {c}); float4 kf_t = *kf_q; {} *kf_q = kf_t; }} // column sum {s}",
                    adds.join(" ")
                ));
            }
        } else {
            for q in 0..width {
                lines.push(format!("kf_cps[{at} + {q}] += kf_cg{s}[{q}]; // column sum {s}"));
            }
        }
    }
    lines
}

/// The shape's template.
const ROW_WISE: &str = include_str!("../templates/row_wise.cuh");

/// The sizes, the lanes per row, the `accumulators` and the grid-stride loop over the rows,
/// running `body`; `prologue` goes before the loop (with `registers`, the columns a lane keeps:
/// the body and prologue of rows kept in registers).
pub(crate) fn write(
    src: &mut String,
    sizes: &RowSizes,
    accumulators: &str,
    (prologue, body, after): (&[String], &[String], &[String]),
    registers: Option<u32>,
) {
    let mut body_lines = String::new();
    write_lines(&mut body_lines, body, "        ");
    let mut prologue_lines = String::new();
    write_lines(&mut prologue_lines, prologue, "    ");
    let mut after_lines = String::new();
    if !after.is_empty() {
        after_lines.push('\n');
        write_lines(&mut after_lines, after, "    ");
        after_lines.truncate(after_lines.trim_end_matches('\n').len());
    }
    // Rows kept in registers fill the lanes' slots: the fewest lanes (from one) that hold the row,
    // so that short rows fold over few lanes or none. The grid, sized by `crate::row_lanes`'s
    // larger groups, has blocks enough; the grid-stride loop leaves the extra ones idle.
    let (min_lanes, cols_per_lane) = match registers {
        Some(slots) => (1, u64::from(slots)),
        None => (crate::ROW_MIN_LANES, crate::ROW_COLS_PER_LANE),
    };
    let spread = match registers {
        Some(slots) if slots > ROW_CACHE_SLOTS => format!(
            "\n    while (kf_g < (int)blockDim.x && kf_g * {ROW_CACHE_SLOTS} < cols && rows * kf_g < {ROW_SPREAD_THREADS}ll) kf_g <<= 1; // few rows: more lanes each"
        ),
        _ => String::new(),
    };
    src.push_str(&render(
        ROW_WISE,
        &[
            ("rows", &sizes.rows),
            ("cols", &sizes.cols),
            ("min_lanes", &min_lanes.to_string()),
            ("cols_per_lane", &cols_per_lane.to_string()),
            ("fold_doubles", &sizes.fold_doubles.to_string()),
            ("accumulators", accumulators),
            ("prologue", &prologue_lines),
            ("n_type", if registers.is_some() { "int" } else { "long long" }),
            ("spread", &spread),
            ("body", &body_lines),
            ("after", &after_lines),
        ],
    ));
}

/// The launch's grid: enough blocks for every row group of the row length's lanes, at most
/// `resident` blocks per multiprocessor.
pub(crate) fn grid(plan: &RowWise, dims: &[Dim], block: u32, resident: u32) -> Result<GridSpec, CodegenError> {
    let rows = size_expr(&dims[..plan.row_axes(dims)])?;
    let cols = size_expr(&[plan.cols])?;
    Ok(GridSpec::Rows { rows, cols, block, max_blocks_per_sm: resident })
}

/// The header's domain line; `registers`: the kernel's block, the largest block of its entry
/// for rows in registers and the strided inputs that entry keeps, when it has one.
pub(crate) fn domain_note(plan: &RowWise, dom: &str, registers: Option<(u32, u32, &[u32])>) -> String {
    let per = match plan.case {
        RowCase::Elements => "the body at each element of the row",
        RowCase::Results => "the body once per row (lane 0)",
    };
    let kept = match plan.phases.is_empty() {
        true => String::new(),
        false => format!(", {ROW_CACHE_SLOTS_ONE_INPUT} when one row-shaped input is kept"),
    };
    let blocks = match registers {
        Some((block, max, _)) if max > block => format!(", in blocks of {block} up to {max} threads as the row needs"),
        _ => String::new(),
    };
    let strided = match registers {
        Some((_, _, inputs)) if !inputs.is_empty() => {
            let names: Vec<String> = inputs.iter().map(|k| format!("in{k}")).collect();
            format!(
                ", strided {} kept where the last axis has stride 1 and each row starts on a vector",
                names.join(" ")
            )
        }
        _ => String::new(),
    };
    // The entry for rows in registers, where the kernel has one (row-shaped inputs to keep).
    let registers = match registers {
        Some(_) => {
            format!(
                "; rows kept in registers: from 1 lane, at most {ROW_CACHE_SLOTS} columns a lane{kept}{blocks}{strided}"
            )
        }
        None => String::new(),
    };
    let lanes = format!(
        "a group of {} to blockDim.x lanes per row (about {} columns a lane{registers})",
        crate::ROW_MIN_LANES,
        crate::ROW_COLS_PER_LANE,
    );
    let online = match plan.online.len() {
        0 => String::new(),
        _ => "; a softmax's maximum and exp-sum in one pass (a running maximum) over rows read from memory".to_string(),
    };
    if plan.phases.is_empty() {
        return format!(
            "// domain: {dom} elements; elementwise by rows of the last axis, {lanes}, grid-stride over the rows; no row reductions, the body at each element of the row"
        );
    }
    format!(
        "// domain: {dom} elements; rows of the last reduced axis, {lanes}, grid-stride over the rows; its {} row reduction phase(s) computed once per row, then {per}{online}",
        plan.phases.len()
    )
}
