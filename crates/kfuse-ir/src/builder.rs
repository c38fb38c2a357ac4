//! The builder: the one place that holds kfuse's typing rules.
//!
//! Every constructor checks dtypes and shapes, inserts the casts that make a binary op's operands
//! share a [`Kind`], and hash-conses the node (building the same node twice returns the same id,
//! which is common-subexpression elimination for free). Literals are *weak*: `1 - x` takes `x`'s
//! dtype, as in NumPy and PyTorch.

use std::collections::{HashMap, HashSet};

use crate::{
    broadcast_shapes, verify, BinaryOp, Constraint, DType, Dim, Graph, Input, InputId, IrError, Kind, ListId, Literal,
    Node, NodeId, Op, Output, ReduceAxis, ReduceOp, Shape, SymId, TernaryOp, UnaryOp,
};

/// Builds a [`Graph`] node by node. See the module docs for the rules.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
    dedup: HashMap<Node, NodeId>,
    lists: HashMap<Vec<NodeId>, ListId>,
    weak: HashSet<NodeId>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Continues building on an existing graph (autodiff appends the backward nodes this way).
    pub fn from_graph(graph: Graph) -> Self {
        let dedup = graph.nodes.iter().enumerate().map(|(i, n)| (n.clone(), NodeId(i as u32))).collect();
        let lists = graph.lists.iter().enumerate().map(|(i, l)| (l.clone(), ListId(i as u32))).collect();
        GraphBuilder { graph, dedup, lists, weak: HashSet::new() }
    }

    /// The graph built so far (not verified).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn node(&self, id: NodeId) -> &Node {
        self.graph.node(id)
    }

    /// The symbol with this name, created on first use.
    pub fn symbol(&mut self, name: &str) -> SymId {
        if let Some(s) = self.graph.symbol(name) {
            return s;
        }
        self.graph.symbols.push(name.to_string());
        SymId(self.graph.symbols.len() as u32 - 1)
    }

    /// Declares an input and returns the node that reads it.
    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> Result<NodeId, IrError> {
        if self.graph.input_by_name(name).is_some() {
            return Err(IrError::DuplicateName(name.to_string()));
        }
        for d in &shape.0 {
            if let Dim::Sym(s) = d {
                if s.0 as usize >= self.graph.symbols.len() {
                    return Err(IrError::UnknownSymbol(format!("?{}", s.0)));
                }
            }
        }
        self.graph.inputs.push(Input { name: name.to_string(), dtype, shape: shape.clone() });
        let id = InputId(self.graph.inputs.len() as u32 - 1);
        Ok(self.push(Node { op: Op::Input(id), dtype, shape }))
    }

    /// A float literal that adopts the dtype of what it meets (`f32` on its own).
    pub fn lit_float(&mut self, v: f64) -> NodeId {
        let id = self.constant(Literal::float(v), DType::F32);
        self.weak.insert(id);
        id
    }

    /// An integer literal that adopts the dtype of what it meets (`i32` on its own).
    pub fn lit_int(&mut self, v: i64) -> NodeId {
        let id = self.constant(Literal::Int(v), DType::I32);
        self.weak.insert(id);
        id
    }

    pub fn lit_bool(&mut self, v: bool) -> NodeId {
        self.constant(Literal::Bool(v), DType::Bool)
    }

    /// A scalar constant of a fixed dtype.
    pub fn constant(&mut self, lit: Literal, dtype: DType) -> NodeId {
        let lit = match (lit, dtype.kind()) {
            (l, Kind::Float) => Literal::float(l.as_f64()),
            (Literal::Float(b), Kind::Int) => Literal::Int(f64::from_bits(b) as i64),
            (l, Kind::Bool) => Literal::Bool(l.as_f64() != 0.0),
            (l, _) => l,
        };
        self.push(Node { op: Op::Const(lit), dtype, shape: Shape::scalar() })
    }

    pub fn cast(&mut self, x: NodeId, dtype: DType) -> NodeId {
        let n = self.node(x);
        if n.dtype == dtype {
            return x;
        }
        if let Op::Const(l) = n.op {
            return self.constant(l, dtype);
        }
        let shape = n.shape.clone();
        self.push(Node { op: Op::Cast(x), dtype, shape })
    }

    /// Converts `x` so that it computes as `dtype` does: a cast only when the kind changes, or
    /// the integer width (`i32` and `i64` compute differently; float dtypes all compute alike).
    fn retype_for(&mut self, x: NodeId, dtype: DType) -> NodeId {
        let n = self.node(x);
        if self.weak.contains(&x) {
            return self.cast(x, dtype);
        }
        if n.dtype.kind() == dtype.kind() && (dtype.kind() != Kind::Int || n.dtype == dtype) {
            x
        } else {
            self.cast(x, dtype)
        }
    }

    /// The dtype that operands `a` and `b` meet at, honouring weak literals.
    fn meet(&self, op: &'static str, a: NodeId, b: NodeId) -> Result<DType, IrError> {
        self.meet_all(op, &[a, b])
    }

    /// The dtype that all `operands` meet at: strong operands promote among themselves; weak
    /// literals adopt the result, except that a float literal turns an int result into `f32`.
    /// Bools meet only bools.
    fn meet_all(&self, op: &'static str, operands: &[NodeId]) -> Result<DType, IrError> {
        let dtypes: Vec<DType> = operands.iter().map(|&o| self.node(o).dtype).collect();
        if dtypes.contains(&DType::Bool) {
            if let Some(&other) = dtypes.iter().find(|d| **d != DType::Bool) {
                return Err(IrError::KindMismatch { op, left: DType::Bool, right: other });
            }
            return Ok(DType::Bool);
        }
        let strong: Vec<DType> =
            operands.iter().zip(&dtypes).filter(|(o, _)| !self.weak.contains(o)).map(|(_, d)| *d).collect();
        let weak_float = operands.iter().zip(&dtypes).any(|(o, d)| self.weak.contains(o) && d.is_float());
        let base = match strong.split_first() {
            None => DType::I32,
            Some((&first, rest)) => rest
                .iter()
                .try_fold(first, |acc, &d| DType::promote(acc, d))
                .ok_or(IrError::BadDType { op, dtype: DType::Bool, hint: "" })?,
        };
        Ok(if base.kind() == Kind::Int && weak_float { DType::F32 } else { base })
    }

    pub fn unary(&mut self, op: UnaryOp, x: NodeId) -> Result<NodeId, IrError> {
        let d = self.node(x).dtype;
        let x = match (op, d.kind()) {
            (UnaryOp::Detach, Kind::Float) => x,
            (UnaryOp::Detach, _) => return Ok(x),
            (UnaryOp::Rounded, _) if !matches!(d, DType::F16 | DType::BF16) => return Ok(x),
            // Values of the dtype already: an input, a rounded value, a literal (rounded here).
            (UnaryOp::Rounded, _) => match self.node(x).op {
                Op::Input(_) | Op::Unary(UnaryOp::Rounded, _) => return Ok(x),
                Op::Const(literal @ (Literal::Float(_) | Literal::Int(_))) => {
                    return Ok(self.constant(Literal::float(d.round(literal.as_f64())), d));
                }
                _ => x,
            },
            (UnaryOp::Not, Kind::Bool) => x,
            (UnaryOp::Not, _) => return Err(IrError::BadDType { op: "not", dtype: d, hint: " (it takes bool)" }),
            // `torch.bitwise_not` of a bool is the logical not.
            (UnaryOp::BitNot, Kind::Bool) => return self.unary(UnaryOp::Not, x),
            (UnaryOp::BitNot, Kind::Float) => {
                return Err(IrError::BadDType { op: op.name(), dtype: d, hint: " (it takes i32, i64 or bool)" })
            }
            (_, Kind::Bool) => {
                return Err(IrError::BadDType {
                    // Negation is written `-x`; its IR name `neg` is nowhere in the language.
                    op: if op == UnaryOp::Neg { "-" } else { op.name() },
                    dtype: d,
                    hint: " (use where(c, 1.0, 0.0) to turn a bool into a number)",
                });
            }
            // An int is already whole, as `torch.round`/`trunc`/`ceil`/`floor` of an int tensor say.
            (UnaryOp::Round | UnaryOp::Trunc | UnaryOp::Ceil | UnaryOp::Floor, Kind::Int) => return Ok(x),
            (op, Kind::Int) if op.is_float_math() => self.cast(x, DType::F32),
            _ => x,
        };
        let n = self.node(x);
        let dtype = if op.is_predicate() { DType::Bool } else { n.dtype };
        let shape = n.shape.clone();
        Ok(self.push(Node { op: Op::Unary(op, x), dtype, shape }))
    }

    pub fn binary(&mut self, op: BinaryOp, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        let mut meet = self.meet(op.name(), a, b)?;
        if op.is_bitwise() {
            // Bitwise and/or/xor of bools are the logical ops, as in PyTorch.
            match (op, meet) {
                (BinaryOp::BitAnd, DType::Bool) => return self.binary(BinaryOp::And, a, b),
                (BinaryOp::BitOr, DType::Bool) => return self.binary(BinaryOp::Or, a, b),
                (BinaryOp::BitXor, DType::Bool) => return self.binary(BinaryOp::Ne, a, b),
                (_, DType::I32 | DType::I64) => {}
                (BinaryOp::Shl | BinaryOp::Shr, d) => {
                    return Err(IrError::BadDType { op: op.name(), dtype: d, hint: " (it takes i32 or i64)" })
                }
                (_, d) => {
                    return Err(IrError::BadDType { op: op.name(), dtype: d, hint: " (it takes i32, i64 or bool)" })
                }
            }
        }
        if op.is_logical() {
            if meet != DType::Bool {
                return Err(IrError::BadDType { op: op.name(), dtype: meet, hint: " (it takes bool)" });
            }
        } else if meet == DType::Bool && !matches!(op, BinaryOp::Eq | BinaryOp::Ne) {
            return Err(IrError::BadDType {
                op: op.name(),
                dtype: DType::Bool,
                hint: " (use where(c, 1.0, 0.0) to turn a bool into a number)",
            });
        }
        if op.is_float_only() && meet.kind() == Kind::Int {
            meet = DType::F32; // true division, as in PyTorch
        }
        let (a, b) = (self.retype_for(a, meet), self.retype_for(b, meet));
        let shape = self.broadcast(a, b)?;
        let dtype = if op.is_comparison() { DType::Bool } else { meet };
        Ok(self.push(Node { op: Op::Binary(op, a, b), dtype, shape }))
    }

    pub fn ternary(&mut self, op: TernaryOp, a: NodeId, b: NodeId, c: NodeId) -> Result<NodeId, IrError> {
        match op {
            TernaryOp::Select => self.select(a, b, c),
            TernaryOp::Clamp => self.clamp(a, b, c),
            TernaryOp::Fma => self.fma(a, b, c),
        }
    }

    /// `fma(a, b, c)` = `a * b + c` (one rounding for floats, wrapping for `i32`).
    pub fn fma(&mut self, a: NodeId, b: NodeId, c: NodeId) -> Result<NodeId, IrError> {
        let dtype = self.meet_all("fma", &[a, b, c])?;
        if dtype == DType::Bool {
            return Err(IrError::BadDType {
                op: "fma",
                dtype,
                hint: " (use where(c, 1.0, 0.0) to turn a bool into a number)",
            });
        }
        let (a, b, c) = (self.retype_for(a, dtype), self.retype_for(b, dtype), self.retype_for(c, dtype));
        let s = self.broadcast(a, b)?;
        let shape = self.broadcast_shape(&s, c)?;
        Ok(self.push(Node { op: Op::Ternary(TernaryOp::Fma, a, b, c), dtype, shape }))
    }

    /// `where(cond, a, b)`.
    pub fn select(&mut self, cond: NodeId, a: NodeId, b: NodeId) -> Result<NodeId, IrError> {
        let dc = self.node(cond).dtype;
        if dc != DType::Bool {
            return Err(IrError::BadDType { op: "where", dtype: dc, hint: " as its condition (it needs bool)" });
        }
        let meet = self.meet("where", a, b)?;
        let (a, b) = (self.retype_for(a, meet), self.retype_for(b, meet));
        let s = self.broadcast(cond, a)?;
        let shape = self.broadcast_shape(&s, b)?;
        Ok(self.push(Node { op: Op::Ternary(TernaryOp::Select, cond, a, b), dtype: meet, shape }))
    }

    /// `clamp(x, lo, hi)`.
    pub fn clamp(&mut self, x: NodeId, lo: NodeId, hi: NodeId) -> Result<NodeId, IrError> {
        let dtype = self.meet_all("clamp", &[x, lo, hi])?;
        if dtype == DType::Bool {
            return Err(IrError::BadDType { op: "clamp", dtype, hint: "" });
        }
        let (x, lo, hi) = (self.retype_for(x, dtype), self.retype_for(lo, dtype), self.retype_for(hi, dtype));
        let s = self.broadcast(x, lo)?;
        let shape = self.broadcast_shape(&s, hi)?;
        Ok(self.push(Node { op: Op::Ternary(TernaryOp::Clamp, x, lo, hi), dtype, shape }))
    }

    /// `x[.., index]`; a negative index counts from the end.
    pub fn component(&mut self, x: NodeId, index: i64) -> Result<NodeId, IrError> {
        let n = self.node(x);
        let size = match n.shape.last() {
            Some(Dim::Const(c)) => c,
            Some(Dim::Sym(_)) => {
                return Err(IrError::ComponentNeedsConstAxis { shape: self.graph.shape_str(&n.shape) })
            }
            None => return Err(IrError::RankTooLow { op: "component access", min: 1, shape: "[]".into() }),
        };
        let i = if index < 0 { index + size as i64 } else { index };
        if i < 0 || i as u64 >= size || i > u32::MAX as i64 {
            return Err(IrError::ComponentOutOfRange { index, size });
        }
        let (dtype, shape) = (n.dtype, n.shape.without_last());
        Ok(self.push(Node { op: Op::Component { x, index: i as u32 }, dtype, shape }))
    }

    /// `x[.., index, ..]` on `axis` (negative axes and, on an axis of constant size, negative
    /// indices count from the end): drops the axis. On an axis of symbolic size the index must
    /// be a constant `>= 0`; binding then checks that the size exceeds it.
    pub fn select_index(&mut self, x: NodeId, axis: i64, index: i64) -> Result<NodeId, IrError> {
        let n = self.node(x);
        let (dtype, xs) = (n.dtype, n.shape.clone());
        let a = self.view_axis("select", axis, &xs)?;
        let bad = |b: &Self, why: String| IrError::BadView { op: "select", axis, shape: b.graph.shape_str(&xs), why };
        let i = match xs.dims()[a] {
            Dim::Const(_) if a + 1 == xs.rank() => return self.component(x, index),
            Dim::Const(size) => {
                let i = if index < 0 { index.saturating_add(size as i64) } else { index };
                if i < 0 || i as u64 >= size {
                    let range =
                        if size == 0 { "the axis is empty".into() } else { format!("from -{size} to {}", size - 1) };
                    return Err(bad(self, format!("index {index} is out of range ({range})")));
                }
                i
            }
            Dim::Sym(_) if index < 0 => {
                let why = format!("index {index} counts from the end of an axis of symbolic size (use an index >= 0)");
                return Err(bad(self, why));
            }
            Dim::Sym(_) => index,
        };
        let index = u32::try_from(i)
            .map_err(|_| bad(self, format!("index {index} is past the largest index, {}", u32::MAX)))?;
        let mut dims = xs.dims().to_vec();
        dims.remove(a);
        Ok(self.push(Node { op: Op::Select { x, axis: a as u32, index }, dtype, shape: Shape(dims) }))
    }

    /// `x[.., start:end:step, ..]` on `axis`, as NumPy and PyTorch: a missing `start` is 0, a
    /// missing `end` the axis's size, a missing `step` 1; on an axis of constant size negative
    /// bounds count from the end and bounds past it are clamped. On an axis of symbolic size the
    /// bounds must be constants `>= 0` and `end` must be given (the result has a constant size);
    /// binding checks that the size reaches the last element read. `step` must be positive.
    pub fn slice(
        &mut self,
        x: NodeId,
        axis: i64,
        start: Option<i64>,
        end: Option<i64>,
        step: Option<i64>,
    ) -> Result<NodeId, IrError> {
        let n = self.node(x);
        let (dtype, xs) = (n.dtype, n.shape.clone());
        let a = self.view_axis("slice", axis, &xs)?;
        let bad = |b: &Self, why: String| IrError::BadView { op: "slice", axis, shape: b.graph.shape_str(&xs), why };
        let step = step.unwrap_or(1);
        if step <= 0 {
            return Err(bad(self, format!("step {step} is not positive (a slice step must be at least 1)")));
        }
        // `:` keeps the whole axis, of any size.
        if start.unwrap_or(0) == 0 && end.is_none() && step == 1 {
            return Ok(x);
        }
        let (lo, hi) = match xs.dims()[a] {
            Dim::Const(size) => {
                let size = i64::try_from(size).unwrap_or(i64::MAX);
                let norm = |v: i64| if v < 0 { v.saturating_add(size).max(0) } else { v.min(size) };
                (norm(start.unwrap_or(0)), norm(end.unwrap_or(size)))
            }
            Dim::Sym(s) => {
                let sym = self.graph.symbols.get(s.0 as usize).cloned().unwrap_or_default();
                let Some(end) = end else {
                    let why = format!("a slice of an axis of symbolic size {sym} needs a constant end (as in 0:8)");
                    return Err(bad(self, why));
                };
                let start = start.unwrap_or(0);
                if start < 0 || end < 0 {
                    let why = format!(
                        "bounds {start}:{end} count from the end of an axis of symbolic size {sym} (use bounds >= 0)"
                    );
                    return Err(bad(self, why));
                }
                (start, end)
            }
        };
        let len = if hi > lo { (hi - lo + step - 1) / step } else { 0 };
        let lo = if len == 0 { 0 } else { lo };
        let (start, step) = match (u32::try_from(lo), u32::try_from(step)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return Err(bad(self, format!("bounds past the largest index, {}", u32::MAX))),
        };
        let len = Dim::Const(len as u64);
        if start == 0 && step == 1 && xs.dims()[a] == len {
            return Ok(x);
        }
        let mut dims = xs.dims().to_vec();
        dims[a] = len;
        Ok(self.push(Node { op: Op::Slice { x, axis: a as u32, start, step }, dtype, shape: Shape(dims) }))
    }

    /// `transpose(x, a, b)`: axes `a` and `b` swapped (negative axes count from the end).
    pub fn transpose(&mut self, x: NodeId, a: i64, b: i64) -> Result<NodeId, IrError> {
        let xs = self.node(x).shape.clone();
        let (a, b) = (self.view_axis("transpose", a, &xs)?, self.view_axis("transpose", b, &xs)?);
        let (a, b) = (a.min(b) as u32, a.max(b) as u32);
        if a == b {
            return Ok(x);
        }
        // Swapping the same two axes again gives back the operand.
        if let Op::Transpose { x: inner, a: ia, b: ib } = self.node(x).op {
            if (ia, ib) == (a, b) {
                return Ok(inner);
            }
        }
        let mut dims = xs.dims().to_vec();
        dims.swap(a as usize, b as usize);
        let dtype = self.node(x).dtype;
        Ok(self.push(Node { op: Op::Transpose { x, a, b }, dtype, shape: Shape(dims) }))
    }

    /// `permute(x, perm)`: axis `k` of the result is axis `perm[k]` of `x` (`torch.permute`;
    /// negative axes count from the end), made of [`Op::Transpose`]s.
    pub fn permute(&mut self, x: NodeId, perm: &[i64]) -> Result<NodeId, IrError> {
        let xs = self.node(x).shape.clone();
        let rank = xs.rank();
        if perm.len() != rank {
            return Err(IrError::BadAxis {
                op: "permute",
                axis: perm.len() as i64,
                rank,
                why: format!("axes are named, but a permutation names each of the {rank} axes once"),
            });
        }
        let mut want = Vec::with_capacity(rank);
        for &p in perm {
            let a = self.view_axis("permute", p, &xs)?;
            if want.contains(&a) {
                return Err(IrError::BadAxis {
                    op: "permute",
                    axis: p,
                    rank,
                    why: format!("is named twice (as axis {a}); a permutation names each axis once"),
                });
            }
            want.push(a);
        }
        // `cur[k]`: the axis of `x` now at position `k`.
        let mut cur: Vec<usize> = (0..rank).collect();
        let mut y = x;
        for (k, &w) in want.iter().enumerate() {
            let j = cur.iter().position(|&c| c == w).unwrap_or(k);
            if j != k {
                y = self.transpose(y, k as i64, j as i64)?;
                cur.swap(k, j);
            }
        }
        Ok(y)
    }

    /// `reshape(x, dims)` (`torch.reshape`): `x`'s elements in row-major order in the shape
    /// `dims`, where one `None` is the constant size that makes the element counts agree (torch's
    /// `-1`). Constant axes split and merge freely; a symbolic axis stays whole, in the same order
    /// among the symbolic axes (see [`crate::reshape_groups`]). A reshape of a reshape is one.
    pub fn reshape(&mut self, x: NodeId, dims: &[Option<Dim>]) -> Result<NodeId, IrError> {
        let (mut x, xs) = (x, self.node(x).shape.clone());
        let shown = |b: &Self, d: &[Option<Dim>]| {
            let parts: Vec<String> = d.iter().map(|d| d.map_or("-1".to_string(), |d| b.graph.dim_str(d))).collect();
            format!("[{}]", parts.join(", "))
        };
        let bad = |b: &Self, why: String| IrError::BadReshape { from: b.graph.shape_str(&xs), to: shown(b, dims), why };
        let symbols = |d: &mut dyn Iterator<Item = Dim>| -> (Vec<Dim>, Option<u64>) {
            let (mut syms, mut prod) = (Vec::new(), Some(1u64));
            for d in d {
                match d {
                    Dim::Sym(_) => syms.push(d),
                    Dim::Const(c) => prod = prod.and_then(|p| p.checked_mul(c)),
                }
            }
            (syms, prod)
        };
        let (xsyms, xprod) = symbols(&mut xs.dims().iter().copied());
        let (tsyms, tprod) = symbols(&mut dims.iter().flatten().copied());
        if xsyms != tsyms {
            return Err(bad(
                self,
                "its symbolic axes must stay whole and in order: only axes of constant size split or merge".into(),
            ));
        }
        let (Some(xprod), Some(tprod)) = (xprod, tprod) else {
            return Err(bad(self, "the element count overflows".into()));
        };
        let inferred = match dims.iter().filter(|d| d.is_none()).count() {
            0 => None,
            1 if tprod > 0 && xprod % tprod == 0 => Some(xprod / tprod),
            1 => {
                return Err(bad(
                    self,
                    format!("no size for -1 makes {tprod} x -1 elements of the constant axes equal {xprod}"),
                ))
            }
            _ => return Err(bad(self, "at most one size may be -1".into())),
        };
        let to: Vec<Dim> = dims.iter().map(|d| d.unwrap_or(Dim::Const(inferred.unwrap_or(1)))).collect();
        if crate::reshape_groups(xs.dims(), &to).is_none() {
            let held = inferred.map_or(tprod, |i| tprod * i);
            let why = match held == xprod {
                true => {
                    "a symbolic axis would split or merge: only runs of constant axes between the symbolic ones regroup"
                        .to_string()
                }
                false => format!("the constant axes hold {xprod} elements here and {held} there"),
            };
            return Err(bad(self, why));
        }
        if xs.dims() == &to[..] {
            return Ok(x);
        }
        // A reshape of a reshape reads the first one's operand (the regrouping of the two).
        if let Op::Reshape(inner) = self.node(x).op {
            if crate::reshape_groups(self.node(inner).shape.dims(), &to).is_some() {
                x = inner;
                if self.node(inner).shape.dims() == &to[..] {
                    return Ok(inner);
                }
            }
        }
        let dtype = self.node(x).dtype;
        Ok(self.push(Node { op: Op::Reshape(x), dtype, shape: Shape(to) }))
    }

    /// Axis `axis` of a tensor of shape `xs` (negative counts from the end), or the error of `op`.
    fn view_axis(&self, op: &'static str, axis: i64, xs: &Shape) -> Result<usize, IrError> {
        let rank = xs.rank();
        let r = i64::try_from(rank).unwrap_or(i64::MAX);
        let a = if axis < 0 { axis.saturating_add(r) } else { axis };
        if !(0..r).contains(&a) {
            let why = match rank {
                0 => "is out of range (a scalar has no axis)".to_string(),
                _ => format!("is out of range (the axes are 0 to {} or -{r} to -1)", r - 1),
            };
            return Err(IrError::BadAxis { op, axis, rank, why });
        }
        Ok(a as usize)
    }

    /// Stacks parts of one shape along a new last axis.
    pub fn stack(&mut self, parts: &[NodeId]) -> Result<NodeId, IrError> {
        let first = *parts.first().ok_or(IrError::EmptyStack)?;
        let dtype = self.meet_all("stack", parts)?;
        let mut shape = self.node(first).shape.clone();
        for &p in &parts[1..] {
            shape = self.broadcast_shape(&shape, p)?;
        }
        let parts: Vec<NodeId> = parts.iter().map(|&p| self.retype_for(p, dtype)).collect();
        let list = match self.lists.get(&parts) {
            Some(&l) => l,
            None => {
                self.graph.lists.push(parts.clone());
                let l = ListId(self.graph.lists.len() as u32 - 1);
                self.lists.insert(parts.clone(), l);
                l
            }
        };
        let shape = shape.with_last(Dim::Const(parts.len() as u64));
        Ok(self.push(Node { op: Op::Stack(list), dtype, shape }))
    }

    /// `torch.stack(parts, dim=axis)`: the parts, broadcast to one shape, along a new axis at
    /// position `axis` of the result (negative counts from the end of the result's axes, so -1 is
    /// [`GraphBuilder::stack`]'s new last axis). Built as that stack with its last axis moved to
    /// `axis`, so the interpreter, every kernel and the gradient need nothing new.
    pub fn stack_at(&mut self, parts: &[NodeId], axis: i64) -> Result<NodeId, IrError> {
        let stacked = self.stack(parts)?;
        let shape = self.node(stacked).shape.clone();
        let (at, last) = (self.view_axis("stack", axis, &shape)?, shape.rank() - 1);
        if at == last {
            return Ok(stacked);
        }
        // Axis `at` of the result is the new last axis; those after it move up by one.
        let perm: Vec<i64> = (0..=last).map(|k| if k < at { k } else if k == at { last } else { k - 1 } as i64).collect();
        self.permute(stacked, &perm)
    }

    /// `x[.., None]`.
    pub fn expand_last(&mut self, x: NodeId) -> NodeId {
        let n = self.node(x);
        let (dtype, shape) = (n.dtype, n.shape.with_last(Dim::Const(1)));
        self.push(Node { op: Op::ExpandLast(x), dtype, shape })
    }

    /// A bool tensor of `shape` that is true everywhere: `iota(shape, axis) >= 0`. A count of it
    /// along some axes is the product of their sizes, which the code generator reads from the
    /// sizes with no pass (`size(D)`, a mean's count).
    pub fn all_true(&mut self, shape: Shape, axis: u32) -> Result<NodeId, IrError> {
        let iota = self.iota(shape, axis)?;
        let zero = self.lit_int(0);
        self.binary(BinaryOp::Ge, iota, zero)
    }

    /// `torch.argmax` / `torch.argmin` along `axis` (negative counts from the end; `op` is `Max`
    /// or `Min`): the first position along the axis that holds the extreme value of its line, or
    /// the first NaN there (torch's answer), as an i64. Built from existing reductions: the
    /// extreme (kept as a size-1 axis), then the least position whose element equals it or is NaN.
    pub fn arg_extremum(&mut self, op: ReduceOp, x: NodeId, axis: i64, keepdim: bool) -> Result<NodeId, IrError> {
        let (name, xs, dtype) = self.arg_operand(op, x)?;
        let bits = axis_mask(name, &[axis], xs.rank())?;
        let extreme = self.reduce(op, ReduceAxis::Axes { mask: bits, keepdim: true }, x, None)?;
        let hit = self.holds_extreme(x, extreme, dtype)?;
        let at = self.iota(xs, bits.trailing_zeros())?;
        let at = self.cast(at, DType::I64);
        self.reduce(ReduceOp::Min, ReduceAxis::Axes { mask: bits, keepdim }, at, Some(hit))
    }

    /// `torch.argmax(x)` / `torch.argmin(x)` with no dimension: the flat (row-major) index of the
    /// first element that holds the extreme value, or of the first NaN, as an i64 (`keepdim`:
    /// every axis kept with size 1). The flat index is `iota` along each axis times the product
    /// of the later axes' sizes (counted, so a symbolic size costs no pass). A tensor with no
    /// element gives the largest i32 (torch raises there; a kernel cannot).
    pub fn arg_extremum_flat(&mut self, op: ReduceOp, x: NodeId, keepdim: bool) -> Result<NodeId, IrError> {
        let (_, xs, dtype) = self.arg_operand(op, x)?;
        let extreme = self.reduce(op, ReduceAxis::All, x, None)?;
        let hit = self.holds_extreme(x, extreme, dtype)?;
        let rank = xs.rank();
        let mut at: Option<NodeId> = None;
        for axis in 0..rank as u32 {
            let i = self.iota(xs.clone(), axis)?;
            let i = self.cast(i, DType::I64);
            at = Some(match at {
                None => i,
                Some(prev) => {
                    let every = self.all_true(Shape(vec![xs.dims()[axis as usize]]), 0)?;
                    let size = self.reduce(ReduceOp::Count, ReduceAxis::All, every, None)?;
                    let size = self.cast(size, DType::I64);
                    let scaled = self.binary(BinaryOp::Mul, prev, size)?;
                    self.binary(BinaryOp::Add, scaled, i)?
                }
            });
        }
        let at = at.ok_or_else(|| IrError::Malformed("a flat index of a scalar".into()))?;
        let all = (1u32 << rank) - 1;
        self.reduce(ReduceOp::Min, ReduceAxis::Axes { mask: all, keepdim }, at, Some(hit))
    }

    /// Where `x` (of `dtype`) equals its `extreme`, or is NaN (torch's arg-extremum takes the first
    /// NaN).
    fn holds_extreme(&mut self, x: NodeId, extreme: NodeId, dtype: DType) -> Result<NodeId, IrError> {
        let hit = self.binary(BinaryOp::Eq, x, extreme)?;
        if dtype.kind() != Kind::Float {
            return Ok(hit);
        }
        let nan = self.unary(UnaryOp::IsNan, x)?;
        self.binary(BinaryOp::Or, hit, nan)
    }

    /// The name of an arg-extremum of `op`, and its operand's shape and dtype, checked: a tensor
    /// (rank 1 or more) of numbers.
    fn arg_operand(&self, op: ReduceOp, x: NodeId) -> Result<(&'static str, Shape, DType), IrError> {
        let name = match op {
            ReduceOp::Max => "argmax",
            ReduceOp::Min => "argmin",
            _ => return Err(IrError::Malformed(format!("arg_extremum of {}", op.name()))),
        };
        let (xs, dtype) = (self.node(x).shape.clone(), self.node(x).dtype);
        if xs.rank() == 0 {
            return Err(IrError::RankTooLow { op: name, min: 1, shape: self.graph.shape_str(&xs) });
        }
        if dtype == DType::Bool {
            return Err(IrError::BadDType { op: name, dtype, hint: " (compare a bool tensor, or cast it to i32)" });
        }
        Ok((name, xs, dtype))
    }

    /// `torch.cat(parts, dim=axis)`: the parts, of one rank, equal sizes on every other axis and
    /// a constant size along `axis` (negative counts from the end), one after another along it,
    /// in their common dtype. Built from existing ops: at position `c` along the axis, the part
    /// whose range holds `c`, gathered at `c` less the sizes of the parts before it (an index
    /// clamped into the part), so the interpreter, every kernel shape and the gradient (each
    /// part's share of the upstream gradient, by the gathers' gradients) need nothing new.
    pub fn cat(&mut self, parts: &[NodeId], axis: i64) -> Result<NodeId, IrError> {
        let first = *parts.first().ok_or(IrError::EmptyStack)?;
        let shape = self.node(first).shape.clone();
        let rank = shape.rank();
        if rank == 0 {
            return Err(IrError::RankTooLow { op: "cat", min: 1, shape: self.graph.shape_str(&shape) });
        }
        let a = axis_mask("cat", &[axis], rank)?.trailing_zeros() as usize;
        let dtype = self.meet_all("cat", parts)?;
        let bad = |b: &Self, p: NodeId, why: String| IrError::BadView {
            op: "cat",
            axis,
            shape: b.graph.shape_str(&b.node(p).shape),
            why,
        };
        let mut sizes = Vec::with_capacity(parts.len());
        for (k, &p) in parts.iter().enumerate() {
            let dims = self.node(p).shape.dims();
            if dims.len() != rank || (0..rank).any(|d| d != a && dims[d] != shape.dims()[d]) {
                let want = self.graph.shape_str(&shape);
                return Err(bad(
                    self,
                    p,
                    format!("part {k} differs from part 0's shape {want} on an axis other than {a}"),
                ));
            }
            match dims[a] {
                Dim::Const(n) if n > 0 => sizes.push(n),
                _ => return Err(bad(self, p, format!("part {k} needs a constant size of at least 1 along the axis"))),
            }
        }
        let parts: Vec<NodeId> = parts.iter().map(|&p| self.cast(p, dtype)).collect();
        if parts.len() == 1 {
            return Ok(parts[0]);
        }
        let mut dims = shape.dims().to_vec();
        dims[a] = Dim::Const(sizes.iter().sum());
        let at = self.iota(Shape(dims), a as u32)?;
        let mut result: Option<NodeId> = None;
        let mut end: u64 = sizes.iter().sum();
        for (&p, &n) in parts.iter().zip(&sizes).rev() {
            let start = end - n;
            let shift = self.lit_int(start as i64);
            let local = self.binary(BinaryOp::Sub, at, shift)?;
            let (lo, hi) = (self.lit_int(0), self.lit_int(n as i64 - 1));
            let index = self.clamp(local, lo, hi)?;
            let picked = self.gather(p, index, a as i64)?;
            result = Some(match result {
                None => picked,
                Some(later) => {
                    let bound = self.lit_int(end as i64);
                    let here = self.binary(BinaryOp::Lt, at, bound)?;
                    self.select(here, picked, later)?
                }
            });
            end = start;
        }
        result.ok_or(IrError::EmptyStack)
    }

    /// The index along `axis` of each element of a tensor of `shape`.
    pub fn iota(&mut self, shape: Shape, axis: u32) -> Result<NodeId, IrError> {
        if axis as usize >= shape.rank() {
            return Err(IrError::RankTooLow {
                op: "iota",
                min: axis as usize + 1,
                shape: self.graph.shape_str(&shape),
            });
        }
        Ok(self.push(Node { op: Op::Iota { axis }, dtype: DType::I32, shape }))
    }

    /// A uniform `f32` in `[0, 1)` for each element of `shape` (see [`Op::Rand`]), keyed by
    /// `seed`: an integer scalar (a literal, an `i32` or `i64` value), converted to `i64`.
    pub fn rand(&mut self, shape: Shape, seed: NodeId) -> Result<NodeId, IrError> {
        let s = self.node(seed);
        if s.dtype.kind() != Kind::Int {
            return Err(IrError::BadDType {
                op: "rand_like",
                dtype: s.dtype,
                hint: " as a seed (it takes an i32 or i64 scalar)",
            });
        }
        if !s.shape.is_scalar() {
            return Err(IrError::RandSeedShape { shape: self.graph.shape_str(&s.shape) });
        }
        let seed = self.cast(seed, DType::I64);
        Ok(self.push(Node { op: Op::Rand { seed }, dtype: DType::F32, shape }))
    }

    /// `torch.gather(x, axis, index)` (see [`Op::Gather`]): `axis` negative counts from the end;
    /// `index` is `i32` or `i64` with `x`'s rank and `x`'s size on every axis but `axis`.
    pub fn gather(&mut self, x: NodeId, index: NodeId, axis: i64) -> Result<NodeId, IrError> {
        let (xn, inode) = (self.node(x), self.node(index));
        let rank = xn.shape.rank();
        if rank == 0 {
            return Err(IrError::RankTooLow { op: "gather", min: 1, shape: self.graph.shape_str(&xn.shape) });
        }
        let a = axis_mask("gather", &[axis], rank)?.trailing_zeros();
        if !matches!(inode.dtype, DType::I32 | DType::I64) {
            return Err(IrError::BadDType {
                op: "gather",
                dtype: inode.dtype,
                hint: " as the index (it must be i32 or i64)",
            });
        }
        let fits = inode.shape.rank() == rank
            && (0..rank).all(|d| d == a as usize || inode.shape.dims()[d] == xn.shape.dims()[d]);
        if !fits {
            return Err(IrError::GatherShape {
                axis: a as usize,
                index: self.graph.shape_str(&inode.shape),
                operand: self.graph.shape_str(&xn.shape),
            });
        }
        let (dtype, shape) = (xn.dtype, inode.shape.clone());
        Ok(self.push(Node { op: Op::Gather { x, index, axis: a }, dtype, shape }))
    }

    /// A reduction over the axes `axes` of `x` (PyTorch's `dim=`: negative axes count from the
    /// end), keeping them with size 1 under `keepdim`, optionally masked. Errors name the axis
    /// and the rank: an axis out of range, one named twice, an empty list.
    pub fn reduce_axes(
        &mut self,
        op: ReduceOp,
        x: NodeId,
        axes: &[i64],
        keepdim: bool,
        mask: Option<NodeId>,
    ) -> Result<NodeId, IrError> {
        let mask_bits = axis_mask(op.name(), axes, self.node(x).shape.rank())?;
        self.reduce(op, ReduceAxis::Axes { mask: mask_bits, keepdim }, x, mask)
    }

    /// `x` with new size-1 axes where `axes` has a bit set (see [`Op::Unsqueeze`]). New axes
    /// only at the end are written as `x[.., None]`, and no new axis is `x` itself.
    pub fn unsqueeze(&mut self, x: NodeId, axes: u32) -> Result<NodeId, IrError> {
        let n = self.node(x);
        let Some(shape) = n.shape.unsqueezed(axes) else {
            let rank = n.shape.rank() + axes.count_ones() as usize;
            let axis = (0..32).rev().find(|a| axes >> a & 1 == 1).unwrap_or(0);
            return Err(IrError::BadAxis { op: "unsqueeze", axis, rank, why: "is past the result's last axis".into() });
        };
        let new_trailing = (n.shape.rank()..shape.rank()).all(|a| axes >> a & 1 == 1);
        if new_trailing {
            let mut y = x;
            for _ in 0..axes.count_ones() {
                y = self.expand_last(y);
            }
            return Ok(y);
        }
        let dtype = n.dtype;
        Ok(self.push(Node { op: Op::Unsqueeze { x, axes }, dtype, shape }))
    }

    /// A reduction over every element, along the last axis or over a set of axes (see
    /// [`ReduceAxis`], whose normal forms this makes), optionally masked.
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        axis: ReduceAxis,
        x: NodeId,
        mask: Option<NodeId>,
    ) -> Result<NodeId, IrError> {
        let d = self.node(x).dtype;
        let (x, dtype) = match (op, d) {
            (ReduceOp::Count, DType::Bool) => (x, DType::I32),
            (ReduceOp::Count, d) => {
                return Err(IrError::BadDType {
                    op: "count",
                    dtype: d,
                    hint: " (it counts the true elements of a bool tensor)",
                })
            }
            // As torch does: a sum of integers or bools is an i64 (the bools count as 0 and 1).
            (ReduceOp::Sum, DType::I32 | DType::Bool) => (self.cast(x, DType::I64), DType::I64),
            (op, DType::Bool) => {
                return Err(IrError::BadDType {
                    op: op.name(),
                    dtype: DType::Bool,
                    hint: " (use count for bool tensors)",
                })
            }
            (ReduceOp::Mean, DType::I32 | DType::I64) => (self.cast(x, DType::F32), DType::F32),
            (ReduceOp::Prod, d @ (DType::I32 | DType::I64)) => {
                return Err(IrError::BadDType {
                    op: "prod",
                    dtype: d,
                    hint: " (a product of integers is not supported yet: cast the operand to f32 or f64 first)",
                })
            }
            (_, d) => (x, d),
        };
        let xs = self.node(x).shape.clone();
        if let Some(m) = mask {
            let ms = &self.node(m).shape;
            if self.node(m).dtype != DType::Bool {
                return Err(IrError::BadDType {
                    op: "where:",
                    dtype: self.node(m).dtype,
                    hint: " as a reduction mask (it needs bool)",
                });
            }
            if !ms.broadcasts_to(&xs) {
                return Err(IrError::MaskShape {
                    op: op.name(),
                    mask: self.graph.shape_str(ms),
                    operand: self.graph.shape_str(&xs),
                });
            }
        }
        let rank = xs.rank();
        let (axis, keep) = match axis {
            ReduceAxis::Axes { mask: m, keepdim } => {
                if m == 0 {
                    return Err(IrError::BadAxis { op: op.name(), axis: 0, rank, why: "list is empty".into() });
                }
                let all = if rank >= 32 { u32::MAX } else { (1u32 << rank) - 1 };
                if m & !all != 0 {
                    let axis = i64::from(31 - m.leading_zeros());
                    return Err(IrError::BadAxis { op: op.name(), axis, rank, why: "is out of range".into() });
                }
                let keep = if keepdim { m.count_ones() } else { 0 };
                // The last axis alone is `Last` even at rank 1 (where it is also every axis), as
                // `axis: -1` always was.
                if m == 1 << (rank - 1) {
                    (ReduceAxis::Last, keep)
                } else if m == all {
                    (ReduceAxis::All, keep)
                } else {
                    (ReduceAxis::Axes { mask: m, keepdim }, 0)
                }
            }
            a => (a, 0),
        };
        let Some(shape) = axis.result_shape(&xs) else {
            return Err(IrError::RankTooLow { op: op.name(), min: 1, shape: self.graph.shape_str(&xs) });
        };
        let shifted = match (axis, mask, op) {
            (ReduceAxis::Last, None, ReduceOp::Sum) => match self.pick_one_hot(x)? {
                Some(y) => Some(y),
                None => self.split_row_shift(op, x)?,
            },
            (ReduceAxis::Last, None, _) => self.split_row_shift(op, x)?,
            _ => None,
        };
        let mut y = match shifted {
            Some(y) => y,
            None => self.push(Node { op: Op::Reduce { op, axis, x, mask }, dtype, shape }),
        };
        for _ in 0..keep {
            y = self.expand_last(y);
        }
        Ok(y)
    }

    /// A sum along the last axis of `where(iota == k, f, 0)` (the comparison either way round, the
    /// index cast to `k`'s integer dtype or not), where `k` is the same at every column of a row (a
    /// class label, a gather's index): `f` at column `k` of its row where `0 <= k <` the row
    /// length, else 0. A cross-entropy's pick of the label's log-probability and the row sums of a
    /// gather's gradient (its scatter) then read one element per row instead of comparing and
    /// adding at every element. `f` is gathered at `k` clamped into the row (an index out of range
    /// is not an error here, as it is not in the sum), or taken as it is where it is the same
    /// along the row; `+ 0` turns a picked `-0` into the `+0` that a sum of zeros and `-0` gives.
    /// `None` where the pattern does not apply.
    fn pick_one_hot(&mut self, x: NodeId) -> Result<Option<NodeId>, IrError> {
        let xn = self.node(x);
        let Op::Ternary(TernaryOp::Select, cond, f, zero) = xn.op else { return Ok(None) };
        if xn.dtype.kind() != Kind::Float || xn.shape.rank() < 2 {
            return Ok(None);
        }
        if !matches!(self.node(zero).op, Op::Const(Literal::Float(0))) {
            return Ok(None);
        }
        let xs = xn.shape.clone();
        let last = xs.rank() as u32 - 1;
        // The same at every column: `xs`'s shape with a last axis of 1.
        let row_constant = |b: &GraphBuilder, n: NodeId| {
            let ns = b.node(n).shape.dims();
            ns.len() == xs.rank()
                && ns[..ns.len() - 1] == xs.dims()[..ns.len() - 1]
                && ns.last() == Some(&Dim::Const(1))
        };
        if row_constant(self, cond) {
            // `where(c, f, 0)` with `c` the same along the row (a gather's gradient under a mask of
            // rows): the pick of `f`, kept where `c` holds (a sum of zeros is +0 elsewhere).
            let Some(inner) = self.pick_one_hot(f)? else { return Ok(None) };
            let kept = self.component(cond, 0)?;
            return Ok(Some(self.select(kept, inner, zero)?));
        }
        let Op::Binary(BinaryOp::Eq, l, r) = self.node(cond).op else { return Ok(None) };
        let is_index = |b: &GraphBuilder, n: NodeId| {
            let (op, dtype) = (&b.node(n).op, b.node(n).dtype);
            let iota = match *op {
                Op::Cast(i) if matches!(dtype, DType::I32 | DType::I64) => i,
                _ => n,
            };
            matches!(b.node(iota).op, Op::Iota { axis } if axis == last) && b.node(iota).shape == xs
        };
        let k = match (is_index(self, l), is_index(self, r)) {
            (true, false) => r,
            (false, true) => l,
            _ => return Ok(None),
        };
        let kd = self.node(k).dtype;
        if !matches!(kd, DType::I32 | DType::I64) || !row_constant(self, k) {
            return Ok(None);
        }
        let along_row = self.node(f).shape == xs;
        if !along_row && !row_constant(self, f) && !self.node(f).shape.is_scalar() {
            return Ok(None);
        }
        let every = self.all_true(xs.clone(), last)?;
        let count = self.reduce(ReduceOp::Count, ReduceAxis::Last, every, None)?;
        let count = self.expand_last(count);
        let length = self.cast(count, kd);
        let zero_index = self.constant(Literal::Int(0), kd);
        let one = self.constant(Literal::Int(1), kd);
        let (at_least_0, below_length) =
            (self.binary(BinaryOp::Ge, k, zero_index)?, self.binary(BinaryOp::Lt, k, length)?);
        let inside = self.binary(BinaryOp::And, at_least_0, below_length)?;
        let picked = if along_row {
            let highest = self.binary(BinaryOp::Sub, length, one)?;
            let clamped = self.clamp(k, zero_index, highest)?;
            self.gather(f, clamped, -1)?
        } else {
            f
        };
        let plus_zero = self.binary(BinaryOp::Add, picked, zero)?;
        let y = self.select(inside, plus_zero, zero)?;
        Ok(Some(self.component(y, 0)?))
    }

    /// A sum or mean along the last axis of `a ± c` (or `c ± a`) where `c` is the same at every
    /// column of a row (a row statistic broadcast back, as in `x - max(x)[.., None]`): the
    /// reduction of `a` alone, shifted by `c` (times the row length for a sum). The row's
    /// reductions then all read the row as it is, so a row kernel computes them in one pass
    /// (`mean(log_softmax(x))` takes the pass of the maximum instead of one of its own). `None`
    /// where the pattern does not apply (another op, mixed dtypes, a shift that varies along the
    /// row).
    fn split_row_shift(&mut self, op: ReduceOp, x: NodeId) -> Result<Option<NodeId>, IrError> {
        let xn = self.node(x);
        let Op::Binary(bop @ (BinaryOp::Add | BinaryOp::Sub), l, r) = xn.op else { return Ok(None) };
        if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) || xn.dtype.kind() != Kind::Float || xn.shape.rank() < 2 {
            return Ok(None);
        }
        let (dtype, xs) = (xn.dtype, xn.shape.clone());
        let row_constant = |b: &GraphBuilder, n: NodeId| {
            let ns = &b.node(n).shape;
            b.node(n).dtype == dtype
                && (ns.is_scalar() || (ns.rank() == xs.rank() && ns.dims().last() == Some(&Dim::Const(1))))
        };
        let full = |b: &GraphBuilder, n: NodeId| b.node(n).dtype == dtype && b.node(n).shape == xs;
        // (the varying side, the shift, whether the varying side is subtracted)
        let (a, c, a_negated) = if full(self, l) && row_constant(self, r) {
            (l, r, false)
        } else if bop == BinaryOp::Add && row_constant(self, l) && full(self, r) {
            (r, l, false)
        } else if bop == BinaryOp::Sub && row_constant(self, l) && full(self, r) {
            (r, l, true)
        } else {
            return Ok(None);
        };
        let reduced = self.reduce(op, ReduceAxis::Last, a, None)?;
        let mut shift = match self.node(c).shape.is_scalar() {
            true => c,
            false => self.component(c, 0)?,
        };
        if op == ReduceOp::Sum {
            // The row length as a count of every column (a kernel reads it from the sizes).
            let every = self.all_true(xs.clone(), xs.rank() as u32 - 1)?;
            let count = self.reduce(ReduceOp::Count, ReduceAxis::Last, every, None)?;
            let count = self.cast(count, dtype);
            shift = self.binary(BinaryOp::Mul, shift, count)?;
        }
        Ok(Some(match (bop, a_negated) {
            (BinaryOp::Add, _) => self.binary(BinaryOp::Add, reduced, shift)?,
            (_, false) => self.binary(BinaryOp::Sub, reduced, shift)?,
            (_, true) => self.binary(BinaryOp::Sub, shift, reduced)?,
        }))
    }

    /// Declares the ragged layout of an `i32` input (see [`Constraint`]); the values are checked
    /// at bind time. An input takes at most one layout.
    pub fn constrain(&mut self, c: Constraint) -> Result<(), IrError> {
        crate::verify::check_constraint(&self.graph, c)?;
        if self.graph.constraint_of(c.input()).is_some() {
            let name = self.graph.input(c.input()).name.clone();
            return Err(IrError::BadConstraint {
                input: name,
                layout: c.name(),
                why: "it already has a layout".into(),
            });
        }
        self.graph.constraints.push(c);
        Ok(())
    }

    /// Names `node` as an output.
    pub fn output(&mut self, name: &str, node: NodeId) -> Result<(), IrError> {
        if self.graph.output_by_name(name).is_some() {
            return Err(IrError::DuplicateName(name.to_string()));
        }
        self.graph.outputs.push(Output { name: name.to_string(), node });
        Ok(())
    }

    /// Drops nodes no output depends on (input reads stay), verifies, and returns the graph.
    pub fn finish(self) -> Result<Graph, IrError> {
        let graph = prune_dead(self.graph);
        verify(&graph)?;
        Ok(graph)
    }

    fn broadcast(&self, a: NodeId, b: NodeId) -> Result<Shape, IrError> {
        let sa = self.node(a).shape.clone();
        self.broadcast_shape(&sa, b)
    }

    fn broadcast_shape(&self, sa: &Shape, b: NodeId) -> Result<Shape, IrError> {
        let sb = &self.node(b).shape;
        broadcast_shapes(sa, sb)
            .ok_or_else(|| IrError::Broadcast { left: self.graph.shape_str(sa), right: self.graph.shape_str(sb) })
    }

    fn push(&mut self, node: Node) -> NodeId {
        if let Some(&id) = self.dedup.get(&node) {
            return id;
        }
        self.graph.nodes.push(node.clone());
        let id = NodeId(self.graph.nodes.len() as u32 - 1);
        self.dedup.insert(node, id);
        id
    }
}

/// The bit mask of `axes` (negative ones counting from the end) of an operand of rank `rank`.
fn axis_mask(op: &'static str, axes: &[i64], rank: usize) -> Result<u32, IrError> {
    let bad = |axis: i64, why: String| IrError::BadAxis { op, axis, rank, why };
    if axes.is_empty() {
        return Err(bad(0, "list is empty (name at least one axis, or reduce over every element)".into()));
    }
    let r = i64::try_from(rank).unwrap_or(i64::MAX);
    let mut mask = 0u32;
    for &axis in axes {
        let a = if axis < 0 { axis.saturating_add(r) } else { axis };
        if !(0..r).contains(&a) {
            let range = match rank {
                0 => "a scalar has no axis".to_string(),
                _ => format!("the axes are 0 to {} or -{r} to -1", r - 1),
            };
            return Err(bad(axis, format!("is out of range ({range})")));
        }
        if a >= ReduceAxis::MAX_RANK as i64 {
            return Err(bad(axis, format!("is past the {} axes a reduction can name", ReduceAxis::MAX_RANK)));
        }
        if mask >> a & 1 == 1 {
            return Err(bad(axis, format!("is named twice (as axis {a})")));
        }
        mask |= 1 << a;
    }
    Ok(mask)
}

/// Removes dead nodes (left behind by weak literals that were retyped, or unused `let`s) and
/// renumbers the rest, keeping their order.
fn prune_dead(g: Graph) -> Graph {
    let live = g.live_nodes();
    let mut remap = vec![NodeId(u32::MAX); g.nodes.len()];
    let mut out = Graph {
        symbols: g.symbols.clone(),
        inputs: g.inputs.clone(),
        constraints: g.constraints.clone(),
        ..Graph::default()
    };
    let mut lists: HashMap<Vec<NodeId>, ListId> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if !live[i] && !matches!(n.op, Op::Input(_)) {
            continue;
        }
        let r = |x: NodeId| remap[x.index()];
        let op = match n.op {
            Op::Stack(l) => {
                let parts: Vec<NodeId> = g.list(l).iter().map(|&p| r(p)).collect();
                let next = ListId(lists.len() as u32);
                let id = *lists.entry(parts.clone()).or_insert_with(|| {
                    out.lists.push(parts);
                    next
                });
                Op::Stack(id)
            }
            op => op.map_operands(r),
        };
        out.nodes.push(Node { op, dtype: n.dtype, shape: n.shape.clone() });
        remap[i] = NodeId(out.nodes.len() as u32 - 1);
    }
    out.outputs = g.outputs.iter().map(|o| Output { name: o.name.clone(), node: remap[o.node.index()] }).collect();
    out
}
