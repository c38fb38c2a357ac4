//! The columns shape: reductions over the leading axis of an operand shaped like the rows times
//! the kernel's domain (a bias's gradient, a norm's weight gradients: `sum(g, axis: 0)` of a
//! `[B, D]` `g`) as split reductions with a deterministic fold, instead of one thread per column
//! walking every row (a few hundred threads for a whole GPU).
//!
//! The domain's flat elements (the columns) come in tiles of [`TILE`]; each tile's rows are split
//! in `kf_s` chunks, one block each (`blockIdx.x = tile * kf_s + chunk`; the host's
//! `GridSpec::Columns` sets the grid, so `kf_s = gridDim.x / tiles`). A block's threads are
//! [`TILE`] columns by `blockDim.x / TILE` row lanes:
//!
//! 1. Each thread adds the rows `chunk start + lane, + lanes, …` of its column into its
//!    accumulators (the reduction's element evaluated at that row and column).
//! 2. The block folds its row lanes in order through shared memory and writes one partial per
//!    accumulator and column of its chunk.
//! 3. A ticket per tile: the tile's last block folds the chunks' partials in chunk order, binds
//!    each reduction's value, runs the kernel's body (the stores) for the tile's columns, and
//!    resets the ticket for the next launch.
//!
//! No float atomics: the fold order is fixed by the grid, so results are the same bits from run
//! to run on a device.
//!
//! A column kernel whose unmasked float sums read values that the row kernel of the same rows
//! evaluates anyway ([`fuse`]) also has a fold entry (`<name>_fold`): the row kernel's entry for
//! rows in registers sums those values per column as it goes, one row of partial sums per block,
//! and the fold entry runs step 1 over those rows instead of the rows of the operand (its own
//! grid, the same partials and tickets). The executor launches it where the row kernel took that
//! entry. Not handled here: reductions over several leading axes or nested column
//! reductions (they stay serial loops, see `emit`), kernels with full reductions.

use std::collections::{BTreeSet, HashMap};

use kfuse_ir::{DType, Dim, Graph, NodeId, Op, ReduceAxis, ReduceOp};

use crate::actions::{Combine, Group};
use crate::analysis::{slots_of, Analysis, KernelInfo, SinkKind};
use crate::buffers::size_expr;
use crate::cuda::Helper;
use crate::emit::{finish_reduce, Coord, Emitter};
use crate::plan::GridSpec;
use crate::shapes::grid_stride;
use crate::text::{render, write_lines};
use crate::CodegenError;

/// Columns a block takes (one warp's width: the row lanes' loads are coalesced).
pub(crate) const TILE: u32 = 32;
/// How many row steps of a thread's pass are unrolled (their loads in flight together).
const UNROLL: u32 = 4;

/// A kernel's column reductions, found by [`detect`].
#[derive(Clone, Debug)]
pub(crate) struct Columns {
    /// The reductions over axis 0 of an operand shaped `[rows] ++ domain`, in node order.
    pub reductions: Vec<NodeId>,
    /// The reduced leading axis.
    pub rows: Dim,
    /// Accumulators per column over all the reductions (a mean keeps two).
    pub accs: u32,
    /// The fold entry's plan (see [`fuse`]): the reductions are folded from the column partial
    /// sums that an earlier row-wise kernel wrote as it computed their operands (one row of them
    /// per block of its grid), instead of from the rows; its grid splits those rows in chunks
    /// (`FoldEntry::blocks`).
    pub from: Option<FromRows>,
}

/// Where a fold kernel's partial sums come from (see [`fuse`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FromRows {
    /// The row-wise kernel that writes them (into its [`crate::BufferKind::ColumnPartials`]).
    pub kernel: usize,
}

/// The column reductions of kernel `info`, among the nodes its element work evaluates (`seen`):
/// reductions over axis 0 alone, without keepdim, of an operand shaped `[rows] ++ domain`, no
/// one of them inside another's operand. `None` when there are none, when the kernel also has
/// full reductions, or when a sink is not a tensor output.
pub(crate) fn detect(g: &Graph, info: &KernelInfo, seen: &[bool]) -> Option<Columns> {
    let dims = &info.dims;
    if dims.is_empty() || info.slots > 0 || info.sinks.iter().any(|s| !matches!(s.kind, SinkKind::Output { .. })) {
        return None;
    }
    let mut reductions = Vec::new();
    let mut rows = None;
    for (i, node) in g.nodes.iter().enumerate() {
        let Op::Reduce { op, axis: ReduceAxis::Axes { mask: 1, keepdim: false }, x, .. } = node.op else { continue };
        let xd = g.node(x).shape.dims();
        if !seen[i] || xd.len() != dims.len() + 1 || xd[1..] != dims[..] || rows.is_some_and(|r| r != xd[0]) {
            continue;
        }
        rows = Some(xd[0]);
        reductions.push((NodeId(i as u32), op));
    }
    let rows = rows?;
    // Each reduction's operand must not read another: they are all folded at once.
    let found: BTreeSet<NodeId> = reductions.iter().map(|r| r.0).collect();
    let mut inside = vec![false; g.nodes.len()];
    for (i, node) in g.nodes.iter().enumerate() {
        let mut r = false;
        node.op.for_each_operand(&g.lists, |x| r |= inside[x.index()] || found.contains(&x));
        inside[i] = r;
    }
    if reductions.iter().any(|&(n, _)| inside[n.index()]) {
        return None;
    }
    let accs = reductions.iter().map(|&(_, op)| slots_of(op)).sum();
    Some(Columns { reductions: reductions.into_iter().map(|r| r.0).collect(), rows, accs, from: None })
}

/// The row-wise kernel (an earlier one, of the same level) that can also sum the operands of
/// column kernel `c`'s reductions as it goes (`plan`; layer norm's weight gradients beside its
/// input gradient), so that `c` folds partial sums instead of reading the rows again: its
/// domain is `[rows, cols]` with the reductions' operands shaped like it, and everything the
/// operands read is in its reach (its own row reductions, row values and scalars of earlier
/// kernels, inputs). Unmasked float sums only; an operand that is a stored output only when the
/// row kernel stores it (a bias gradient beside the gradient it sums). Returns that kernel and
/// the sums' operands in reduction order; `None` when no kernel qualifies.
pub(crate) fn fuse(
    g: &Graph,
    an: &Analysis,
    rows: &[crate::shapes::row_wise::KernelRows],
    c: usize,
    plan: &Columns,
) -> Option<(usize, Vec<NodeId>)> {
    let info = &an.kernels[c];
    let mut operands = Vec::with_capacity(plan.reductions.len());
    for &n in &plan.reductions {
        let Op::Reduce { op: ReduceOp::Sum, x, mask: None, .. } = g.node(n).op else { return None };
        if !matches!(g.node(x).dtype, DType::F32 | DType::F16 | DType::BF16) {
            return None;
        }
        operands.push(x);
    }
    // A stored output is summed as stored (see `stored_operands`): by the row kernel only when
    // that kernel stores it, then adding the value it stores (see `row_wise`'s column sums).
    let stored = stored_operands(g, an, c, plan);
    let stores = |a: usize, o: usize| {
        an.kernels[a].sinks.iter().any(|s| matches!(s.kind, SinkKind::Output { index } if index == o))
    };
    let mut domain = vec![plan.rows];
    domain.extend_from_slice(&info.dims);
    (0..c)
        .find(|&a| {
            let Some(rp) = rows[a].plan.as_ref() else { return false };
            let ai = &an.kernels[a];
            let own: BTreeSet<NodeId> = rp.phases.iter().flatten().copied().collect();
            rp.case == crate::shapes::row_wise::RowCase::Elements
                && ai.level == info.level
                && ai.dims.len() == 2
                && ai.dims == domain
                && operands.iter().all(|&x| reachable(g, an, a, &own, x))
                && stored.values().all(|&o| stores(a, o))
        })
        .map(|a| (a, operands))
}

/// Whether kernel `a`, whose row reductions are `own`, can evaluate `x` at each element.
fn reachable(g: &Graph, an: &Analysis, a: usize, own: &BTreeSet<NodeId>, x: NodeId) -> bool {
    let mut stack = vec![x];
    let mut seen = BTreeSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) || own.contains(&n) {
            continue;
        }
        if g.node(n).shape.is_scalar() {
            if let Some(home) = an.home[n.index()] {
                if home < a {
                    continue;
                }
                return false;
            }
        }
        if let Some(&w) = an.row_values.get(&n) {
            if w < a {
                continue;
            }
            return false;
        }
        if crate::analysis::counts_every_element(g, n) {
            continue; // the product of sizes
        }
        if matches!(g.node(n).op, Op::Reduce { .. }) {
            return false;
        }
        g.node(n).op.for_each_operand(&g.lists, |o| stack.push(o));
    }
    true
}

/// The column reductions' operands that an earlier kernel stores as outputs (node → output
/// index): the reductions read those buffers (one tensor: a bias gradient summed from the stored
/// input gradient) instead of computing their operands again from the tensors they come from.
/// The sum is then of the stored values, rounded to the output's dtype, as PyTorch sums the
/// gradient tensor it has.
pub(crate) fn stored_operands(g: &Graph, an: &Analysis, k: usize, plan: &Columns) -> HashMap<NodeId, usize> {
    let mut stored = HashMap::new();
    for &n in &plan.reductions {
        let Op::Reduce { x, .. } = g.node(n).op else { continue };
        let earlier = an.kernels[..k].iter().flat_map(|info| &info.sinks).find_map(|s| match s.kind {
            SinkKind::Output { index } if g.outputs[index].node == x => Some(index),
            _ => None,
        });
        if let Some(o) = earlier {
            stored.insert(x, o);
        }
    }
    stored
}

/// The C expressions of the kernel's sizes, for its template.
pub(crate) struct ColumnSizes {
    pub cols: String,
    pub rows: String,
}

/// Emits the whole kernel body into `em`: the pass over the block's rows, the block's fold and
/// partials, the tile's ticket, the last block's fold of the partials and the sinks' `groups` at
/// the tile's columns. Inputs read outside the sinks' predicates go into `unconditional`.
pub(crate) fn emit_body(
    em: &mut Emitter,
    g: &Graph,
    plan: &Columns,
    dims: &[Dim],
    groups: &[Group],
    unconditional: &mut BTreeSet<u32>,
) -> Result<ColumnSizes, CodegenError> {
    let rows = match plan.from {
        Some(_) => "kf_parts".to_string(),
        None => em.dim(plan.rows),
    };
    let sizes = ColumnSizes { cols: em.product(dims), rows };
    let dom: Vec<Coord> = (0..dims.len() as u32).map(Coord::Dom).collect();
    // 1. The pass over the chunk's rows (of partial sums, for a fold).
    let mut reductions = Vec::with_capacity(plan.reductions.len());
    for &n in &plan.reductions {
        let Op::Reduce { op, x, mask, .. } = g.node(n).op else {
            return Err(CodegenError::Internal { node: n.0, what: "a column reduction that does not reduce" });
        };
        let accs = em.declare_accumulators(0, op, g.node(x).dtype);
        reductions.push((n, op, x, mask, accs));
    }
    let l = em.open_row_loop("kf_r0 + kf_lane", "kf_r1", "kf_lanes", UNROLL);
    for (s, (_, op, x, mask, accs)) in reductions.iter().enumerate() {
        if plan.from.is_some() {
            let n = reductions.len();
            em.push_stmt(format!("{} += (double)kf_colp[(j{l} * {n} + {s}) * cols + i];", accs[0]));
            continue;
        }
        let mut xctx = vec![Coord::Loop(l)];
        xctx.extend(dom.iter().cloned());
        em.reduce_update_guarded(*op, *x, *mask, &xctx, accs)?;
    }
    em.close();
    unconditional.extend(em.uses.inputs.iter().copied());
    // 2. The block's fold over its row lanes, in lane order, and its partials.
    let all: Vec<(Combine, &String)> = reductions
        .iter()
        .flat_map(|(_, op, _, _, accs)| {
            let c = Combine::of(*op);
            // A mean's count adds; its sum (the first) combines as the reduction does.
            accs.iter().enumerate().map(move |(j, a)| (if j == 0 { c } else { Combine::Sum }, a))
        })
        .collect();
    for (s, (c, a)) in all.iter().enumerate() {
        if c.uses_min_max() {
            em.uses.helpers.insert(Helper::MinMaxF64);
        }
        em.push_stmt(format!("kf_cs[kf_lane][kf_c] = {a}; // accumulator {s}"));
        em.push_stmt("__syncthreads();".to_string());
        em.push_stmt("if (kf_lane == 0) {".to_string());
        em.push_stmt(format!(
            "    for (long long kf_k = 1; kf_k < kf_lanes; ++kf_k) {a} = {};",
            c.expr(a, "kf_cs[kf_k][kf_c]")
        ));
        em.push_stmt(format!("    partials[(blockIdx.x * {}ll + {s}) * {TILE} + kf_c] = {a};", all.len()));
        em.push_stmt("}".to_string());
        em.push_stmt("__syncthreads(); // kf_cs is reused".to_string());
    }
    // 3. The tile's ticket; its last block folds the chunks in order and runs the body.
    em.push_stmt("__shared__ bool kf_last_block;".to_string());
    em.push_stmt("if (threadIdx.x == 0) {".to_string());
    em.push_stmt("    __threadfence(); // publish the partials before taking a ticket".to_string());
    em.push_stmt("    kf_last_block = atomicAdd(&counter[kf_tile], 1u) == (unsigned int)(kf_s - 1);".to_string());
    em.push_stmt("}".to_string());
    em.push_stmt("__syncthreads();".to_string());
    em.push_stmt("if (!kf_last_block) return;".to_string());
    em.push_stmt("__threadfence();".to_string());
    em.push_stmt(
        "if (threadIdx.x == 0) counter[kf_tile] = 0u; // self-resetting: the next launch needs no memset".to_string(),
    );
    em.open_branch("kf_lane == 0 && kf_live");
    for (s, (c, a)) in all.iter().enumerate() {
        let p = format!(
            "((volatile double*)partials)[((long long)(kf_tile * kf_s + kf_k) * {} + {s}) * {TILE} + kf_c]",
            all.len()
        );
        em.push_stmt(format!(
            "{a} = ((volatile double*)partials)[((long long)(kf_tile * kf_s) * {} + {s}) * {TILE} + kf_c];",
            all.len()
        ));
        em.push_stmt(format!("for (long long kf_k = 1; kf_k < kf_s; ++kf_k) {a} = {};", c.expr(a, &p)));
    }
    for (n, op, x, _, accs) in &reductions {
        let e = finish_reduce(*op, g.node(*x).dtype, accs);
        em.bind_here(*n, dom.clone(), e, &format!("n{} {} over the rows, folded over the chunks", n.0, op.name()));
    }
    grid_stride::emit_groups(em, g, groups, unconditional, false)?;
    em.close();
    Ok(sizes)
}

/// The shape's template.
const COLUMNS: &str = include_str!("../templates/columns.cuh");

/// The sizes, the block's coordinates and `body`.
pub(crate) fn write(src: &mut String, sizes: &ColumnSizes, block: u32, body: &[String]) {
    let mut body_lines = String::new();
    write_lines(&mut body_lines, body, "    ");
    src.push_str(&render(
        COLUMNS,
        &[
            ("cols", &sizes.cols),
            ("rows", &sizes.rows),
            ("tile", &TILE.to_string()),
            ("lanes", &(block / TILE).to_string()),
            ("body", &body_lines),
        ],
    ));
}

/// The launch's grid: a block per tile of [`TILE`] columns and chunk of rows.
pub(crate) fn grid(plan: &Columns, dims: &[Dim], block: u32) -> Result<GridSpec, CodegenError> {
    Ok(GridSpec::Columns { cols: size_expr(dims)?, rows: size_expr(&[plan.rows])?, lanes: block / TILE })
}

/// The header's domain line.
pub(crate) fn domain_note(plan: &Columns, dom: &str) -> String {
    if let Some(from) = plan.from {
        return format!(
            "// domain: {dom} elements as columns, in tiles of {TILE}; {} sum(s) over the leading axis folded from the column partial sums of kernel {}'s entry for rows in registers (a row of them per block of its grid), split in chunks of those rows, a block per tile and chunk, folded in chunk order by the tile's last block",
            plan.reductions.len(),
            from.kernel + 1
        );
    }
    format!(
        "// domain: {dom} elements as columns, in tiles of {TILE}; {} reduction(s) over the leading axis split in chunks of rows, a block per tile and chunk, folded in chunk order by the tile's last block",
        plan.reductions.len()
    )
}
