//! The syntax tree the parser produces and the lowering consumes. Untyped: every typing rule is
//! applied by `kfuse_ir::GraphBuilder` during lowering.

use kfuse_ir::{BinaryOp, DType};

use crate::diagnostic::Span;

/// A name with its place in the source.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Ident {
    pub name: String,
    pub span: Span,
}

/// One dimension in an input type: a symbol (`B`) or a constant (`4`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum DimAst {
    Sym(String),
    Const(u64),
}

/// Which ragged layout an `i32` input describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayoutKind {
    /// `as lengths(N)`: valid rows per batch row, each in `0..=N`.
    Lengths,
    /// `as offsets(T)`: segment boundaries of `T` packed rows.
    Offsets,
}

/// `as lengths(DIM)` / `as offsets(DIM)` after an input's type.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Layout {
    pub kind: LayoutKind,
    pub dim: DimAst,
    /// The whole `as ...(...)` clause.
    pub span: Span,
    /// The dimension inside the parentheses.
    pub dim_span: Span,
}

/// One statement (one line, or several when brackets span lines).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stmt {
    /// `input NAME: DTYPE[DIMS]`, optionally followed by `as lengths(DIM)` or `as offsets(DIM)`.
    Input { name: Ident, dtype: DType, dims: Vec<DimAst>, layout: Option<Layout> },
    /// `let NAME = EXPR` or `NAME = EXPR`.
    Let { name: Ident, value: Expr },
    /// `output NAME[: DTYPE] = EXPR`, or `output NAME[: DTYPE]` for an existing value.
    Output { name: Ident, dtype: Option<DType>, value: Option<Expr> },
}

impl Stmt {
    /// The name the statement defines (an output that re-exports a value defines none).
    pub fn defined_name(&self) -> Option<&Ident> {
        match self {
            Stmt::Input { name, .. } | Stmt::Let { name, .. } => Some(name),
            Stmt::Output { name, value: Some(_), .. } => Some(name),
            Stmt::Output { value: None, .. } => None,
        }
    }
}

/// An expression with its span and its nesting depth (bounded, so that recursion over the tree
/// cannot overflow the stack).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Expr {
    pub kind: ExprKind,
    pub span: Span,
    pub depth: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Name(String),
    Neg(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// `x[items]`: NumPy indexing (`x[.., 0]`, `x[.., None]`, `x[1:5, ..]`, `x[:, 0:8:2]`).
    Index {
        x: Box<Expr>,
        items: Vec<IndexItem>,
    },
    Call {
        func: Ident,
        args: Vec<Arg>,
    },
    /// `[a, b, ...]`: a list, as in `axis: [0, 1]` (not a value).
    List(Vec<Expr>),
}

/// A call argument, positional or `name: value`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Arg {
    pub keyword: Option<Ident>,
    pub value: Expr,
}

impl Arg {
    /// The span of the whole argument, keyword included.
    pub fn span(&self) -> Span {
        match &self.keyword {
            Some(k) => k.span.to(self.value.span),
            None => self.value.span,
        }
    }
}

impl Expr {
    /// The greatest depth among the direct sub-expressions.
    pub fn child_depth(kind: &ExprKind) -> u32 {
        match kind {
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::Name(_) => 0,
            ExprKind::Neg(x) | ExprKind::Not(x) => x.depth,
            ExprKind::Index { x, .. } => x.depth,
            ExprKind::Binary(_, a, b) => a.depth.max(b.depth),
            ExprKind::Call { args, .. } => args.iter().map(|a| a.value.depth).max().unwrap_or(0),
            ExprKind::List(items) => items.iter().map(|x| x.depth).max().unwrap_or(0),
        }
    }
}

/// One item of an index `x[...]`, with its span for reports.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexItem {
    pub kind: IndexKind,
    pub span: Span,
}

/// What an index item does to the axes (NumPy's rules).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IndexKind {
    /// `..`: every axis the other items do not name.
    Ellipsis,
    /// `None`: a new axis of size 1.
    NewAxis,
    /// An integer: that element of the axis; the axis goes.
    At(i64),
    /// `start:end:step`, each part optional.
    Slice(Option<i64>, Option<i64>, Option<i64>),
}
