//! Summing a gradient back over the axes along which its operand was broadcast.
//!
//! When an operand of shape `A` was broadcast up to the result shape `S` (a scalar bias, a `[B, 1]`
//! column, a `[4]` row), the operand's gradient is the result's gradient summed over the broadcast
//! axes. The IR reduces only over all axes or the last axis, so [`reduce_to`] handles:
//! - an operand that is scalar-like (every dim 1 or absent): one sum over all axes;
//! - broadcast axes at the end of `S` (`[B, 1]` in `[B, N]`): sums along the last axis, then the
//!   size-1 axes are put back with `x[.., None]`;
//! - a kept last axis of small constant size (`[4]` in `[B, 4]`): the gradient is split into its
//!   components, each is reduced recursively, and the results are stacked again.
//!
//! Anything else (a symbolic kept axis after a broadcast one, `[N]` in `[B, N]`; leading size-1
//! axes that the operand lacks) is reported as [`IrError::NotDifferentiable`] rather than guessed.

use kfuse_ir::{Dim, IrError, NodeId, ReduceAxis, ReduceOp, Shape};

use crate::emit::Emitter;

/// The largest number of component slices the per-component fallback may create in total.
const MAX_SLICES: u64 = 64;

/// Reduces `g` (shape broadcasting to `full`, the shape of the op's result) to a node whose shape
/// broadcasts to `target` (the operand's shape, which broadcasts to `full`).
pub(crate) fn reduce_to(em: &mut Emitter<'_>, g: NodeId, full: &Shape, target: &Shape) -> Result<NodeId, IrError> {
    if !has_broadcast_axis(full, target) && em.shape(g).broadcasts_to(target) {
        return Ok(g);
    }
    // Sums must see every element, so a lazily broadcast gradient is first made full-sized.
    let x = em.broadcast_to(g, full)?;
    let mut budget = MAX_SLICES;
    match reduce_exact(em, x, full, target, &mut budget) {
        Ok(r) => Ok(r),
        Err(Failure::Ir(e)) => Err(e),
        Err(Failure::Unreducible) => Err(IrError::NotDifferentiable {
            what: format!("an operand of shape {} broadcast to {}", show(em, target), show(em, full)),
            why: "its gradient needs a sum over broadcast axes that come before kept axes, which the IR \
                  (sums over all axes or the last axis only) expresses only when the kept trailing axes \
                  are small constants; make the operand broadcast as a scalar or along trailing size-1 axes"
                .into(),
        }),
    }
}

/// Why [`reduce_exact`] stopped.
enum Failure {
    /// The broadcast pattern is not expressible (the caller names the shapes).
    Unreducible,
    /// Building a node failed.
    Ir(IrError),
}

impl From<IrError> for Failure {
    fn from(e: IrError) -> Self {
        Failure::Ir(e)
    }
}

fn show(em: &Emitter<'_>, s: &Shape) -> String {
    em.b.graph().shape_str(s)
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
) -> Result<NodeId, Failure> {
    if target.rank() > full.rank() {
        return Err(Failure::Unreducible);
    }
    if !has_broadcast_axis(full, target) {
        return if full.broadcasts_to(target) { Ok(x) } else { Err(Failure::Unreducible) };
    }
    if target.dims().iter().all(|d| *d == Dim::Const(1)) {
        return Ok(em.reduce(ReduceOp::Sum, ReduceAxis::All, x, None)?);
    }
    // Here `target` has a dim other than 1, so both shapes have a last axis.
    let (Some(fl), Some(tl)) = (full.last(), target.last()) else {
        return Err(Failure::Unreducible);
    };
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
    // The last axis is kept while some earlier axis is broadcast: only a small constant last
    // axis can be split into components, each reduced on its own.
    let Dim::Const(k) = fl else {
        return Err(Failure::Unreducible);
    };
    if k > *budget {
        return Err(Failure::Unreducible);
    }
    *budget /= k;
    let mut parts = Vec::new();
    for i in 0..k {
        let i = u32::try_from(i).map_err(|_| Failure::Unreducible)?;
        let y = em.component(x, i)?;
        let mut inner_budget = *budget;
        parts.push(reduce_exact(em, y, &full_rest, &target_rest, &mut inner_budget)?);
    }
    Ok(em.stack(&parts)?)
}
