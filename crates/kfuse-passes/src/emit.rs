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
        if let (Some((m, x)), Some((m2, y))) = (self.zero_outside(a), self.zero_outside(b)) {
            if m == m2 {
                let s = self.add(x, y)?;
                return self.keep_where(m, s);
            }
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
        if let (Some((m, x)), Some((m2, y))) = (self.zero_outside(a), self.zero_outside(b)) {
            if m == m2 {
                let s = self.sub(x, y)?;
                return self.keep_where(m, s);
            }
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
        if let Some((m, x)) = self.zero_outside(a) {
            let n = self.neg(x)?;
            return self.keep_where(m, n);
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
        if let Some((m, x)) = self.zero_outside(a) {
            let p = self.mul(x, b)?;
            return self.keep_where(m, p);
        }
        if let Some((m, y)) = self.zero_outside(b) {
            let p = self.mul(a, y)?;
            return self.keep_where(m, p);
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
        if let Some((m, x)) = self.zero_outside(a) {
            let q = self.div(x, b)?;
            return self.keep_where(m, q);
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
    /// zero outside one mask make a select that is zero outside it.
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        if a == b {
            return Ok(a);
        }
        if let (Some(x), Some(y)) = (self.float_const(a), self.float_const(b)) {
            if x.to_bits() == y.to_bits() {
                return Ok(a);
            }
        }
        let (ma, mb) = (self.zero_outside(a), self.zero_outside(b));
        let shared = match (ma, mb) {
            (Some((m, x)), Some((m2, y))) if m == m2 => Some((m, x, y)),
            (Some((m, x)), None) if self.is_zero(b) => Some((m, x, b)),
            (None, Some((m, y))) if self.is_zero(a) => Some((m, a, y)),
            _ => None,
        };
        if let Some((m, x, y)) = shared {
            if m != cond {
                let inner = self.select(cond, x, y)?;
                return self.keep_where(m, inner);
            }
        }
        self.b.select(cond, a, b)
    }

    /// A bool tensor of `shape` that is true everywhere (`iota >= 0`); it carries a shape so that
    /// a scalar can be broadcast to it.
    pub fn true_of(&mut self, shape: &Shape) -> Result<NodeId, IrError> {
        if shape.is_scalar() {
            return Ok(self.b.lit_bool(true));
        }
        let iota = self.b.iota(shape.clone(), 0)?;
        let zero = self.b.lit_int(0);
        self.b.binary(BinaryOp::Ge, iota, zero)
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

    pub fn stack(&mut self, parts: &[NodeId]) -> Result<NodeId, IrError> {
        self.b.stack(parts)
    }

    pub fn shape(&self, x: NodeId) -> Shape {
        self.b.node(x).shape.clone()
    }
}
