//! Built-in functions: argument checking and lowering of calls.
//!
//! `where`, `clamp`, `pow`, `fma`, elementwise `min`/`max` (two arguments), the one-argument math
//! functions, the two-argument ones (`atan2`, `remainder`, `fmod`, `hypot`, `copysign`,
//! `floor_div`, the bitwise ops and shifts, named as in PyTorch), reductions `sum mean max min count` (with `where:`, `axis:` and `keepdim:`), the casts
//! `f32 f16 bf16 i32 i64 bool`, `grad`, `stack(a, b, ...)` (along a new last axis), `iota(x, axis: A)` (the index along an axis, for one-hot
//! comparisons with integer labels), `gather(x, index, axis: A)` (`torch.gather`), `softmax`/`log_softmax(x, axis: A)` (the axis's maximum detached), `detach(x)` (no gradient flows through), and the ragged-data helpers `mask(lengths)` and `size(D)`,
//! which lower to existing ops (iota, comparisons, count). There are no user-defined functions.

use kfuse_ir::{BinaryOp, Constraint, DType, Dim, NodeId, Op, ReduceAxis, ReduceOp, Shape, UnaryOp};

use crate::ast::{Arg, Expr, ExprKind, Ident};
use crate::diagnostic::{DiagnosticKind, Report, Span};
use crate::functions::FUNCTIONS;
use crate::lower::Lowerer;
use crate::suggest::closest;

fn unary_function(name: &str) -> Option<UnaryOp> {
    UnaryOp::ALL.into_iter().find(|op| !matches!(op, UnaryOp::Neg | UnaryOp::Not) && op.name() == name)
}

/// The two-argument elementwise functions named as in PyTorch, with their signature.
fn binary_function(name: &str) -> Option<(BinaryOp, &'static str)> {
    Some(match name {
        "atan2" => (BinaryOp::Atan2, "atan2(y, x)"),
        "remainder" => (BinaryOp::Remainder, "remainder(a, b)"),
        "fmod" => (BinaryOp::Fmod, "fmod(a, b)"),
        "hypot" => (BinaryOp::Hypot, "hypot(a, b)"),
        "copysign" => (BinaryOp::Copysign, "copysign(a, b)"),
        "floor_div" => (BinaryOp::FloorDiv, "floor_div(a, b)"),
        "bitwise_and" => (BinaryOp::BitAnd, "bitwise_and(a, b)"),
        "bitwise_or" => (BinaryOp::BitOr, "bitwise_or(a, b)"),
        "bitwise_xor" => (BinaryOp::BitXor, "bitwise_xor(a, b)"),
        "bitwise_left_shift" => (BinaryOp::Shl, "bitwise_left_shift(a, n)"),
        "bitwise_right_shift" => (BinaryOp::Shr, "bitwise_right_shift(a, n)"),
        _ => return None,
    })
}

/// Reads an `axis:` argument: one integer literal (maybe negative) or a list of them, each with
/// its span. Whether the axes fit the operand is the builder's check.
fn axis_list(ax: &Expr) -> Result<Vec<(i64, Span)>, Report> {
    let int = |e: &Expr| match &e.kind {
        ExprKind::Int(v) => Some(*v),
        ExprKind::Neg(x) => match x.kind {
            ExprKind::Int(v) => Some(-v),
            _ => None,
        },
        _ => None,
    };
    let not_int = |at: Span| {
        Report::new(DiagnosticKind::Axis, at, "the axis must be an integer literal")
            .expected("axis: 0, axis: -1 (the last axis) or a list such as axis: [0, 1]")
    };
    match &ax.kind {
        ExprKind::List(items) if items.is_empty() => Err(Report::new(
            DiagnosticKind::Axis,
            ax.span,
            "the axis list is empty, so there is nothing to reduce over",
        )
        .expected("at least one axis, as in axis: [0], or no `axis:` to reduce over every element")),
        ExprKind::List(items) => {
            items.iter().map(|e| int(e).map(|v| (v, e.span)).ok_or_else(|| not_int(e.span))).collect()
        }
        _ => int(ax).map(|v| vec![(v, ax.span)]).ok_or_else(|| not_int(ax.span)),
    }
}

fn reduction(name: &str) -> Option<ReduceOp> {
    Some(match name {
        "sum" => ReduceOp::Sum,
        "mean" => ReduceOp::Mean,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "count" => ReduceOp::Count,
        "prod" => ReduceOp::Prod,
        _ => return None,
    })
}

/// The `axis:` argument of a function that takes one axis (`iota`, `gather`, `softmax`): its value (-1 when
/// it is left out) and where to point an error about it.
fn one_axis(a: &SplitArgs, span: Span, expected: &str) -> Result<(i64, Span), Report> {
    let Some(ax) = a.keyword("axis") else { return Ok((-1, span)) };
    let literal = match &ax.kind {
        ExprKind::Int(v) => Some(*v),
        ExprKind::Neg(x) => match x.kind {
            ExprKind::Int(v) => Some(-v),
            _ => None,
        },
        _ => None,
    };
    match literal {
        Some(v) => Ok((v, ax.span)),
        None => {
            Err(Report::new(DiagnosticKind::Axis, ax.span, "the axis must be an integer literal").expected(expected))
        }
    }
}

/// One axis written as an integer literal (maybe negative).
fn single_axis(e: &Expr) -> Result<i64, Report> {
    match axis_list(e)?[..] {
        [(v, _)] => Ok(v),
        _ => Err(Report::new(DiagnosticKind::Axis, e.span, "an axis must be one integer literal")
            .expected("an axis such as 0 or -1")),
    }
}

/// A call's arguments split into positional ones and `keyword: value` ones.
struct SplitArgs<'a> {
    positional: Vec<&'a Expr>,
    keywords: Vec<(&'a Ident, &'a Expr)>,
}

impl SplitArgs<'_> {
    fn keyword(&self, name: &str) -> Option<&Expr> {
        self.keywords.iter().find(|(k, _)| k.name == name).map(|(_, v)| *v)
    }
    /// The span of `name: value`, keyword included.
    fn keyword_span(&self, name: &str) -> Option<Span> {
        self.keywords.iter().find(|(k, _)| k.name == name).map(|(k, v)| k.span.to(v.span))
    }
}

impl Lowerer<'_> {
    /// Lowers `func(args)` spanning `span`.
    pub(crate) fn call(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let name = func.name.as_str();
        if let Some(op) = unary_function(name) {
            let a = split(func, args, &[])?;
            let [x] = exact(func, &a, span, &format!("{name}(x)"))?;
            let x = self.expr(x)?;
            return self.b.unary(op, x).map_err(|e| self.ir_report(e, span, &[]));
        }
        if let Some((op, signature)) = binary_function(name) {
            let a = split(func, args, &[])?;
            let [x, y] = exact(func, &a, span, signature)?;
            return self.binary(op, x, y, span);
        }
        if let Some(dtype) = DType::from_name(name) {
            let a = split(func, args, &[])?;
            let [x] = exact(func, &a, span, &format!("{name}(x)"))?;
            let x = self.expr(x)?;
            return Ok(self.b.cast(x, dtype));
        }
        match name {
            "where" => {
                let a = split(func, args, &[])?;
                let [c, x, y] = exact(func, &a, span, "where(condition, a, b)")?;
                let (cn, xn, yn) = (self.expr(c)?, self.expr(x)?, self.expr(y)?);
                self.b.select(cn, xn, yn).map_err(|e| {
                    let at = if self.dtype(cn) != DType::Bool { c.span } else { span };
                    self.ir_report(e, at, &[xn, yn])
                })
            }
            "clamp" => {
                let a = split(func, args, &[])?;
                let [x, lo, hi] = exact(func, &a, span, "clamp(x, lo, hi)")?;
                let (x, lo, hi) = (self.expr(x)?, self.expr(lo)?, self.expr(hi)?);
                self.b.clamp(x, lo, hi).map_err(|e| self.ir_report(e, span, &[]))
            }
            "fma" => {
                let a = split(func, args, &[])?;
                let [x, y, z] = exact(func, &a, span, "fma(a, b, c), which is a * b + c rounded once")?;
                let (x, y, z) = (self.expr(x)?, self.expr(y)?, self.expr(z)?);
                self.b.fma(x, y, z).map_err(|e| self.ir_report(e, span, &[]))
            }
            "pow" => {
                let a = split(func, args, &[])?;
                let [x, y] = exact(func, &a, span, "pow(base, exponent)")?;
                self.binary(BinaryOp::Pow, x, y, span)
            }
            "min" | "max" => self.min_or_max(func, args, span),
            "sum" | "mean" | "count" | "prod" => self.reduce(func, args, span),
            "grad" => self.grad(func, args, span),
            "mask" => self.mask(func, args, span),
            "size" => self.size(func, args, span),
            "iota" => self.iota(func, args, span),
            "gather" => self.gather(func, args, span),
            "rand_like" => {
                // rand_like(x, seed): a uniform f32 in [0, 1) per element of x's shape (Philox).
                let a = split(func, args, &[])?;
                let [x, seed] = exact(func, &a, span, "rand_like(x, seed), for an integer scalar seed")?;
                let (xn, sn) = (self.expr(x)?, self.expr(seed)?);
                let shape = self.b.node(xn).shape.clone();
                self.b.rand(shape, sn).map_err(|e| self.ir_report(e, seed.span, &[]))
            }
            "transpose" | "permute" => self.permute(func, args, span),
            "reshape" => self.reshape(func, args, span),
            "softmax" | "log_softmax" => self.softmax(func, args, span),
            "cat" => self.cat(func, args, span),
            "argmax" | "argmin" => self.arg_extremum(func, args, span),
            "stack" => self.stack(func, args, span),
            _ => Err(self.unknown_function(func)),
        }
    }

    fn binary(&mut self, op: BinaryOp, x: &Expr, y: &Expr, span: Span) -> Result<NodeId, Report> {
        let (x, y) = (self.expr(x)?, self.expr(y)?);
        self.b.binary(op, x, y).map_err(|e| self.ir_report(e, span, &[x, y]))
    }

    /// `min(a, b)` / `max(a, b)` are elementwise; with one positional argument they reduce.
    fn min_or_max(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let n = func.name.as_str();
        let a = split(func, args, &["where", "axis", "keepdim"])?;
        match a.positional.as_slice() {
            [_] => self.reduce(func, args, span),
            [x, y] => {
                if let Some((k, v)) = a.keywords.first() {
                    return Err(Report::new(
                        DiagnosticKind::Arguments,
                        k.span.to(v.span),
                        format!("`{n}(a, b)` is elementwise and takes no `{}:`", k.name),
                    )
                    .expected(format!("{n}(a, b), or {n}(x, where: mask, axis: -1) to reduce")));
                }
                let op = if n == "min" { BinaryOp::Min } else { BinaryOp::Max };
                self.binary(op, x, y, span)
            }
            other => Err(Report::new(
                DiagnosticKind::Arguments,
                span,
                format!("`{n}` takes 1 argument (a reduction) or 2 (elementwise), got {}", other.len()),
            )
            .expected(format!("{n}(x), {n}(x, where: mask, axis: -1) or {n}(a, b)"))),
        }
    }

    /// `sum mean max min count` with optional `where:`, `axis:` (one axis or a list, negative
    /// ones counting from the end) and `keepdim:` (PyTorch's: the reduced axes stay, of size 1).
    fn reduce(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let n = func.name.as_str();
        let Some(op) = reduction(n) else {
            return Err(self.unknown_function(func));
        };
        let a = split(func, args, &["where", "axis", "keepdim"])?;
        let keepdim = match a.keyword("keepdim") {
            None => false,
            Some(Expr { kind: ExprKind::Bool(b), .. }) => *b,
            Some(other) => {
                return Err(Report::new(DiagnosticKind::Arguments, other.span, "`keepdim` must be `true` or `false`")
                    .expected(format!("{n}(x, axis: -1, keepdim: true)")))
            }
        };
        if keepdim && a.keyword("axis").is_none() {
            let at = a.keyword_span("keepdim").unwrap_or(span);
            return Err(Report::new(
                DiagnosticKind::Arguments,
                at,
                format!("`keepdim: true` keeps the reduced axis, so `{n}` needs an `axis:`"),
            )
            .expected(format!("{n}(x, axis: -1, keepdim: true), or {n}(x) over every element")));
        }
        let [x] = exact(func, &a, span, &format!("{n}(x, where: mask, axis: -1)"))?;
        let axes = a.keyword("axis").map(axis_list).transpose()?;
        let xn = self.expr(x)?;
        let mask = match a.keyword("where") {
            Some(m) => Some((self.expr(m)?, m.span)),
            None => None,
        };
        // A mask error points at the whole `where: MASK` argument, an axis error at the axis.
        let mask = mask.map(|(m, s)| (m, a.keyword_span("where").unwrap_or(s)));
        let reduced = match &axes {
            None => self.b.reduce(op, ReduceAxis::All, xn, mask.map(|m| m.0)),
            Some(list) => {
                let values: Vec<i64> = list.iter().map(|(v, _)| *v).collect();
                self.b.reduce_axes(op, xn, &values, keepdim, mask.map(|m| m.0))
            }
        };
        reduced.map_err(|e| {
            let at = match (&e, mask) {
                (kfuse_ir::IrError::MaskShape { .. }, Some((_, s))) => s,
                (kfuse_ir::IrError::BadDType { op: "where:", .. }, Some((_, s))) => s,
                (kfuse_ir::IrError::BadAxis { axis, .. }, _) => {
                    let items = axes.iter().flatten();
                    // The second naming of a duplicate, else the first item with that value.
                    let hits: Vec<Span> = items.filter(|(v, _)| v == axis).map(|(_, s)| *s).collect();
                    let dup = axes.iter().flatten().filter(|(v, _)| *v == *axis).count() > 1;
                    match (hits.last(), hits.first(), dup) {
                        (Some(s), _, true) | (_, Some(s), false) => *s,
                        _ => a.keyword("axis").map_or(span, |ax| ax.span),
                    }
                }
                _ => span,
            };
            self.ir_report(e, at, &[])
        })
    }

    /// `softmax(x, axis: A)` and `log_softmax(x, axis: A)` (`torch.softmax`, `torch.log_softmax`;
    /// `axis: -1` when left out) over one axis, shifted by the axis's maximum for range. The
    /// maximum is detached: the result does not depend on the shift, so its exact gradient has
    /// no term through it, and none is computed (a tie count and a sum along the axis fewer).
    fn softmax(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let n = func.name.as_str();
        let a = split(func, args, &["axis"])?;
        let [x] = exact(func, &a, span, &format!("{n}(x, axis: -1)"))?;
        let axis = one_axis(&a, span, &format!("{n}(x, axis: -1)"))?;
        let xn = self.expr(x)?;
        let at = axis.1;
        let err = |l: &Self, e| l.ir_report(e, at, &[]);
        let xf = match self.dtype(xn).kind() {
            kfuse_ir::Kind::Float => xn,
            _ => self.b.cast(xn, DType::F32),
        };
        let m = self.b.reduce_axes(ReduceOp::Max, xf, &[axis.0], true, None).map_err(|e| err(self, e))?;
        let m = self.b.unary(UnaryOp::Detach, m).map_err(|e| err(self, e))?;
        let z = self.b.binary(BinaryOp::Sub, xf, m).map_err(|e| err(self, e))?;
        let ez = self.b.unary(UnaryOp::Exp, z).map_err(|e| err(self, e))?;
        let s = self.b.reduce_axes(ReduceOp::Sum, ez, &[axis.0], true, None).map_err(|e| err(self, e))?;
        if n == "softmax" {
            return self.b.binary(BinaryOp::Div, ez, s).map_err(|e| err(self, e));
        }
        let ls = self.b.unary(UnaryOp::Log, s).map_err(|e| err(self, e))?;
        self.b.binary(BinaryOp::Sub, z, ls).map_err(|e| err(self, e))
    }

    /// `grad(of, wrt)`: the gradient of a scalar float with respect to an input.
    fn grad(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &[])?;
        let [of, wrt] = exact(func, &a, span, "grad(scalar, input)")?;
        let of_node = self.expr(of)?;
        let node = self.b.node(of_node);
        if !node.shape.is_scalar() {
            return Err(Report::new(
                DiagnosticKind::Grad,
                of.span,
                format!("`grad` differentiates a scalar, but this value has shape {}", self.shape_str(of_node)),
            )
            .expected("a scalar: reduce it first, e.g. grad(sum(x), input) or grad(mean(x), input)"));
        }
        if !node.dtype.is_float() {
            return Err(Report::new(
                DiagnosticKind::Grad,
                of.span,
                format!("`grad` differentiates a float, but this value is {}", node.dtype),
            )
            .expected("a float scalar (f32, f16 or bf16)"));
        }
        let not_input = |what: String| {
            Report::new(
                DiagnosticKind::Grad,
                wrt.span,
                format!("`grad` differentiates with respect to an input, but {what} is not one"),
            )
            .expected("the name of an `input`, as in grad(loss, pred)")
        };
        let ExprKind::Name(name) = &wrt.kind else {
            return Err(not_input("this expression".into()));
        };
        let binding = self.lookup(&Ident { name: name.clone(), span: wrt.span })?;
        if !binding.is_input {
            return Err(not_input(format!("`{name}`")));
        }
        kfuse_passes::grad(&mut self.b, of_node, binding.node).map_err(|e| self.ir_report(e, span, &[]))
    }

    /// `mask(lengths)`: `bool[..., B, N]` with `mask[.., b, n] = n < lengths[.., b]`, for an input
    /// declared `as lengths(N)`. Lowered as `iota(last axis) < lengths[.., None]`: it depends on
    /// the lengths only, so the code generator can skip (and not even read) invalid slots.
    fn mask(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &[])?;
        let [x] = exact(func, &a, span, "mask(lengths)")?;
        let xn = self.expr(x)?;
        let constraint = match self.b.node(xn).op {
            Op::Input(id) => self.b.graph().constraint_of(id),
            _ => None,
        };
        let what = match &x.kind {
            ExprKind::Name(n) => format!("`{n}`"),
            _ => "this expression".into(),
        };
        let max = match constraint {
            Some(Constraint::Lengths { max, .. }) => max,
            Some(Constraint::Offsets { .. }) => {
                return Err(Report::new(
                    DiagnosticKind::Type,
                    x.span,
                    format!("`mask` takes lengths, but {what} is declared as offsets (packed rows are all valid and need no mask)"),
                )
                .expected("an input declared as lengths, as in `input lengths: i32[B] as lengths(N)`, then mask(lengths)"))
            }
            None => {
                return Err(Report::new(
                    DiagnosticKind::Type,
                    x.span,
                    format!("`mask` takes an input declared as lengths, but {what} is not one"),
                )
                .expected("an input declared `as lengths(N)`, as in `input lengths: i32[B] as lengths(N)`; then mask(lengths)[b, n] is n < lengths[b]"))
            }
        };
        let shape = self.b.node(xn).shape.with_last(max);
        let axis = u32::try_from(shape.rank() - 1).map_err(|_| {
            Report::new(DiagnosticKind::Shape, x.span, "the lengths have too many axes")
                .expected("lengths of a few axes")
        })?;
        let iota = self.b.iota(shape, axis).map_err(|e| self.ir_report(e, span, &[]))?;
        let lengths = self.b.expand_last(xn);
        self.b.binary(BinaryOp::Lt, iota, lengths).map_err(|e| self.ir_report(e, span, &[]))
    }

    /// `iota(x, axis: A)`: an `i32` tensor of `x`'s shape whose every element is its index along
    /// axis `A` (negative counts from the end; the last axis when `axis:` is left out), as
    /// `torch.arange` along that axis; `iota(logits, axis: -1) == labels[.., None]` is a one-hot.
    fn iota(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &["axis"])?;
        let [x] = exact(func, &a, span, "iota(x, axis: -1)")?;
        let xn = self.expr(x)?;
        let shape = self.b.node(xn).shape.clone();
        let rank = shape.rank() as i64;
        let (axis, at) =
            one_axis(&a, span, "iota(x, axis: -1), an axis of x counted from 0 or, negative, from the end")?;
        let k = if axis < 0 { axis + rank } else { axis };
        if !(0..rank).contains(&k) {
            return Err(Report::new(
                DiagnosticKind::Axis,
                at,
                format!("`iota` counts along axis {axis}, but its operand has rank {rank}"),
            )
            .expected(format!("an axis from {} to {}", -rank, rank - 1)));
        }
        self.b.iota(shape, k as u32).map_err(|e| self.ir_report(e, span, &[]))
    }

    /// `transpose(x, a, b)` (axes `a` and `b` swapped) and `permute(x, [a, b, ...])` (axis `k` of
    /// the result is axis `perm[k]` of `x`), as PyTorch's; axes are integer literals, negative
    /// ones counting from the end.
    fn permute(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &[])?;
        let transpose = func.name == "transpose";
        let r = if transpose {
            let [x, d0, d1] = exact(func, &a, span, "transpose(x, 0, 1), two axes of x to swap")?;
            let (d0, d1) = (single_axis(d0)?, single_axis(d1)?);
            let x = self.expr(x)?;
            self.b.transpose(x, d0, d1)
        } else {
            let [x, perm] = exact(func, &a, span, "permute(x, [1, 0, 2]), every axis of x once, in the new order")?;
            let perm: Vec<i64> = match &perm.kind {
                ExprKind::List(items) => items.iter().map(single_axis).collect::<Result<_, _>>()?,
                _ => vec![single_axis(perm)?],
            };
            let x = self.expr(x)?;
            self.b.permute(x, &perm)
        };
        r.map_err(|e| self.ir_report(e, span, &[]))
    }

    /// `reshape(x, [B, N, 4, 16])` (`torch.reshape`): the shape as a list of dimension symbols and
    /// integer sizes, one of which may be `-1` (the constant size that keeps the element count).
    fn reshape(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let expected = "reshape(x, [B, N, 4, 16]): dimension symbols and sizes (one may be -1), the symbolic axes whole and in order";
        let a = split(func, args, &[])?;
        let [x, shape] = exact(func, &a, span, expected)?;
        let items: Vec<&Expr> = match &shape.kind {
            ExprKind::List(items) => items.iter().collect(),
            _ => vec![shape],
        };
        let mut dims = Vec::with_capacity(items.len());
        for e in items {
            let d = match &e.kind {
                ExprKind::Int(v) if *v >= 0 => Some(Dim::Const(*v as u64)),
                ExprKind::Neg(inner) if matches!(inner.kind, ExprKind::Int(1)) => None,
                ExprKind::Name(n) => match self.b.graph().symbol(n) {
                    Some(sym) => Some(Dim::Sym(sym)),
                    None => {
                        return Err(Report::new(
                            DiagnosticKind::Shape,
                            e.span,
                            format!("`{n}` is not a dimension symbol of any input"),
                        )
                        .expected(expected))
                    }
                },
                _ => {
                    return Err(Report::new(
                        DiagnosticKind::Shape,
                        e.span,
                        "a size of `reshape` must be a dimension symbol, a size >= 0 or -1",
                    )
                    .expected(expected))
                }
            };
            dims.push(d);
        }
        let xn = self.expr(x)?;
        self.b.reshape(xn, &dims).map_err(|e| self.ir_report(e, span, &[xn]))
    }

    /// `argmax(x, axis: A)` / `argmin(x, axis: A, keepdim: true)`: `torch.argmax` / `argmin`
    /// along one axis, an i64; without `axis:`, the flat (row-major) index over every element.
    fn arg_extremum(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let n = func.name.as_str();
        let expected = format!("{n}(x, axis: -1), {n}(x, axis: 1, keepdim: true), or {n}(x) over every element");
        let a = split(func, args, &["axis", "keepdim"])?;
        let keepdim = match a.keyword("keepdim") {
            None => false,
            Some(Expr { kind: ExprKind::Bool(b), .. }) => *b,
            Some(other) => {
                return Err(Report::new(DiagnosticKind::Arguments, other.span, "`keepdim` must be `true` or `false`")
                    .expected(expected))
            }
        };
        let [x] = exact(func, &a, span, &expected)?;
        let op = if n == "argmax" { ReduceOp::Max } else { ReduceOp::Min };
        if a.keyword("axis").is_none() {
            let xn = self.expr(x)?;
            return self.b.arg_extremum_flat(op, xn, keepdim).map_err(|e| self.ir_report(e, span, &[xn]));
        }
        let (axis, at) = one_axis(&a, span, &expected)?;
        let xn = self.expr(x)?;
        self.b.arg_extremum(op, xn, axis, keepdim).map_err(|e| {
            let at = if matches!(e, kfuse_ir::IrError::BadAxis { .. }) { at } else { span };
            self.ir_report(e, at, &[xn])
        })
    }

    /// `cat([a, b, ..], axis: A)`: `torch.cat` along axis `A` (the last when `axis:` is left
    /// out) of parts with one rank, equal sizes on every other axis and constant sizes along it.
    fn cat(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &["axis"])?;
        let expected = "cat([a, b], axis: 1), a list of parts of one rank joined along one axis";
        let [list] = exact(func, &a, span, expected)?;
        let ExprKind::List(items) = &list.kind else {
            return Err(
                Report::new(DiagnosticKind::Arguments, list.span, "`cat` takes its parts as a list").expected(expected)
            );
        };
        let (axis, _) = one_axis(&a, span, expected)?;
        let parts = items.iter().map(|e| self.expr(e)).collect::<Result<Vec<_>, _>>()?;
        if parts.is_empty() {
            return Err(
                Report::new(DiagnosticKind::Arguments, list.span, "`cat` needs at least one part").expected(expected)
            );
        }
        self.b.cat(&parts, axis).map_err(|e| self.ir_report(e, span, &parts))
    }

    /// `stack(a, b, ..)` or `stack([a, b, ..], axis: A)`: `torch.stack` of the parts, broadcast
    /// to one shape, along a new axis at position `A` of the result (a new last axis when `axis:`
    /// is left out, as `cat`'s default is the last axis).
    fn stack(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let expected = "stack(a, b, ...) or stack([a, b], axis: 0), the parts along a new axis (the last by default)";
        let a = split(func, args, &["axis"])?;
        let items: Vec<&Expr> = match a.positional.as_slice() {
            [list] => match &list.kind {
                ExprKind::List(items) => items.iter().collect(),
                _ => vec![*list],
            },
            parts => parts.to_vec(),
        };
        if items.is_empty() {
            return Err(
                Report::new(DiagnosticKind::Arguments, span, "`stack` needs at least one part").expected(expected)
            );
        }
        let (axis, at) = one_axis(&a, span, expected)?;
        let parts = items.into_iter().map(|e| self.expr(e)).collect::<Result<Vec<_>, _>>()?;
        self.b.stack_at(&parts, axis).map_err(|e| {
            let place = if matches!(e, kfuse_ir::IrError::BadAxis { .. }) { at } else { span };
            self.ir_report(e, place, &parts)
        })
    }

    /// `gather(x, index, axis: A)`: `torch.gather(x, A, index)`, the elements of `x` at `index`
    /// along axis `A` (the last axis when `axis:` is left out). `index` is `i32` or `i64`, with
    /// `x`'s rank and `x`'s size on every other axis; the result has its shape. `x` may be any
    /// expression: it is evaluated at the gathered positions only.
    fn gather(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &["axis"])?;
        let [x, index] = exact(func, &a, span, "gather(x, index, axis: -1)")?;
        let (xn, ixn) = (self.expr(x)?, self.expr(index)?);
        let (axis, at) =
            one_axis(&a, span, "gather(x, index, axis: -1), an axis of x counted from 0 or, negative, from the end")?;
        self.b.gather(xn, ixn, axis).map_err(|e| {
            let place = match e {
                kfuse_ir::IrError::BadAxis { .. } => at,
                kfuse_ir::IrError::BadDType { .. } => index.span,
                _ => span,
            };
            self.ir_report(e, place, &[])
        })
    }

    /// `size(D)`: the run-time size of dimension symbol `D` as an `i32` scalar, lowered as
    /// `count(iota([D]) >= 0)` so that no new op is needed.
    fn size(&mut self, func: &Ident, args: &[Arg], span: Span) -> Result<NodeId, Report> {
        let a = split(func, args, &[])?;
        let [d] = exact(func, &a, span, "size(D), for a dimension symbol D")?;
        let sym = match &d.kind {
            ExprKind::Name(n) => self.b.graph().symbol(n),
            _ => None,
        };
        let Some(sym) = sym else {
            let what = match &d.kind {
                ExprKind::Name(n) => format!("`{n}` is not a dimension symbol of any input"),
                _ => "this is not a dimension symbol".into(),
            };
            let mut symbols = self.b.graph().symbols.clone();
            symbols.sort_unstable();
            let known = if symbols.is_empty() {
                "a dimension symbol named in an input's type, as in size(N) after `input x: f32[N]`".to_string()
            } else {
                format!("a dimension symbol named in an input's type: {}", symbols.join(", "))
            };
            return Err(Report::new(DiagnosticKind::Type, d.span, format!("`size` takes a dimension, but {what}"))
                .expected(known));
        };
        let all = self.b.all_true(Shape(vec![Dim::Sym(sym)]), 0).map_err(|e| self.ir_report(e, span, &[]))?;
        self.b.reduce(ReduceOp::Count, ReduceAxis::All, all, None).map_err(|e| self.ir_report(e, span, &[]))
    }

    fn unknown_function(&self, func: &Ident) -> Report {
        let n = &func.name;
        if self.scope.contains_key(n) {
            return Report::new(
                DiagnosticKind::UnknownFunction,
                func.span,
                format!("`{n}` is a value, not a function"),
            )
            .expected(format!("a function: {}", FUNCTIONS.join(", ")));
        }
        let r = Report::new(DiagnosticKind::UnknownFunction, func.span, format!("unknown function `{n}`"));
        match closest(n, FUNCTIONS.iter().copied()) {
            Some(s) => r.expected(format!("a built-in function; did you mean `{s}`?")),
            None => r.expected(format!("a built-in function: {}", FUNCTIONS.join(", "))),
        }
    }
}

/// Splits arguments, refusing positional-after-keyword, unknown and repeated keywords.
fn split<'a>(func: &Ident, args: &'a [Arg], allowed: &[&str]) -> Result<SplitArgs<'a>, Report> {
    let mut out = SplitArgs { positional: Vec::new(), keywords: Vec::new() };
    for arg in args {
        match &arg.keyword {
            None if !out.keywords.is_empty() => {
                return Err(Report::new(
                    DiagnosticKind::Arguments,
                    arg.span(),
                    "positional argument after a keyword argument",
                )
                .expected("positional arguments first, then `keyword: value` ones"));
            }
            None => out.positional.push(&arg.value),
            Some(k) if !allowed.contains(&k.name.as_str()) => {
                let what = if allowed.is_empty() {
                    "no keyword arguments".to_string()
                } else {
                    let names: Vec<String> = allowed.iter().map(|a| format!("`{a}:`")).collect();
                    format!("one of {}", names.join(", "))
                };
                return Err(Report::new(
                    DiagnosticKind::Arguments,
                    arg.span(),
                    format!("`{}` has no keyword argument `{}:`", func.name, k.name),
                )
                .expected(what));
            }
            Some(k) if out.keyword(&k.name).is_some() => {
                return Err(Report::new(
                    DiagnosticKind::Arguments,
                    arg.span(),
                    format!("keyword `{}:` given twice", k.name),
                )
                .expected("each keyword at most once"));
            }
            Some(k) => out.keywords.push((k, &arg.value)),
        }
    }
    Ok(out)
}

/// Exactly `N` positional arguments, or a report quoting `signature`.
fn exact<'a, const N: usize>(
    func: &Ident,
    a: &SplitArgs<'a>,
    span: Span,
    signature: &str,
) -> Result<[&'a Expr; N], Report> {
    <[&Expr; N]>::try_from(a.positional.as_slice()).map_err(|_| {
        let plural = if N == 1 { "" } else { "s" };
        Report::new(
            DiagnosticKind::Arguments,
            span,
            format!("`{}` takes {N} argument{plural}, got {}", func.name, a.positional.len()),
        )
        .expected(signature.to_string())
    })
}
