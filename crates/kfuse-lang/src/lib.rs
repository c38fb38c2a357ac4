//! The `.kf` language: a small, NumPy-flavoured description of a computation, parsed and lowered
//! into a typed [`kfuse_ir::Graph`] through [`kfuse_ir::GraphBuilder`] (which holds every typing
//! rule; this crate holds none of its own beyond names, arities and axes).
//!
//! ```text
//! # Comments start with #. Statements end at a line break (not inside brackets).
//! input pred:   f32[B, N, 4]          # dtype f32 f16 bf16 i32 i64 bool; dims: symbols or sizes
//! input scale:  f32                   # a scalar (also `f32[]`)
//! let valid = pred[.., 3] != 0        # last-axis component; negative indices count from the end
//! w = where(valid, 1.0, 0.0)          # `let` is optional
//! output loss = sum(pred[.., 0] * w, where: valid) / max(count(valid), 1)
//! output half: f16 = pred * scale     # an output dtype casts
//! output d = grad(loss, pred)         # gradient of a scalar float w.r.t. an input
//!
//! input lengths: i32[B] as lengths(N) # ragged, padded: 0 <= lengths[b] <= N, checked at run time
//! let valid = mask(lengths)           # bool[B, N]: valid[b, n] is n < lengths[b]
//! input offsets: i32[S] as offsets(T) # ragged, packed: offsets[0] = 0 <= ... <= offsets[S-1] = T
//! let rows = size(T)                  # the run-time size of a dimension symbol, as an i32
//! input labels: i64[B]                # class indices, as torch's int64
//! let one_hot = iota(x, axis: -1) == labels[.., None]   # iota: each element's index along an axis
//! let picked = gather(x, labels[.., None], axis: -1)    # torch.gather: x[b, labels[b]], as [B, 1]
//! ```
//!
//! Precedence, loosest first (Python's): `or`, `and`, `not`, comparisons (non-chaining), `|`,
//! `^`, `&`, `<< >>`, `+ -`, `* / // %`, unary `- ~`, postfix indexing `[...]` (see below). The
//! operators `| ^ & << >> // % ~` are the functions `bitwise_or bitwise_xor bitwise_and
//! bitwise_left_shift bitwise_right_shift floor_div remainder bitwise_not` (so `valid & (x > 0)`
//! is a mask, and the comparison needs its brackets, as in PyTorch). Functions: `where(c, a, b)`, `min(a, b)`,
//! `max(a, b)`, `clamp(x, lo, hi)`, `pow(a, b)`, `fma(a, b, c)` (`a * b + c` rounded once),
//! `abs exp log sqrt rsqrt sigmoid tanh erf sin cos floor log1p expm1 atan tan asin acos sinh cosh asinh
//! acosh atanh lgamma digamma trigamma erfinv erfc sign round trunc ceil isnan isinf isfinite`, `atan2(y, x)`, `remainder(a, b)`,
//! `fmod(a, b)`, `hypot(a, b)`, `copysign(a, b)`, `floor_div(a, b)`, `bitwise_and bitwise_or bitwise_xor (a, b)`, `bitwise_not(x)`,
//! `bitwise_left_shift bitwise_right_shift (a, n)`, reductions `sum mean max min count` (one
//! positional argument, optional `where: MASK`, `axis:` and `keepdim: true`), casts `f32 f16 bf16 i32 i64 bool`,
//! `grad(OF, INPUT)`, `stack(A, B, ...)` (the parts, broadcast to one shape, along a new last axis,
//! as `torch.stack(..., dim=-1)`; `stack([A, B], axis: K)` along a new axis at position `K`), `iota(X, axis: A)` (an `i32` of `X`'s shape: each element's index along axis
//! `A`, negative from the end, the last when left out), `gather(X, INDEX, axis: A)` (see below), and for ragged data `mask(LENGTHS)` and `size(DIM)`. `as`, `lengths` and
//! `offsets` are words only after an input's type, so they remain usable as names.
//!
//! Values of `f16` and `bf16` are computed in f32 and rounded to their dtype only where stored; a
//! comparison (`==`, `!=`, `<`, `<=`, `>`, `>=`) of two of them compares them rounded to their
//! dtype, as PyTorch does, so that a value computed again equals the one stored before.
//! `rounded(x)` rounds an `f16` or `bf16` value to its dtype there and then (to nearest, ties to
//! even), as PyTorch rounds the result of every op of that dtype; it is `x` itself for other
//! dtypes, and its gradient is the upstream gradient.
//!
//! The elementwise functions follow PyTorch's names and results (what this paragraph says of `i32`
//! holds for `i64` too, with 64 for 32): math functions of an `i32` give
//! `f32` (but `round`, `trunc`, `ceil`, `floor` and `sign` of an `i32` stay `i32`); `round` takes halfway
//! cases to even; `sign` of NaN is 0; `isnan isinf isfinite` give `bool`; `remainder` has the sign
//! of the divisor, `fmod` (C's) that of the dividend and `floor_div` rounds toward -inf, for floats
//! and `i32` alike; `atan2`, `hypot` and `copysign` of `i32`s give `f32`. `lgamma` is `ln |Γ(x)|`
//! (+inf at 0 and the negative integers), `digamma` is `torch.digamma` (`∓inf` at `±0`, NaN at the
//! negative integers), `trigamma` is `torch.special.polygamma(1, x)` (+inf at its poles, 0 and the
//! negative integers), `erfinv` is `torch.erfinv` (`±inf` at `±1`, NaN outside `[-1, 1]`) and
//! `erfc` is `torch.erfc` (`1 - erf(x)` without the cancellation: `erfc(10)` is about `2.1e-45`).
//! Two definitions where PyTorch raises or C++ leaves it undefined: an `i32` `remainder`, `fmod` or `floor_div` by 0
//! gives 0 (`i32::MIN` floor-divided by -1 wraps to `i32::MIN`, its `fmod` by -1 is 0), and a
//! shift count outside `0..=31` gives 0 for a left shift and the sign fill (`a >> 31`: 0 or -1) for a right shift, as PyTorch
//! computes them. The bitwise functions take `i32` or `bool` (for bools they are `and`, `or` and
//! `!=`); the shifts take `i32`. Gradients follow PyTorch's `derivatives.yaml`: `sign round trunc
//! ceil floor floor_div` have none, `remainder(a, b)` gives `g` to `a` and `-g * floor_div(a, b)`
//! to `b`, `fmod(a, b)` gives `g` to `a` and `-g * trunc(a / b)` to `b`, `hypot(a, b)` gives
//! `g * a / hypot(a, b)` and `g * b / hypot(a, b)` (NaN at the origin), `copysign(a, b)` gives
//! `g * copysign(a, b) / a` to `a` (0 where `a == 0`) and nothing to `b`, `lgamma` gives
//! `g * digamma(x)`, `digamma` `g * trigamma(x)`, `erfinv` `g * sqrt(pi) / 2 * exp(erfinv(x)^2)`,
//! `erfc` `-g * 2/sqrt(pi) * exp(-x^2)`, and `grad` through `trigamma` is an error (PyTorch's
//! gradient is `polygamma(2, x)`).
//!
//! Reductions follow PyTorch's `dim=` and `keepdim=`: with no `axis:` over every element (a
//! scalar); `axis: 0`, `axis: -2` (negative axes count from the end) or a list `axis: [0, 2]`
//! over those axes, which the result drops, or keeps with size 1 under `keepdim: true`
//! (`sum(x, axis: 0, keepdim: true)` of an `[R, C]` `x` is `[1, C]`). A mask (`where:`)
//! broadcasts to the operand whatever the axes. An axis out of range, one named twice (`[1, -1]`
//! of a rank-2 operand) and an empty list are [`DiagnosticKind::Axis`] errors at the axis.
//! Gradients flow through every form, and through operands broadcast along any axes (a `[D]`
//! bias added to `[B, D]` rows gets the column sum).
//!
//! Indexing follows NumPy and PyTorch: `x[i, ..]`, `x[.., 1:5]`, `x[:, 0:8:2, 3]`, `x[.., None]`.
//! Integers select an element (the axis goes), slices `start:end:step` keep a range (each part
//! optional, the step positive), `None` inserts an axis of size 1 and one `..` stands for the axes
//! the other items leave (without it they trail). On an axis of constant size negative indices
//! and bounds count from the end and slice bounds are clamped; on an axis of symbolic size they
//! must be constants `>= 0` and a slice needs its end (`x[.., 0:8]`, `x[.., :]` is the whole
//! axis), so that the result's size is constant: a size below the last element read is an error
//! when inputs are bound (interpreter and GPU alike). `transpose(x, a, b)` swaps two axes and
//! `permute(x, [2, 0, 1])` reorders them (PyTorch's); `reshape(x, [B, N, 4, 16])` splits and merges
//! axes of constant size in row-major order, symbolic axes whole and in order (one size may be
//! `-1`). Gradients flow through every view.
//!
//! `gather(x, index, axis: A)` is `torch.gather(x, A, index)` (`axis:` one integer literal,
//! negative from the end, the last when left out): `index` is `i32` or `i64`, has `x`'s rank and
//! `x`'s size on every axis but `A`; the result has `index`'s shape and `x`'s dtype, and holds
//! `x` at `index` along `A` (`gather(x, i, axis: 1)[r, j] = x[r, i[r, j]]`). `x` may be any
//! expression; generated code evaluates it at the gathered positions only. An index outside
//! `0..size` (negative ones too, as torch on CUDA) is an interpreter error naming its position;
//! generated code does not check it, reads nothing there and gives NaN (floats), 0 (integers) or
//! `false`. The gradient puts `g` back at each index, adding where an index repeats: each element
//! of the source's gradient compares its column with the indices of its row (no atomics, O(K)
//! per element for K indices a row).
//!
//! Integers: `i32` with `i64` computes as `i64`, an integer with a float as the float, and an
//! integer literal takes the other operand's dtype (literals themselves fit in `i32`: write
//! `i64(1 << 20) * 4096` for larger values). A float cast to `i32` or `i64` truncates toward zero,
//! saturates at the target's range and gives 0 for NaN (on the CPU and the GPU alike; PyTorch
//! leaves out-of-range values undefined); `i64` to `i32` keeps the low 32 bits, as PyTorch does.
//! `i64` `+ - *` wrap at 64 bits; `i64` reductions are computed in f64, as on the GPU: `sum`,
//! `max` and `min` of `i64` are exact while the values and every partial sum stay within ±2^53
//! (about 9.007e15), and a `max`/`min` of no element gives the `i32` limits, as for `i32`.
//! `i32` `+ - *` wrap as in C. A `sum` of `i32` or `bool` is an `i64`, as in PyTorch (the bools
//! count as 0 and 1). A `count` is an `i32`, computed exactly in 64 bits; a count outside the
//! `i32` range is never wrapped: the CPU interpreter refuses it with an error naming the
//! reduction, and a GPU kernel, which cannot stop with an error, clamps it to the nearest `i32`
//! limit.
//!
//! Text: a source is UTF-8 (a leading byte-order mark is skipped; a byte that is not UTF-8 is an
//! [`DiagnosticKind::Encoding`] error with its line, column and byte offset). Control characters
//! (tab, line feed and carriage return aside) and invisible ones (zero-width and bidirectional
//! controls, spaces other than U+0020) are errors that name them by code point (`U+0000 (NUL)`);
//! comments may hold any visible text and spaces. [`files`] reads a source file: a regular file
//! of at most [`files::MAX_SOURCE_BYTES`].
//!
//! Programs may have any number of statements (a chain of 100,000 `let`s is fine). One
//! expression may nest at most 64 levels of parentheses, calls and unary `-`/`not`, and its tree
//! may be at most 256 levels deep (a chain `a + b + ...` adds one level per operator); past
//! either limit the parser stops with a diagnostic that names the limit, and a `let` per part
//! keeps any computation within them.
//!
//! Every error is a [`Diagnostic`] with file, line, column, a caret under the span and what was
//! expected. No input makes this crate panic (a property test feeds it random text). It does not
//! execute or compile anything: the interpreter and code generator consume the graph.
#![forbid(unsafe_code)]

mod ast;
mod builtins;
mod diagnostic;
pub mod files;
mod functions;
mod lexer;
mod lower;
mod parser;
mod suggest;

pub use diagnostic::{Diagnostic, DiagnosticKind};

use kfuse_ir::{DType, Dim, Graph, Shape};

use diagnostic::{Report, Span};
use lower::Lowerer;
use parser::Parser;

/// Parses and type-checks a `.kf` program; `file_name` is how errors name the file.
///
/// ```
/// let g = kfuse_lang::parse_program("input x: f32[N]\noutput y = sum(x * x)\n", "demo.kf")?;
/// assert_eq!(g.outputs[0].name, "y");
/// let err = kfuse_lang::parse_program("input x: f32[N]\noutput y = x +\n", "demo.kf").unwrap_err();
/// assert_eq!((err.line, err.column), (2, 15));
/// # Ok::<(), kfuse_lang::Diagnostic>(())
/// ```
// The diagnostic is returned by value as the public API promises; errors are rare and cold.
#[allow(clippy::result_large_err)]
pub fn parse_program(source: &str, file_name: &str) -> Result<Graph, Diagnostic> {
    let source = without_bom(source);
    program(source).map_err(|r| r.place(source, file_name))
}

/// [`parse_program`] with some inputs declared at another dtype than the source writes: each
/// `(name, dtype)` replaces the dtype of input `name` before type checking, so the whole program is
/// typed as if the source said so (for example the f16 or bf16 run of an f32 description). A name
/// that is not an input of the program is an error, reported at the start of the file.
///
/// ```
/// use kfuse_ir::DType;
/// let src = "input x: f32[N]\noutput y = x * 2.0\n";
/// let g = kfuse_lang::parse_program_with_dtypes(src, "demo.kf", &[("x", DType::BF16)])?;
/// assert_eq!(g.inputs[0].dtype, DType::BF16);
/// assert!(kfuse_lang::parse_program_with_dtypes(src, "demo.kf", &[("z", DType::F16)]).is_err());
/// # Ok::<(), kfuse_lang::Diagnostic>(())
/// ```
#[allow(clippy::result_large_err)]
pub fn parse_program_with_dtypes(source: &str, file_name: &str, dtypes: &[(&str, DType)]) -> Result<Graph, Diagnostic> {
    let source = without_bom(source);
    program_with(source, dtypes).map_err(|r| r.place(source, file_name))
}

/// The text without a leading byte-order mark (U+FEFF, which some editors write at the start of
/// a UTF-8 file); lines and columns are then counted from the text after it.
fn without_bom(source: &str) -> &str {
    source.strip_prefix('\u{FEFF}').unwrap_or(source)
}

/// The text of a source file's bytes: UTF-8, else a [`DiagnosticKind::Encoding`] diagnostic at the
/// first byte that is not (line, column, and the byte offset in the message). A leading
/// byte-order mark is kept here and skipped by the parser.
///
/// ```
/// let d = kfuse_lang::source_text(b"input x: f32\nlet y = \xff\n".to_vec(), "bad.kf").unwrap_err();
/// assert_eq!((d.line, d.column), (2, 9));
/// assert!(d.message.contains("byte offset 21"));
/// ```
#[allow(clippy::result_large_err)]
pub fn source_text(bytes: Vec<u8>, file_name: &str) -> Result<String, Diagnostic> {
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        let byte = bytes.get(at).copied().unwrap_or(0);
        // The lossy text equals the original up to `at`, so the span lands on the same line and
        // column; the bad byte shows as U+FFFD.
        let lossy = String::from_utf8_lossy(bytes);
        let replacement = '\u{FFFD}'.len_utf8();
        Report::new(
            DiagnosticKind::Encoding,
            Span::new(at, at + replacement),
            format!(
                "the file is not UTF-8 text: byte 0x{byte:02X} at byte offset {at} does not start a valid character"
            ),
        )
        .expected("a .kf file saved as UTF-8")
        .place(&lossy, file_name)
    })
}

fn program(source: &str) -> Result<Graph, Report> {
    program_with(source, &[])
}

fn program_with(source: &str, dtypes: &[(&str, DType)]) -> Result<Graph, Report> {
    let toks = lexer::lex(source)?;
    let stmts = Parser::new(&toks).program()?;
    let graph = Lowerer::new(source).with_dtype_overrides(dtypes).program(&stmts)?;
    if let Some((name, _)) = dtypes.iter().find(|(n, _)| graph.input_by_name(n).is_none()) {
        let known = graph.inputs.iter().map(|i| format!("`{}`", i.name)).collect::<Vec<_>>().join(", ");
        return Err(Report::new(
            DiagnosticKind::UnknownName,
            Span::new(0, 0),
            format!("a dtype is given for `{name}`, which is not an input of the program"),
        )
        .expected(format!("one of the inputs: {known}")));
    }
    Ok(graph)
}

/// For MLP activations: an expression over the given scalar/tensor variables, as a graph with those
/// inputs (in order) and one output named "y".
///
/// Dimension symbols in the variables' shapes (`Dim::Sym(SymId(k))`) name symbols `s0`, `s1`, ...
/// of the new graph, so that `SymId(k)` keeps its meaning. Errors name the file `<expression>`.
#[allow(clippy::result_large_err)]
pub fn parse_expression(source: &str, vars: &[(&str, DType, Shape)]) -> Result<Graph, Diagnostic> {
    let source = without_bom(source);
    expression(source, vars).map_err(|r| r.place(source, "<expression>"))
}

/// The most dimension symbols `parse_expression` creates for its variables.
const MAX_EXPRESSION_SYMBOLS: u32 = 1024;

fn expression(source: &str, vars: &[(&str, DType, Shape)]) -> Result<Graph, Report> {
    let toks = lexer::lex(source)?;
    let expr = Parser::new(&toks).standalone_expression()?;
    let mut lower = Lowerer::new(source);
    let max_sym = vars
        .iter()
        .flat_map(|(_, _, s)| s.dims())
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(s.0),
            Dim::Const(_) => None,
        })
        .max();
    if let Some(max) = max_sym {
        // Symbols are created densely up to the largest id; refuse absurd ids instead of
        // allocating billions of names.
        if max >= MAX_EXPRESSION_SYMBOLS {
            return Err(Report::new(
                DiagnosticKind::Shape,
                Span::new(0, 0),
                format!("a variable's shape uses dimension symbol id {max}"),
            )
            .expected(format!("symbol ids below {MAX_EXPRESSION_SYMBOLS}")));
        }
        for k in 0..=max {
            lower.b.symbol(&format!("s{k}"));
        }
    }
    for (name, dtype, shape) in vars {
        lower.declare_input(name, *dtype, shape.clone())?;
    }
    let y = lower.expr(&expr)?;
    lower.b.output("y", y).map_err(|e| lower.ir_report(e, Span::new(0, source.len()), &[]))?;
    lower.finish()
}
