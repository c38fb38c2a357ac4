//! Random well-typed `.kf` programs: inputs of every dtype over the padded (`B`, `N`, with an
//! optional `lengths` input) or packed (`T`, with an `offsets` input) symbols, then `let`s drawn
//! from elementwise arithmetic, comparisons, logic, `where`, `clamp`, `pow`, math functions,
//! `atan2`, `remainder`, `fmod`, `hypot`, `copysign`, `floor_div`, `fma`, bitwise ops and shifts, casts, component access, `[.., None]`, reductions (all, last or leading axis, with or without
//! `where:`, `prod` included), `argmax`/`argmin` (along the last axis or flat), `rand_like`,
//! views (`transpose`, `permute`, slices of a constant last axis, `reshape` splitting and merging one), `cat` along a constant last
//! axis, `mask(lengths)`, `size(DIM)`, and outputs that may include `grad(loss, input)`.
//!
//! The generator tracks each value's shape and kind so that what it writes type-checks; where its
//! bookkeeping is conservative (a float it takes for an int) the program is still valid. Random
//! edits of its output (see `mutate`) are the ill-typed programs.

use kfuse_testing::{Rng, SeedableRng, StdRng};

/// A value the program can use: its name, shape (dims as written; `1` after `[.., None]`) and
/// kind.
#[derive(Clone, Debug)]
struct Val {
    name: String,
    shape: Vec<&'static str>,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A float of any dtype (computed in f32 / f64).
    Float,
    /// An `i32`.
    Int,
    /// A `bool`.
    Bool,
}

impl Kind {
    fn numeric(self) -> bool {
        self != Kind::Bool
    }
}

/// A generated program.
pub struct Generated {
    pub source: String,
}

const FLOATS: [&str; 3] = ["f32", "f16", "bf16"];
const MATH: [&str; 35] = [
    "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "sin", "cos", "floor", "log1p", "expm1", "sign",
    "round", "trunc", "ceil", "isnan", "isinf", "isfinite", "atan", "tan", "asin", "acos", "sinh", "cosh", "asinh",
    "acosh", "atanh", "lgamma", "digamma", "trigamma", "erfinv", "erfc", "rounded",
];
/// Functions of two numeric operands (`fma` takes a third, a literal).
const BINARY: [&str; 10] = ["min", "max", "pow", "atan2", "remainder", "fmod", "hypot", "copysign", "floor_div", "fma"];
/// Functions of two operands of one kind: `i32` (both) or `bool` (both, except the shifts).
const BITWISE: [&str; 5] = ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift"];
const ARITH: [&str; 4] = ["+", "-", "*", "/"];
const CMP: [&str; 6] = ["==", "!=", "<", "<=", ">", ">="];
const REDUCE: [&str; 5] = ["sum", "mean", "max", "min", "prod"];
/// Constant sizes as written, by value (slices and `cat` make new ones).
const NUMBERS: [&str; 17] =
    ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"];

/// NumPy broadcasting of two shapes as written (`1` stretches), or `None` when they clash.
fn broadcast(a: &[&'static str], b: &[&'static str]) -> Option<Vec<&'static str>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for k in 0..rank {
        let da = (k + a.len()).checked_sub(rank).map(|i| a[i]);
        let db = (k + b.len()).checked_sub(rank).map(|i| b[i]);
        out.push(match (da, db) {
            (Some(x), Some(y)) if x == y => x,
            (Some("1"), Some(y)) => y,
            (Some(x), Some("1")) => x,
            (Some(x), None) => x,
            (None, Some(y)) => y,
            _ => return None,
        });
    }
    Some(out)
}

/// The kind of `a OP b` for arithmetic: float when either is (or for `/`), else int.
fn arith_kind(op: &str, a: Kind, b: Kind) -> Kind {
    if op == "/" || a == Kind::Float || b == Kind::Float {
        Kind::Float
    } else {
        Kind::Int
    }
}

struct Gen {
    rng: StdRng,
    vals: Vec<Val>,
    lines: Vec<String>,
    float_inputs: Vec<String>,
    lengths: Option<String>,
    packed: bool,
    next: usize,
}

impl Gen {
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.random_range(0..items.len())]
    }

    fn input(&mut self, name: &str, dtype: &str, shape: &[&'static str]) {
        let kind = match dtype {
            "i32" => Kind::Int,
            "bool" => Kind::Bool,
            _ => Kind::Float,
        };
        let dims = if shape.is_empty() { String::new() } else { format!("[{}]", shape.join(", ")) };
        self.lines.push(format!("input {name}: {dtype}{dims}"));
        if kind == Kind::Float {
            self.float_inputs.push(name.to_string());
        }
        self.vals.push(Val { name: name.to_string(), shape: shape.to_vec(), kind });
    }

    fn declare_inputs(&mut self) {
        self.packed = self.rng.random_bool(0.3);
        let candidates: Vec<(&str, Vec<&'static str>)> = if self.packed {
            vec![("p", vec!["T", "4"]), ("q", vec!["T"]), ("w", vec!["S"]), ("s", vec![])]
        } else {
            vec![("x", vec!["B", "N"]), ("v", vec!["B", "N", "4"]), ("r", vec!["N"]), ("c", vec!["B"]), ("s", vec![])]
        };
        let mut any = false;
        for (name, shape) in candidates {
            if self.rng.random_bool(0.6) || (!any && name == "s") {
                let dtype = match self.rng.random_range(0..10) {
                    0 => "i32",
                    1 => "bool",
                    k => FLOATS[k % 3],
                };
                self.input(name, dtype, &shape);
                any = true;
            }
        }
        // The layout's bounded dimension must size some input's axis.
        let bounded = if self.packed { "T" } else { "N" };
        if !self.vals.iter().any(|v| v.shape.contains(&bounded)) {
            let (name, shape) = if self.packed { ("q", vec!["T"]) } else { ("r", vec!["N"]) };
            self.input(name, "f32", &shape);
        }
        if self.packed {
            self.lines.push("input offsets: i32[S] as offsets(T)".into());
            self.vals.push(Val { name: "offsets".into(), shape: vec!["S"], kind: Kind::Int });
        } else if self.rng.random_bool(0.5) {
            self.lines.push("input lengths: i32[B] as lengths(N)".into());
            self.vals.push(Val { name: "lengths".into(), shape: vec!["B"], kind: Kind::Int });
            self.lengths = Some("lengths".into());
        }
        if !self.packed && self.rng.random_bool(0.3) {
            self.input("m", "bool", &["B", "N"]);
        }
    }

    fn val_where(&mut self, ok: impl Fn(&Val) -> bool) -> Option<Val> {
        let found: Vec<Val> = self.vals.iter().filter(|v| ok(v)).cloned().collect();
        (!found.is_empty()).then(|| self.pick(&found).clone())
    }

    fn literal(&mut self, kind: Kind) -> String {
        match kind {
            Kind::Bool => "true".into(),
            Kind::Int => self.rng.random_range(-3..=4).to_string(),
            Kind::Float => (*self.pick(&["0.5", "2.0", "1e-7", "0.0", "-1.5", "3.0", "1e3"])).to_string(),
        }
    }

    /// One new expression over the values so far, with its shape and kind, or `None` when the
    /// chosen form has no operands that fit.
    fn expression(&mut self) -> Option<(String, Vec<&'static str>, Kind)> {
        let a = self.val_where(|_| true)?;
        match self.rng.random_range(0..18) {
            0..=2 if a.kind.numeric() => {
                let op = *self.pick(&ARITH);
                if self.rng.random_bool(0.3) {
                    let kind = if self.rng.random_bool(0.7) { Kind::Float } else { Kind::Int };
                    let lit = self.literal(kind);
                    return Some((format!("{} {op} {lit}", a.name), a.shape, arith_kind(op, a.kind, kind)));
                }
                let b = self.val_where(|b| b.kind.numeric() && broadcast(&a.shape, &b.shape).is_some())?;
                let shape = broadcast(&a.shape, &b.shape)?;
                Some((format!("{} {op} {}", a.name, b.name), shape, arith_kind(op, a.kind, b.kind)))
            }
            3 if a.kind.numeric() => {
                let f = *self.pick(&MATH);
                let kind = match f {
                    "abs" | "sign" | "round" | "trunc" | "ceil" => a.kind,
                    "isnan" | "isinf" | "isfinite" => Kind::Bool,
                    _ => Kind::Float, // `floor` of an int is f32 too
                };
                Some((format!("{f}({})", a.name), a.shape, kind))
            }
            4 if a.kind.numeric() => {
                let b = self.val_where(|b| b.kind.numeric() && broadcast(&a.shape, &b.shape).is_some())?;
                let shape = broadcast(&a.shape, &b.shape)?;
                let f = *self.pick(&BINARY);
                let kind = if matches!(f, "pow" | "atan2" | "hypot" | "copysign") {
                    Kind::Float
                } else {
                    arith_kind("+", a.kind, b.kind)
                };
                if f == "fma" {
                    let lit = self.literal(Kind::Float);
                    return Some((format!("fma({}, {}, {lit})", a.name, b.name), shape, Kind::Float));
                }
                Some((format!("{f}({}, {})", a.name, b.name), shape, kind))
            }
            13 if a.kind != Kind::Float => {
                if self.rng.random_bool(0.25) {
                    return Some((format!("bitwise_not({})", a.name), a.shape, a.kind));
                }
                let b = self.val_where(|b| b.kind == a.kind && broadcast(&a.shape, &b.shape).is_some())?;
                let shape = broadcast(&a.shape, &b.shape)?;
                let ops = if a.kind == Kind::Bool { &BITWISE[..3] } else { &BITWISE[..] };
                let f = *self.pick(ops);
                Some((format!("{f}({}, {})", a.name, b.name), shape, a.kind))
            }
            5 => {
                let b = self
                    .val_where(|b| b.kind.numeric() == a.kind.numeric() && broadcast(&a.shape, &b.shape).is_some())?;
                let shape = broadcast(&a.shape, &b.shape)?;
                if a.kind == Kind::Bool {
                    let op = *self.pick(&["and", "or", "==", "!="]);
                    Some((format!("{} {op} {}", a.name, b.name), shape, Kind::Bool))
                } else {
                    let op = *self.pick(&CMP);
                    Some((format!("{} {op} {}", a.name, b.name), shape, Kind::Bool))
                }
            }
            6 => {
                let c = self.val_where(|c| c.kind == Kind::Bool && broadcast(&a.shape, &c.shape).is_some())?;
                if !a.kind.numeric() {
                    return Some((format!("not {}", c.name), c.shape, Kind::Bool));
                }
                let shape = broadcast(&a.shape, &c.shape)?;
                let other = self.literal(a.kind);
                Some((format!("where({}, {}, {other})", c.name, a.name), shape, a.kind))
            }
            7 if a.kind.numeric() => {
                Some((format!("clamp({}, -1, {})", a.name, self.literal(Kind::Int)), a.shape, a.kind))
            }
            8 if a.shape.last() == Some(&"4") => {
                let k = self.rng.random_range(-4..4);
                Some((format!("{}[.., {k}]", a.name), a.shape[..a.shape.len() - 1].to_vec(), a.kind))
            }
            9 if (1..3).contains(&a.shape.len()) => {
                let mut shape = a.shape.clone();
                shape.push("1");
                Some((format!("{}[.., None]", a.name), shape, a.kind))
            }
            10 | 11 => self.reduction(a),
            15 => self.view(a),
            16 => self.joined(a),
            17 if a.kind.numeric() && !a.shape.is_empty() => {
                if self.rng.random_bool(0.5) {
                    // Every element's own draw; an integer seed of the program's or a literal.
                    let seed = match self.val_where(|v| v.kind == Kind::Int && v.shape.is_empty()) {
                        Some(v) if self.rng.random_bool(0.5) => v.name,
                        _ => self.rng.random_range(0..1000).to_string(),
                    };
                    return Some((format!("rand_like({}, {seed})", a.name), a.shape, Kind::Float));
                }
                let f = *self.pick(&["argmax", "argmin"]);
                if self.rng.random_bool(0.3) {
                    return Some((format!("{f}({})", a.name), vec![], Kind::Int));
                }
                Some((format!("{f}({}, axis: -1)", a.name), a.shape[..a.shape.len() - 1].to_vec(), Kind::Int))
            }
            12 => {
                let to = *self.pick(&["f32", "f16", "bf16", "i32", "bool"]);
                let kind = match to {
                    "i32" => Kind::Int,
                    "bool" => Kind::Bool,
                    _ => Kind::Float,
                };
                Some((format!("{to}({})", a.name), a.shape, kind))
            }
            _ => {
                if let Some(l) = self.lengths.clone().filter(|_| self.rng.random_bool(0.6)) {
                    return Some((format!("mask({l})"), vec!["B", "N"], Kind::Bool));
                }
                let dims: Vec<&str> = ["B", "N", "T", "S"]
                    .into_iter()
                    .filter(|d| self.vals.iter().any(|v| v.shape.contains(d)))
                    .collect();
                let dim = *self.pick(&dims);
                Some((format!("size({dim})"), vec![], Kind::Int))
            }
        }
    }

    /// A view of `a`: its first two axes swapped, its axes rotated, or a slice of a constant last
    /// axis (symbolic axes are never sliced: their sizes may be 0 at run time).
    fn view(&mut self, a: Val) -> Option<(String, Vec<&'static str>, Kind)> {
        let rank = a.shape.len();
        match self.rng.random_range(0..4) {
            3 => {
                // A constant last axis split in two, the halves' axes swapped and merged again: a
                // permutation of its columns through `reshape`.
                let (&last, lead) = a.shape.split_last()?;
                let size: usize = last.parse().ok().filter(|&n| n >= 4 && n % 2 == 0)?;
                let lead = lead.join(", ");
                let sep = if lead.is_empty() { "" } else { ", " };
                let text = format!(
                    "reshape(transpose(reshape({}, [{lead}{sep}2, {}]), -1, -2), [{lead}{sep}{size}])",
                    a.name,
                    size / 2
                );
                Some((text, a.shape.clone(), a.kind))
            }
            0 if rank >= 2 => {
                let mut shape = a.shape.clone();
                shape.swap(0, 1);
                Some((format!("transpose({}, 0, 1)", a.name), shape, a.kind))
            }
            1 if rank == 3 => {
                let shape = vec![a.shape[2], a.shape[0], a.shape[1]];
                Some((format!("permute({}, [2, 0, 1])", a.name), shape, a.kind))
            }
            _ => {
                let last = *a.shape.last()?;
                let size: usize = last.parse().ok().filter(|&n| n >= 2)?;
                let start = self.rng.random_range(0..size);
                let step = self.rng.random_range(1..=2);
                let len = (size - start).div_ceil(step);
                let mut shape = a.shape.clone();
                *shape.last_mut()? = NUMBERS[len];
                Some((format!("{}[.., {start}:{size}:{step}]", a.name), shape, a.kind))
            }
        }
    }

    /// `a` joined with another value of its shape along a constant last axis (`cat`).
    fn joined(&mut self, a: Val) -> Option<(String, Vec<&'static str>, Kind)> {
        let (&last, lead) = a.shape.split_last()?;
        let n: usize = last.parse().ok()?;
        let b = self.val_where(|b| {
            b.kind.numeric() == a.kind.numeric()
                && b.shape.len() == a.shape.len()
                && b.shape[..lead.len()] == *lead
                && b.shape.last().is_some_and(|d| d.parse::<usize>().is_ok_and(|m| n + m < NUMBERS.len()))
        })?;
        let m: usize = b.shape.last()?.parse().ok()?;
        let mut shape = a.shape.clone();
        *shape.last_mut()? = NUMBERS[n + m];
        let kind = if a.kind == b.kind { a.kind } else { arith_kind("+", a.kind, b.kind) };
        Some((format!("cat([{}, {}], axis: -1)", a.name, b.name), shape, kind))
    }

    fn reduction(&mut self, a: Val) -> Option<(String, Vec<&'static str>, Kind)> {
        // A normalization: a mean and the variance about it over the same axes (a layer norm's
        // trailing ones, a batch norm's all but the second), read back at every element; the
        // stages reduce both by the mean's parts.
        if a.kind == Kind::Float && a.shape.len() >= 2 && self.rng.random_bool(0.15) {
            let rank = a.shape.len();
            let axes: Vec<String> = match rank >= 3 && self.rng.random_bool(0.5) {
                true => std::iter::once(0).chain(2..rank).map(|k| k.to_string()).collect(),
                false => (1..rank).map(|k| k.to_string()).collect(),
            };
            let axes = axes.join(", ");
            let d = format!("({} - mean({}, axis: [{axes}], keepdim: true))", a.name, a.name);
            let norm = format!("{d} * rsqrt(mean({d} * {d}, axis: [{axes}], keepdim: true) + 1e-5)");
            return Some((norm, a.shape, Kind::Float));
        }
        // Along the leading axis with keepdim (read back at a larger shape, such a reduction is
        // stored once by a stage of its own), the last axis, or every axis.
        let leading = a.shape.len() >= 2 && self.rng.random_bool(0.25);
        let last = !leading && !a.shape.is_empty() && self.rng.random_bool(0.4);
        let shape = match (leading, last) {
            (true, _) => std::iter::once("1").chain(a.shape[1..].iter().copied()).collect(),
            (_, true) => a.shape[..a.shape.len() - 1].to_vec(),
            _ => vec![],
        };
        let axis = match (leading, last) {
            (true, _) => ", axis: 0, keepdim: true",
            (_, true) => ", axis: -1",
            _ => "",
        };
        let mask = if self.rng.random_bool(0.4) {
            self.val_where(|m| m.kind == Kind::Bool && broadcast(&a.shape, &m.shape).as_deref() == Some(&a.shape[..]))
        } else {
            None
        };
        let mask = mask.map(|m| format!(", where: {}", m.name)).unwrap_or_default();
        if a.kind == Kind::Bool {
            return Some((format!("count({}{mask}{axis})", a.name), shape, Kind::Int));
        }
        let op = *self.pick(&REDUCE);
        let kind = if matches!(op, "mean" | "prod") { Kind::Float } else { a.kind };
        // A product of integers is refused: its operand is made a float (the kinds this
        // generator tracks are not always the language's, e.g. floor of an integer).
        let x = if op == "prod" { format!("f32({})", a.name) } else { a.name.clone() };
        Some((format!("{op}({x}{mask}{axis})"), shape, kind))
    }

    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("t{}", self.next)
    }

    fn lets(&mut self, count: usize) {
        for _ in 0..count {
            let Some((text, shape, kind)) = (0..8).find_map(|_| self.expression()) else { continue };
            let name = self.fresh();
            self.lines.push(format!("let {name} = {text}"));
            self.vals.push(Val { name, shape, kind });
        }
    }

    fn outputs(&mut self) {
        let outs = self.rng.random_range(1..=3);
        let inputs = self.lines.iter().filter(|l| l.starts_with("input")).count();
        for k in 0..outs {
            // Prefer computed values; an input may be an output as it is.
            let from = if self.vals.len() > inputs && self.rng.random_bool(0.85) { inputs } else { 0 };
            let v = self.vals[self.rng.random_range(from..self.vals.len())].clone();
            let cast = if v.kind == Kind::Float && self.rng.random_bool(0.2) {
                format!(": {}", self.pick(&FLOATS))
            } else {
                String::new()
            };
            self.lines.push(format!("output o{k}{cast} = {}", v.name));
        }
        // A loss: a scalar float, and its gradient with respect to float inputs.
        if !self.float_inputs.is_empty() && self.rng.random_bool(0.5) {
            let loss = self.val_where(|v| v.kind == Kind::Float && v.shape.is_empty());
            if let Some(loss) = loss {
                self.lines.push(format!("output loss = {}", loss.name));
                let wrt = self.float_inputs.clone();
                for x in wrt {
                    if self.rng.random_bool(0.7) {
                        self.lines.push(format!("output d{x} = grad(loss, {x})"));
                    }
                }
            }
        }
    }
}

/// The program of `seed`.
pub fn generate(seed: u64) -> Generated {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        vals: Vec::new(),
        lines: vec![format!("# fuzz program {seed}")],
        float_inputs: Vec::new(),
        lengths: None,
        packed: false,
        next: 0,
    };
    g.declare_inputs();
    let count = g.rng.random_range(1..=12);
    g.lets(count);
    g.outputs();
    let mut source = g.lines.join("\n");
    source.push('\n');
    Generated { source }
}

const EDIT_TOKENS: &[&str] = &[
    " ",
    "\n",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    "=",
    "+",
    "*",
    "..",
    "None",
    "-1",
    "0",
    "4",
    "1e40",
    "x",
    "t1",
    "loss",
    "grad(",
    "sum(",
    "where: ",
    "axis: ",
    "mask(",
    "size(",
    "as lengths(N)",
    "f16",
    "bool",
    "i32",
    "output ",
    "let ",
    "input ",
    "\u{0}",
    "é",
    "#",
];

/// A random edit of `source` (deletions, duplications, insertions of tokens, byte flips) from
/// `seed`: mostly ill-typed or malformed programs near valid ones.
pub fn mutate(source: &str, seed: u64) -> String {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s: Vec<char> = source.chars().collect();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=s.len());
        match rng.random_range(0..5) {
            0 => {
                let end = (at + rng.random_range(1..12)).min(s.len());
                s.drain(at..end);
            }
            1 => {
                let tok = EDIT_TOKENS[rng.random_range(0..EDIT_TOKENS.len())];
                s.splice(at..at, tok.chars());
            }
            2 => {
                let end = (at + rng.random_range(1..40)).min(s.len());
                let piece: Vec<char> = s[at..end].to_vec();
                s.splice(at..at, piece);
            }
            3 if at < s.len() => s[at] = char::from(rng.random_range(0x20u8..0x7f)),
            _ => {
                // Swap two lines: a use before its definition, an output before its value.
                let mut lines: Vec<String> = s.iter().collect::<String>().split('\n').map(String::from).collect();
                let (i, j) = (rng.random_range(0..lines.len()), rng.random_range(0..lines.len()));
                lines.swap(i, j);
                s = lines.join("\n").chars().collect();
            }
        }
    }
    s.into_iter().collect()
}
