//! Fusion planning: which kernels a graph needs and what each one computes.
//!
//! - Every node gets a *level*: the number of full reductions on its longest dependency path.
//!   Element work of level `L` can only run after the reductions it reads have finished, so it
//!   goes into a kernel of level `L`; a full reduction over level-`L` work is a *sink* of that
//!   kernel, and its scalar result is level `L + 1`.
//! - Sinks (full reductions, non-scalar outputs) are grouped by (level, domain); each group is one
//!   kernel. The domain of a sink is its shape without a small constant last axis (at most
//!   [`MAX_COMPONENTS`] wide), which becomes per-thread *components* read and written as vectors.
//! - Every scalar that depends on a full reduction has a *home*: the kernel whose epilogue (run by
//!   the last block) computes it. A later kernel reads it from a [`crate::BufferKind::Temp`].
//!
//! A reduction over every axis (`ReduceAxis::All`, `Last` of a rank-1 tensor, `Axes` naming every
//! axis without `keepdim`) is a full reduction and handled as one; any other is computed where its
//! result is used (see `emit`), once per row where the kernel runs over its rows (see
//! `shapes::row_wise`), or by an earlier stage when it must be stored (see `stages`).
//! Not handled here: anything about CUDA text (see `emit` and `kernel`).

use std::collections::{BTreeMap, BTreeSet};

use kfuse_ir::{BinaryOp, Dim, Graph, NodeId, Op, ReduceAxis, ReduceOp};

use crate::CodegenError;

/// The widest small constant last axis that is kept in registers as components of one domain
/// element (and loaded/stored as one vector when its byte size allows).
pub const MAX_COMPONENTS: u64 = 8;

/// A full reduction `(op, x, mask)`, or `None` for any other node. A count of every element
/// (`size(D)`) is none: its value is the product of sizes, known to every kernel.
pub(crate) fn full_reduce(g: &Graph, n: NodeId) -> Option<(ReduceOp, NodeId, Option<NodeId>)> {
    match g.node(n).op {
        Op::Reduce { op, axis, x, mask }
            if reduces_everything(axis, g.node(x).shape.rank()) && !counts_every_element(g, n) =>
        {
            Some((op, x, mask))
        }
        _ => None,
    }
}

/// Whether node `n` counts every element of its operand along its axes: a `count` without a
/// mask of `iota >= 0` (what `size(D)` and a mean's gradient count), whose value is the product
/// of the reduced axes' sizes.
pub(crate) fn counts_every_element(g: &Graph, n: NodeId) -> bool {
    let Op::Reduce { op: ReduceOp::Count, x, mask: None, .. } = g.node(n).op else { return false };
    let Op::Binary(BinaryOp::Ge, a, b) = g.node(x).op else { return false };
    matches!(g.node(a).op, Op::Iota { .. })
        && matches!(g.node(b).op, Op::Const(kfuse_ir::Literal::Int(0)))
        && g.node(x).shape == g.node(a).shape
}

/// Whether a reduction along `axis` of an operand of rank `rank` leaves a scalar.
fn reduces_everything(axis: ReduceAxis, rank: usize) -> bool {
    match axis {
        ReduceAxis::All => true,
        ReduceAxis::Last => rank == 1,
        ReduceAxis::Axes { keepdim, .. } => !keepdim && (0..rank).all(|a| axis.reduces(a, rank)),
    }
}

/// Splits a sink shape into its domain and its component count (`None`: no component axis).
pub(crate) fn split_domain(dims: &[Dim]) -> (Vec<Dim>, Option<u32>) {
    match dims.split_last() {
        Some((Dim::Const(c), rest)) if *c <= MAX_COMPONENTS => (rest.to_vec(), Some(*c as u32)),
        _ => (dims.to_vec(), None),
    }
}

/// The domain and components of output node `n`'s sink: its shape split as [`split_domain`]
/// does, except for a reduction over the leading axis (see `shapes::columns`) or the last (see
/// `shapes::row_wise`), whose elements all stay in the domain, so that its rows are split over
/// blocks (columns) or taken by groups of lanes (rows) however few its last axis has.
pub(crate) fn output_domain(g: &Graph, n: NodeId) -> (Vec<Dim>, Option<u32>) {
    let dims = g.node(n).shape.dims();
    match g.node(n).op {
        Op::Reduce { axis: ReduceAxis::Axes { mask: 1, keepdim: false } | ReduceAxis::Last, .. } => {
            (dims.to_vec(), None)
        }
        _ => split_domain(dims),
    }
}

/// What a kernel writes per domain element.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SinkKind {
    /// A full reduction node, accumulated into partial slots starting at `slot`.
    Reduce { node: NodeId, slot: u32 },
    /// A non-scalar graph output (index into `graph.outputs`).
    Output { index: usize },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sink {
    pub kind: SinkKind,
    /// Components per domain element (the sink's small constant last axis), if any.
    pub comps: Option<u32>,
}

/// One planned kernel before code generation.
#[derive(Clone, Debug, Default)]
pub(crate) struct KernelInfo {
    pub level: u32,
    pub dims: Vec<Dim>,
    pub sinks: Vec<Sink>,
    /// Partial-accumulator slots per block (0: the kernel has no full reduction).
    pub slots: u32,
    /// Scalar outputs written by this kernel's epilogue.
    pub scalar_outputs: Vec<usize>,
    /// Scalar nodes this kernel's epilogue stores into Temp buffers for later kernels.
    pub temp_writes: Vec<NodeId>,
}

/// The result of planning: kernels in launch order plus per-node facts.
#[derive(Clone, Debug)]
pub(crate) struct Analysis {
    pub kernels: Vec<KernelInfo>,
    /// For each node: the kernel whose epilogue computes it, for scalars that depend on a full
    /// reduction (and full reductions themselves); `None` for values computed where needed.
    pub home: Vec<Option<usize>>,
    /// Temp buffer number of each value that crosses kernels: the scalars (numbered in node
    /// order), then the row values (see `row_values`).
    pub temps: BTreeMap<NodeId, usize>,
    /// Row reductions that a row-wise kernel computes once per row and stores, one value per row,
    /// for later kernels to read instead of reducing the rows again: node -> the kernel that
    /// stores it (set by `shapes::row_wise::plan_rows`; their buffers are in `temps`).
    pub row_values: BTreeMap<NodeId, usize>,
    /// The inputs read through strides given at launch (`CodegenOptions::strided_inputs`).
    pub strided: BTreeSet<u32>,
}

/// How many partial slots a full reduction needs (`mean` keeps a sum and a count).
pub(crate) fn slots_of(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Mean => 2,
        _ => 1,
    }
}

/// Whether kernel `info` holds a row result deferred into it (see [`defer_row_results`]): a sink
/// with one value per row of its domain.
pub(crate) fn has_row_results(g: &Graph, info: &KernelInfo) -> bool {
    info.sinks.iter().any(|s| {
        let dims = match s.kind {
            SinkKind::Reduce { node, .. } => full_reduce(g, node).map(|(_, x, _)| g.node(x).shape.dims().to_vec()),
            SinkKind::Output { index } => {
                return output_domain(g, g.outputs[index].node).0.len() + 1 == info.dims.len()
            }
        };
        dims.is_some_and(|d| split_domain(&d).0.len() + 1 == info.dims.len())
    })
}

/// What [`analyse`] moves into later kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Defer {
    /// Row results, into the kernels of their rows' elements (see [`defer_row_results`]).
    pub rows: bool,
    /// Full reductions, into the element kernels after them (see [`defer_full_reductions`]).
    pub full: bool,
}

/// Plans the kernels of a verified graph, moving into later kernels what `defer` says.
pub(crate) fn analyse(g: &Graph, defer: Defer, strided: &[u32]) -> Result<Analysis, CodegenError> {
    let live = g.live_nodes();
    let mut level = vec![0u32; g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        let mut l = 0;
        n.op.for_each_operand(&g.lists, |x| l = l.max(level[x.index()]));
        if full_reduce(g, NodeId(i as u32)).is_some() {
            l += 1;
        }
        level[i] = l;
    }

    // Sinks in a fixed order: reductions in node order, then tensor outputs in output order; each
    // keyed by its kernel's (level, domain), with its component count.
    let mut keyed: Vec<KeyedSink> = Vec::new();
    for i in 0..g.nodes.len() {
        let id = NodeId(i as u32);
        if let (true, Some((_, x, _))) = (live[i], full_reduce(g, id)) {
            let (dims, comps) = split_domain(g.node(x).shape.dims());
            keyed.push(((level[i] - 1, dims), SinkKind::Reduce { node: id, slot: 0 }, comps));
        }
    }
    for (index, o) in g.outputs.iter().enumerate() {
        if !g.node(o.node).shape.is_scalar() {
            let (dims, comps) = output_domain(g, o.node);
            keyed.push(((level[o.node.index()], dims), SinkKind::Output { index }, comps));
        }
    }
    if defer.rows {
        defer_row_results(g, &level, &mut keyed);
    }
    if defer.full {
        defer_full_reductions(g, &mut keyed);
    }
    let mut keys: Vec<(u32, Vec<Dim>)> = Vec::new();
    for (k, _, _) in &keyed {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    // By level; within a level, wider domains first (a row kernel before the column kernel of
    // the same rows, which may read what it stores or fold the column sums it takes as it goes,
    // see `shapes::columns::fuse`); stable: first appearance otherwise.
    keys.sort_by_key(|k| (k.0, std::cmp::Reverse(k.1.len())));
    let mut kernels: Vec<KernelInfo> = keys
        .iter()
        .map(|(level, dims)| KernelInfo { level: *level, dims: dims.clone(), ..Default::default() })
        .collect();
    let mut home: Vec<Option<usize>> = vec![None; g.nodes.len()];
    for (key, mut kind, comps) in keyed {
        let k =
            keys.iter().position(|x| *x == key).ok_or(CodegenError::Internal { node: 0, what: "sink key vanished" })?;
        if let SinkKind::Reduce { node, slot } = &mut kind {
            let (op, _, _) =
                full_reduce(g, *node).ok_or(CodegenError::Internal { node: node.0, what: "not a reduction" })?;
            *slot = kernels[k].slots;
            kernels[k].slots += slots_of(op);
            home[node.index()] = Some(k);
        }
        kernels[k].sinks.push(Sink { kind, comps });
    }
    for (i, n) in g.nodes.iter().enumerate() {
        if home[i].is_none() {
            let mut h: Option<usize> = None;
            n.op.for_each_operand(&g.lists, |x| h = h.max(home[x.index()]));
            home[i] = h;
        }
    }
    for (index, o) in g.outputs.iter().enumerate() {
        if g.node(o.node).shape.is_scalar() {
            let k = match home[o.node.index()] {
                Some(k) => k,
                None => {
                    if kernels.is_empty() {
                        kernels.push(KernelInfo::default()); // a one-element kernel for constant outputs
                    }
                    0
                }
            };
            kernels[k].scalar_outputs.push(index);
        }
    }

    // Scalars that cross kernels, found from the last kernel backwards so that each kernel's
    // epilogue knows every Temp it must write before its own dependencies are collected.
    let mut requested: BTreeMap<NodeId, usize> = BTreeMap::new();
    for k in (0..kernels.len()).rev() {
        let mut roots: Vec<NodeId> = Vec::new();
        for s in &kernels[k].sinks {
            match s.kind {
                SinkKind::Reduce { node, .. } => g.node(node).op.for_each_operand(&g.lists, |x| roots.push(x)),
                SinkKind::Output { index } => roots.push(g.outputs[index].node),
            }
        }
        collect_crossings(g, &home, k, roots, Phase::Element, &mut requested)?;
        let mut roots: Vec<NodeId> = kernels[k].scalar_outputs.iter().map(|&o| g.outputs[o].node).collect();
        roots.extend(requested.iter().filter(|(_, &h)| h == k).map(|(&n, _)| n));
        collect_crossings(g, &home, k, roots, Phase::Epilogue, &mut requested)?;
    }
    let mut temps = BTreeMap::new();
    for (t, (&n, &h)) in requested.iter().enumerate() {
        temps.insert(n, t);
        kernels[h].temp_writes.push(n);
    }
    Ok(Analysis { kernels, home, temps, row_values: BTreeMap::new(), strided: strided.iter().copied().collect() })
}

/// A sink keyed by its kernel's (level, domain), with its component count.
type KeyedSink = ((u32, Vec<Dim>), SinkKind, Option<u32>);

/// Whether `root`'s value depends on node `target` (through operands).
pub(crate) fn depends_on(g: &Graph, root: NodeId, target: NodeId) -> bool {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        if n == target {
            return true;
        }
        if !std::mem::replace(&mut seen[n.index()], true) {
            g.node(n).op.for_each_operand(&g.lists, |x| stack.push(x));
        }
    }
    false
}

/// The values a sink's kernel evaluates start from: a reduction's operand and mask, an output.
fn sink_operands(g: &Graph, kind: &SinkKind) -> Vec<NodeId> {
    match *kind {
        SinkKind::Reduce { node, .. } => {
            full_reduce(g, node).map(|(_, x, m)| [Some(x), m].into_iter().flatten().collect()).unwrap_or_default()
        }
        SinkKind::Output { index } => vec![g.outputs[index].node],
    }
}

/// Whether a sink other than `keyed[s]` at a level in `(from, to]` reads `node`.
fn read_between(g: &Graph, keyed: &[KeyedSink], s: usize, node: NodeId, (from, to): (u32, u32)) -> bool {
    keyed.iter().enumerate().any(|(t, ((lt, _), kind, _))| {
        t != s && *lt > from && *lt <= to && sink_operands(g, kind).into_iter().any(|r| depends_on(g, r, node))
    })
}

/// Row results deferred to the kernel of their rows' elements. A full reduction of per-row values
/// (a per-row loss summed into a mean: domain `[rows..]`), or an output with one value per row (a
/// layer norm's mean and variance, saved for its backward), that reads a reduction along the last
/// axis of `[rows.., cols]` takes a kernel that reads every row, and the kernel at each element of
/// the same rows (the loss's gradient, the normalised output; at the same level or a later one
/// when it needs another full reduction, a count) reads them all again. When no sink after the
/// result's level up to that kernel's reads it, it moves into that kernel, which computes it once
/// per row from the row reductions it computes anyway (see `shapes::row_wise`): the rows are read
/// once instead of twice, and the first kernel keeps only what the later one needs (the count) or
/// disappears.
fn defer_row_results(g: &Graph, level: &[u32], keyed: &mut [KeyedSink]) {
    // Whether `root` reads a reduction along the last axis of a node shaped `dims`.
    let reads_rows = |root: NodeId, dims: &[Dim]| {
        let mut seen = vec![false; g.nodes.len()];
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n.index()], true) {
                continue;
            }
            if let Op::Reduce { axis: ReduceAxis::Last, x, .. } = g.node(n).op {
                if g.node(x).shape.dims() == dims && !counts_every_element(g, n) {
                    return true;
                }
            }
            if full_reduce(g, n).is_none() {
                g.node(n).op.for_each_operand(&g.lists, |x| stack.push(x));
            }
        }
        false
    };
    let mut moves: Vec<(usize, (u32, Vec<Dim>))> = Vec::new();
    for s in 0..keyed.len() {
        let ((l, ref dims), ref kind, comps) = keyed[s];
        // The row result (`node`) and the per-row value it is computed from (`x`): a full
        // reduction of per-row values, or an output with one value per row (`[rows..]`, or
        // `[rows.., 1]` under keepdim: a layer norm's saved mean and variance).
        let (node, x) = match (kind, comps) {
            (&SinkKind::Reduce { node, .. }, None) => match full_reduce(g, node) {
                Some((_, x, _)) if level[node.index()] == l + 1 => (node, x),
                _ => continue,
            },
            (&SinkKind::Output { index }, None | Some(1)) => (g.outputs[index].node, g.outputs[index].node),
            _ => continue,
        };
        // The element kernel of the rows: an output at the same level or a later one, one wide
        // axis longer.
        let target = keyed.iter().find_map(|((lq, dq), kind, _)| {
            let rows_of = *lq >= l && dq.len() == dims.len() + 1 && dq[..dims.len()] == dims[..];
            match (kind, rows_of) {
                (SinkKind::Output { index }, true) if reads_rows(g.outputs[*index].node, dq) => Some((*lq, dq.clone())),
                _ => None,
            }
        });
        let Some((lq, dq)) = target else { continue };
        // The reduction's own row values read those rows, and nothing up to that kernel reads it.
        let needed = read_between(g, keyed, s, node, (l, lq));
        if reads_rows(x, &dq) && !needed {
            moves.push((s, (lq, dq)));
        }
    }
    // The element kernel must compute the rows' reductions itself: no sink that stays in an
    // earlier kernel reads them (that kernel would store them for it, leaving it no rows). A move
    // refused leaves its sink reading the rows where it is, which may refuse others: repeat.
    loop {
        let stays_reading = |key: &(u32, Vec<Dim>)| {
            keyed.iter().enumerate().any(|(t, (kt, kind, _))| {
                kt.0 <= key.0
                    && kt != key
                    && !moves.iter().any(|m| m.0 == t)
                    && sink_operands(g, kind).into_iter().any(|r| reads_rows(r, &key.1))
            })
        };
        let kept: Vec<(usize, (u32, Vec<Dim>))> =
            moves.iter().filter(|(_, key)| !stays_reading(key)).cloned().collect();
        if kept.len() == moves.len() {
            break;
        }
        moves = kept;
    }
    for (s, key) in moves {
        keyed[s].0 = key;
    }
}

/// Full reductions deferred to the element kernel after them. A full reduction of elementwise
/// work that nothing up to a later kernel of the same domain reads (a loss summed beside the
/// count that scales its gradient) is computed by that kernel, when that kernel's tensor outputs
/// read every input the reduction reads: the inputs are read once instead of twice, and the
/// first kernel keeps only what the later one needs (the count, from the mask's input alone).
/// Work with row or column reductions is left where it is (their kernels have shapes of their
/// own, see `shapes`).
fn defer_full_reductions(g: &Graph, keyed: &mut [KeyedSink]) {
    // The inputs element work from `roots` reads, or None where it reads a reduction along axes
    // (computed where it is used) or a random draw.
    let inputs_of = |roots: Vec<NodeId>| -> Option<BTreeSet<u32>> {
        let mut seen = vec![false; g.nodes.len()];
        let mut stack = roots;
        let mut inputs = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n.index()], true) || full_reduce(g, n).is_some() {
                continue;
            }
            match g.node(n).op {
                Op::Input(id) => {
                    inputs.insert(id.0);
                }
                Op::Reduce { .. } if !counts_every_element(g, n) => return None,
                Op::Rand { .. } => return None,
                _ => {}
            }
            g.node(n).op.for_each_operand(&g.lists, |x| stack.push(x));
        }
        Some(inputs)
    };
    let mut moves: Vec<(usize, (u32, Vec<Dim>))> = Vec::new();
    for s in 0..keyed.len() {
        let ((l, ref dims), SinkKind::Reduce { node, .. }, _) = keyed[s] else { continue };
        let Some(reads) = inputs_of(sink_operands(g, &keyed[s].1)) else { continue };
        // The first later kernel of the domain with tensor outputs that read what it reads.
        let later =
            keyed.iter().filter(|((lq, dq), kind, _)| *lq > l && dq == dims && matches!(kind, SinkKind::Output { .. }));
        let Some(lq) = later.map(|((lq, _), _, _)| *lq).min() else { continue };
        let outputs: Vec<NodeId> = keyed
            .iter()
            .filter(|(key, kind, _)| key.0 == lq && key.1 == *dims && matches!(kind, SinkKind::Output { .. }))
            .flat_map(|(_, kind, _)| sink_operands(g, kind))
            .collect();
        let Some(target_reads) = inputs_of(outputs) else { continue };
        let needed = read_between(g, keyed, s, node, (l, lq));
        if !needed && reads.is_subset(&target_reads) {
            moves.push((s, (lq, dims.clone())));
        }
    }
    for (s, key) in moves {
        keyed[s].0 = key;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Element,
    Epilogue,
}

/// Walks the values kernel `k` computes from `roots` and records every scalar it must read from
/// an earlier kernel (`requested`: node → writing kernel).
fn collect_crossings(
    g: &Graph,
    home: &[Option<usize>],
    k: usize,
    roots: Vec<NodeId>,
    phase: Phase,
    requested: &mut BTreeMap<NodeId, usize>,
) -> Result<(), CodegenError> {
    let mut seen = vec![false; g.nodes.len()];
    let mut stack = roots;
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n.index()], true) {
            continue;
        }
        let node = g.node(n);
        if let (true, Some(h)) = (node.shape.is_scalar(), home[n.index()]) {
            if h < k {
                requested.insert(n, h);
                continue;
            }
            if h > k || phase == Phase::Element {
                return Err(CodegenError::Internal {
                    node: n.0,
                    what: "a scalar is needed before the kernel that computes it",
                });
            }
            if full_reduce(g, n).is_some() {
                continue; // this kernel's own reduction: a partial-slot result in the epilogue
            }
        }
        node.op.for_each_operand(&g.lists, |x| stack.push(x));
    }
    Ok(())
}
