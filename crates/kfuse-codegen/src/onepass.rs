//! One-pass masked gradients: recognises a second kernel whose only work is a masked tensor
//! output `where(m, v, 0)` with `v` linear in the scalars of the first kernel's reductions
//! (typically `v = s * h(inputs)` with `s = 1 / max(count(m), 1)`), and plans both as one launch.
//!
//! Under a lengths mask (`col < lengths[row]`) the count is the sum of the clamped lengths, so
//! every block adds its rows' share to one arrival word: the rows plan (see `shapes::rows`), a
//! cooperative launch with no list and no barrier for the stores of the padding, when every
//! crossing scalar follows from `count(m)` alone.
//!
//! Otherwise (e.g. the predicate `target[.., 3] != 0`), the compacted plan (see
//! `shapes::compacted`), one cooperative kernel (every block resident at once):
//!
//! - before its grid barrier, the reduction kernel's loop over the predicate's inputs: where
//!   `m` fails it stores the zeros; where it holds, the element's index is queued in shared
//!   memory, and whenever a block's worth is queued (and at the end) full sets of lanes compute
//!   the queued elements (`kf_drain`: the reductions' terms and `h = v` at the scale `s = 1`,
//!   loads direct) and list `(index, h)`: in shared memory, past its capacity in the block's
//!   global segment (which starts at the count of elements the threads of blocks `< b` own in
//!   the grid-stride loop, so it always fits). The valid elements are few in a padded batch; in
//!   place they would idle the other lanes of their warps.
//! - the barrier: each block publishes its partials and arrives; once all have arrived, every
//!   block folds all partials itself in the same fixed order (the same values everywhere; block
//!   0 writes the scalar outputs) and computes the scale. The last block to leave resets it.
//! - after it: each block writes `out[index] = s * h` for the entries it listed itself.
//!
//! So the predicate's inputs (e.g. `target` under `target[.., 3] != 0`) are read once instead of
//! twice, and a loss with its gradient is one launch instead of two. The values are
//! deterministic (each entry's value does not depend on the list order), so runs are
//! bit-identical for a given grid; they round as `s * h(1)` instead of `h(s)` (a few f32 ulps
//! apart). H100, bf16 GIoU step at B=16384, N=256: 33.7 µs (the previous in-place form with a
//! list in global memory and a last-block release: 38.3 µs).
//!
//! Not handled (the two-kernel plan is kept): more than one crossing scale that is not a constant
//! multiple of the first, anything non-linear in the scale, a non-zero `else` value, outputs
//! without a small component axis, graphs with more kernels or other sinks in the second kernel,
//! lengths masks whose scalars need more than the count, and lengths masks when
//! `CodegenOptions::lengths_gradient` asks for two kernels.

use std::collections::HashMap;

use kfuse_ir::{BinaryOp, Graph, Kind, NodeId, Op, ReduceOp, TernaryOp, UnaryOp};

use crate::analysis::{full_reduce, Analysis, SinkKind};
use crate::emit::{Coord, Emitter, Mode};

/// A recognised one-pass plan for kernels 0 and 1.
#[derive(Clone, Debug)]
pub(crate) struct OnePass {
    /// The masked tensor output (index into `graph.outputs`).
    pub output: usize,
    /// Its component count (the small constant last axis).
    pub comps: u32,
    /// The scale `s` (a scalar of kernel 0 crossing to kernel 1 through its Temp buffer).
    pub scale: NodeId,
    /// Every crossing scalar and what the kernel uses for it: the f32 literal it takes when
    /// `s = 1` (compacted plan), or the `kf_c<t>` each block computes (rows plan).
    pub substitutions: Vec<(NodeId, String)>,
    /// The rows plan (a lengths mask; see `shapes::rows`): the count slots the crossing scalars need,
    /// taken from the lengths, so no grid barrier and no list.
    pub rows: bool,
    /// The rows plan: kernel 0's full reductions that are `count(m)` of the lengths mask (one
    /// per element where it holds, no mask of their own, no component axis). Every block sums
    /// the clamped lengths itself (`kf_cntd`), so these get no partial slot: they are neither
    /// accumulated per element nor folded, and the tail reads the block's count. Empty
    /// otherwise.
    pub counts: Vec<NodeId>,
}

/// How a value depends on the crossing scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deg {
    /// The constant 0 (homogeneous of every degree).
    Zero,
    /// Independent of them.
    Free,
    /// Homogeneous of degree 1.
    Linear,
}

/// Recognises the one-pass form (see the module docs).
pub(crate) fn detect(g: &Graph, an: &Analysis, lengths: crate::LengthsGradient) -> Option<OnePass> {
    let [k0, k1] = an.kernels.as_slice() else { return None };
    if k0.level != 0 || k1.level != 1 || k0.dims != k1.dims || k0.slots == 0 || k1.slots != 0 {
        return None;
    }
    if !k1.scalar_outputs.is_empty() || !k1.temp_writes.is_empty() || k0.dims.is_empty() {
        return None;
    }
    let [sink] = k1.sinks.as_slice() else { return None };
    let (SinkKind::Output { index }, Some(comps)) = (&sink.kind, sink.comps) else { return None };
    let out = g.outputs[*index].node;
    if g.node(out).dtype.kind() != Kind::Float {
        return None;
    }
    // The crossing scalars: the first is the scale, the others constant multiples of it.
    let crossing: Vec<NodeId> = an.temps.keys().copied().collect();
    let scale = *crossing.first()?;
    let mut substitutions = vec![(scale, crate::cuda::float_literal(1.0))];
    for &t in &crossing[1..] {
        let v = value_at_unit_scale(g, t, scale)?;
        substitutions.push((t, crate::cuda::float_literal(v)));
    }
    // The output must be where(m, v, 0) with one shared m, v linear, 0 literal.
    let em = Emitter::new(g, Some(an), Mode::Element { kernel: 1 }, k1.dims.clone(), 0);
    let dom: Vec<Coord> = (0..k1.dims.len() as u32).map(Coord::Dom).collect();
    let mut guard = None;
    let mut degs: HashMap<NodeId, Option<Deg>> = HashMap::new();
    for c in 0..u64::from(comps) {
        let mut ctx = dom.clone();
        ctx.push(Coord::Const(c));
        let (gd, (a, _), (b, _)) = crate::actions::resolve_select(&em, g, out, ctx)?;
        let gd = em.canonical(gd.0, gd.1);
        if guard.as_ref().is_some_and(|x| *x != gd) {
            return None;
        }
        guard = Some(gd);
        if degree(g, b, &crossing, &mut degs)? != Deg::Zero || degree(g, a, &crossing, &mut degs)? == Deg::Free {
            return None;
        }
    }
    let guard = guard?;
    let m = guard.0;
    if degree(g, m, &crossing, &mut degs)? != Deg::Free {
        return None;
    }
    let rows = is_lengths_mask(g, m);
    let mut counts = Vec::new();
    if rows {
        // Every crossing scalar must follow from counts of the mask alone (sums of the clamped
        // lengths), which every block computes itself.
        counts = mask_counts(g, &em, k0, &guard, &dom);
        if lengths == crate::LengthsGradient::TwoKernels || !crossing.iter().all(|&t| counts_only(g, t, &counts)) {
            return None;
        }
        substitutions = crossing.iter().map(|t| (*t, format!("kf_c{}", an.temps[t]))).collect();
    }
    Some(OnePass { output: *index, comps, scale, substitutions, rows, counts })
}

/// Kernel `k0`'s full reductions `count(x)` (no mask of their own, no component axis) whose
/// `x` over the domain is the guard (`m` in the domain's context): one per element where it
/// holds.
fn mask_counts(
    g: &Graph,
    em: &Emitter,
    k0: &crate::analysis::KernelInfo,
    guard: &(NodeId, Vec<Coord>),
    dom: &[Coord],
) -> Vec<NodeId> {
    let count_of_guard = |n: NodeId| match full_reduce(g, n) {
        Some((ReduceOp::Count, x, None)) => {
            g.node(x).shape.dims() == k0.dims.as_slice() && em.canonical(x, dom.to_vec()) == *guard
        }
        _ => false,
    };
    k0.sinks
        .iter()
        .filter_map(|s| match s.kind {
            SinkKind::Reduce { node, .. } if s.comps.is_none() && count_of_guard(node) => Some(node),
            _ => None,
        })
        .collect()
}

/// Whether scalar `t` depends on reductions only through `counts` (see [`mask_counts`]).
fn counts_only(g: &Graph, t: NodeId, counts: &[NodeId]) -> bool {
    let mut stack = vec![t];
    let mut seen = std::collections::HashSet::new();
    while let Some(n) = stack.pop() {
        if !seen.insert(n) {
            continue;
        }
        if let Op::Reduce { .. } = g.node(n).op {
            if !counts.contains(&n) {
                return false;
            }
            continue;
        }
        stack.extend(g.operands(n));
    }
    true
}

/// `iota(last) < bound`: the row-mode predicate of `mask(lengths)`.
fn is_lengths_mask(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Binary(BinaryOp::Lt, a, _) if matches!(g.node(a).op, Op::Iota { .. }))
}

/// The f32 value of scalar `t` when `scale` is 1, for `t` built from `scale` and constants by
/// negation, +, -, * and /; `None` otherwise.
fn value_at_unit_scale(g: &Graph, t: NodeId, scale: NodeId) -> Option<f32> {
    let reads = |n: NodeId| match g.node(n).op {
        _ if n == scale || g.node(n).dtype.kind() != Kind::Float => vec![],
        Op::Unary(UnaryOp::Neg, x) => vec![x],
        Op::Binary(_, a, b) => vec![a, b],
        _ => vec![],
    };
    let mut memo: HashMap<NodeId, Option<f32>> = HashMap::new();
    bottom_up(t, &mut memo, reads, |n, memo| {
        let value = |x: NodeId| memo.get(&x).copied().flatten();
        if n == scale {
            return Some(1.0);
        }
        let node = g.node(n);
        if node.dtype.kind() != Kind::Float {
            return None;
        }
        match node.op {
            Op::Const(l) => Some(l.as_f64() as f32),
            Op::Unary(UnaryOp::Neg, x) => Some(-value(x)?),
            Op::Binary(op, a, b) => {
                let (a, b) = (value(a)?, value(b)?);
                match op {
                    BinaryOp::Add => Some(a + b),
                    BinaryOp::Sub => Some(a - b),
                    BinaryOp::Mul => Some(a * b),
                    BinaryOp::Div => Some(a / b),
                    _ => None,
                }
            }
            _ => None,
        }
        .filter(|v| v.is_finite())
    })
    .flatten()
}

/// Computes `f` for `root` and for every node it reads, each once, operands before their users,
/// with an explicit stack (graphs of any depth): `reads(n)` are the nodes whose results `f(n, _)`
/// looks up in the memo. Results stay in `memo` for later calls.
fn bottom_up<T: Copy>(
    root: NodeId,
    memo: &mut HashMap<NodeId, T>,
    reads: impl Fn(NodeId) -> Vec<NodeId>,
    f: impl Fn(NodeId, &HashMap<NodeId, T>) -> T,
) -> Option<T> {
    let mut stack = vec![(root, false)];
    while let Some((n, operands_done)) = stack.pop() {
        if memo.contains_key(&n) {
            continue;
        }
        if operands_done {
            let v = f(n, memo);
            memo.insert(n, v);
        } else {
            stack.push((n, true));
            stack.extend(reads(n).into_iter().filter(|x| !memo.contains_key(x)).map(|x| (x, false)));
        }
    }
    memo.get(&root).copied()
}

/// The degree of node `n` in the crossing scalars (`None`: not homogeneous, or a shape of
/// dependence this analysis does not follow).
fn degree(g: &Graph, n: NodeId, crossing: &[NodeId], memo: &mut HashMap<NodeId, Option<Deg>>) -> Option<Deg> {
    let reads = |n: NodeId| if crossing.contains(&n) { vec![] } else { g.operands(n) };
    bottom_up(n, memo, reads, |n, memo| degree_of(g, n, crossing, |x| memo.get(&x).copied().flatten())).flatten()
}

/// The degree of node `n` from its operands' degrees (`deg`).
fn degree_of(g: &Graph, n: NodeId, crossing: &[NodeId], deg: impl Fn(NodeId) -> Option<Deg>) -> Option<Deg> {
    use Deg::*;
    if crossing.contains(&n) {
        return Some(Linear);
    }
    let node = g.node(n);
    let free = |d: Deg| matches!(d, Free | Zero);
    match node.op {
        Op::Const(l) => Some(if node.dtype.kind() == Kind::Float && l.as_f64() == 0.0 { Zero } else { Free }),
        Op::Input(_) | Op::Iota { .. } | Op::Rand { .. } => Some(Free),
        Op::Component { x, .. }
        | Op::Select { x, .. }
        | Op::Slice { x, .. }
        | Op::Transpose { x, .. }
        | Op::Reshape(x)
        | Op::ExpandLast(x)
        | Op::Unsqueeze { x, .. } => deg(x),
        Op::Unary(UnaryOp::Neg, x) => deg(x),
        // A selection of `x`'s elements: as linear as `x`, at an index that does not vary with the scale.
        Op::Gather { x, index, .. } => deg(index).filter(|d| free(*d)).and_then(|_| deg(x)),
        Op::Cast(x) if node.dtype.kind() == Kind::Float && g.node(x).dtype.kind() == Kind::Float => deg(x),
        Op::Unary(_, x) | Op::Cast(x) => deg(x).filter(|d| free(*d)).map(|_| Free),
        Op::Binary(op, a, b) => {
            let (da, db) = (deg(a)?, deg(b)?);
            match op {
                BinaryOp::Add | BinaryOp::Sub => match (da, db) {
                    (Zero, d) | (d, Zero) => Some(d),
                    (x, y) if x == y => Some(x),
                    _ => None,
                },
                BinaryOp::Mul => match (da, db) {
                    (Zero, _) | (_, Zero) => Some(Zero),
                    (Free, d) | (d, Free) => Some(d),
                    _ => None,
                },
                BinaryOp::Div => match (da, db) {
                    (Zero, Free) => Some(Zero),
                    (d, Free) => Some(d),
                    _ => None,
                },
                _ if free(da) && free(db) => Some(Free),
                _ => None,
            }
        }
        Op::Ternary(TernaryOp::Select, c, a, b) => {
            if !free(deg(c)?) {
                return None;
            }
            match (deg(a)?, deg(b)?) {
                (Zero, d) | (d, Zero) => Some(d),
                (x, y) if x == y => Some(x),
                (Free, Free) => Some(Free),
                _ => None,
            }
        }
        Op::Ternary(_, a, b, c) => (free(deg(a)?) && free(deg(b)?) && free(deg(c)?)).then_some(Free),
        Op::Stack(l) => {
            let mut acc = Zero;
            for &p in g.list(l) {
                acc = match (acc, deg(p)?) {
                    (Zero, d) | (d, Zero) => d,
                    (x, y) if x == y => x,
                    _ => return None,
                };
            }
            Some(acc)
        }
        Op::Reduce { x, mask, .. } => {
            let dm = match mask {
                Some(m) => deg(m)?,
                None => Free,
            };
            (free(deg(x)?) && free(dm) && !node.shape.is_scalar()).then_some(Free)
        }
    }
}

/// Buffers of a one-pass plan (indices into `Plan::buffers`).
#[derive(Clone, Debug)]
pub(crate) struct OnePassBuffers {
    pub pass: OnePass,
    /// The compacted plan's list: `u64` flat domain indices of the entries past the shared
    /// memory, and their `f32` unscaled values, `comps` per entry (`None`: the rows plan).
    pub list: Option<(usize, usize)>,
}
