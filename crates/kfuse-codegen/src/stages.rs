//! Reductions stored once. A reduction along axes other than the last whose result is read back
//! at the elements it reduces (`x - mean(x, axis: 0, keepdim: true)`, a batch norm's statistics)
//! would be computed where it is used, again at every element that reads it. Such a reduction is
//! computed by a stage of its own instead, a plan whose output is the reduction, stored into a
//! [`crate::BufferKind::Temp`] (or the graph's output, when it is one); the later stages read it
//! as an input. [`split`] finds them and the
//! graph of each stage; [`merge`] joins the stages' plans into one.
//!
//! Not handled here: how a stage is planned (see `analysis` and `shapes`).

use std::collections::BTreeSet;

use kfuse_ir::{
    BinaryOp, DType, Dim, Graph, Input, InputId, Kind, Node, NodeId, Op, Output, ReduceAxis, ReduceOp, Shape,
};

use crate::analysis::{counts_every_element, depends_on, full_reduce};
use crate::{BufferDecl, BufferKind, ElemType, Param, Plan, SizeExpr};

/// The most operand elements a reduction computed where it is used may read again per element:
/// past it (or where the count is known only at run time) a reduction along axes other than the
/// last that is read back at larger shapes is stored once by a stage of its own.
pub const RECOMPUTED_EXTENT_LIMIT: u64 = 64;

/// A graph split into stages: each earlier stage computes some stored values; the last computes
/// the graph's outputs.
pub struct Stages {
    /// The stored values (a stored reduction, or the first part of one), in the order they are
    /// computed: their dtype and shape as the stages read them.
    pub stored: Vec<(DType, Shape)>,
    /// Per stored value, the original graph's output that it is, if any: the stage that computes
    /// it stores it there, and the last stage does not compute that output again.
    pub stored_outputs: Vec<Option<usize>>,
    /// The earlier stages, in order: a graph whose outputs are stored values, and the indices
    /// into `stored` of its outputs. Its inputs are the original graph's, then the values stored
    /// by the stages before it, in `stored` order.
    pub early: Vec<(Graph, Vec<usize>)>,
    /// The last stage: the original graph with every stored reduction read from an input after
    /// the original ones, in `stored` order (the first parts are inputs it does not read), and
    /// without the outputs that are stored values. `None` when every output is one.
    pub last: Option<Graph>,
    /// The original graph's output that each output of `last` is.
    pub last_outputs: Vec<usize>,
}

/// The longest row a stage reduces by merging constant trailing axes: longer rows are reduced
/// in parts (a row takes one group of lanes, so fewer, longer rows leave the GPU idler: a batch
/// norm's statistics of `[32, 64, 56, 56]` took 62 µs in rows of 3136 and 48 µs in parts of 56
/// on an H200).
const MERGED_ROW_LIMIT: u64 = 1024;

/// A stored reduction as the stages reduce it: its operand (its own, then the last part stored)
/// and the axes of that operand left to reduce (bit `a` = axis `a`).
struct Work {
    r: NodeId,
    x: NodeId,
    axes: u32,
    parted: bool,
    /// The variance about `r` (a mean) that the same parts compute (see [`variance_of`]), and
    /// the last part's variances, one per element of `x` (`None` before the first part).
    var: Option<(NodeId, Option<NodeId>)>,
}

/// The stages of `g` (verified), or `None` when it has no reduction to store.
///
/// A stored reduction is computed in the form that plans well. Its kept axes (`keepdim`) are
/// left out: the same elements in the same order, and a reduction over the leading axis alone
/// plans as a split column reduction. An unmasked sum, mean, max or min of floats that reduces
/// trailing axes is reduced in parts, each a stage storing its part in f32: the longest suffix of
/// them that one row holds (the last axis, or constant axes merged by a reshape into a row of at
/// most `MERGED_ROW_LIMIT`) by rows, again while reduced axes are left before it; the last part
/// is reduced over what is left (by rows, or by columns over the leading axis). A mean reduced
/// in parts whose variance is stored too (`mean((x - m) * (x - m))` over the same axes) has it
/// computed by the same parts, in one pass over `x`: each part stores its rows' means and their
/// variances, and the next part combines them (see [`moments`]). Any other reduction is computed
/// as it is, its trailing axes merged into rows where their sizes are constant. An output that
/// is elementwise work on stored values, of the shape of a value an earlier stage stores, is
/// computed by that stage (see [`output_with_its_stage`]).
pub(crate) fn split(g: &Graph, forced: &BTreeSet<NodeId>) -> Option<Stages> {
    let mut stored: Vec<(DType, Shape)> = Vec::new();
    let mut stored_outputs: Vec<Option<usize>> = Vec::new();
    let mut early = Vec::new();
    let mut current = g.clone();
    loop {
        let candidates = stored_candidates(&current, forced);
        if candidates.is_empty() {
            break;
        }
        // The candidates that read no other candidate are computed by this stage.
        let mut work: Vec<Work> = candidates
            .iter()
            .copied()
            .filter(|&r| !candidates.iter().any(|&o| o != r && depends_on(&current, r, o)))
            .filter_map(|r| match current.node(r).op {
                Op::Reduce { axis, x, .. } => {
                    let rank = current.node(x).shape.rank();
                    Some(Work { r, x, axes: axis_bits(axis, rank), parted: false, var: None })
                }
                _ => None,
            })
            .collect();
        for w in &mut work {
            if next_part(&current, w).is_some() {
                w.var = variance_of(&current, w.r, &candidates).map(|v| (v, None));
            }
        }
        // Parts, a stage each, while some reduction has one to store.
        loop {
            let parts: Vec<(usize, usize)> =
                work.iter().enumerate().filter_map(|(i, w)| next_part(&current, w).map(|k| (i, k))).collect();
            if parts.is_empty() {
                break;
            }
            let mut stage = current.clone();
            stage.outputs.clear();
            let mut outs = Vec::new();
            for (i, k) in parts {
                let w = &mut work[i];
                let values = match w.var {
                    None => vec![(w.r, rows_reduction(&mut stage, w.r, w.x, k, DType::F32)?)],
                    Some((v, q)) => {
                        let (mean, var) = moments(&mut stage, w.x, q, k)?;
                        vec![(w.r, mean), (v, var)]
                    }
                };
                let mut ids = Vec::with_capacity(2);
                for (of, part) in values {
                    let (dtype, shape) = (DType::F32, stage.node(part).shape.clone());
                    let name = stored_name(of, &format!("part {}", stored.len()));
                    stage.outputs.push(Output { name: name.clone(), node: part });
                    outs.push(stored.len());
                    stored.push((dtype, shape.clone()));
                    stored_outputs.push(None);
                    current.inputs.push(Input { name, dtype, shape: shape.clone() });
                    let id = InputId((current.inputs.len() - 1) as u32);
                    current.nodes.push(Node { op: Op::Input(id), dtype, shape });
                    ids.push(NodeId((current.nodes.len() - 1) as u32));
                }
                w.x = ids[0];
                if let (Some((v, _)), Some(&q)) = (w.var, ids.get(1)) {
                    w.var = Some((v, Some(q)));
                }
                w.axes &= (1u32 << k) - 1;
                w.parted = true;
            }
            early.push((stage, outs));
        }
        let mut stage = current.clone();
        stage.outputs.clear();
        let mut outs = Vec::new();
        // Variances whose means are reduced by columns: stored by a stage after the means'.
        let mut deferred = Vec::new();
        for w in &work {
            let values = match w.var {
                Some((v, q)) if w.parted => {
                    let dims = stage.node(w.x).shape.dims().to_vec();
                    match row_suffix(&dims, w.axes, true) {
                        Some(k) if w.axes & ((1u32 << k) - 1) == 0 => {
                            let (mean, var) = moments(&mut stage, w.x, q, k)?;
                            let (mean_dtype, var_dtype) = (stage.node(w.r).dtype, stage.node(v).dtype);
                            vec![(w.r, cast(&mut stage, mean, mean_dtype)), (v, cast(&mut stage, var, var_dtype))]
                        }
                        _ => {
                            deferred.push((w.r, v, w.x, q?, w.axes));
                            vec![(w.r, rest_of(&mut stage, w)?)]
                        }
                    }
                }
                _ if w.parted => vec![(w.r, rest_of(&mut stage, w)?)],
                _ => vec![(w.r, stored_form(&mut stage, w.r)?)],
            };
            for (r, out) in values {
                let mut to =
                    Kept { g, current: &mut current, stored: &mut stored, stored_outputs: &mut stored_outputs };
                to.keep(&mut stage, &mut outs, r, out);
            }
        }
        early.push((stage, outs));
        if !deferred.is_empty() {
            let mut stage = current.clone();
            stage.outputs.clear();
            let mut outs = Vec::new();
            for (m, v, means, q, axes) in deferred {
                let var = variance_about(&mut stage, m, means, q, axes)?;
                let dtype = stage.node(v).dtype;
                let var = cast(&mut stage, var, dtype);
                let mut to =
                    Kept { g, current: &mut current, stored: &mut stored, stored_outputs: &mut stored_outputs };
                to.keep(&mut stage, &mut outs, v, var);
            }
            early.push((stage, outs));
        }
    }
    if stored.is_empty() {
        return None;
    }
    for o in 0..g.outputs.len() {
        if !stored_outputs.contains(&Some(o)) {
            if let Some(s) = output_with_its_stage(g, &current, &mut early, o) {
                let node = g.node(g.outputs[o].node);
                early[s].1.push(stored.len());
                stored.push((node.dtype, node.shape.clone()));
                stored_outputs.push(Some(o));
            }
        }
    }
    let last_outputs: Vec<usize> = (0..g.outputs.len()).filter(|o| !stored_outputs.contains(&Some(*o))).collect();
    current.outputs = last_outputs.iter().map(|&o| g.outputs[o].clone()).collect();
    let last = (!current.outputs.is_empty()).then_some(current);
    Some(Stages { stored, stored_outputs, early, last, last_outputs })
}

/// Output `o` of `g` computed by the early stage that stores the last stored value it reads,
/// where it is elementwise work on the original inputs and stored values (in `current`, the last
/// stage's graph) of the shape of a value that stage stores: the stage's kernel of that shape
/// computes it, where the last stage would launch a kernel for it alone (a batch norm's running
/// statistics and weight gradient, per channel, from the channels' sums). Appends the output to
/// that stage's graph and returns the stage; `None` leaves `o` to the last stage.
fn output_with_its_stage(g: &Graph, current: &Graph, early: &mut [(Graph, Vec<usize>)], o: usize) -> Option<usize> {
    let original = g.inputs.len();
    let root = g.outputs[o].node;
    // The output's work in the last stage, in node order, and the stored values it reads.
    let mut cone = BTreeSet::new();
    let mut stack = vec![root];
    let mut reads = Vec::new();
    while let Some(n) = stack.pop() {
        if !cone.insert(n) {
            continue;
        }
        match current.node(n).op {
            Op::Input(id) => reads.extend((id.0 as usize).checked_sub(original)),
            Op::Reduce { .. } | Op::Rand { .. } | Op::Stack(_) => return None,
            ref op => op.for_each_operand(&current.lists, |x| stack.push(x)),
        }
    }
    let stage_of = |j: usize| early.iter().position(|(_, outs)| outs.contains(&j));
    let s = reads.iter().map(|&j| stage_of(j)).max()??;
    let (sg, outs) = &mut early[s];
    let shape = &current.node(root).shape;
    if !sg.outputs.iter().any(|out| sg.node(out.node).shape == *shape) {
        return None;
    }
    let mut to = std::collections::HashMap::new();
    for &n in &cone {
        let node = current.node(n);
        let copy = match node.op {
            Op::Input(id) => {
                match (id.0 as usize).checked_sub(original).and_then(|j| outs.iter().position(|&k| k == j)) {
                    // A value this stage computes: its node, in the shape later stages read it in.
                    Some(k) => {
                        let v = sg.outputs[k].node;
                        match sg.node(v).shape == node.shape {
                            true => v,
                            false => push(sg, Op::Reshape(v), node.dtype, node.shape.clone()),
                        }
                    }
                    // An original input, or one stored by a stage before (the same input here).
                    None => push(sg, Op::Input(id), node.dtype, node.shape.clone()),
                }
            }
            // Elementwise work (the cone holds no reduction, random numbers or stack).
            op => push(sg, op.map_operands(|x| to[&x]), node.dtype, node.shape.clone()),
        };
        to.insert(n, copy);
    }
    sg.outputs.push(Output { name: g.outputs[o].name.clone(), node: to[&root] });
    Some(s)
}

/// Where [`split`] keeps the values its stages store.
struct Kept<'a> {
    g: &'a Graph,
    current: &'a mut Graph,
    stored: &'a mut Vec<(DType, Shape)>,
    stored_outputs: &'a mut Vec<Option<usize>>,
}

impl Kept<'_> {
    /// Stores reduction `r` of the graph being split, computed by node `out` of `stage` (whose
    /// stored values `outs` lists): into the original graph's output when `r` is one (named so
    /// in the plan's notes), and read by the later stages as an input in its place.
    fn keep(&mut self, stage: &mut Graph, outs: &mut Vec<usize>, r: NodeId, out: NodeId) {
        let output = self.g.outputs.iter().position(|o| o.node == r);
        let name = output.map_or_else(|| stored_name(r, "stored"), |o| self.g.outputs[o].name.clone());
        stage.outputs.push(Output { name, node: out });
        outs.push(self.stored.len());
        let node = self.current.node(r);
        let (dtype, shape) = (node.dtype, node.shape.clone());
        self.stored.push((dtype, shape.clone()));
        self.stored_outputs.push(output);
        self.current.inputs.push(Input { name: stored_name(r, "stored"), dtype, shape });
        self.current.nodes[r.index()].op = Op::Input(InputId((self.current.inputs.len() - 1) as u32));
    }
}

/// The name of an input (and stage output) that holds a stored value of reduction `r`: not an
/// identifier, so no name of the user's.
fn stored_name(r: NodeId, what: &str) -> String {
    format!("{what} n{}", r.0)
}

fn push(g: &mut Graph, op: Op, dtype: DType, shape: Shape) -> NodeId {
    g.nodes.push(Node { op, dtype, shape });
    NodeId((g.nodes.len() - 1) as u32)
}

/// The reduced axes of `axis` over an operand of rank `rank`, as bits.
fn axis_bits(axis: ReduceAxis, rank: usize) -> u32 {
    axis.axes(rank).iter().fold(0u32, |m, &a| m | 1 << a)
}

/// The first axis of the longest suffix of `dims` reduced under `axes` that one row holds: the
/// last axis, with the constant axes before it while their product stays within
/// [`MERGED_ROW_LIMIT`] (any product when `unlimited`). `None` when the last axis is not reduced.
fn row_suffix(dims: &[Dim], axes: u32, unlimited: bool) -> Option<usize> {
    let rank = dims.len();
    if rank == 0 || axes >> (rank - 1) & 1 == 0 {
        return None;
    }
    let mut k = rank - 1;
    let mut row = match dims[k] {
        Dim::Const(c) => Some(c),
        Dim::Sym(_) => None,
    };
    while k > 0 && axes >> (k - 1) & 1 == 1 {
        let (Some(r), Dim::Const(c)) = (row, dims[k - 1]) else { break };
        let merged = r.saturating_mul(c);
        if !unlimited && merged > MERGED_ROW_LIMIT {
            break;
        }
        row = Some(merged);
        k -= 1;
    }
    Some(k)
}

/// Where the next part of `w` starts (see [`split`]): the first axis of the row suffix, when
/// `w`'s reduction reduces in parts and reduced axes are left before the suffix.
fn next_part(g: &Graph, w: &Work) -> Option<usize> {
    let Op::Reduce { op, mask: None, .. } = g.node(w.r).op else { return None };
    let partable = matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
        && g.node(w.r).dtype.kind() == Kind::Float;
    let k = row_suffix(g.node(w.x).shape.dims(), w.axes, false)?;
    (partable && w.axes & ((1u32 << k) - 1) != 0).then_some(k)
}

/// `x` reduced (by `r`'s op, unmasked) along its axes from `k` on as one last-axis reduction,
/// appended to `g` with `dtype` (a cast of `x` first when it differs): `x` reshaped to merge them
/// when they are several (of constant sizes).
fn rows_reduction(g: &mut Graph, r: NodeId, x: NodeId, k: usize, dtype: DType) -> Option<NodeId> {
    let Op::Reduce { op, .. } = g.node(r).op else { return None };
    let rows = as_rows(g, x, k)?;
    let rows = cast(g, rows, dtype);
    let shape = Shape(g.node(x).shape.dims()[..k].to_vec());
    Some(push(g, Op::Reduce { op, axis: ReduceAxis::Last, x: rows, mask: None }, dtype, shape))
}

/// `x` with its axes from `k` on merged into one by a reshape (of constant sizes) when they are
/// several, appended to `g`; a reshape `x` reshapes is reshaped instead (an input's rows are
/// then its memory, see `Emitter::cached_reshape`).
fn as_rows(g: &mut Graph, x: NodeId, k: usize) -> Option<NodeId> {
    let (dims, dtype) = (g.node(x).shape.dims().to_vec(), g.node(x).dtype);
    if dims.len() - k <= 1 {
        return Some(x);
    }
    let cols = SizeExpr::of(&dims[k..]).filter(|e| e.symbols.is_empty())?.constant;
    let mut to = dims[..k].to_vec();
    to.push(Dim::Const(cols));
    let source = match g.node(x).op {
        Op::Reshape(y) => y,
        _ => x,
    };
    Some(push(g, Op::Reshape(source), dtype, Shape(to)))
}

/// `x` cast to `dtype`, appended to `g` when its dtype differs.
fn cast(g: &mut Graph, x: NodeId, dtype: DType) -> NodeId {
    match g.node(x).dtype == dtype {
        true => x,
        false => push(g, Op::Cast(x), dtype, g.node(x).shape.clone()),
    }
}

/// The rest of a reduction reduced in parts: its last part (an input of `g`) reduced over the
/// axes left, by rows when they are a suffix, as they are otherwise (a leading axis: by columns),
/// cast to the reduction's dtype.
fn rest_of(g: &mut Graph, w: &Work) -> Option<NodeId> {
    let Op::Reduce { op, .. } = g.node(w.r).op else { return None };
    let dims = g.node(w.x).shape.dims().to_vec();
    let y = match row_suffix(&dims, w.axes, true) {
        Some(k) if w.axes & ((1u32 << k) - 1) == 0 => rows_reduction(g, w.r, w.x, k, DType::F32)?,
        _ => {
            let axis = ReduceAxis::Axes { mask: w.axes, keepdim: false };
            let shape = axis.result_shape(&g.node(w.x).shape)?;
            push(g, Op::Reduce { op, axis, x: w.x, mask: None }, DType::F32, shape)
        }
    };
    Some(cast(g, y, g.node(w.r).dtype))
}

/// The variance about mean `m` among `candidates`: `mean(d * d)` over the same axes with
/// `d = x - m`, `x` the mean's operand, both unmasked means of the same float dtype, `m` read
/// back at the axes it reduces (its axes kept, or leading ones).
fn variance_of(g: &Graph, m: NodeId, candidates: &[NodeId]) -> Option<NodeId> {
    let Op::Reduce { op: ReduceOp::Mean, axis, x, mask: None } = g.node(m).op else { return None };
    let rank = g.node(x).shape.rank();
    let axes = axis_bits(axis, rank);
    let aligned = axis.keepdim() || (axes + 1).is_power_of_two();
    if g.node(m).dtype.kind() != Kind::Float || !aligned {
        return None;
    }
    candidates.iter().copied().find(|&v| {
        let Op::Reduce { op: ReduceOp::Mean, axis: va, x: sq, mask: None } = g.node(v).op else { return false };
        let Op::Binary(BinaryOp::Mul, d, d2) = g.node(sq).op else { return false };
        d == d2
            && g.node(v).dtype == g.node(m).dtype
            && g.node(d).shape == g.node(x).shape
            && axis_bits(va, rank) == axes
            && matches!(g.node(d).op, Op::Binary(BinaryOp::Sub, a, b) if a == x && b == m)
    })
}

/// The means of `x`'s rows over its axes from `k` on (merged by a reshape when several, of
/// constant sizes) and their variances, in f32, appended to `g`: `x`'s own when `q` is `None`
/// (the first part, over the values themselves), otherwise over the means of the parts before
/// (`x`), each part's variance `q` given. Parts of equal counts combine exactly: the variance of
/// the union is the mean of the parts' variances plus the variance of their means, so no count
/// is needed and every part is one pass over its operand (two over each row, kept in registers).
fn moments(g: &mut Graph, x: NodeId, q: Option<NodeId>, k: usize) -> Option<(NodeId, NodeId)> {
    // `x` as rows in f32.
    let rows = |g: &mut Graph, x: NodeId| as_rows(g, x, k).map(|r| cast(g, r, DType::F32));
    let xr = rows(g, x)?;
    let dims = g.node(xr).shape.dims().to_vec();
    let result = Shape(dims[..dims.len() - 1].to_vec());
    let mut kept = dims.clone();
    kept[dims.len() - 1] = Dim::Const(1);
    let mean_of = |g: &mut Graph, v: NodeId| {
        push(g, Op::Reduce { op: ReduceOp::Mean, axis: ReduceAxis::Last, x: v, mask: None }, DType::F32, result.clone())
    };
    let mean = mean_of(g, xr);
    let spread = push(g, Op::Reshape(mean), DType::F32, Shape(kept));
    let d = push(g, Op::Binary(BinaryOp::Sub, xr, spread), DType::F32, Shape(dims.clone()));
    let dd = push(g, Op::Binary(BinaryOp::Mul, d, d), DType::F32, Shape(dims));
    let between = mean_of(g, dd);
    let var = match q {
        None => between,
        Some(q) => {
            let qr = rows(g, q)?;
            let within = mean_of(g, qr);
            push(g, Op::Binary(BinaryOp::Add, within, between), DType::F32, result.clone())
        }
    };
    Some((mean, var))
}

/// The variance about stored mean `m` (an input of `g` now) of the values whose parts' means
/// are `means` and variances `q` (inputs, f32), over `axes` of them as they are (by columns),
/// appended to `g` in f32: the mean of the parts' variances plus their means' squared deviations
/// from `m`, one pass over the parts.
fn variance_about(g: &mut Graph, m: NodeId, means: NodeId, q: NodeId, axes: u32) -> Option<NodeId> {
    let dims = g.node(means).shape.dims().to_vec();
    let kept =
        Shape(dims.iter().enumerate().map(|(a, &d)| if axes >> a & 1 == 1 { Dim::Const(1) } else { d }).collect());
    let m = cast(g, m, DType::F32);
    let spread = push(g, Op::Reshape(m), DType::F32, kept);
    let d = push(g, Op::Binary(BinaryOp::Sub, means, spread), DType::F32, Shape(dims.clone()));
    let dd = push(g, Op::Binary(BinaryOp::Mul, d, d), DType::F32, Shape(dims.clone()));
    let sum = push(g, Op::Binary(BinaryOp::Add, q, dd), DType::F32, Shape(dims));
    let axis = ReduceAxis::Axes { mask: axes, keepdim: false };
    let shape = axis.result_shape(&g.node(sum).shape)?;
    Some(push(g, Op::Reduce { op: ReduceOp::Mean, axis, x: sum, mask: None }, DType::F32, shape))
}

/// Reduction `r`'s elements without its kept axes, appended to `g`: by rows when it reduces
/// trailing axes alone (merged by a reshape where they are several, of constant sizes), as it is
/// otherwise.
fn stored_form(g: &mut Graph, r: NodeId) -> Option<NodeId> {
    let node = g.node(r).clone();
    let Op::Reduce { axis, x, mask, .. } = node.op else { return None };
    let rank = g.node(x).shape.rank();
    let axes = axis_bits(axis, rank);
    if mask.is_none() {
        if let Some(k) = row_suffix(g.node(x).shape.dims(), axes, true) {
            if axes & ((1u32 << k) - 1) == 0 && rank - k > 1 {
                return rows_reduction(g, r, x, k, node.dtype);
            }
        }
    }
    match axis {
        ReduceAxis::Axes { mask: m, keepdim: true } => {
            let axis = ReduceAxis::Axes { mask: m, keepdim: false };
            let shape = axis.result_shape(&g.node(x).shape)?;
            let Op::Reduce { op, .. } = node.op else { return None };
            Some(push(g, Op::Reduce { op, axis, x, mask }, node.dtype, shape))
        }
        _ => Some(r),
    }
}

/// The reductions of `g` to store: along axes other than the last (and not every axis), over
/// more than [`RECOMPUTED_EXTENT_LIMIT`] elements or a count known at run time, whose result a
/// value larger than it reads (the result broadcast back over what it reduced), not through a
/// full reduction (whose scalar crosses kernels once).
fn stored_candidates(g: &Graph, forced: &BTreeSet<NodeId>) -> Vec<NodeId> {
    let live = g.live_nodes();
    let mut users: Vec<Vec<NodeId>> = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if live[i] {
            n.op.for_each_operand(&g.lists, |x| users[x.index()].push(NodeId(i as u32)));
        }
    }
    let mut found = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        let id = NodeId(i as u32);
        if live[i] && forced.contains(&id) && storable(g, id) {
            found.push(id);
            continue;
        }
        let Op::Reduce { axis: axis @ ReduceAxis::Axes { .. }, x, .. } = n.op else { continue };
        if !live[i] || full_reduce(g, id).is_some() || counts_every_element(g, id) {
            continue;
        }
        let xs = g.node(x).shape.dims();
        let reduced: Vec<Dim> = axis.axes(xs.len()).iter().map(|&a| xs[a]).collect();
        let extent = SizeExpr::of(&reduced).filter(|e| e.symbols.is_empty()).map(|e| e.constant);
        if extent.is_some_and(|e| e <= RECOMPUTED_EXTENT_LIMIT) {
            continue;
        }
        if read_at_larger_shape(g, &users, id) {
            found.push(id);
        }
    }
    found
}

/// Whether node `n` is a reduction a stage may store: along some axes, not every one (a full
/// reduction crosses kernels as a scalar) nor counting every element (a product of sizes).
pub(crate) fn storable(g: &Graph, n: NodeId) -> bool {
    matches!(g.node(n).op, Op::Reduce { .. }) && full_reduce(g, n).is_none() && !counts_every_element(g, n)
}

/// Whether a value larger than node `r` (more elements, or a count not provably at most its own)
/// reads it, through values that are not full reductions.
fn read_at_larger_shape(g: &Graph, users: &[Vec<NodeId>], r: NodeId) -> bool {
    let count = |n: NodeId| SizeExpr::of(g.node(n).shape.dims());
    let size = count(r);
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = users[r.index()].clone();
    while let Some(u) = stack.pop() {
        if std::mem::replace(&mut seen[u.index()], true) || full_reduce(g, u).is_some() {
            continue;
        }
        let at_most = matches!((count(u), &size), (Some(a), Some(b)) if a.at_most(b));
        if !at_most {
            return true;
        }
        stack.extend(users[u.index()].iter().copied());
    }
    false
}

/// One plan of the stages' plans, `early` (each with the indices into `stages.stored` of its
/// outputs) then `last` (when the stages have one), for original graph `g`: the original inputs
/// and outputs keep their buffers, each stored value takes its output's buffer or a
/// [`BufferKind::Temp`] after them, and every other buffer of every stage follows, its kernels
/// renumbered in launch order.
pub(crate) fn merge(
    g: &Graph,
    stages: &Stages,
    early: Vec<(Plan, Vec<usize>)>,
    last: Option<Plan>,
    strided_inputs: Vec<u32>,
) -> Plan {
    let decl = |kind, dtype, shape: &Shape| BufferDecl {
        kind,
        elem: ElemType::Tensor(dtype),
        elems: SizeExpr::of(shape.dims()).unwrap_or(SizeExpr::constant(0)),
    };
    let n_in = g.inputs.len();
    let mut buffers: Vec<BufferDecl> = g
        .inputs
        .iter()
        .enumerate()
        .map(|(i, inp)| decl(BufferKind::Input(InputId(i as u32)), inp.dtype, &inp.shape))
        .collect();
    for (o, out) in g.outputs.iter().enumerate() {
        let node = g.node(out.node);
        buffers.push(decl(BufferKind::Output(o), node.dtype, &node.shape));
    }
    let mut stored_buffers = Vec::with_capacity(stages.stored.len());
    for ((dtype, shape), output) in stages.stored.iter().zip(&stages.stored_outputs) {
        stored_buffers.push(match output {
            Some(o) => n_in + o,
            None => {
                buffers.push(decl(BufferKind::Temp, *dtype, shape));
                buffers.len() - 1
            }
        });
    }
    let mut kernels = Vec::new();
    let last_outputs: Vec<usize> = stages.last_outputs.iter().map(|o| n_in + o).collect();
    let early_plans = early.into_iter().map(|(p, outs)| {
        let outs: Vec<usize> = outs.iter().map(|&s| stored_buffers[s]).collect();
        (p, outs)
    });
    for (plan, outs) in early_plans.chain(last.map(|p| (p, last_outputs))) {
        let offset = kernels.len();
        let inputs = plan.buffers.iter().take_while(|b| matches!(b.kind, BufferKind::Input(_))).count();
        let outputs = plan.buffers[inputs..].iter().take_while(|b| matches!(b.kind, BufferKind::Output(_))).count();
        let mut map: Vec<usize> = Vec::with_capacity(plan.buffers.len());
        for (b, decl) in plan.buffers.iter().enumerate() {
            let to = if b < n_in {
                b
            } else if b < inputs {
                stored_buffers[b - n_in]
            } else if b < inputs + outputs {
                outs[b - inputs]
            } else {
                let kind = match decl.kind {
                    BufferKind::Partials { kernel, slots_per_block } => {
                        BufferKind::Partials { kernel: kernel + offset, slots_per_block }
                    }
                    BufferKind::Counter { kernel } => BufferKind::Counter { kernel: kernel + offset },
                    BufferKind::ColumnPartials { kernel } => BufferKind::ColumnPartials { kernel: kernel + offset },
                    BufferKind::Scratch { kernel } => BufferKind::Scratch { kernel: kernel + offset },
                    k => k,
                };
                buffers.push(BufferDecl { kind, ..decl.clone() });
                buffers.len() - 1
            };
            map.push(to);
        }
        let remap = |params: &mut Vec<Param>| {
            for p in params {
                match p {
                    Param::Buffer(b) => *b = map[*b],
                    Param::Grid(k) => *k += offset,
                    _ => {}
                }
            }
        };
        for mut k in plan.kernels {
            remap(&mut k.params);
            if let Some(f) = &mut k.fold {
                remap(&mut f.params);
                f.after += offset;
            }
            k.lazy_inputs.retain(|i| (i.0 as usize) < n_in);
            kernels.push(k);
        }
    }
    Plan { graph_hash: g.stable_hash(), interface: kfuse_ir::Interface::of(g), buffers, kernels, strided_inputs }
}
