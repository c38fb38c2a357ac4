//! Summing a gradient back over the axes along which its operand was broadcast.
//!
//! When an operand of shape `A` was broadcast up to the result shape `S` (a scalar bias, a `[B, 1]`
//! column, a `[D]` weight), the operand's gradient is the result's gradient summed over the
//! broadcast axes. [`reduce_to`] handles every pattern, preferring these forms:
//! - an operand that is scalar-like (every dim 1 or absent): one sum over all axes;
//! - broadcast axes at the end of `S` (`[B, 1]` in `[B, N]`): a sum along the last axis, then the
//!   size-1 axis is put back with `x[.., None]`; several (`[B, 1, 1]` in `[B, H, W]`), one sum
//!   over them that keeps them;
//! - a kept last axis of small constant size, at most 8 (`[4]` in `[B, 4]`): the gradient is split
//!   into its components, each is reduced recursively, and the results are stacked again;
//! - anything else (`[D]` in `[B, D]`, `[1, D]` in `[A, B, D]`): one sum over the broadcast axes
//!   (the leading axes the operand lacks dropped), the operand's inner size-1 axes put back.

use kfuse_ir::{Dim, IrError, NodeId, ReduceAxis, ReduceOp, Shape};

use crate::emit::Emitter;

/// The largest number of component slices the per-component fallback may create in total.
const MAX_SLICES: u64 = 64;
/// The widest kept last axis split into components (a box's 4 coordinates): the planner keeps
/// such an axis in registers (its `MAX_COMPONENTS`); a wider one (a norm's channels) is summed over
/// the other axes at once, which it plans as a split column reduction.
const MAX_COMPONENT_AXIS: u64 = 8;

/// Reduces `g` (shape broadcasting to `full`, the shape of the op's result) to a node whose shape
/// broadcasts to `target` (the operand's shape, which broadcasts to `full`).
pub(crate) fn reduce_to(em: &mut Emitter<'_>, g: NodeId, full: &Shape, target: &Shape) -> Result<NodeId, IrError> {
    if !has_broadcast_axis(full, target) && em.shape(g).broadcasts_to(target) {
        return Ok(g);
    }
    // Sums must see every element, so a lazily broadcast gradient is first made full-sized.
    let x = em.broadcast_to(g, full)?;
    let mut budget = MAX_SLICES;
    reduce_exact(em, x, full, target, &mut budget)
}

/// Whether `target` (aligned to the right) is broadcast along some axis of `full` that is not 1.
fn has_broadcast_axis(full: &Shape, target: &Shape) -> bool {
    (0..full.rank()).any(|i| is_reduced(full.dims()[i], target_dim(full, target, i)))
}

/// `target`'s dim aligned with axis `i` of `full`, if `target` has one there.
fn target_dim(full: &Shape, target: &Shape, i: usize) -> Option<Dim> {
    let lead = full.rank().checked_sub(target.rank())?;
    i.checked_sub(lead).map(|j| target.dims()[j])
}

fn is_reduced(full: Dim, target: Option<Dim>) -> bool {
    full != Dim::Const(1) && matches!(target, None | Some(Dim::Const(1)))
}

/// `x` has exactly shape `full`; returns a node whose shape broadcasts to `target`.
fn reduce_exact(
    em: &mut Emitter<'_>,
    x: NodeId,
    full: &Shape,
    target: &Shape,
    budget: &mut u64,
) -> Result<NodeId, IrError> {
    if !target.broadcasts_to(full) {
        let g = em.b.graph();
        return Err(IrError::Malformed(format!(
            "a gradient of shape {} for an operand of shape {}",
            g.shape_str(full),
            g.shape_str(target)
        )));
    }
    if !has_broadcast_axis(full, target) {
        // Only size-1 leading axes that `target` lacks, if any, are left to drop.
        return if full.rank() > target.rank() { sum_broadcast_axes(em, x, full, target) } else { Ok(x) };
    }
    if target.dims().iter().all(|d| *d == Dim::Const(1)) {
        return em.reduce(ReduceOp::Sum, ReduceAxis::All, x, None);
    }
    // Here `target` has a dim other than 1, so both shapes have a last axis.
    let (Some(fl), Some(tl)) = (full.last(), target.last()) else {
        return sum_broadcast_axes(em, x, full, target);
    };
    // Several trailing axes broadcast from 1 (`[B, 1, 1]` in `[B, H, W]`): one sum over them,
    // not a chain of last-axis sums (the planner stores such a sum once, reducing the merged
    // axes by rows, where a chain would be summed again at each element it is read back at).
    let rank = full.rank();
    let run = (0..rank).rev().take_while(|&i| target_dim(full, target, i) == Some(Dim::Const(1))).collect::<Vec<_>>();
    let summed: Vec<usize> = run.into_iter().filter(|&i| full.dims()[i] != Dim::Const(1)).collect();
    if summed.len() >= 2 {
        let mask = summed.iter().fold(0u32, |m, &i| m | 1 << i);
        let y = em.reduce(ReduceOp::Sum, ReduceAxis::Axes { mask, keepdim: true }, x, None)?;
        let mut dims = full.dims().to_vec();
        for &i in &summed {
            dims[i] = Dim::Const(1);
        }
        return reduce_exact(em, y, &Shape(dims), target, budget);
    }
    let (full_rest, target_rest) = (full.without_last(), target.without_last());
    if fl == Dim::Const(1) || tl == Dim::Const(1) {
        // A size-1 axis in both is dropped; an axis broadcast from 1 is summed away. Either way
        // the rest is reduced and the axis comes back with size 1.
        let y = if fl == Dim::Const(1) {
            em.component(x, 0)?
        } else {
            em.reduce(ReduceOp::Sum, ReduceAxis::Last, x, None)?
        };
        let r = reduce_exact(em, y, &full_rest, &target_rest, budget)?;
        return Ok(em.expand_last(r));
    }
    // The last axis is kept while some earlier axis is broadcast: a small constant last axis is
    // split into components, each reduced on its own; any other is summed over the axes at once.
    let k = match fl {
        Dim::Const(k) if k <= *budget && k <= MAX_COMPONENT_AXIS => k,
        _ => return sum_broadcast_axes(em, x, full, target),
    };
    *budget /= k;
    let mut parts = Vec::new();
    for i in 0..k {
        let i = u32::try_from(i).map_err(|_| IrError::Malformed("component index exceeds u32".into()))?;
        let y = em.component(x, i)?;
        let mut inner_budget = *budget;
        parts.push(reduce_exact(em, y, &full_rest, &target_rest, &mut inner_budget)?);
    }
    em.stack(&parts)
}

/// `x` (exactly of shape `full`) summed over the axes along which `target` was broadcast in one
/// reduction: the leading axes `target` lacks are dropped, `target`'s size-1 axes put back.
fn sum_broadcast_axes(em: &mut Emitter<'_>, x: NodeId, full: &Shape, target: &Shape) -> Result<NodeId, IrError> {
    let lead = full.rank() - target.rank();
    let (mut dropped, mut kept_ones) = (0u32, 0u32);
    for a in 0..full.rank() {
        if a < lead {
            dropped |= 1 << a;
        } else if is_reduced(full.dims()[a], target_dim(full, target, a)) {
            kept_ones |= 1 << (a - lead);
        }
    }
    let r =
        em.reduce(ReduceOp::Sum, ReduceAxis::Axes { mask: dropped | kept_ones << lead, keepdim: false }, x, None)?;
    if kept_ones == 0 {
        return Ok(r);
    }
    em.unsqueeze(r, kept_ones)
}
