//! Reverse-mode automatic differentiation on the IR.
//!
//! [`grad`] walks the nodes between the input `wrt` and the scalar `of` backwards, once each,
//! accumulating for every node the gradient of `of` with respect to it (its *adjoint*), and appends
//! the backward nodes to the same builder. Forward nodes are reused as they are, so shared
//! subexpressions are computed once. Only nodes that depend on `wrt` and are floats take part.
//!
//! Adjoints are *lazily broadcast*: an adjoint's shape broadcasts to its node's shape (the adjoint
//! of a value summed over all axes stays a scalar). Gradients of an operand that was broadcast are
//! summed back by [`crate::unbroadcast`]. Gradients of several components of one `[.., K]` tensor
//! are kept apart and combined with one `stack` (zeros where no gradient arrived).
//!
//! Subgradients follow PyTorch: `abs` at 0 gives 0; `clamp` passes the gradient where
//! `lo <= x <= hi`; elementwise `max`/`min` ties split it half and half; `max`/`min` reductions
//! share it evenly among tied elements; `where` sends it to the selected branch only; `sqrt` at 0
//! gives inf; `floor`, `ceil`, `round`, `trunc`, `sign`, `floor_div` and the comparisons have none
//! (zeros, as PyTorch's `derivatives.yaml` says); `remainder(a, b)` gives `g` to `a` and
//! `-g * floor_div(a, b)` to `b`, `fmod(a, b)` gives `g` to `a` and `-g * trunc(a / b)` to `b`;
//! `hypot` at the origin gives NaN (`0 / 0`); `copysign(a, b)` gives `a` 0 where `a == 0` and `b`
//! none; `lgamma` gives `g * digamma(x)`, `digamma` `g * trigamma(x)`, `erfinv`
//! `g * sqrt(pi) / 2 * exp(erfinv(x)^2)` and `erfc` `-g * 2/sqrt(pi) * exp(-x^2)`; masked-out
//! elements get exactly 0.
//!
//! Not handled: gradients with respect to a non-input node, integer or bool inputs, a
//! non-scalar `of`, or through `trigamma` (PyTorch's would be `polygamma(2, x)`), all reported as
//! [`IrError::NotDifferentiable`].

use std::collections::BTreeMap;

use kfuse_ir::{BinaryOp, Dim, GraphBuilder, IrError, Node, NodeId, Op, ReduceAxis, ReduceOp, TernaryOp, UnaryOp};

use crate::emit::Emitter;
use crate::unbroadcast::reduce_to;

/// Appends to `b` the gradient of the scalar float node `of` with respect to the input node `wrt`
/// and returns the gradient node (shaped and typed like `wrt`).
///
/// If `of` does not depend on `wrt` the gradient is zeros. Errors: `of` not a scalar float,
/// `wrt` not an input node or not a float input, node ids outside the graph, and broadcast
/// patterns whose gradient the IR cannot sum (see the `unbroadcast` module).
pub fn grad(b: &mut GraphBuilder, of: NodeId, wrt: NodeId) -> Result<NodeId, IrError> {
    check_ids(b, &[("of", of), ("wrt", wrt)])?;
    check_of(b, of)?;
    check_wrt(b, wrt)?;
    let one = Emitter { b }.lit(1.0);
    let grads = backprop(b, &[(of, one)], &[wrt])?;
    grads.into_iter().next().ok_or_else(|| IrError::Malformed("grad: no gradient was produced".into()))
}

/// Appends to `b` the vector–Jacobian product: for each `(node, seed)` of `seeds`, `seed` is the
/// gradient that flows into the float node `node` (its shape broadcasts to the node's shape), and
/// the result is, for each input node of `wrt` in order, the sum over the seeds of
/// `seedᵀ · ∂node/∂input`, shaped and typed like the input.
///
/// [`grad`] is the case of one scalar node seeded with 1. A `wrt` input that no seeded node depends
/// on gets zeros. Errors: as [`grad`], and a seeded node that is not a float.
pub fn backprop(b: &mut GraphBuilder, seeds: &[(NodeId, NodeId)], wrt: &[NodeId]) -> Result<Vec<NodeId>, IrError> {
    for &(node, seed) in seeds {
        check_ids(b, &[("seeded node", node), ("seed", seed)])?;
        if !b.node(node).dtype.is_float() {
            return Err(IrError::NotDifferentiable {
                what: describe(b, node),
                why: format!("it has dtype {}, and only float values carry gradients", b.node(node).dtype),
            });
        }
    }
    for &x in wrt {
        check_ids(b, &[("wrt", x)])?;
        check_wrt(b, x)?;
    }
    let (Some(top), Some(bottom)) = (seeds.iter().map(|s| s.0).max(), wrt.iter().copied().min()) else {
        // Nothing seeded or nothing asked for: every asked-for gradient is zero.
        let mut em = Emitter { b };
        return wrt.iter().map(|&x| zeros_like(&mut em, x)).collect();
    };
    let wrt_nodes: Vec<Node> = wrt.iter().map(|&x| b.node(x).clone()).collect();
    let active = activity(b, top, wrt);
    let mut em = Emitter { b };
    let mut found: BTreeMap<NodeId, NodeId> = BTreeMap::new();
    if bottom <= top {
        let mut adj: Vec<Adjoint> = (0..=top.index()).map(|_| Adjoint::default()).collect();
        for &(node, seed) in seeds {
            if !active[node.index()] {
                continue;
            }
            let total = match adj[node.index()].full {
                Some(prev) => em.add(prev, seed)?,
                None => seed,
            };
            adj[node.index()].full = Some(total);
        }
        for i in (bottom.index()..=top.index()).rev() {
            if !active[i] {
                continue;
            }
            let id = NodeId(u32::try_from(i).map_err(|_| IrError::Malformed("node index exceeds u32".into()))?);
            let node = em.b.node(id).clone();
            let Some(g) = adj[i].collect(&mut em, &node)? else {
                continue;
            };
            if wrt.contains(&id) {
                found.insert(id, g);
                if id == bottom {
                    break;
                }
                continue;
            }
            let mut step = Step { em: &mut em, adj: &mut adj, active: &active, node: &node, id, g };
            step.propagate()?;
        }
    }
    let mut out = Vec::with_capacity(wrt.len());
    for (&x, xn) in wrt.iter().zip(&wrt_nodes) {
        let g = match found.get(&x) {
            Some(&g) => g,
            None => em.lit(0.0),
        };
        let g = em.broadcast_to(g, &xn.shape)?;
        out.push(em.b.cast(g, xn.dtype));
    }
    Ok(out)
}

/// Zeros shaped and typed like node `x`.
fn zeros_like(em: &mut Emitter<'_>, x: NodeId) -> Result<NodeId, IrError> {
    let n = em.b.node(x).clone();
    let z = em.lit(0.0);
    let z = em.broadcast_to(z, &n.shape)?;
    Ok(em.b.cast(z, n.dtype))
}

fn check_ids(b: &GraphBuilder, ids: &[(&str, NodeId)]) -> Result<(), IrError> {
    let count = b.graph().nodes.len();
    for &(role, id) in ids {
        if id.index() >= count {
            return Err(IrError::Malformed(format!("grad: `{role}` is v{}, but the graph has {count} nodes", id.0)));
        }
    }
    Ok(())
}

/// A readable name for node `id`: the output that shows it, or `v<id>` and its op.
fn describe(b: &GraphBuilder, id: NodeId) -> String {
    let g = b.graph();
    if let Some(o) = g.outputs.iter().find(|o| o.node == id) {
        return format!("output `{}`", o.name);
    }
    let what = match g.node(id).op {
        Op::Input(i) => return format!("input `{}`", g.input(i).name),
        Op::Const(_) => "a constant",
        Op::Iota { .. } => "iota",
        Op::Rand { .. } => "rand_like",
        Op::Cast(_) => "a cast",
        Op::Unary(op, _) => op.name(),
        Op::Binary(op, _, _) => op.name(),
        Op::Ternary(TernaryOp::Select, ..) => "where",
        Op::Ternary(TernaryOp::Clamp, ..) => "clamp",
        Op::Ternary(TernaryOp::Fma, ..) => "fma",
        Op::Component { .. } => "a component",
        Op::Select { .. } => "select",
        Op::Slice { .. } => "slice",
        Op::Transpose { .. } => "transpose",
        Op::Stack(_) => "stack",
        Op::ExpandLast(_) => "x[.., None]",
        Op::Reshape(_) => "reshape",
        Op::Unsqueeze { .. } => "unsqueeze",
        Op::Gather { .. } => "gather",
        Op::Reduce { op, .. } => op.name(),
    };
    format!("v{} (`{what}`)", id.0)
}

fn check_of(b: &GraphBuilder, of: NodeId) -> Result<(), IrError> {
    let n = b.node(of);
    if !n.dtype.is_float() || !n.shape.is_scalar() {
        return Err(IrError::NotDifferentiable {
            what: describe(b, of),
            why: format!(
                "grad needs a scalar float value to differentiate, but it is {}{} (reduce it with sum or mean first)",
                n.dtype,
                b.graph().shape_str(&n.shape)
            ),
        });
    }
    Ok(())
}

fn check_wrt(b: &GraphBuilder, wrt: NodeId) -> Result<(), IrError> {
    let n = b.node(wrt);
    let Op::Input(_) = n.op else {
        return Err(IrError::NotDifferentiable {
            what: describe(b, wrt),
            why: "grad is taken with respect to an input; this node is computed".into(),
        });
    };
    if !n.dtype.is_float() {
        return Err(IrError::NotDifferentiable {
            what: describe(b, wrt),
            why: format!("it has dtype {}, and only float inputs have gradients", n.dtype),
        });
    }
    Ok(())
}

/// For each node up to `of`: whether it is a float that depends on one of `wrt`.
fn activity(b: &GraphBuilder, of: NodeId, wrt: &[NodeId]) -> Vec<bool> {
    let g = b.graph();
    let mut active = vec![false; of.index() + 1];
    let Some(bottom) = wrt.iter().copied().min() else {
        return active;
    };
    if bottom.index() > of.index() {
        return active;
    }
    for &x in wrt {
        if x.index() <= of.index() {
            active[x.index()] = true;
        }
    }
    for i in bottom.index() + 1..=of.index() {
        if active[i] {
            continue;
        }
        let n = &g.nodes[i];
        let mut any = false;
        n.op.for_each_operand(&g.lists, |x| any |= active[x.index()]);
        active[i] = any && n.dtype.is_float();
    }
    active
}

/// The gradient accumulated for one node: whole-tensor contributions, and per-component ones
/// (from `x[.., k]`) that are stacked when the node is reached.
#[derive(Default)]
struct Adjoint {
    full: Option<NodeId>,
    parts: BTreeMap<u32, NodeId>,
}

impl Adjoint {
    /// The node's total adjoint, or `None` if no gradient reached it.
    fn collect(&mut self, em: &mut Emitter<'_>, node: &Node) -> Result<Option<NodeId>, IrError> {
        if self.parts.is_empty() {
            return Ok(self.full);
        }
        let Some(Dim::Const(k)) = node.shape.last() else {
            return Err(IrError::Malformed("component gradients on a node without a constant last axis".into()));
        };
        let zero = em.lit(0.0);
        let mut slots = Vec::new();
        for i in 0..k {
            let i = u32::try_from(i).map_err(|_| IrError::Malformed("component axis exceeds u32".into()))?;
            slots.push(self.parts.get(&i).copied().unwrap_or(zero));
        }
        let stacked = em.stack(&slots)?;
        Ok(Some(match self.full {
            Some(f) => em.add(f, stacked)?,
            None => stacked,
        }))
    }
}

/// One backward step: the adjoint `g` of `node` (id `id`) handed to its active operands.
struct Step<'e, 'b> {
    em: &'e mut Emitter<'b>,
    adj: &'e mut [Adjoint],
    active: &'e [bool],
    node: &'e Node,
    id: NodeId,
    g: NodeId,
}

impl Step<'_, '_> {
    fn is_active(&self, x: NodeId) -> bool {
        self.active.get(x.index()).copied().unwrap_or(false)
    }

    /// Adds contribution `c` (shape broadcasting to this node's shape) to operand `x`'s adjoint,
    /// summed over the axes along which `x` was broadcast.
    fn send(&mut self, x: NodeId, c: NodeId) -> Result<(), IrError> {
        if !self.is_active(x) || self.em.is_zero(c) {
            return Ok(());
        }
        let target = self.em.shape(x);
        let c = reduce_to(self.em, c, &self.node.shape, &target)?;
        let slot = &mut self.adj[x.index()].full;
        *slot = Some(match *slot {
            Some(prev) => self.em.add(prev, c)?,
            None => c,
        });
        Ok(())
    }

    fn propagate(&mut self) -> Result<(), IrError> {
        let g = self.g;
        match self.node.op {
            // Random numbers are constants of the inputs: no gradient flows to the seed.
            Op::Input(_) | Op::Const(_) | Op::Iota { .. } | Op::Rand { .. } => Ok(()),
            Op::Cast(x) => self.send(x, g),
            Op::Unary(op, x) => {
                let c = self.unary(op, x)?;
                match c {
                    Some(c) => self.send(x, c),
                    None => Ok(()),
                }
            }
            Op::Binary(op, a, b) => self.binary(op, a, b),
            Op::Ternary(TernaryOp::Select, cond, a, b) => {
                let zero = self.em.lit(0.0);
                if self.is_active(a) {
                    let ca = self.em.select(cond, g, zero)?;
                    self.send(a, ca)?;
                }
                if self.is_active(b) {
                    let cb = self.em.select(cond, zero, g)?;
                    self.send(b, cb)?;
                }
                Ok(())
            }
            Op::Ternary(TernaryOp::Clamp, x, lo, hi) => self.clamp(x, lo, hi),
            Op::Ternary(TernaryOp::Fma, a, b, c) => {
                // d(a * b + c) = b da + a db + dc.
                if self.is_active(a) {
                    let ca = self.em.mul(g, b)?;
                    self.send(a, ca)?;
                }
                if self.is_active(b) {
                    let cb = self.em.mul(g, a)?;
                    self.send(b, cb)?;
                }
                self.send(c, g)
            }
            Op::Component { x, index } => {
                if !self.is_active(x) {
                    return Ok(());
                }
                let parts = &mut self.adj[x.index()].parts;
                let prev = parts.get(&index).copied();
                let sum = match prev {
                    Some(p) => self.em.add(p, g)?,
                    None => g,
                };
                self.adj[x.index()].parts.insert(index, sum);
                Ok(())
            }
            Op::Stack(list) => {
                let parts = self.em.b.graph().list(list).to_vec();
                let k = parts.len();
                let inner = self.node.shape.without_last();
                for (i, p) in parts.into_iter().enumerate() {
                    if !self.is_active(p) {
                        continue;
                    }
                    let gi = self.slice_last(g, i, k)?;
                    let target = self.em.shape(p);
                    let c = reduce_to(self.em, gi, &inner, &target)?;
                    let slot = &mut self.adj[p.index()].full;
                    *slot = Some(match *slot {
                        Some(prev) => self.em.add(prev, c)?,
                        None => c,
                    });
                }
                Ok(())
            }
            Op::ExpandLast(x) => {
                let c = self.slice_last(g, 0, 1)?;
                self.send_exact(x, c)
            }
            Op::Unsqueeze { x, axes } => {
                // `g` has size 1 on the new axes (or lacks them): sum them away.
                let (gr, yr) = (self.em.shape(g).rank(), self.node.shape.rank());
                let bits = (yr - gr.min(yr)..yr).filter(|&a| axes >> a & 1 == 1).map(|a| a - (yr - gr.min(yr)));
                let m = bits.fold(0u32, |m, a| m | 1 << a);
                let c = if m == 0 {
                    g
                } else {
                    self.em.reduce(ReduceOp::Sum, ReduceAxis::Axes { mask: m, keepdim: false }, g, None)?
                };
                self.send_exact(x, c)
            }
            Op::Gather { x, index, axis } => self.gather(x, index, axis),
            Op::Select { x, axis, index } => self.select_index(x, axis, index),
            Op::Slice { x, axis, start, step } => self.slice(x, axis, start, step),
            Op::Transpose { x, a, b } => {
                if !self.is_active(x) || self.em.is_zero(self.g) {
                    return Ok(());
                }
                let out = self.node.shape.clone();
                let g = self.em.broadcast_to(self.g, &out)?;
                let c = self.em.b.transpose(g, i64::from(a), i64::from(b))?;
                self.send_exact(x, c)
            }
            Op::Reshape(x) => {
                // The gradient in the result's shape, read back in the operand's.
                if !self.is_active(x) || self.em.is_zero(self.g) {
                    return Ok(());
                }
                let (out, xs) = (self.node.shape.clone(), self.em.shape(x));
                let g = self.em.broadcast_to(self.g, &out)?;
                let dims: Vec<Option<Dim>> = xs.dims().iter().map(|&d| Some(d)).collect();
                let c = self.em.b.reshape(g, &dims)?;
                self.send_exact(x, c)
            }
            Op::Reduce { op, axis, x, mask } => self.reduce(op, axis, x, mask),
        }
    }

    /// The gradient of `gather(x, index, axis)` scatters `g` back without atomics:
    /// `dx[.., c, ..] = sum over j of g[.., j, ..] where index[.., j, ..] == c`, written as a
    /// one-hot of each index along a new axis after `axis` (`iota` compared with the index),
    /// selecting `g`, summed over `axis`. Each element of `dx` reads the K indices of its row:
    /// O(C K) per row, as a one-hot. An out-of-range index picks no column. With K = 1 (one label
    /// per row) the one-hot is the index compared along the source's axis itself: the same values
    /// with no sum.
    fn gather(&mut self, x: NodeId, index: NodeId, axis: u32) -> Result<(), IrError> {
        if !self.is_active(x) || self.em.is_zero(self.g) {
            return Ok(());
        }
        let a = axis as usize;
        let (out, xs) = (self.node.shape.clone(), self.em.shape(x));
        if a + 1 >= ReduceAxis::MAX_RANK {
            return Err(IrError::NotDifferentiable {
                what: format!("v{} (`gather`)", self.id.0),
                why: format!(
                    "its gradient needs an axis after axis {a}, past the {} axes kfuse can name",
                    ReduceAxis::MAX_RANK
                ),
            });
        }
        let g = self.em.broadcast_to(self.g, &out)?;
        if out.dims()[a] == Dim::Const(1) {
            // One index along the axis (a label per row): the one-hot needs no axis of its own
            // and no sum over it; the index broadcasts along the source's axis.
            let mut dims = out.dims().to_vec();
            dims[a] = xs.dims()[a];
            let column = self.em.b.iota(kfuse_ir::Shape(dims), axis)?;
            let hit = self.em.compare(BinaryOp::Eq, index, column)?;
            let zero = self.em.lit(0.0);
            let picked = self.em.select(hit, g, zero)?;
            return self.send_exact(x, picked);
        }
        // [.., K, C, ..]: the index's shape with the source's axis inserted after `axis`.
        let mut dims = out.dims().to_vec();
        dims.insert(a + 1, xs.dims()[a]);
        let column = self.em.b.iota(kfuse_ir::Shape(dims), axis + 1)?;
        let new_axis = 1u32 << (a + 1);
        let at = self.em.unsqueeze(index, new_axis)?;
        let hit = self.em.compare(BinaryOp::Eq, at, column)?;
        let gu = self.em.unsqueeze(g, new_axis)?;
        let zero = self.em.lit(0.0);
        let picked = self.em.select(hit, gu, zero)?;
        let c = self.em.reduce(ReduceOp::Sum, ReduceAxis::Axes { mask: 1 << a, keepdim: false }, picked, None)?;
        self.send_exact(x, c)
    }

    /// The gradient of `x[.., index, ..]` (on `axis`): `g` placed at `index` of that axis, zeros
    /// elsewhere (`where(iota == index, g[.., None, ..], 0)`).
    fn select_index(&mut self, x: NodeId, axis: u32, index: u32) -> Result<(), IrError> {
        if !self.is_active(x) || self.em.is_zero(self.g) {
            return Ok(());
        }
        let (out, xs) = (self.node.shape.clone(), self.em.shape(x));
        if axis as usize >= ReduceAxis::MAX_RANK {
            return Err(self.too_many_axes("select", axis));
        }
        let g = self.em.broadcast_to(self.g, &out)?;
        let gu = self.em.unsqueeze(g, 1 << axis)?;
        let at = self.em.b.iota(xs, axis)?;
        let i = self.em.b.lit_int(i64::from(index));
        let hit = self.em.compare(BinaryOp::Eq, at, i)?;
        let zero = self.em.lit(0.0);
        let c = self.em.select(hit, gu, zero)?;
        self.send_exact(x, c)
    }

    /// The gradient of a slice `start::step` (of `len` elements) on `axis`: element `c` of the
    /// operand's axis takes `g` at `(c - start) / step` where that is a whole number in `0..len`,
    /// and 0 elsewhere (a gather of `g` at the clamped position, under that condition).
    fn slice(&mut self, x: NodeId, axis: u32, start: u32, step: u32) -> Result<(), IrError> {
        if !self.is_active(x) || self.em.is_zero(self.g) {
            return Ok(());
        }
        let (out, xs) = (self.node.shape.clone(), self.em.shape(x));
        let len = match out.dims().get(axis as usize) {
            Some(Dim::Const(len)) if *len > 0 => i64::try_from(*len).unwrap_or(i64::MAX),
            _ => return Ok(()),
        };
        let g = self.em.broadcast_to(self.g, &out)?;
        let b = &mut *self.em.b;
        let at = b.iota(xs, axis)?;
        let s = b.lit_int(i64::from(start));
        let rel = b.binary(BinaryOp::Sub, at, s)?;
        let step = i64::from(step);
        let pos = match step {
            1 => rel,
            k => {
                let k = b.lit_int(k);
                b.binary(BinaryOp::FloorDiv, rel, k)?
            }
        };
        let (zero, last) = (b.lit_int(0), b.lit_int(len - 1));
        let index = b.clamp(pos, zero, last)?;
        let picked = b.gather(g, index, i64::from(axis))?;
        let lo = b.binary(BinaryOp::Ge, rel, zero)?;
        let end = b.lit_int(step * (len - 1));
        let hi = b.binary(BinaryOp::Le, rel, end)?;
        let mut inside = b.binary(BinaryOp::And, lo, hi)?;
        if step > 1 {
            let k = b.lit_int(step);
            let r = b.binary(BinaryOp::Remainder, rel, k)?;
            let on = b.binary(BinaryOp::Eq, r, zero)?;
            inside = b.binary(BinaryOp::And, inside, on)?;
        }
        let fzero = self.em.lit(0.0);
        let c = self.em.select(inside, picked, fzero)?;
        self.send_exact(x, c)
    }

    /// The error of an op whose gradient needs to name an axis past [`ReduceAxis::MAX_RANK`].
    fn too_many_axes(&self, op: &str, axis: u32) -> IrError {
        IrError::NotDifferentiable {
            what: format!("v{} (`{op}`)", self.id.0),
            why: format!("its gradient names axis {axis}, past the {} axes kfuse can name", ReduceAxis::MAX_RANK),
        }
    }

    /// Like [`Step::send`] for ops whose operand has the result's shape minus or plus an axis
    /// (no broadcasting between them).
    fn send_exact(&mut self, x: NodeId, c: NodeId) -> Result<(), IrError> {
        if !self.is_active(x) || self.em.is_zero(c) {
            return Ok(());
        }
        let slot = &mut self.adj[x.index()].full;
        *slot = Some(match *slot {
            Some(prev) => self.em.add(prev, c)?,
            None => c,
        });
        Ok(())
    }

    /// Component `i` of `g`, whose shape broadcasts to `[.., k]` (a scalar `g` or one with a last
    /// axis of size 1 is the same for every component).
    fn slice_last(&mut self, g: NodeId, i: usize, k: usize) -> Result<NodeId, IrError> {
        let shape = self.em.shape(g);
        match shape.last() {
            None => Ok(g),
            Some(Dim::Const(1)) => self.em.component(g, 0),
            Some(Dim::Const(c)) if usize::try_from(c).ok() == Some(k) => {
                let i = u32::try_from(i).map_err(|_| IrError::Malformed("stack index exceeds u32".into()))?;
                self.em.component(g, i)
            }
            _ => Err(IrError::Malformed(format!(
                "a gradient of shape {} for a stack of {k} parts",
                self.em.b.graph().shape_str(&shape)
            ))),
        }
    }

    /// The contribution of a unary op's adjoint to its operand, `None` where there is none.
    fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<Option<NodeId>, IrError> {
        let (g, y) = (self.g, self.id);
        let em = &mut *self.em;
        let c = match op {
            // Piecewise constant (or bool/int valued): no gradient, as in PyTorch.
            UnaryOp::Not
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Trunc
            | UnaryOp::Sign
            | UnaryOp::IsNan
            | UnaryOp::IsInf
            | UnaryOp::IsFinite
            | UnaryOp::BitNot
            // No gradient flows through by definition.
            | UnaryOp::Detach => return Ok(None),
            // A rounding to the value's own dtype passes the gradient on, as a cast does.
            UnaryOp::Rounded => g,
            UnaryOp::Log1p => {
                let one = em.lit(1.0);
                let xp = em.add(x, one)?;
                em.div(g, xp)?
            }
            UnaryOp::Expm1 => {
                let one = em.lit(1.0);
                let d = em.add(y, one)?;
                em.mul(g, d)?
            }
            UnaryOp::Atan => {
                let one = em.lit(1.0);
                let x2 = em.mul(x, x)?;
                let d = em.add(x2, one)?;
                em.div(g, d)?
            }
            UnaryOp::Tan => {
                let one = em.lit(1.0);
                let y2 = em.mul(y, y)?;
                let d = em.add(y2, one)?;
                em.mul(g, d)?
            }
            UnaryOp::Asin | UnaryOp::Acos => {
                // ±g / sqrt(1 - x^2), written as PyTorch does with rsqrt.
                let one = em.lit(1.0);
                let x2 = em.mul(x, x)?;
                let d = em.sub(one, x2)?;
                let r = em.unary(UnaryOp::Rsqrt, d)?;
                let c = em.mul(g, r)?;
                if op == UnaryOp::Acos {
                    em.neg(c)?
                } else {
                    c
                }
            }
            UnaryOp::Sinh => {
                let c = em.unary(UnaryOp::Cosh, x)?;
                em.mul(g, c)?
            }
            UnaryOp::Cosh => {
                let s = em.unary(UnaryOp::Sinh, x)?;
                em.mul(g, s)?
            }
            UnaryOp::Asinh | UnaryOp::Acosh => {
                // g / sqrt(x^2 ± 1), written as PyTorch does with rsqrt.
                let one = em.lit(1.0);
                let x2 = em.mul(x, x)?;
                let d = if op == UnaryOp::Asinh { em.add(x2, one)? } else { em.sub(x2, one)? };
                let r = em.unary(UnaryOp::Rsqrt, d)?;
                em.mul(g, r)?
            }
            UnaryOp::Atanh => {
                let one = em.lit(1.0);
                let x2 = em.mul(x, x)?;
                let d = em.sub(one, x2)?;
                em.div(g, d)?
            }
            UnaryOp::Lgamma => {
                let d = em.unary(UnaryOp::Digamma, x)?;
                em.mul(g, d)?
            }
            UnaryOp::Digamma => {
                let d = em.unary(UnaryOp::Trigamma, x)?;
                em.mul(g, d)?
            }
            UnaryOp::Trigamma => {
                return Err(IrError::NotDifferentiable {
                    what: format!("v{} (`trigamma`)", y.0),
                    why: "its gradient would be polygamma(2, x) (PyTorch's), which kfuse does not compute".into(),
                })
            }
            UnaryOp::Erfinv => {
                // g * sqrt(pi) / 2 * exp(erfinv(x)^2), as PyTorch.
                let y2 = em.mul(y, y)?;
                let e = em.unary(UnaryOp::Exp, y2)?;
                let k = em.lit(std::f64::consts::PI.sqrt() / 2.0);
                let d = em.mul(e, k)?;
                em.mul(g, d)?
            }
            UnaryOp::Neg => em.neg(g)?,
            UnaryOp::Abs => {
                // sign(x) * g with sign(0) = 0, as PyTorch.
                let zero = em.lit(0.0);
                let pos = em.compare(BinaryOp::Gt, x, zero)?;
                let negative = em.compare(BinaryOp::Lt, x, zero)?;
                let ng = em.neg(g)?;
                let inner = em.select(negative, ng, zero)?;
                em.select(pos, g, inner)?
            }
            UnaryOp::Exp => em.mul(g, y)?,
            UnaryOp::Log => em.div(g, x)?,
            UnaryOp::Sqrt => {
                let half = em.lit(0.5);
                let h = em.mul(g, half)?;
                em.div(h, y)?
            }
            UnaryOp::Rsqrt => {
                // d/dx x^(-1/2) = -1/2 * y^3.
                let y2 = em.mul(y, y)?;
                let y3 = em.mul(y2, y)?;
                let k = em.lit(-0.5);
                let d = em.mul(y3, k)?;
                em.mul(g, d)?
            }
            UnaryOp::Sigmoid => {
                let one = em.lit(1.0);
                let om = em.sub(one, y)?;
                let d = em.mul(y, om)?;
                em.mul(g, d)?
            }
            UnaryOp::Tanh => {
                let one = em.lit(1.0);
                let y2 = em.mul(y, y)?;
                let d = em.sub(one, y2)?;
                em.mul(g, d)?
            }
            UnaryOp::Erf => {
                let x2 = em.mul(x, x)?;
                let nx2 = em.neg(x2)?;
                let e = em.unary(UnaryOp::Exp, nx2)?;
                let k = em.lit(std::f64::consts::FRAC_2_SQRT_PI);
                let d = em.mul(e, k)?;
                em.mul(g, d)?
            }
            UnaryOp::Erfc => {
                // -g * 2/sqrt(pi) * exp(-x^2), as PyTorch: erf's with the sign turned.
                let x2 = em.mul(x, x)?;
                let nx2 = em.neg(x2)?;
                let e = em.unary(UnaryOp::Exp, nx2)?;
                let k = em.lit(-std::f64::consts::FRAC_2_SQRT_PI);
                let d = em.mul(e, k)?;
                em.mul(g, d)?
            }
            UnaryOp::Sin => {
                let c = em.unary(UnaryOp::Cos, x)?;
                em.mul(g, c)?
            }
            UnaryOp::Cos => {
                let s = em.unary(UnaryOp::Sin, x)?;
                let gs = em.mul(g, s)?;
                em.neg(gs)?
            }
        };
        Ok(Some(c))
    }

    fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<(), IrError> {
        let (g, y) = (self.g, self.id);
        let (act_a, act_b) = (self.is_active(a), self.is_active(b));
        match op {
            BinaryOp::Add => {
                self.send(a, g)?;
                self.send(b, g)
            }
            BinaryOp::Sub => {
                self.send(a, g)?;
                if act_b {
                    let n = self.em.neg(g)?;
                    self.send(b, n)?;
                }
                Ok(())
            }
            BinaryOp::Mul => {
                if act_a {
                    let c = self.em.mul(g, b)?;
                    self.send(a, c)?;
                }
                if act_b {
                    let c = self.em.mul(g, a)?;
                    self.send(b, c)?;
                }
                Ok(())
            }
            BinaryOp::Div => {
                if act_a {
                    let c = self.em.div(g, b)?;
                    self.send(a, c)?;
                }
                if act_b {
                    // d(a/b)/db = -(a/b)/b.
                    let gy = self.em.mul(g, y)?;
                    let q = self.em.div(gy, b)?;
                    let c = self.em.neg(q)?;
                    self.send(b, c)?;
                }
                Ok(())
            }
            BinaryOp::Pow => self.pow(a, b),
            BinaryOp::Atan2 => {
                // atan2(a, b): a gets g * b / (a² + b²), b gets -g * a / (a² + b²).
                let a2 = self.em.mul(a, a)?;
                let b2 = self.em.mul(b, b)?;
                let r2 = self.em.add(a2, b2)?;
                let gr = self.em.div(g, r2)?;
                if act_a {
                    let c = self.em.mul(gr, b)?;
                    self.send(a, c)?;
                }
                if act_b {
                    let ga = self.em.mul(gr, a)?;
                    let c = self.em.neg(ga)?;
                    self.send(b, c)?;
                }
                Ok(())
            }
            BinaryOp::Remainder => {
                // a - floor_div(a, b) * b: the quotient is piecewise constant.
                self.send(a, g)?;
                if act_b {
                    let q = self.em.b.binary(BinaryOp::FloorDiv, a, b)?;
                    let gq = self.em.mul(g, q)?;
                    let c = self.em.neg(gq)?;
                    self.send(b, c)?;
                }
                Ok(())
            }
            BinaryOp::Fmod => {
                // a - trunc(a / b) * b: the quotient is piecewise constant (torch.fmod's gradient).
                self.send(a, g)?;
                if act_b {
                    let ab = self.em.div(a, b)?;
                    let q = self.em.unary(UnaryOp::Trunc, ab)?;
                    let gq = self.em.mul(g, q)?;
                    let c = self.em.neg(gq)?;
                    self.send(b, c)?;
                }
                Ok(())
            }
            BinaryOp::Hypot => {
                // torch.hypot's: a gets g * a / y, b gets g * b / y (NaN at the origin, as torch's).
                for (x, act) in [(a, act_a), (b, act_b)] {
                    if act {
                        let gx = self.em.mul(g, x)?;
                        let c = self.em.div(gx, y)?;
                        self.send(x, c)?;
                    }
                }
                Ok(())
            }
            BinaryOp::Copysign => {
                // torch.copysign's: a gets g * (y / a), 0 where a == 0; b gets none (y is
                // piecewise constant in b).
                if act_a {
                    let zero = self.em.lit(0.0);
                    let r = self.em.div(y, a)?;
                    let nonzero = self.em.compare(BinaryOp::Ne, a, zero)?;
                    let ratio = self.em.select(nonzero, r, zero)?;
                    let c = self.em.mul(g, ratio)?;
                    self.send(a, c)?;
                }
                Ok(())
            }
            // floor_div is piecewise constant; comparisons, logic and bitwise ops give bools or ints,
            // which are never active.
            BinaryOp::Max | BinaryOp::Min => {
                // Ties split the gradient half and half (torch.maximum / torch.minimum).
                let wins = if op == BinaryOp::Max { BinaryOp::Gt } else { BinaryOp::Lt };
                let zero = self.em.lit(0.0);
                let half = self.em.lit(0.5);
                let tie = self.em.compare(BinaryOp::Eq, a, b)?;
                let hg = self.em.mul(g, half)?;
                let on_tie = self.em.select(tie, hg, zero)?;
                for (x, other, act) in [(a, b, act_a), (b, a, act_b)] {
                    if act {
                        let w = self.em.compare(wins, x, other)?;
                        let c = self.em.select(w, g, on_tie)?;
                        self.send(x, c)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `y = a ^ b`, with PyTorch's conventions: no gradient to `a` where `b == 0`, none to `b`
    /// where `a == 0 and b >= 0`.
    fn pow(&mut self, a: NodeId, b: NodeId) -> Result<(), IrError> {
        let (g, y) = (self.g, self.id);
        let em = &mut *self.em;
        let zero = em.lit(0.0);
        if self.active.get(a.index()).copied().unwrap_or(false) {
            let c = match em.float_const(b) {
                Some(0.0) => None,
                Some(e) => {
                    let scaled = {
                        let k = em.lit(e);
                        em.mul(g, k)?
                    };
                    let p = if e - 1.0 == 1.0 {
                        a
                    } else {
                        let e1 = em.lit(e - 1.0);
                        em.b.binary(BinaryOp::Pow, a, e1)?
                    };
                    // x^0 is 1, so a power of 0 (e == 1) multiplies by nothing.
                    Some(if e == 1.0 { scaled } else { em.mul(scaled, p)? })
                }
                None => {
                    let one = em.lit(1.0);
                    let e1 = em.sub(b, one)?;
                    let p = em.b.binary(BinaryOp::Pow, a, e1)?;
                    let gb = em.mul(g, b)?;
                    let t = em.mul(gb, p)?;
                    let b_zero = em.compare(BinaryOp::Eq, b, zero)?;
                    Some(em.select(b_zero, zero, t)?)
                }
            };
            if let Some(c) = c {
                self.send(a, c)?;
            }
        }
        if self.is_active(b) {
            let em = &mut *self.em;
            let l = em.unary(UnaryOp::Log, a)?;
            let gy = em.mul(g, y)?;
            let t = em.mul(gy, l)?;
            let c = match em.float_const(a) {
                Some(v) if v != 0.0 => t,
                _ => {
                    let a_zero = em.compare(BinaryOp::Eq, a, zero)?;
                    let b_nonneg = em.compare(BinaryOp::Ge, b, zero)?;
                    let cond = em.compare(BinaryOp::And, a_zero, b_nonneg)?;
                    em.select(cond, zero, t)?
                }
            };
            self.send(b, c)?;
        }
        Ok(())
    }

    /// `clamp(x, lo, hi)` as PyTorch's `clamp_backward_min_max`: `x` gets the gradient where
    /// `lo <= x <= hi`; `lo` where `x < lo` (and `lo < hi`); `hi` where `x > hi` or `hi < lo`.
    fn clamp(&mut self, x: NodeId, lo: NodeId, hi: NodeId) -> Result<(), IrError> {
        let g = self.g;
        let zero = self.em.lit(0.0);
        if self.is_active(x) {
            let ge = self.em.compare(BinaryOp::Ge, x, lo)?;
            let le = self.em.compare(BinaryOp::Le, x, hi)?;
            let inside = self.em.compare(BinaryOp::And, ge, le)?;
            let c = self.em.select(inside, g, zero)?;
            self.send(x, c)?;
        }
        if self.is_active(lo) {
            let below = self.em.compare(BinaryOp::Lt, x, lo)?;
            let ordered = self.em.compare(BinaryOp::Lt, lo, hi)?;
            let cond = self.em.compare(BinaryOp::And, below, ordered)?;
            let c = self.em.select(cond, g, zero)?;
            self.send(lo, c)?;
        }
        if self.is_active(hi) {
            let above = self.em.compare(BinaryOp::Gt, x, hi)?;
            let crossed = self.em.compare(BinaryOp::Lt, hi, lo)?;
            let cond = self.em.compare(BinaryOp::Or, above, crossed)?;
            let c = self.em.select(cond, g, zero)?;
            self.send(hi, c)?;
        }
        Ok(())
    }

    fn reduce(&mut self, op: ReduceOp, axis: ReduceAxis, x: NodeId, mask: Option<NodeId>) -> Result<(), IrError> {
        if !self.is_active(x) {
            return Ok(());
        }
        let (g, y) = (self.g, self.id);
        let xs = self.em.shape(x);
        let rank = xs.rank();
        let c = match op {
            ReduceOp::Count => return Ok(()),
            ReduceOp::Sum => {
                let gb = self.spread(g, axis, rank)?;
                self.masked(mask, gb)?
            }
            ReduceOp::Mean => {
                let n = self.element_count(axis, x, mask)?;
                let share = self.em.div(g, n)?;
                let gb = self.spread(share, axis, rank)?;
                self.masked(mask, gb)?
            }
            ReduceOp::Max | ReduceOp::Min => {
                // The gradient is shared evenly among the elements equal to the result (PyTorch's
                // amax/amin); elements left out by the mask never take part.
                let yb = self.spread(y, axis, rank)?;
                let hit = self.em.compare(BinaryOp::Eq, x, yb)?;
                let hit = match mask {
                    Some(m) => self.em.compare(BinaryOp::And, hit, m)?,
                    None => hit,
                };
                let ties = self.em.reduce(ReduceOp::Count, axis, hit, None)?;
                let share = self.em.div(g, ties)?;
                let sb = self.spread(share, axis, rank)?;
                let zero = self.em.lit(0.0);
                self.em.select(hit, sb, zero)?
            }
            ReduceOp::Prod => self.prod_gradient(axis, x, mask)?,
        };
        debug_assert!(self.em.shape(c).broadcasts_to(&xs));
        self.send_exact(x, c)
    }

    /// The gradient of `prod(x)` along `axis` (under `mask`) as PyTorch's `prod_backward`: where
    /// no included element is 0, `g * y / x`; where exactly one is, that element gets `g` times the
    /// product of the others and every other element 0; where two or more are, 0 everywhere.
    /// Elements the mask leaves out get 0.
    fn prod_gradient(&mut self, axis: ReduceAxis, x: NodeId, mask: Option<NodeId>) -> Result<NodeId, IrError> {
        let (g, y) = (self.g, self.id);
        let rank = self.em.shape(x).rank();
        let (zero, one) = (self.em.lit(0.0), self.em.lit(1.0));
        let is_zero = self.em.compare(BinaryOp::Eq, x, zero)?;
        let counted = match mask {
            Some(m) => self.em.compare(BinaryOp::And, is_zero, m)?,
            None => is_zero,
        };
        let zeros = self.em.reduce(ReduceOp::Count, axis, counted, None)?;
        let zeros = self.spread(zeros, axis, rank)?;
        let (none, int_one) = (self.em.b.lit_int(0), self.em.b.lit_int(1));
        let no_zero = self.em.compare(BinaryOp::Eq, zeros, none)?;
        let one_zero = self.em.compare(BinaryOp::Eq, zeros, int_one)?;
        // No zero: g * y / x.
        let yb = self.spread(y, axis, rank)?;
        let gb = self.spread(g, axis, rank)?;
        let gy = self.em.mul(gb, yb)?;
        let plain = self.em.div(gy, x)?;
        // One zero: that element gets g times the product of the others (the non-zero ones).
        let ones_for_zeros = self.em.select(is_zero, one, x)?;
        let others = self.em.reduce(ReduceOp::Prod, axis, ones_for_zeros, mask)?;
        let others = self.spread(others, axis, rank)?;
        let at_zero = self.em.mul(gb, others)?;
        let the_zero = self.em.compare(BinaryOp::And, counted, one_zero)?;
        let single = self.em.select(the_zero, at_zero, zero)?;
        let c = self.em.select(no_zero, plain, single)?;
        self.masked(mask, c)
    }

    /// A value whose shape broadcasts to a reduction's result, made to broadcast against the
    /// reduced operand (of rank `rank`): the reduced axes that the result dropped and that come
    /// after `v`'s first axis are put back with size 1.
    fn spread(&mut self, v: NodeId, axis: ReduceAxis, rank: usize) -> Result<NodeId, IrError> {
        let vr = self.em.shape(v).rank();
        match axis {
            ReduceAxis::Last if vr > 0 => Ok(self.em.expand_last(v)),
            ReduceAxis::Axes { keepdim: false, .. } if vr > 0 => {
                // `v`'s axes are the last `vr` kept axes of the operand; the first of them is where
                // the spread value begins.
                let kept: Vec<usize> = (0..rank).filter(|&a| !axis.reduces(a, rank)).collect();
                let start = kept.len().checked_sub(vr).map(|k| kept[k]).ok_or_else(|| {
                    IrError::Malformed(format!("a gradient of rank {vr} for a reduction to rank {}", kept.len()))
                })?;
                let bits = (start..rank).filter(|&a| axis.reduces(a, rank)).fold(0u32, |m, a| m | 1 << (a - start));
                self.em.unsqueeze(v, bits)
            }
            _ => Ok(v),
        }
    }

    /// `c` where `mask` holds and exactly 0 elsewhere.
    fn masked(&mut self, mask: Option<NodeId>, c: NodeId) -> Result<NodeId, IrError> {
        match mask {
            Some(m) => {
                let zero = self.em.lit(0.0);
                self.em.select(m, c, zero)
            }
            None => Ok(c),
        }
    }

    /// How many elements of `x` a reduction along `axis` (under `mask`) takes in.
    fn element_count(&mut self, axis: ReduceAxis, x: NodeId, mask: Option<NodeId>) -> Result<NodeId, IrError> {
        let xs = self.em.shape(x);
        if mask.is_none() {
            let dims = axis.axes(xs.rank()).into_iter().map(|a| xs.dims()[a]);
            let consts: Option<Vec<u64>> = dims.map(|d| if let Dim::Const(c) = d { Some(c) } else { None }).collect();
            if let Some(c) = consts {
                // Exact in f64 for any tensor that fits in memory.
                return Ok(self.em.lit(c.iter().map(|&v| v as f64).product()));
            }
        }
        let (counted, mask) = match mask {
            Some(m) if self.em.shape(m) == xs => (m, None),
            m => (self.em.true_of(&xs)?, m),
        };
        self.em.reduce(ReduceOp::Count, axis, counted, mask)
    }
}
