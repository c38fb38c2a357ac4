//! Simplifying node constructors for the backward pass.
//!
//! Autodiff builds many products with an upstream gradient that is often the literal 1, sums with
//! a missing (zero) gradient, and selects against 0. These helpers fold such trivial cases at
//! construction (`x * 1`, `x + 0`, `0 * x`, `--x`, constant arithmetic), so the backward graph
//! stays small and fuses well. Everything else goes through [`GraphBuilder`], so every node is
//! typed, broadcast-checked and hash-consed.
//!
//! Gradients that are zero outside a mask, `where(m, g, 0)`, keep that form through products,
//! quotients, negation, sums and selects: `where(m, g, 0) * x` is built as `where(m, g * x, 0)`.
//! Masked-out elements then stay exactly 0 even where `x` holds NaN or infinity (padding
//! garbage), and the kernel needs the rest of the expression only under the mask.
//!
//! A gradient can sit inside many such layers, one per `where` it came through (a chain of
//! `let a_i = where(x > i, a_{i-1} * c, 0)` puts one layer per `let` around its gradient). The
//! constructors peel the layers with a loop, apply the operation inside them, and wrap the result
//! again with a loop ([`Emitter::wrap`]): more than two layers become two, the inner ones combined
//! with `and` (`where(m1, where(m2, g, 0), 0)` is `where(m1 and m2, g, 0)`, still exactly 0 where
//! any mask is false). So each constructor does a bounded amount of work and no recursion deeper
//! than two calls, whatever the depth of the program.
//!
//! Folding `0 * x` to `0` treats a zero gradient as a structural zero (it does not turn into NaN
//! when `x` is infinite), which is the intended meaning of "no gradient flows here".
//!
//! Results are *lazily broadcast*: a helper may return a node whose shape merely broadcasts to the
//! shape the caller has in mind (a scalar 0, for example). [`Emitter::broadcast_to`] materialises a
//! value at an exact shape when that matters.

use kfuse_ir::{
    BinaryOp, DType, GraphBuilder, IrError, Literal, NodeId, Op, ReduceAxis, ReduceOp, Shape, TernaryOp, UnaryOp,
};

/// A [`GraphBuilder`] with folding constructors.
pub(crate) struct Emitter<'a> {
    pub b: &'a mut GraphBuilder,
}

impl Emitter<'_> {
    /// The value of a float constant node, if `n` is one.
    pub fn float_const(&self, n: NodeId) -> Option<f64> {
        let node = self.b.node(n);
        match node.op {
            Op::Const(Literal::Float(bits)) if node.dtype.is_float() => Some(f64::from_bits(bits)),
            _ => None,
        }
    }

    /// Whether `n` is the float constant 0 (either sign).
    pub fn is_zero(&self, n: NodeId) -> bool {
        self.float_const(n) == Some(0.0)
    }

    fn is_one(&self, n: NodeId) -> bool {
        self.float_const(n) == Some(1.0)
    }

    /// A weak float literal (it adopts the dtype of what it meets).
    pub fn lit(&mut self, v: f64) -> NodeId {
        self.b.lit_float(v)
    }

    /// Folds `f(a, b)` when both are float constants.
    fn fold(&mut self, a: NodeId, b: NodeId, f: impl Fn(f64, f64) -> f64) -> Option<NodeId> {
        let (x, y) = (self.float_const(a)?, self.float_const(b)?);
        let dtype = DType::promote(self.b.node(a).dtype, self.b.node(b).dtype).unwrap_or(DType::F32);
        Some(self.b.constant(Literal::float(f(x, y)), dtype))
    }

    /// `(m, g)` when `n` is `where(m, g, 0)`.
    fn zero_outside(&self, n: NodeId) -> Option<(NodeId, NodeId)> {
        match self.b.node(n).op {
            Op::Ternary(TernaryOp::Select, m, g, z) if self.is_zero(z) => Some((m, g)),
            _ => None,
        }
    }

    /// The masks of the `where(m, _, 0)` layers around `n`, outermost first, and the value inside.
    fn peel(&self, mut n: NodeId) -> (Vec<NodeId>, NodeId) {
        let mut masks = Vec::new();
        while let Some((m, g)) = self.zero_outside(n) {
            masks.push(m);
            n = g;
        }
        (masks, n)
    }

    /// `inner` inside `where(m, _, 0)` layers of `masks` (outermost first), and of the layers that
    /// `inner` already has. Up to two layers are built as they are; beyond two, the outermost mask
    /// stays and the others are combined into one with `and`, so a gradient that goes through a
    /// chain of `where`s keeps two layers (and a growing mask) instead of one layer per `where`.
    fn wrap(&mut self, masks: &[NodeId], inner: NodeId) -> Result<NodeId, IrError> {
        if masks.is_empty() {
            return Ok(inner);
        }
        let (more, core) = self.peel(inner);
        if masks.len() + more.len() <= 2 {
            return masks.iter().rev().try_fold(inner, |v, &m| self.keep_where(m, v));
        }
        let mut all = masks.iter().chain(&more).copied();
        let (Some(outer), Some(first)) = (all.next(), all.next()) else {
            return Err(IrError::Malformed("wrap: fewer than three masks to combine".into()));
        };
        let combined = all.try_fold(first, |acc, m| self.b.binary(BinaryOp::And, acc, m))?;
        let v = self.keep_where(combined, core)?;
        self.keep_where(outer, v)
    }

    /// Descends `a` and `b` together through the `where(m, _, 0)` layers they share (the same
    /// mask node, outermost first): the shared masks and the two values inside them.
    fn shared_masks(&self, mut a: NodeId, mut b: NodeId) -> (Vec<NodeId>, NodeId, NodeId) {
        let mut masks = Vec::new();
        while let (Some((m, x)), Some((m2, y))) = (self.zero_outside(a), self.zero_outside(b)) {
            if m != m2 {
                break;
            }
            masks.push(m);
            (a, b) = (x, y);
        }
        (masks, a, b)
    }

    /// `where(m, inner, 0)`, built as it is (re-hoisting here could swap two masks forever).
    fn keep_where(&mut self, m: NodeId, inner: NodeId) -> Result<NodeId, IrError> {
        if self.is_zero(inner) {
            return Ok(inner);
        }
        let zero = self.lit(0.0);
        self.b.select(m, inner, zero)
    }

    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        if self.is_zero(a) {
            return Ok(b);
        }
        if self.is_zero(b) {
            return Ok(a);
        }
        let (masks, x, y) = self.shared_masks(a, b);
        if !masks.is_empty() {
            let s = self.add(x, y)?;
            return self.wrap(&masks, s);
        }
        if let Some(c) = self.fold(a, b, |x, y| x + y) {
            return Ok(c);
        }
        self.b.binary(BinaryOp::Add, a, b)
    }

    pub fn sub(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        if self.is_zero(b) {
            return Ok(a);
        }
        if self.is_zero(a) {
            return self.neg(b);
        }
        let (masks, x, y) = self.shared_masks(a, b);
        if !masks.is_empty() {
            let s = self.sub(x, y)?;
            return self.wrap(&masks, s);
        }
        if let Some(c) = self.fold(a, b, |x, y| x - y) {
            return Ok(c);
        }
        self.b.binary(BinaryOp::Sub, a, b)
    }

    pub fn neg(&mut self, a: NodeId) -> Result<NodeId, IrError> {
        if let Some(v) = self.float_const(a) {
            let dtype = self.b.node(a).dtype;
            return Ok(self.b.constant(Literal::float(-v), dtype));
        }
        if let Op::Unary(UnaryOp::Neg, x) = self.b.node(a).op {
            return Ok(x);
        }
        let (masks, x) = self.peel(a);
        if !masks.is_empty() {
            let n = self.neg(x)?;
            return self.wrap(&masks, n);
        }
        self.b.unary(UnaryOp::Neg, a)
    }

    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        if self.is_zero(a) {
            return Ok(a);
        }
        if self.is_zero(b) {
            return Ok(b);
        }
        if self.is_one(a) {
            return Ok(b);
        }
        if self.is_one(b) {
            return Ok(a);
        }
        if let Some(c) = self.fold(a, b, |x, y| x * y) {
            return Ok(c);
        }
        let (masks, x) = self.peel(a);
        if !masks.is_empty() {
            let p = self.mul(x, b)?;
            return self.wrap(&masks, p);
        }
        let (masks, y) = self.peel(b);
        if !masks.is_empty() {
            let p = self.mul(a, y)?;
            return self.wrap(&masks, p);
        }
        if self.float_const(a) == Some(-1.0) {
            return self.neg(b);
        }
        if self.float_const(b) == Some(-1.0) {
            return self.neg(a);
        }
        self.b.binary(BinaryOp::Mul, a, b)
    }

    pub fn div(&mut self, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        if self.is_one(b) {
            return Ok(a);
        }
        if self.is_zero(a) {
            return Ok(a);
        }
        if let Some(c) = self.fold(a, b, |x, y| x / y) {
            return Ok(c);
        }
        let (masks, x) = self.peel(a);
        if !masks.is_empty() {
            let q = self.div(x, b)?;
            return self.wrap(&masks, q);
        }
        self.b.binary(BinaryOp::Div, a, b)
    }

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, IrError> {
        self.b.unary(op, x)
    }

    /// A comparison or logical op (no folding).
    pub fn compare(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        self.b.binary(op, a, b)
    }

    /// `where(cond, a, b)`; `where(c, x, x)` is `x` (lazily broadcast); two branches that are
    /// zero outside one mask make a select that is zero outside it (layer by layer, in a loop).
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        let (mut masks, mut a, mut b) = (Vec::new(), a, b);
        let inner = loop {
            if a == b {
                break a;
            }
            if let (Some(x), Some(y)) = (self.float_const(a), self.float_const(b)) {
                if x.to_bits() == y.to_bits() {
                    break a;
                }
            }
            let (ma, mb) = (self.zero_outside(a), self.zero_outside(b));
            let shared = match (ma, mb) {
                (Some((m, x)), Some((m2, y))) if m == m2 => Some((m, x, y)),
                (Some((m, x)), None) if self.is_zero(b) => Some((m, x, b)),
                (None, Some((m, y))) if self.is_zero(a) => Some((m, a, y)),
                _ => None,
            };
            match shared {
                Some((m, x, y)) if m != cond => {
                    masks.push(m);
                    (a, b) = (x, y);
                }
                _ => break self.b.select(cond, a, b)?,
            }
        };
        self.wrap(&masks, inner)
    }

    /// A bool tensor of `shape` that is true everywhere (`iota >= 0`); it carries a shape so that
    /// a scalar can be broadcast to it.
    pub fn true_of(&mut self, shape: &Shape) -> Result<NodeId, IrError> {
        if shape.is_scalar() {
            return Ok(self.b.lit_bool(true));
        }
        self.b.all_true(shape.clone(), 0)
    }

    /// `x` (whose shape broadcasts to `shape`) materialised at exactly `shape`.
    pub fn broadcast_to(&mut self, x: NodeId, shape: &Shape) -> Result<NodeId, IrError> {
        if &self.b.node(x).shape == shape {
            return Ok(x);
        }
        let all = self.true_of(shape)?;
        // Deliberately not `self.select`: `where(true, x, x)` exists to carry the shape.
        self.b.select(all, x, x)
    }

    pub fn reduce(
        &mut self,
        op: ReduceOp,
        axis: ReduceAxis,
        x: NodeId,
        mask: Option<NodeId>,
    ) -> Result<NodeId, IrError> {
        self.b.reduce(op, axis, x, mask)
    }

    pub fn component(&mut self, x: NodeId, index: u32) -> Result<NodeId, IrError> {
        self.b.component(x, i64::from(index))
    }

    pub fn expand_last(&mut self, x: NodeId) -> NodeId {
        self.b.expand_last(x)
    }

    pub fn unsqueeze(&mut self, x: NodeId, axes: u32) -> Result<NodeId, IrError> {
        self.b.unsqueeze(x, axes)
    }

    pub fn stack(&mut self, parts: &[NodeId]) -> Result<NodeId, IrError> {
        self.b.stack(parts)
    }

    pub fn shape(&self, x: NodeId) -> Shape {
        self.b.node(x).shape.clone()
    }
}
