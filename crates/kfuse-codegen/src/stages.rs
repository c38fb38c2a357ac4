//! Reductions stored once. A reduction along axes other than the last whose result is read back
//! at the elements it reduces (`x - mean(x, axis: 0, keepdim: true)`, a batch norm's statistics)
//! would be computed where it is used, again at every element that reads it. Such a reduction is
//! computed by a stage of its own instead, a plan whose output is the reduction, stored into a
//! [`crate::BufferKind::Temp`]; the later stages read it as an input. [`split`] finds them and the
//! graph of each stage; [`merge`] joins the stages' plans into one.
//!
//! Not handled here: how a stage is planned (see `analysis` and `shapes`).

use std::collections::BTreeMap;

use kfuse_ir::{DType, Dim, Graph, Input, InputId, Kind, Node, NodeId, Op, Output, ReduceAxis, ReduceOp, Shape};

use crate::analysis::{counts_every_element, depends_on, full_reduce};
use crate::{BufferDecl, BufferKind, ElemType, Param, Plan, SizeExpr};

/// The most operand elements a reduction computed where it is used may read again per element:
/// past it (or where the count is known only at run time) a reduction along axes other than the
/// last that is read back at larger shapes is stored once by a stage of its own.
pub const RECOMPUTED_EXTENT_LIMIT: u64 = 64;

/// A graph split into stages: each earlier stage computes some stored values; the last computes
/// the graph's outputs.
pub(crate) struct Stages {
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

/// The stages of `g` (verified), or `None` when it has no reduction to store.
///
/// A stored reduction is computed in the form that plans well. Its kept axes (`keepdim`) are
/// left out: the same elements in the same order, and a reduction over the leading axis alone
/// plans as a split column reduction. When it reduces trailing axes, they are reduced first, as
/// one last-axis reduction (merged by a reshape when they are several, of constant sizes), by
/// rows; an unmasked sum, mean, max or min of floats over other axes too then stores that first
/// part (in f32) in a stage of its own, and reduces it over the rest in the next.
pub(crate) fn split(g: &Graph) -> Option<Stages> {
    let mut stored: Vec<(DType, Shape)> = Vec::new();
    let mut stored_outputs: Vec<Option<usize>> = Vec::new();
    let mut early = Vec::new();
    let mut current = g.clone();
    loop {
        let candidates = stored_candidates(&current);
        if candidates.is_empty() {
            break;
        }
        // The candidates that read no other candidate are computed by this stage.
        let ready: Vec<NodeId> = candidates
            .iter()
            .copied()
            .filter(|&r| !candidates.iter().any(|&o| o != r && depends_on(&current, r, o)))
            .collect();
        let (mut first, mut second) = (current.clone(), current.clone());
        first.outputs.clear();
        second.outputs.clear();
        let mut first_outs = Vec::new();
        // The first parts, computed by a stage before the one of the stored reductions.
        let mut parts: Vec<Option<NodeId>> = Vec::new();
        for &r in &ready {
            parts.push(first_part(&mut first, r).map(|part| {
                let (dtype, shape) = (first.node(part).dtype, first.node(part).shape.clone());
                first.outputs.push(Output { name: stored_name(r, "part"), node: part });
                first_outs.push(stored.len());
                stored.push((dtype, shape.clone()));
                stored_outputs.push(None);
                let decl = Input { name: stored_name(r, "part"), dtype, shape: shape.clone() };
                for g in [&mut second, &mut current] {
                    g.inputs.push(decl.clone());
                }
                let id = InputId((second.inputs.len() - 1) as u32);
                second.nodes.push(Node { op: Op::Input(id), dtype, shape });
                NodeId((second.nodes.len() - 1) as u32)
            }));
        }
        let mut second_outs = Vec::new();
        for (&r, part) in ready.iter().zip(parts) {
            let out = stored_form(&mut second, r, part)?;
            // Stored into an output of the graph when it is one (named so in the plan's notes).
            let output = g.outputs.iter().position(|o| o.node == r);
            let name = output.map_or_else(|| stored_name(r, "stored"), |o| g.outputs[o].name.clone());
            second.outputs.push(Output { name, node: out });
            second_outs.push(stored.len());
            let node = current.node(r);
            stored.push((node.dtype, node.shape.clone()));
            stored_outputs.push(output);
            // Later stages read it.
            current.inputs.push(Input { name: stored_name(r, "stored"), dtype: node.dtype, shape: node.shape.clone() });
            current.nodes[r.index()].op = Op::Input(InputId((current.inputs.len() - 1) as u32));
        }
        if !first.outputs.is_empty() {
            early.push((first, first_outs));
        }
        early.push((second, second_outs));
    }
    if stored.is_empty() {
        return None;
    }
    let last_outputs: Vec<usize> = (0..g.outputs.len()).filter(|o| !stored_outputs.contains(&Some(*o))).collect();
    current.outputs = last_outputs.iter().map(|&o| g.outputs[o].clone()).collect();
    let last = (!current.outputs.is_empty()).then_some(current);
    Some(Stages { stored, stored_outputs, early, last, last_outputs })
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

/// The trailing reduced axes of reduction `r` as one last-axis reduction, appended to `g`: `x`
/// reshaped to merge them, reduced along the last axis. `None` when it reduces no trailing axis,
/// or several of which one has a symbolic size.
fn trailing(g: &mut Graph, r: NodeId, x: NodeId, dtype: DType) -> Option<(NodeId, usize)> {
    let Op::Reduce { op, axis, mask: None, .. } = g.node(r).op else { return None };
    let dims = g.node(x).shape.dims().to_vec();
    let rank = dims.len();
    let k = (0..rank).rev().take_while(|&a| axis.reduces(a, rank)).last()?;
    let rows = if rank - k > 1 {
        let cols = dims[k..].iter().try_fold(1u64, |acc, d| match d {
            Dim::Const(c) => acc.checked_mul(*c),
            Dim::Sym(_) => None,
        })?;
        let mut to = dims[..k].to_vec();
        to.push(Dim::Const(cols));
        push(g, Op::Reshape(x), g.node(x).dtype, Shape(to))
    } else {
        x
    };
    Some((push(g, Op::Reduce { op, axis: ReduceAxis::Last, x: rows, mask: None }, dtype, Shape(dims[..k].to_vec())), k))
}

/// Whether reduction `r` is one that reduces in parts: an unmasked sum, mean, max or min of
/// floats over trailing axes and others.
fn in_parts(g: &Graph, r: NodeId) -> bool {
    let Op::Reduce { op, axis, x, mask: None } = g.node(r).op else { return false };
    let rank = g.node(x).shape.rank();
    let run = (0..rank).rev().take_while(|&a| axis.reduces(a, rank)).count();
    matches!(op, ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
        && g.node(r).dtype.kind() == Kind::Float
        && run > 0
        && (0..rank - run).any(|a| axis.reduces(a, rank))
}

/// The first part of reduction `r` (see [`split`]), appended to `g` (f32), or `None` when it is
/// not reduced in parts.
fn first_part(g: &mut Graph, r: NodeId) -> Option<NodeId> {
    if !in_parts(g, r) {
        return None;
    }
    let Op::Reduce { x, .. } = g.node(r).op else { return None };
    let x32 = match g.node(x).dtype {
        DType::F32 => x,
        _ => push(g, Op::Cast(x), DType::F32, g.node(x).shape.clone()),
    };
    trailing(g, r, x32, DType::F32).map(|(part, _)| part)
}

/// Reduction `r`'s elements without its kept axes, appended to `g`: from its first part (an
/// input of `g`) when it has one, by rows when it reduces trailing axes alone, as it is
/// otherwise.
fn stored_form(g: &mut Graph, r: NodeId, part: Option<NodeId>) -> Option<NodeId> {
    let node = g.node(r).clone();
    let Op::Reduce { op, axis, x, mask } = node.op else { return None };
    let rank = g.node(x).shape.rank();
    let rest = |k: usize| (0..k).filter(|&a| axis.reduces(a, rank)).fold(0u32, |m, a| m | 1 << a);
    if let Some(part) = part {
        // The rest of the axes, of the first part's leading axes.
        let k = g.node(part).shape.rank();
        let axis = ReduceAxis::Axes { mask: rest(k), keepdim: false };
        let shape = axis.result_shape(&g.node(part).shape)?;
        let y = push(g, Op::Reduce { op, axis, x: part, mask: None }, DType::F32, shape.clone());
        return Some(if node.dtype == DType::F32 { y } else { push(g, Op::Cast(y), node.dtype, shape) });
    }
    let run = (0..rank).rev().take_while(|&a| axis.reduces(a, rank)).count();
    if mask.is_none() && rest(rank - run) == 0 {
        if let Some((y, _)) = trailing(g, r, x, node.dtype) {
            return Some(y);
        }
    }
    match axis {
        ReduceAxis::Axes { mask: m, keepdim: true } => {
            let axis = ReduceAxis::Axes { mask: m, keepdim: false };
            let shape = axis.result_shape(&g.node(x).shape)?;
            Some(push(g, Op::Reduce { op, axis, x, mask }, node.dtype, shape))
        }
        _ => Some(r),
    }
}

/// The reductions of `g` to store: along axes other than the last (and not every axis), over
/// more than [`RECOMPUTED_EXTENT_LIMIT`] elements or a count known at run time, whose result a
/// value larger than it reads (the result broadcast back over what it reduced), not through a
/// full reduction (whose scalar crosses kernels once).
fn stored_candidates(g: &Graph) -> Vec<NodeId> {
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
        let Op::Reduce { axis: axis @ ReduceAxis::Axes { .. }, x, .. } = n.op else { continue };
        if !live[i] || full_reduce(g, id).is_some() || counts_every_element(g, id) {
            continue;
        }
        let xs = g.node(x).shape.dims();
        let extent = axis.axes(xs.len()).iter().try_fold(1u64, |acc, &a| match xs[a] {
            Dim::Const(c) => Some(acc.saturating_mul(c)),
            Dim::Sym(_) => None,
        });
        if extent.is_some_and(|e| e <= RECOMPUTED_EXTENT_LIMIT) {
            continue;
        }
        if read_at_larger_shape(g, &users, id) {
            found.push(id);
        }
    }
    found
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
pub(crate) fn merge(g: &Graph, stages: &Stages, early: Vec<(Plan, Vec<usize>)>, last: Option<Plan>) -> Plan {
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
    let strided_inputs =
        last.as_ref().or(early.first().map(|e| &e.0)).map(|p| p.strided_inputs.clone()).unwrap_or_default();
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
        let mut map: BTreeMap<usize, usize> = BTreeMap::new();
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
            map.insert(b, to);
        }
        let remap = |params: &mut Vec<Param>| {
            for p in params {
                match p {
                    Param::Buffer(b) => *b = map[b],
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
