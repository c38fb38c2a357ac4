//! The parser: tokens to statements and expressions, by recursive descent.
//!
//! Precedence, loosest first (as in Python): `or` < `and` < `not` < comparisons (which do not
//! chain) < `+ -` < `* /` < unary `-` < postfix `[.., K]` / `[.., None]`. Binary operators are
//! left-associative. Nesting is bounded ([`MAX_NESTING`], [`MAX_DEPTH`]) so that no input can
//! overflow the stack.
//! Names, types and arities are checked later, by the lowering.

use kfuse_ir::{BinaryOp, DType};

use crate::ast::{Arg, DimAst, Expr, ExprKind, Ident, IndexItem, IndexKind, Layout, LayoutKind, Stmt};
use crate::diagnostic::{DiagnosticKind, Report, Span};
use crate::lexer::{Tok, Token};

/// The deepest expression tree accepted (a chain `a + b + ...` nests one level per operator).
pub(crate) const MAX_DEPTH: u32 = 256;

/// The deepest parser recursion accepted (parentheses, calls, unary operators); each level costs
/// a dozen stack frames, so this is kept well inside a 2 MiB thread stack.
pub(crate) const MAX_NESTING: u32 = 64;

const EXPR_START: &str = "an expression (a name, a number, `(`, `-` or `not`)";

/// A parser over a token list that ends with [`Tok::Eof`].
pub(crate) struct Parser<'t> {
    toks: &'t [Token],
    pos: usize,
    nesting: u32,
}

impl<'t> Parser<'t> {
    pub fn new(toks: &'t [Token]) -> Parser<'t> {
        Parser { toks, pos: 0, nesting: 0 }
    }

    /// A whole program: statements separated by line breaks.
    pub fn program(&mut self) -> Result<Vec<Stmt>, Report> {
        let mut stmts = Vec::new();
        loop {
            self.skip_newlines();
            if self.peek().tok == Tok::Eof {
                return Ok(stmts);
            }
            stmts.push(self.statement()?);
            self.end_of_statement()?;
        }
    }

    /// A lone expression, optionally surrounded by blank lines and comments.
    pub fn standalone_expression(&mut self) -> Result<Expr, Report> {
        self.skip_newlines();
        let e = self.expr()?;
        self.skip_newlines();
        match self.peek().tok {
            Tok::Eof => Ok(e),
            _ => Err(self.unexpected("an operator or the end of the expression")),
        }
    }

    fn peek(&self) -> &Token {
        // The list ends with Eof and `pos` never passes it.
        &self.toks[self.pos.min(self.toks.len().saturating_sub(1))]
    }

    fn peek_at(&self, ahead: usize) -> &Tok {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[(self.pos + ahead).min(last)].tok
    }

    fn bump(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.pos += 1;
        }
        t
    }

    fn eat(&mut self, tok: &Tok) -> Option<Span> {
        (&self.peek().tok == tok).then(|| self.bump().span)
    }

    fn expect(&mut self, tok: &Tok, expected: &str) -> Result<Span, Report> {
        self.eat(tok).ok_or_else(|| self.unexpected(expected))
    }

    fn unexpected(&self, expected: &str) -> Report {
        let t = self.peek();
        Report::new(DiagnosticKind::Syntax, t.span, format!("unexpected {}", t.tok.describe())).expected(expected)
    }

    fn skip_newlines(&mut self) {
        while self.eat(&Tok::Newline).is_some() {}
    }

    fn end_of_statement(&mut self) -> Result<(), Report> {
        match self.peek().tok {
            Tok::Newline | Tok::Eof => Ok(()),
            _ => Err(self.unexpected("an operator or the end of the line")),
        }
    }

    fn ident(&mut self, expected: &str) -> Result<Ident, Report> {
        match &self.peek().tok {
            Tok::Ident(name) => {
                let name = name.clone();
                Ok(Ident { name, span: self.bump().span })
            }
            _ => Err(self.unexpected(expected)),
        }
    }

    fn statement(&mut self) -> Result<Stmt, Report> {
        match &self.peek().tok {
            Tok::Input => {
                self.bump();
                let name = self.ident("the input's name, as in `input x: f32[N]`")?;
                self.expect(&Tok::Colon, "`:` and the input's type, as in `input x: f32[N]`")?;
                let dtype = self.dtype()?;
                let dims = self.dims()?;
                let layout = self.layout()?;
                Ok(Stmt::Input { name, dtype, dims, layout })
            }
            Tok::Let => {
                self.bump();
                let name = self.ident("a name to define, as in `let y = x * 2`")?;
                self.expect(&Tok::Assign, "`=` and a value")?;
                Ok(Stmt::Let { name, value: self.expr()? })
            }
            Tok::Output => {
                self.bump();
                let name = self.ident("the output's name, as in `output loss = ...`")?;
                let dtype = match self.eat(&Tok::Colon) {
                    Some(_) => Some(self.dtype()?),
                    None => None,
                };
                let value = match self.peek().tok {
                    Tok::Newline | Tok::Eof => None,
                    _ => {
                        self.expect(&Tok::Assign, "`=` and a value, or the end of the line")?;
                        Some(self.expr()?)
                    }
                };
                Ok(Stmt::Output { name, dtype, value })
            }
            Tok::Ident(_) if *self.peek_at(1) == Tok::Assign => {
                let name = self.ident("a name")?;
                self.bump();
                Ok(Stmt::Let { name, value: self.expr()? })
            }
            Tok::Ident(_) => {
                self.bump();
                Err(self.unexpected(
                    "`=`: a statement is `input ...`, `let NAME = ...`, `NAME = ...` or `output NAME = ...`",
                ))
            }
            _ => Err(self.unexpected(
                "a statement: `input NAME: TYPE`, `let NAME = EXPR`, `NAME = EXPR` or `output NAME = EXPR`",
            )),
        }
    }

    fn dtype(&mut self) -> Result<DType, Report> {
        const TYPES: &str = "a dtype: f32, f16, bf16, i32, i64 or bool";
        match &self.peek().tok {
            Tok::Ident(name) => match DType::from_name(name) {
                Some(d) => {
                    self.bump();
                    Ok(d)
                }
                None => {
                    let t = self.peek();
                    Err(Report::new(DiagnosticKind::Syntax, t.span, format!("unknown dtype `{name}`")).expected(TYPES))
                }
            },
            _ => Err(self.unexpected(TYPES)),
        }
    }

    /// `[B, N, 4]`, `[]` or nothing (a scalar).
    fn dims(&mut self) -> Result<Vec<DimAst>, Report> {
        let mut dims = Vec::new();
        if self.eat(&Tok::LBracket).is_none() {
            return Ok(dims);
        }
        const DIM: &str = "a dimension: a symbol like `N` or a size like `4`";
        loop {
            if self.eat(&Tok::RBracket).is_some() {
                return Ok(dims);
            }
            match self.peek().tok.clone() {
                Tok::Ident(s) => dims.push(DimAst::Sym(s)),
                Tok::Int(v) => dims.push(DimAst::Const(u64::try_from(v).map_err(|_| self.unexpected(DIM))?)),
                _ => return Err(self.unexpected(DIM)),
            }
            self.bump();
            if self.eat(&Tok::Comma).is_none() {
                self.expect(&Tok::RBracket, "`,` or `]`")?;
                return Ok(dims);
            }
        }
    }

    /// An optional `as lengths(DIM)` / `as offsets(DIM)` after an input's type. `as`, `lengths`
    /// and `offsets` are contextual words, so they stay usable as names elsewhere.
    fn layout(&mut self) -> Result<Option<Layout>, Report> {
        const LAYOUT: &str = "a ragged layout: `as lengths(N)` (valid rows per batch row) or `as offsets(T)` (packed segment boundaries)";
        let start = match &self.peek().tok {
            Tok::Ident(w) if w == "as" => self.bump().span,
            _ => return Ok(None),
        };
        let kind = match &self.peek().tok {
            Tok::Ident(w) if w == "lengths" => LayoutKind::Lengths,
            Tok::Ident(w) if w == "offsets" => LayoutKind::Offsets,
            _ => return Err(self.unexpected(LAYOUT)),
        };
        self.bump();
        self.expect(&Tok::LParen, "`(` and a dimension, as in `as lengths(N)`")?;
        const DIM: &str = "a dimension: a symbol like `N` or a size like `256`";
        let dim = match self.peek().tok.clone() {
            Tok::Ident(s) => DimAst::Sym(s),
            Tok::Int(v) => DimAst::Const(u64::try_from(v).map_err(|_| self.unexpected(DIM))?),
            _ => return Err(self.unexpected(DIM)),
        };
        let dim_span = self.bump().span;
        let close = self.expect(&Tok::RParen, "`)`")?;
        Ok(Some(Layout { kind, dim, span: start.to(close), dim_span }))
    }

    /// Builds an expression node, refusing nesting deeper than [`MAX_DEPTH`].
    fn node(&self, kind: ExprKind, span: Span) -> Result<Expr, Report> {
        let depth = Expr::child_depth(&kind) + 1;
        if depth > MAX_DEPTH {
            return Err(too_deep(span));
        }
        Ok(Expr { kind, span, depth })
    }

    /// Runs `f` one level deeper in the recursion, refusing to go past [`MAX_DEPTH`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T, Report>) -> Result<T, Report> {
        if self.nesting >= MAX_NESTING {
            return Err(Report::new(
                DiagnosticKind::Syntax,
                self.peek().span,
                format!("expression nested more than {MAX_NESTING} levels deep"),
            )
            .expected("fewer nested parentheses or calls: name parts of the expression with `let`"));
        }
        self.nesting += 1;
        let r = f(self);
        self.nesting -= 1;
        r
    }

    pub fn expr(&mut self) -> Result<Expr, Report> {
        self.nested(|p| p.or())
    }

    fn binary_chain(
        &mut self,
        ops: &[(Tok, Infix)],
        mut operand: impl FnMut(&mut Self) -> Result<Expr, Report>,
    ) -> Result<Expr, Report> {
        let mut lhs = operand(self)?;
        while let Some(&(_, op)) = ops.iter().find(|(t, _)| *t == self.peek().tok) {
            let at = self.bump().span;
            let rhs = operand(self)?;
            let span = lhs.span.to(rhs.span);
            let kind = match op {
                Infix::Op(op) => ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                Infix::Func(name) => call(name, at, vec![lhs, rhs]),
            };
            lhs = self.node(kind, span)?;
        }
        Ok(lhs)
    }

    fn or(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::Or, Infix::Op(BinaryOp::Or))], |p| p.and())
    }

    fn and(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::And, Infix::Op(BinaryOp::And))], |p| p.not())
    }

    fn not(&mut self) -> Result<Expr, Report> {
        match self.eat(&Tok::Not) {
            Some(span) => {
                let x = self.nested(|p| p.not())?;
                let span = span.to(x.span);
                self.node(ExprKind::Not(Box::new(x)), span)
            }
            None => self.comparison(),
        }
    }

    fn comparison(&mut self) -> Result<Expr, Report> {
        let lhs = self.bit_or()?;
        let Some(op) = comparison_op(&self.peek().tok) else {
            return Ok(lhs);
        };
        self.bump();
        let rhs = self.bit_or()?;
        if comparison_op(&self.peek().tok).is_some() {
            let t = self.peek();
            return Err(Report::new(DiagnosticKind::Syntax, t.span, "comparisons do not chain")
                .expected("one comparison; join two with `and`, as in (a < b) and (b < c)"));
        }
        let span = lhs.span.to(rhs.span);
        self.node(ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)), span)
    }

    // Python's precedence, as PyTorch's operators have it: `|` below `^` below `&` below shifts,
    // all above comparisons and below `+ -`; `//` and `%` with `*` and `/`; `~` with unary `-`.
    // Each operator is the named function it stands for (`a & b` is `bitwise_and(a, b)`).
    fn bit_or(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::Pipe, Infix::Func("bitwise_or"))], |p| p.bit_xor())
    }

    fn bit_xor(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::Caret, Infix::Func("bitwise_xor"))], |p| p.bit_and())
    }

    fn bit_and(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::Amp, Infix::Func("bitwise_and"))], |p| p.shift())
    }

    fn shift(&mut self) -> Result<Expr, Report> {
        let ops = [(Tok::Shl, Infix::Func("bitwise_left_shift")), (Tok::Shr, Infix::Func("bitwise_right_shift"))];
        self.binary_chain(&ops, |p| p.additive())
    }

    fn additive(&mut self) -> Result<Expr, Report> {
        self.binary_chain(&[(Tok::Plus, Infix::Op(BinaryOp::Add)), (Tok::Minus, Infix::Op(BinaryOp::Sub))], |p| {
            p.multiplicative()
        })
    }

    fn multiplicative(&mut self) -> Result<Expr, Report> {
        let ops = [
            (Tok::Star, Infix::Op(BinaryOp::Mul)),
            (Tok::Slash, Infix::Op(BinaryOp::Div)),
            (Tok::SlashSlash, Infix::Func("floor_div")),
            (Tok::Percent, Infix::Func("remainder")),
        ];
        self.binary_chain(&ops, |p| p.unary())
    }

    fn unary(&mut self) -> Result<Expr, Report> {
        if let Some(span) = self.eat(&Tok::Minus) {
            let x = self.nested(|p| p.unary())?;
            let span = span.to(x.span);
            return self.node(ExprKind::Neg(Box::new(x)), span);
        }
        if let Some(at) = self.eat(&Tok::Tilde) {
            let x = self.nested(|p| p.unary())?;
            let span = at.to(x.span);
            return self.node(call("bitwise_not", at, vec![x]), span);
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, Report> {
        let mut x = self.primary()?;
        while self.eat(&Tok::LBracket).is_some() {
            let mut items = Vec::new();
            loop {
                items.push(self.index_item()?);
                if self.eat(&Tok::Comma).is_none() {
                    break;
                }
            }
            let close = self.expect(&Tok::RBracket, "`,` or `]`")?;
            let span = x.span.to(close);
            x = self.node(ExprKind::Index { x: Box::new(x), items }, span)?;
        }
        Ok(x)
    }

    /// One item of `x[...]`: `..`, `None`, an integer or a slice `start:end:step` (parts
    /// optional, integers maybe negative).
    fn index_item(&mut self) -> Result<IndexItem, Report> {
        const ITEM: &str = "an index item: `..`, `None`, an integer or a slice such as 1:5 or 0:8:2, as in x[.., 0]";
        let first = self.peek().span;
        if let Some(span) = self.eat(&Tok::DotDot) {
            return Ok(IndexItem { kind: IndexKind::Ellipsis, span });
        }
        if let Some(span) = self.eat(&Tok::None) {
            return Ok(IndexItem { kind: IndexKind::NewAxis, span });
        }
        let mut parts: Vec<Option<i64>> = Vec::new();
        let mut span = first;
        loop {
            let value = match self.peek().tok {
                Tok::Int(_) | Tok::Minus => {
                    let neg = self.eat(&Tok::Minus);
                    let Tok::Int(v) = self.peek().tok else { return Err(self.unexpected(ITEM)) };
                    let t = self.bump();
                    span = span.to(t.span);
                    Some(if neg.is_some() { -v } else { v })
                }
                _ => None,
            };
            parts.push(value);
            match self.eat(&Tok::Colon) {
                Some(c) if parts.len() < 3 => span = span.to(c),
                _ => break,
            }
        }
        let kind = match parts[..] {
            [Some(i)] => IndexKind::At(i),
            [None] => return Err(self.unexpected(ITEM)),
            [a, b] => IndexKind::Slice(a, b, None),
            [a, b, c] => IndexKind::Slice(a, b, c),
            _ => return Err(self.unexpected(ITEM)),
        };
        Ok(IndexItem { kind, span })
    }

    fn primary(&mut self) -> Result<Expr, Report> {
        let t = self.peek().clone();
        let kind = match t.tok {
            Tok::Int(v) => ExprKind::Int(v),
            Tok::Float(v) => ExprKind::Float(v),
            Tok::True => ExprKind::Bool(true),
            Tok::False => ExprKind::Bool(false),
            Tok::LParen => {
                self.bump();
                let mut e = self.expr()?;
                let close = self.expect(&Tok::RParen, "`)` or an operator")?;
                e.span = t.span.to(close);
                return Ok(e);
            }
            Tok::Ident(name) if *self.peek_at(1) == Tok::LParen => {
                let func = Ident { name, span: t.span };
                self.bump();
                self.bump();
                let args = self.nested(|p| p.arguments())?;
                let close = self.expect(&Tok::RParen, "`,` or `)`")?;
                return self.node(ExprKind::Call { func, args }, t.span.to(close));
            }
            Tok::Ident(name) => ExprKind::Name(name),
            Tok::LBracket => return self.list(),
            _ => return Err(self.unexpected(EXPR_START)),
        };
        self.bump();
        self.node(kind, t.span)
    }

    /// A list `[a, b, ...]` (the `[` is next). Kept out of `primary` so that its locals do not
    /// enlarge the frame of every nesting level.
    #[inline(never)]
    fn list(&mut self) -> Result<Expr, Report> {
        let open = self.bump().span;
        let items = self.nested(|p| {
            let mut items = Vec::new();
            while p.peek().tok != Tok::RBracket {
                items.push(p.expr()?);
                if p.eat(&Tok::Comma).is_none() {
                    break;
                }
            }
            Ok(items)
        })?;
        let close = self.expect(&Tok::RBracket, "`,` or `]`")?;
        self.node(ExprKind::List(items), open.to(close))
    }

    /// Call arguments up to (not including) the closing `)`.
    fn arguments(&mut self) -> Result<Vec<Arg>, Report> {
        let mut args = Vec::new();
        while self.peek().tok != Tok::RParen {
            let keyword = match (&self.peek().tok, self.peek_at(1)) {
                (Tok::Ident(_), Tok::Colon) => {
                    let k = self.ident("a keyword")?;
                    self.bump();
                    Some(k)
                }
                _ => None,
            };
            args.push(Arg { keyword, value: self.expr()? });
            if self.eat(&Tok::Comma).is_none() {
                break;
            }
        }
        Ok(args)
    }
}

/// What an infix operator builds: a binary node, or a call of the named function it stands for.
#[derive(Clone, Copy)]
enum Infix {
    Op(BinaryOp),
    Func(&'static str),
}

/// A call of the function `name`, written as the operator at `at`, with positional `args`.
fn call(name: &'static str, at: Span, args: Vec<Expr>) -> ExprKind {
    ExprKind::Call {
        func: Ident { name: name.to_string(), span: at },
        args: args.into_iter().map(|value| Arg { keyword: None, value }).collect(),
    }
}

fn comparison_op(t: &Tok) -> Option<BinaryOp> {
    Some(match t {
        Tok::EqEq => BinaryOp::Eq,
        Tok::NotEq => BinaryOp::Ne,
        Tok::Lt => BinaryOp::Lt,
        Tok::Le => BinaryOp::Le,
        Tok::Gt => BinaryOp::Gt,
        Tok::Ge => BinaryOp::Ge,
        _ => return None,
    })
}

fn too_deep(span: Span) -> Report {
    Report::new(DiagnosticKind::Syntax, span, format!("expression nested more than {MAX_DEPTH} levels deep"))
        .expected("a shallower expression: name parts of it with `let`")
}
