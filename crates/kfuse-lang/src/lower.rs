//! Lowering: statements and expressions to IR nodes, straight through `kfuse_ir::GraphBuilder`,
//! which holds every typing rule. This module adds what the builder cannot know: names and their
//! scopes, source spans, and the wording of each error for the person who wrote the source.
//! Calls of built-in functions are lowered in `builtins.rs`.

use std::collections::HashMap;

use kfuse_ir::{Constraint, DType, Dim, Graph, GraphBuilder, IrError, NodeId, Op, Shape, SymId, UnaryOp};

use crate::ast::{DimAst, Expr, ExprKind, Ident, IndexItem, IndexKind, Layout, LayoutKind, Stmt};
use crate::diagnostic::{DiagnosticKind, Report, Span};
use crate::functions::FUNCTIONS;
use crate::suggest::closest;

/// A value name in scope.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Binding {
    pub node: NodeId,
    pub span: Span,
    /// Whether the name is an `input` (what `grad` differentiates with respect to).
    pub is_input: bool,
}

/// Builds one graph from statements, keeping the names in scope.
pub(crate) struct Lowerer<'s> {
    pub b: GraphBuilder,
    pub scope: HashMap<String, Binding>,
    /// Names that later statements define, to say "defined later" rather than "unknown".
    later: HashMap<String, Span>,
    /// The symbol of each `as lengths(N)` / `as offsets(T)` clause with where it was written; an
    /// input's shape must use it, or it would bind to nothing at run time.
    layout_symbols: Vec<(SymId, Span)>,
    /// Input dtypes that replace the declared ones (`parse_program_with_dtypes`), by name.
    dtype_overrides: Vec<(String, DType)>,
    src: &'s str,
}

impl<'s> Lowerer<'s> {
    pub fn new(src: &'s str) -> Lowerer<'s> {
        Lowerer {
            b: GraphBuilder::new(),
            scope: HashMap::new(),
            later: HashMap::new(),
            layout_symbols: Vec::new(),
            dtype_overrides: Vec::new(),
            src,
        }
    }

    /// Declares inputs in `overrides` with the given dtype instead of the one the source writes.
    pub fn with_dtype_overrides(mut self, overrides: &[(&str, DType)]) -> Lowerer<'s> {
        self.dtype_overrides = overrides.iter().map(|(n, d)| (n.to_string(), *d)).collect();
        self
    }

    /// Lowers a whole program and returns the verified graph.
    pub fn program(mut self, stmts: &[Stmt]) -> Result<Graph, Report> {
        for s in stmts {
            if let Some(name) = s.defined_name() {
                self.later.entry(name.name.clone()).or_insert(name.span);
            }
        }
        for s in stmts {
            self.statement(s)?;
        }
        self.check_layout_symbols()?;
        if self.b.graph().outputs.is_empty() {
            let end = Span::new(self.src.len(), self.src.len());
            return Err(Report::new(DiagnosticKind::NoOutput, end, "the program defines no output")
                .expected("at least one `output NAME = EXPR`"));
        }
        self.finish()
    }

    /// Verifies and returns the graph; a verifier failure is kfuse's bug, reported as such.
    pub fn finish(self) -> Result<Graph, Report> {
        self.b.finish().map_err(|e| {
            Report::new(DiagnosticKind::Internal, Span::new(0, 0), format!("internal error: {e}"))
                .expected("a graph the verifier accepts (this is a bug in kfuse; please report it)")
        })
    }

    fn statement(&mut self, s: &Stmt) -> Result<(), Report> {
        match s {
            Stmt::Input { name, dtype, dims, layout } => {
                let shape = Shape(
                    dims.iter()
                        .map(|d| match d {
                            DimAst::Sym(s) => Dim::Sym(self.b.symbol(s)),
                            DimAst::Const(c) => Dim::Const(*c),
                        })
                        .collect(),
                );
                self.check_new_name(name)?;
                let dtype = self.dtype_overrides.iter().find(|(n, _)| *n == name.name).map_or(*dtype, |(_, d)| *d);
                let node = self.b.input(&name.name, dtype, shape).map_err(|e| self.ir_report(e, name.span, &[]))?;
                if let Some(layout) = layout {
                    self.declare_layout(node, layout)?;
                }
                self.bind(name, node, true);
            }
            Stmt::Let { name, value } => {
                self.check_new_name(name)?;
                let node = self.expr(value)?;
                self.bind(name, node, false);
            }
            Stmt::Output { name, dtype, value } => {
                let node = match value {
                    Some(v) => {
                        self.check_new_name(name)?;
                        self.expr(v)?
                    }
                    None => self.lookup(name)?.node,
                };
                let node = match dtype {
                    Some(d) => self.b.cast(node, *d),
                    None => node,
                };
                self.b.output(&name.name, node).map_err(|e| self.ir_report(e, name.span, &[]))?;
                if value.is_some() {
                    self.bind(name, node, false);
                }
            }
        }
        Ok(())
    }

    /// Records `as lengths(DIM)` / `as offsets(DIM)` on the input read by `node`.
    fn declare_layout(&mut self, node: NodeId, layout: &Layout) -> Result<(), Report> {
        let Op::Input(input) = self.b.node(node).op else {
            return Err(Report::new(
                DiagnosticKind::Internal,
                layout.span,
                "internal error: an input without an input node",
            )
            .expected("an input node (this is a bug in kfuse; please report it)"));
        };
        let dim = match &layout.dim {
            DimAst::Sym(s) => {
                let sym = self.b.symbol(s);
                self.layout_symbols.push((sym, layout.dim_span));
                Dim::Sym(sym)
            }
            DimAst::Const(c) => Dim::Const(*c),
        };
        let c = match layout.kind {
            LayoutKind::Lengths => Constraint::Lengths { input, max: dim },
            LayoutKind::Offsets => Constraint::Offsets { input, total: dim },
        };
        self.b.constrain(c).map_err(|e| self.ir_report(e, layout.span, &[]))
    }

    /// Every symbol named by a layout clause must size some input's axis.
    fn check_layout_symbols(&self) -> Result<(), Report> {
        let g = self.b.graph();
        for &(sym, span) in &self.layout_symbols {
            if !g.inputs.iter().any(|i| i.shape.dims().contains(&Dim::Sym(sym))) {
                let name = g.dim_str(Dim::Sym(sym));
                return Err(Report::new(
                    DiagnosticKind::Shape,
                    span,
                    format!("dimension `{name}` sizes no input's axis, so nothing gives it a value"),
                )
                .expected(format!(
                    "a dimension of the padded or packed inputs, as in `input pred: f32[B, {name}, 4]` or `f32[{name}, 4]`"
                )));
            }
        }
        Ok(())
    }

    /// Declares a named input (for `parse_expression`, whose inputs come from the caller).
    pub fn declare_input(&mut self, name: &str, dtype: DType, shape: Shape) -> Result<(), Report> {
        let ident = Ident { name: name.to_string(), span: Span::new(0, 0) };
        if self.scope.contains_key(name) {
            return Err(Report::new(
                DiagnosticKind::DuplicateName,
                ident.span,
                format!("variable `{name}` is given twice"),
            )
            .expected("distinct variable names"));
        }
        let node = self.b.input(name, dtype, shape).map_err(|e| self.ir_report(e, ident.span, &[]))?;
        self.bind(&ident, node, true);
        Ok(())
    }

    fn bind(&mut self, name: &Ident, node: NodeId, is_input: bool) {
        self.scope.insert(name.name.clone(), Binding { node, span: name.span, is_input });
    }

    fn check_new_name(&self, name: &Ident) -> Result<(), Report> {
        match self.scope.get(&name.name) {
            Some(prev) => Err(Report::new(
                DiagnosticKind::DuplicateName,
                name.span,
                format!("`{}` is already defined", name.name),
            )
            .expected(format!(
                "a new name (`{}` was first defined at line {})",
                name.name,
                self.line_of(prev.span)
            ))),
            None => Ok(()),
        }
    }

    fn line_of(&self, span: Span) -> usize {
        let end = span.start.min(self.src.len());
        self.src.as_bytes()[..end].iter().filter(|&&c| c == b'\n').count() + 1
    }

    /// The binding of a name, or a report that says why there is none.
    pub fn lookup(&self, name: &Ident) -> Result<Binding, Report> {
        if let Some(b) = self.scope.get(&name.name) {
            return Ok(*b);
        }
        let n = &name.name;
        let report = Report::new(DiagnosticKind::UnknownName, name.span, format!("unknown name `{n}`"));
        Err(if let Some(def) = self.later.get(n) {
            report.expected(format!(
                "a name defined above this line (`{n}` is defined later, at line {})",
                self.line_of(*def)
            ))
        } else if FUNCTIONS.contains(&n.as_str()) {
            report.expected(format!("a value; `{n}` is a function, call it as {n}(...)"))
        } else if self.b.graph().symbol(n).is_some() {
            report.expected(format!("a value; `{n}` is a dimension symbol (size({n}) is its run-time size as an i32)"))
        } else if let Some(s) = closest(n, self.sorted_names()) {
            report.expected(format!("a defined name; did you mean `{s}`?"))
        } else {
            report.expected("a name defined above by `input`, `let` or `output`")
        })
    }

    /// The names in scope, sorted so that suggestions do not depend on hash order.
    fn sorted_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.scope.keys().map(String::as_str).collect();
        v.sort_unstable();
        v
    }

    /// Lowers an expression to a node.
    pub fn expr(&mut self, e: &Expr) -> Result<NodeId, Report> {
        match &e.kind {
            ExprKind::Int(v) => self.int_literal(*v, e.span),
            ExprKind::Float(v) => Ok(self.b.lit_float(*v)),
            ExprKind::Bool(v) => Ok(self.b.lit_bool(*v)),
            ExprKind::Name(n) => Ok(self.lookup(&Ident { name: n.clone(), span: e.span })?.node),
            // A negated literal stays a (weak) literal, so `x * -1.5` keeps x's dtype.
            ExprKind::Neg(x) => match x.kind {
                ExprKind::Int(v) => self.int_literal(-v, e.span),
                ExprKind::Float(v) => Ok(self.b.lit_float(-v)),
                _ => {
                    let x = self.expr(x)?;
                    self.b.unary(UnaryOp::Neg, x).map_err(|err| self.ir_report(err, e.span, &[]))
                }
            },
            ExprKind::Not(x) => {
                let x = self.expr(x)?;
                self.b.unary(UnaryOp::Not, x).map_err(|err| self.ir_report(err, e.span, &[]))
            }
            ExprKind::Binary(op, a, c) => {
                let (a, c) = (self.expr(a)?, self.expr(c)?);
                self.b.binary(*op, a, c).map_err(|err| self.ir_report(err, e.span, &[a, c]))
            }
            ExprKind::Index { x, items } => {
                let x = self.expr(x)?;
                self.index(x, items, e.span)
            }
            ExprKind::Call { func, args } => self.call(func, args, e.span),
            ExprKind::List(_) => Err(Report::new(DiagnosticKind::Type, e.span, "a list `[...]` is not a value")
                .expected("a list only as the axes of a reduction: sum(x, axis: [0, 1])")),
        }
    }

    /// `x[items]` with NumPy's rules: integers and slices name the axes from the left, `..`
    /// stands for the axes they leave, `None` inserts an axis of size 1.
    fn index(&mut self, x: NodeId, items: &[IndexItem], span: Span) -> Result<NodeId, Report> {
        let rank = self.b.node(x).shape.rank();
        let named = items.iter().filter(|i| matches!(i.kind, IndexKind::At(_) | IndexKind::Slice(..))).count();
        let mut ellipses = items.iter().filter(|i| i.kind == IndexKind::Ellipsis);
        if let (Some(_), Some(second)) = (ellipses.next(), ellipses.next()) {
            return Err(Report::new(DiagnosticKind::Syntax, second.span, "an index has at most one `..`")
                .expected("one `..` for the axes the other items leave, as in x[.., 0] or x[0, ..]"));
        }
        if named > rank {
            let shape = self.shape_str(x);
            return Err(Report::new(
                DiagnosticKind::Shape,
                span,
                format!("{named} axes are indexed, but the tensor has shape {shape} ({rank} axes)"),
            )
            .expected(format!("at most {rank} integers and slices, with `..` for the axes left as they are")));
        }
        let mut pos = 0i64;
        let mut cur = x;
        for item in items {
            let at = item.span;
            let big = |v: Option<i64>| v.is_some_and(|v| i32::try_from(v).is_err());
            let too_large = match item.kind {
                IndexKind::At(i) => big(Some(i)),
                IndexKind::Slice(a, b, c) => big(a) || big(b) || big(c),
                _ => false,
            };
            if too_large {
                return Err(Report::new(DiagnosticKind::Shape, at, "an index or slice bound is too large")
                    .expected(format!("indices and bounds of magnitude at most {}", i32::MAX)));
            }
            let r = match item.kind {
                IndexKind::Ellipsis => {
                    pos += (rank - named) as i64;
                    continue;
                }
                IndexKind::NewAxis => {
                    let axes = u32::try_from(pos).ok().and_then(|p| 1u32.checked_shl(p)).unwrap_or(0);
                    let r = if axes == 0 {
                        Err(IrError::BadAxis {
                            op: "None",
                            axis: pos,
                            rank,
                            why: "is past the axes kfuse can name".into(),
                        })
                    } else {
                        self.b.unsqueeze(cur, axes)
                    };
                    pos += 1;
                    r
                }
                IndexKind::At(i) => self.b.select_index(cur, pos, i),
                IndexKind::Slice(a, b, c) => {
                    pos += 1;
                    self.b.slice(cur, pos - 1, a, b, c)
                }
            };
            cur = r.map_err(|err| self.ir_report(err, at, &[]))?;
        }
        Ok(cur)
    }

    /// Integer literals are `i32`: larger ones would silently wrap in an `i32` computation.
    fn int_literal(&mut self, v: i64, span: Span) -> Result<NodeId, Report> {
        if i32::try_from(v).is_err() {
            return Err(Report::new(DiagnosticKind::Type, span, format!("integer literal {v} does not fit in i32"))
                .expected(format!("an integer from {} to {}, or a float literal like {v}.0", i32::MIN, i32::MAX)));
        }
        Ok(self.b.lit_int(v))
    }

    pub fn dtype(&self, node: NodeId) -> DType {
        self.b.node(node).dtype
    }

    pub fn shape_str(&self, node: NodeId) -> String {
        self.b.graph().shape_str(&self.b.node(node).shape)
    }

    /// Turns a builder error into a report at `span`. `operands` (when given) are the operands in
    /// source order, so that a kind mismatch names them in the order the user wrote them.
    pub fn ir_report(&self, e: IrError, span: Span, operands: &[NodeId]) -> Report {
        let kind = match e {
            IrError::Broadcast { .. }
            | IrError::ComponentOutOfRange { .. }
            | IrError::ComponentNeedsConstAxis { .. }
            | IrError::RankTooLow { .. }
            | IrError::MaskShape { .. }
            | IrError::GatherShape { .. }
            | IrError::RandSeedShape { .. }
            | IrError::BadView { .. }
            | IrError::BadReshape { .. }
            | IrError::EmptyStack => DiagnosticKind::Shape,
            IrError::BadDType { .. } | IrError::KindMismatch { .. } | IrError::BadConstraint { .. } => {
                DiagnosticKind::Type
            }
            IrError::DuplicateName(_) => DiagnosticKind::DuplicateName,
            IrError::BadAxis { .. } => DiagnosticKind::Axis,
            IrError::NotDifferentiable { .. } => DiagnosticKind::Grad,
            IrError::UnknownSymbol(_) | IrError::Malformed(_) => DiagnosticKind::Internal,
        };
        let mut message = e.to_string();
        let expected: String = match &e {
            IrError::Broadcast { .. } => {
                "shapes that broadcast: aligned from the right, equal dimensions or 1 (x[.., None] adds a last axis of size 1)".into()
            }
            IrError::BadDType { op, .. } => expected_operands(op).into(),
            IrError::KindMismatch { op, .. } => {
                if let [a, c] = operands {
                    message = format!("`{op}` needs operands of the same kind, got {} and {}", self.dtype(*a), self.dtype(*c));
                }
                expected_same_kind(op).into()
            }
            IrError::ComponentOutOfRange { size: 0, .. } => "a last axis with at least one component".into(),
            IrError::ComponentOutOfRange { size, .. } => format!("an index from -{size} to {}", size - 1),
            IrError::ComponentNeedsConstAxis { .. } => "a tensor whose last dimension is a constant, as in f32[N, 4]".into(),
            IrError::RankTooLow { min, .. } => format!("a tensor of rank {min} or more, not a scalar"),
            IrError::MaskShape { .. } => {
                "a mask whose shape broadcasts to the operand's (a [B, N] mask over a [B, N, 4] operand is written mask[.., None])".into()
            }
            IrError::GatherShape { axis, .. } => format!(
                "an index with the source's rank whose size differs from the source's on axis {axis} only, as in gather(x, labels[.., None], axis: -1) for x: f32[B, C], labels: i64[B]"
            ),
            IrError::RandSeedShape { .. } => "a scalar seed, as in rand_like(x, seed) for `input seed: i64`".into(),
            IrError::BadView { op: "cat", .. } => {
                "parts of one rank, equal sizes on every other axis and constant sizes along the axis, as in cat([a, b], axis: 1)".into()
            }
            IrError::BadView { op: "select", .. } => {
                "an index within the axis (negative ones count from the end of an axis of constant size)".into()
            }
            IrError::BadView { .. } => {
                "a slice start:end:step with a positive step; on an axis of symbolic size, constant bounds >= 0 and an end, as in x[.., 0:8]".into()
            }
            IrError::BadReshape { .. } => "a shape with the same elements whose symbolic axes stay whole and in order, constant axes splitting or merging between them, as in reshape(x, [B, N, 4, 16]) for x: f32[B, N, 64]".into(),
            IrError::DuplicateName(_) => "a name that is not used yet".into(),
            IrError::BadAxis { rank: 0, .. } => "no axis: a scalar reduces over every element, as in sum(x)".into(),
            IrError::BadAxis { rank, .. } => format!(
                "axes from 0 to {} (or -{rank} to -1, counting from the end), each named once, as in axis: 0 or axis: [0, -1]",
                rank - 1
            ),
            IrError::BadConstraint { layout: "offsets", .. } => {
                "an i32 input of one axis, as in `input offsets: i32[S] as offsets(T)`".into()
            }
            IrError::BadConstraint { .. } => "an i32 input, as in `input lengths: i32[B] as lengths(N)`".into(),
            IrError::NotDifferentiable { .. } => "a scalar float built from differentiable operations of the input".into(),
            IrError::EmptyStack | IrError::UnknownSymbol(_) | IrError::Malformed(_) => {
                "a graph the builder accepts (this is a bug in kfuse; please report it)".into()
            }
        };
        Report::new(kind, span, message).expected(expected)
    }
}

fn expected_operands(op: &str) -> &'static str {
    match op {
        "and" | "or" | "not" => "bool operands, such as comparisons",
        "where" => "a bool condition, such as x > 0",
        "where:" => "a bool mask, such as where: x > 0",
        "count" => "a bool tensor, as in count(x > 0)",
        "gather" => "an i32 or i64 index (i64(x) converts a float)",
        "rand_like" => "an integer seed: a literal or an i32 or i64 scalar, as in rand_like(x, seed)",
        "sum" | "mean" | "max" | "min" | "prod" => {
            "numbers to reduce (count(...) counts the true elements of a bool tensor)"
        }
        "bitwise_and" | "bitwise_or" | "bitwise_xor" | "bitwise_not" => {
            "i32, i64 or bool operands (i32(x) converts a float)"
        }
        "bitwise_left_shift" | "bitwise_right_shift" => "i32 or i64 operands (i32(x) converts a float)",
        _ => "numbers: f32, f16, bf16, i32 or i64",
    }
}

fn expected_same_kind(op: &str) -> &'static str {
    match op {
        "==" | "!=" => "two numbers or two bools",
        "and" | "or" => "bools on both sides",
        "where" => "two branches of the same kind: two numbers or two bools",
        "clamp" => "numbers for x, lo and hi",
        "fma" => "numbers for a, b and c",
        "bitwise_and" | "bitwise_or" | "bitwise_xor" => "two integers or two bools",
        _ => "numbers on both sides (use where(c, 1.0, 0.0) to turn a bool into a number)",
    }
}
