//! The graph: an arena of typed nodes, the declared inputs and the named outputs.

use crate::{DType, Dim, Shape, SymId};

/// A node in [`Graph::nodes`]. Operands always precede the nodes that use them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A declared input, an index into [`Graph::inputs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputId(pub u32);

/// A list of operands (for [`Op::Stack`]), an index into [`Graph::lists`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ListId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A literal value. Floats are stored as their f64 bits so that nodes can be hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Literal {
    Float(u64),
    Int(i64),
    Bool(bool),
}

impl Literal {
    pub fn float(v: f64) -> Literal {
        Literal::Float(v.to_bits())
    }
    /// The value as f64 (`true` is 1).
    pub fn as_f64(self) -> f64 {
        match self {
            Literal::Float(b) => f64::from_bits(b),
            Literal::Int(i) => i as f64,
            Literal::Bool(b) => b as u8 as f64,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Not,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    Tanh,
    Erf,
    Sin,
    Cos,
    Floor,
    Log1p,
    Expm1,
    /// -1, 0 or 1 (0 for NaN and both zeros, as `torch.sign`); ints stay ints.
    Sign,
    /// To the nearest integer, halfway cases to even (`torch.round`).
    Round,
    Trunc,
    Ceil,
    /// `isnan`, `isinf`, `isfinite`: a float operand tested, a `bool` result.
    IsNan,
    IsInf,
    IsFinite,
    Atan,
    Tan,
    Asin,
    Acos,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    /// `torch.lgamma`: `ln |Γ(x)|`, +inf at 0 and the negative integers.
    Lgamma,
    /// `torch.digamma`: `Γ'(x) / Γ(x)`; at `±0` it is `∓inf`, at the negative integers NaN.
    Digamma,
    /// `torch.special.polygamma(1, x)`, digamma's derivative: +inf at 0 and the negative integers
    /// (its poles). `grad` through it is an error (PyTorch's gradient is `polygamma(2, x)`).
    Trigamma,
    /// `torch.erfinv`: the inverse of `erf` on `[-1, 1]`, `±inf` at `±1`, NaN outside.
    Erfinv,
    /// `torch.erfc`: `1 - erf(x)`, computed without the cancellation (so `erfc(10)` is about
    /// `2.1e-45`, not 0); 2 at -inf, 0 at +inf.
    Erfc,
    /// `~x` of an `i32` (the builder turns `bitwise_not` of a bool into `not`).
    BitNot,
    /// `x` itself, through which no gradient flows (`torch.Tensor.detach`): the builder keeps
    /// it for floats only (an int or bool carries no gradient anyway).
    Detach,
    /// `x` rounded to its dtype (to nearest, ties to even) where that is f16 or bf16, as PyTorch
    /// rounds the result of every op of that dtype; values of f16 and bf16 are otherwise computed
    /// in f32 and rounded only where stored. The builder keeps it for f16 and bf16 only. Its
    /// gradient is the upstream gradient itself, as a cast's is.
    Rounded,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 39] = [
        UnaryOp::Neg,
        UnaryOp::Not,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Floor,
        UnaryOp::Log1p,
        UnaryOp::Expm1,
        UnaryOp::Sign,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::Ceil,
        UnaryOp::IsNan,
        UnaryOp::IsInf,
        UnaryOp::IsFinite,
        UnaryOp::Atan,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
        UnaryOp::Lgamma,
        UnaryOp::Digamma,
        UnaryOp::Trigamma,
        UnaryOp::Erfinv,
        UnaryOp::Erfc,
        UnaryOp::BitNot,
        UnaryOp::Detach,
        UnaryOp::Rounded,
    ];
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Not => "not",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Floor => "floor",
            UnaryOp::Log1p => "log1p",
            UnaryOp::Expm1 => "expm1",
            UnaryOp::Sign => "sign",
            UnaryOp::Round => "round",
            UnaryOp::Trunc => "trunc",
            UnaryOp::Ceil => "ceil",
            UnaryOp::IsNan => "isnan",
            UnaryOp::IsInf => "isinf",
            UnaryOp::IsFinite => "isfinite",
            UnaryOp::Atan => "atan",
            UnaryOp::Tan => "tan",
            UnaryOp::Asin => "asin",
            UnaryOp::Acos => "acos",
            UnaryOp::Sinh => "sinh",
            UnaryOp::Cosh => "cosh",
            UnaryOp::Asinh => "asinh",
            UnaryOp::Acosh => "acosh",
            UnaryOp::Atanh => "atanh",
            UnaryOp::Lgamma => "lgamma",
            UnaryOp::Digamma => "digamma",
            UnaryOp::Trigamma => "trigamma",
            UnaryOp::Erfinv => "erfinv",
            UnaryOp::Erfc => "erfc",
            UnaryOp::BitNot => "bitwise_not",
            UnaryOp::Detach => "detach",
            UnaryOp::Rounded => "rounded",
        }
    }
    /// Math functions take floats only (an int operand is cast to `f32` by the builder, except
    /// that `round`, `trunc` and `ceil` of an int are the int itself, as in PyTorch).
    pub fn is_float_math(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg
                | UnaryOp::Not
                | UnaryOp::Abs
                | UnaryOp::Sign
                | UnaryOp::BitNot
                | UnaryOp::Detach
                | UnaryOp::Rounded
        )
    }
    /// `isnan`, `isinf`, `isfinite`: the result is `bool`, not the operand's dtype.
    pub fn is_predicate(self) -> bool {
        matches!(self, UnaryOp::IsNan | UnaryOp::IsInf | UnaryOp::IsFinite)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Min,
    Max,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    /// `atan2(y, x)`: floats only (ints are cast to `f32`, as `torch.atan2`).
    Atan2,
    /// `torch.remainder`: the result has the sign of the divisor. Integer division by zero gives 0.
    Remainder,
    /// `torch.fmod`: C's `fmod`, the result has the sign of the dividend. Integer division by zero
    /// gives 0; `i32::MIN` by -1 gives 0.
    Fmod,
    /// `torch.hypot`: `sqrt(a² + b²)` without overflow; floats only (ints are cast to `f32`).
    Hypot,
    /// `torch.copysign`: `|a|` with the sign bit of `b` (`-0.0` and NaNs' signs count); floats only
    /// (ints are cast to `f32`).
    Copysign,
    /// `torch.floor_divide`: the quotient rounded toward -inf. Integer division by zero gives 0;
    /// `i32::MIN / -1` wraps to `i32::MIN`.
    FloorDiv,
    /// Bitwise `&`, `|`, `^` of `i32` (the builder turns them into `and`, `or`, `!=` for bools).
    BitAnd,
    BitOr,
    BitXor,
    /// `a << n` of `i32`, as `torch.bitwise_left_shift`: 0 when `n < 0` or `n >= 32`.
    Shl,
    /// Arithmetic `a >> n` of `i32`, as `torch.bitwise_right_shift`: `a >> 31` (0 or -1) when
    /// `n < 0` or `n >= 32`.
    Shr,
}

impl BinaryOp {
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
            BinaryOp::Pow => "pow",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::Eq => "==",
            BinaryOp::Ne => "!=",
            BinaryOp::Lt => "<",
            BinaryOp::Le => "<=",
            BinaryOp::Gt => ">",
            BinaryOp::Ge => ">=",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Atan2 => "atan2",
            BinaryOp::Remainder => "remainder",
            BinaryOp::Fmod => "fmod",
            BinaryOp::Hypot => "hypot",
            BinaryOp::Copysign => "copysign",
            BinaryOp::FloorDiv => "floor_div",
            BinaryOp::BitAnd => "bitwise_and",
            BinaryOp::BitOr => "bitwise_or",
            BinaryOp::BitXor => "bitwise_xor",
            BinaryOp::Shl => "bitwise_left_shift",
            BinaryOp::Shr => "bitwise_right_shift",
        }
    }
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
    /// Ops on `i32` only: the bitwise ones and the shifts.
    pub fn is_bitwise(self) -> bool {
        matches!(self, BinaryOp::BitAnd | BinaryOp::BitOr | BinaryOp::BitXor | BinaryOp::Shl | BinaryOp::Shr)
    }
    /// Ops whose `i32` operands are cast to `f32` first (true division, `pow`, `atan2`, `hypot`,
    /// `copysign`).
    pub fn is_float_only(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Pow | BinaryOp::Atan2 | BinaryOp::Hypot | BinaryOp::Copysign)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TernaryOp {
    /// `where(cond, a, b)`.
    Select,
    /// `clamp(x, lo, hi)` = `min(max(x, lo), hi)`; kept whole for its PyTorch gradient.
    Clamp,
    /// `fma(a, b, c)` = `a * b + c`, rounded once for floats; wrapping for `i32`.
    Fma,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    /// Counts the `true` elements of a `bool` operand; the result is `i32`.
    Count,
    /// The product of a floating-point operand's elements (1 for none), accumulated in f64.
    Prod,
}

impl ReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Count => "count",
            ReduceOp::Prod => "prod",
        }
    }
}

/// Which axes a reduction reduces. The builder normalises: a reduction over every axis is `All`
/// (followed by `x[.., None]` per axis under `keepdim`), one over exactly the last axis is `Last`
/// (followed by `x[.., None]` under `keepdim`), so that `Axes` names a proper subset of the axes
/// that is not just the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceAxis {
    /// Over every element: the result is a scalar.
    All,
    /// Along the last axis: the result drops that axis.
    Last,
    /// Over the axes whose bit is set in `mask` (bit `a` = axis `a` of the operand). The result
    /// drops them, or keeps them with size 1 when `keepdim` is set (PyTorch's `dim=`, `keepdim=`).
    Axes { mask: u32, keepdim: bool },
}

impl ReduceAxis {
    /// The most axes an operand of an [`ReduceAxis::Axes`] reduction may have (one bit each).
    pub const MAX_RANK: usize = 32;

    /// Whether axis `a` of an operand of rank `rank` is reduced.
    pub fn reduces(self, a: usize, rank: usize) -> bool {
        match self {
            ReduceAxis::All => true,
            ReduceAxis::Last => a + 1 == rank,
            ReduceAxis::Axes { mask, .. } => a < Self::MAX_RANK && mask >> a & 1 == 1,
        }
    }

    /// Whether the reduced axes stay in the result (with size 1).
    pub fn keepdim(self) -> bool {
        matches!(self, ReduceAxis::Axes { keepdim: true, .. })
    }

    /// The shape of the result of reducing an operand of shape `xs` (`None` when the axes do not
    /// fit the operand: `Last` of a scalar, an `Axes` bit past its rank).
    pub fn result_shape(self, xs: &Shape) -> Option<Shape> {
        let rank = xs.rank();
        match self {
            ReduceAxis::All => Some(Shape::scalar()),
            ReduceAxis::Last => xs.last().map(|_| xs.without_last()),
            ReduceAxis::Axes { mask, keepdim } => {
                if rank < Self::MAX_RANK && mask >> rank != 0 {
                    return None;
                }
                let kept = xs.dims().iter().enumerate().filter_map(|(a, &d)| match self.reduces(a, rank) {
                    false => Some(d),
                    true => keepdim.then_some(Dim::Const(1)),
                });
                Some(Shape(kept.collect()))
            }
        }
    }

    /// The reduced axes of an operand of rank `rank`, in order.
    pub fn axes(self, rank: usize) -> Vec<usize> {
        (0..rank).filter(|&a| self.reduces(a, rank)).collect()
    }
}

/// What a node computes. Operands are other nodes; shapes broadcast like NumPy.
///
/// Empty reductions: `sum` and `count` give 0, `max` gives -inf, `min` +inf, `mean` NaN (0/0).
/// Elements whose mask is `false` are left out of a reduction entirely, so NaN in them does not
/// propagate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Input(InputId),
    Const(Literal),
    /// The index of each element along `axis` of the node's own shape (`i32`).
    Iota {
        axis: u32,
    },
    /// A uniform `f32` in `[0, 1)` for each element of the node's own shape, from the
    /// counter-based generator Philox-4x32-10 keyed by `seed` (an `i64` scalar) and counted by the
    /// element's flat row-major index in that shape; the same bits in the interpreter and in
    /// every generated kernel (see [`crate::philox`] for the recipe). It has no gradient.
    Rand {
        seed: NodeId,
    },
    /// Conversion to the node's dtype (float to int truncates toward zero; to bool is `!= 0`).
    Cast(NodeId),
    Unary(UnaryOp, NodeId),
    Binary(BinaryOp, NodeId, NodeId),
    Ternary(TernaryOp, NodeId, NodeId, NodeId),
    /// `x[.., index]`: one component of a last axis of constant size; drops that axis.
    Component {
        x: NodeId,
        index: u32,
    },
    /// `x[.., index, ..]`: element `index` of `axis` of `x`; drops that axis. (On a last axis of
    /// constant size the builder makes an [`Op::Component`] instead.) On an axis of symbolic size
    /// the size must exceed `index`, which binding checks ([`crate::Interface::min_sizes`]).
    Select {
        x: NodeId,
        axis: u32,
        index: u32,
    },
    /// `x[.., start : start + step * size : step, ..]` on `axis`, whose result size (a constant)
    /// is the node's size on that axis: element `c` of it is element `start + step * c` of `x`.
    /// On an axis of symbolic size the size must reach the last element read, which binding
    /// checks ([`crate::Interface::min_sizes`]).
    Slice {
        x: NodeId,
        axis: u32,
        start: u32,
        step: u32,
    },
    /// `transpose(x, a, b)`: `x` with axes `a < b` swapped (`permute` is a chain of them).
    Transpose {
        x: NodeId,
        a: u32,
        b: u32,
    },
    /// The parts (of equal shape) stacked along a new last axis of constant size.
    Stack(ListId),
    /// `x[.., None]`: a new last axis of size 1.
    ExpandLast(NodeId),
    /// `torch.reshape`: the operand's elements in row-major order, in the node's shape. Its
    /// axes split and merge in groups of constant axes ([`crate::reshape_groups`]); a symbolic
    /// axis stays whole.
    Reshape(NodeId),
    /// New axes of size 1 at the result's axes whose bit is set in `axes` (bit `a` = axis `a` of
    /// the result), the operand's axes filling the others in order (`torch.unsqueeze`, several
    /// at once). The gradient of a reduction over inner axes puts them back with it.
    Unsqueeze {
        x: NodeId,
        axes: u32,
    },
    /// `torch.gather(x, axis, index)`: the result has `index`'s shape, and its element at
    /// `(.., j, ..)` is `x`'s element at `(.., index[.., j, ..], ..)` (`j` on `axis`). `index` is
    /// `i32` or `i64`, has `x`'s rank and equals `x`'s shape on every other axis. An index outside
    /// `0..size` (negative ones too) is an error in the interpreter; generated code reads
    /// in bounds and gives NaN (floats) or 0 (`false`) there.
    Gather {
        x: NodeId,
        index: NodeId,
        axis: u32,
    },
    /// A reduction, optionally over only the elements where `mask` (broadcast to `x`) is true.
    Reduce {
        op: ReduceOp,
        axis: ReduceAxis,
        x: NodeId,
        mask: Option<NodeId>,
    },
}

impl Op {
    /// This op with each operand `x` replaced by `f(x)`. A stack keeps its list: its operands are
    /// in [`Graph::lists`], where the caller maps them.
    pub fn map_operands(self, mut f: impl FnMut(NodeId) -> NodeId) -> Op {
        match self {
            Op::Input(_) | Op::Const(_) | Op::Iota { .. } | Op::Stack(_) => self,
            Op::Cast(x) => Op::Cast(f(x)),
            Op::Unary(u, x) => Op::Unary(u, f(x)),
            Op::Binary(b, x, y) => Op::Binary(b, f(x), f(y)),
            Op::Ternary(t, a, b, c) => Op::Ternary(t, f(a), f(b), f(c)),
            Op::Component { x, index } => Op::Component { x: f(x), index },
            Op::Select { x, axis, index } => Op::Select { x: f(x), axis, index },
            Op::Slice { x, axis, start, step } => Op::Slice { x: f(x), axis, start, step },
            Op::Transpose { x, a, b } => Op::Transpose { x: f(x), a, b },
            Op::ExpandLast(x) => Op::ExpandLast(f(x)),
            Op::Reshape(x) => Op::Reshape(f(x)),
            Op::Rand { seed } => Op::Rand { seed: f(seed) },
            Op::Unsqueeze { x, axes } => Op::Unsqueeze { x: f(x), axes },
            Op::Gather { x, index, axis } => Op::Gather { x: f(x), index: f(index), axis },
            Op::Reduce { op, axis, x, mask } => Op::Reduce { op, axis, x: f(x), mask: mask.map(f) },
        }
    }

    /// The operands of this op, in order (for a stack, call [`Graph::operands`]).
    pub fn for_each_operand(&self, lists: &[Vec<NodeId>], mut f: impl FnMut(NodeId)) {
        match *self {
            Op::Input(_) | Op::Const(_) | Op::Iota { .. } => {}
            Op::Cast(x)
            | Op::Unary(_, x)
            | Op::Component { x, .. }
            | Op::Select { x, .. }
            | Op::Slice { x, .. }
            | Op::Transpose { x, .. }
            | Op::ExpandLast(x)
            | Op::Reshape(x)
            | Op::Unsqueeze { x, .. }
            | Op::Rand { seed: x } => f(x),
            Op::Binary(_, a, b) => {
                f(a);
                f(b)
            }
            Op::Ternary(_, a, b, c) => {
                f(a);
                f(b);
                f(c)
            }
            // A list id out of range (a malformed graph) has no operands; the verifier reports it.
            Op::Stack(l) => lists.get(l.0 as usize).into_iter().flatten().copied().for_each(f),
            Op::Gather { x, index, .. } => {
                f(x);
                f(index)
            }
            Op::Reduce { x, mask, .. } => {
                f(x);
                if let Some(m) = mask {
                    f(m)
                }
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub op: Op,
    pub dtype: DType,
    pub shape: Shape,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Input {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Output {
    pub name: String,
    pub node: NodeId,
}

/// A promise about the *values* of an `i32` input that describes ragged data. It changes no
/// node's meaning; [`crate::SymbolBindings::bind`] checks it before anything runs, so that every
/// consumer (interpreter, GPU executor) refuses bad ragged metadata with the same message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// Padded + lengths: every element `l` of the input satisfies `0 <= l <= max` (one count of
    /// valid rows per batch row; `max` is the padded row count, such as `N`).
    Lengths { input: InputId, max: Dim },
    /// Packed + offsets: the rank-1 input holds segment boundaries `offsets[0] = 0`,
    /// non-decreasing, with `offsets[S - 1] = total` (the packed row count, such as `T`).
    Offsets { input: InputId, total: Dim },
}

impl Constraint {
    /// The input the constraint is about.
    pub fn input(self) -> InputId {
        match self {
            Constraint::Lengths { input, .. } | Constraint::Offsets { input, .. } => input,
        }
    }
    /// The layout's name as the language writes it (`lengths`, `offsets`).
    pub fn name(self) -> &'static str {
        match self {
            Constraint::Lengths { .. } => "lengths",
            Constraint::Offsets { .. } => "offsets",
        }
    }
    /// The dimension the constraint bounds (`max` or `total`).
    pub fn dim(self) -> Dim {
        match self {
            Constraint::Lengths { max: d, .. } | Constraint::Offsets { total: d, .. } => d,
        }
    }
}

/// A whole computation: declared inputs, a node arena in topological order, named outputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    /// Dimension symbol names, indexed by [`SymId`].
    pub symbols: Vec<String>,
    pub inputs: Vec<Input>,
    pub nodes: Vec<Node>,
    pub lists: Vec<Vec<NodeId>>,
    pub outputs: Vec<Output>,
    /// Value constraints on ragged-metadata inputs (lengths, offsets), checked at bind time.
    pub constraints: Vec<Constraint>,
}

impl Graph {
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }
    pub fn input(&self, id: InputId) -> &Input {
        &self.inputs[id.0 as usize]
    }
    /// The parts of a stack (empty for a list id out of range, which the verifier rejects).
    pub fn list(&self, id: ListId) -> &[NodeId] {
        self.lists.get(id.0 as usize).map_or(&[], |l| l.as_slice())
    }
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut v = Vec::new();
        self.node(id).op.for_each_operand(&self.lists, |x| v.push(x));
        v
    }
    pub fn input_by_name(&self, name: &str) -> Option<InputId> {
        self.inputs.iter().position(|i| i.name == name).map(|i| InputId(i as u32))
    }
    pub fn output_by_name(&self, name: &str) -> Option<&Output> {
        self.outputs.iter().find(|o| o.name == name)
    }
    /// The node that reads input `id`, if any node does.
    pub fn input_node(&self, id: InputId) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.op == Op::Input(id)).map(|i| NodeId(i as u32))
    }
    pub fn symbol(&self, name: &str) -> Option<SymId> {
        self.symbols.iter().position(|s| s == name).map(|i| SymId(i as u32))
    }
    /// The constraint on input `id`, if it has one.
    pub fn constraint_of(&self, id: InputId) -> Option<Constraint> {
        self.constraints.iter().copied().find(|c| c.input() == id)
    }
    /// Writes one dimension with this graph's symbol names (`N`, `4`).
    pub fn dim_str(&self, dim: Dim) -> String {
        match dim {
            Dim::Const(c) => c.to_string(),
            Dim::Sym(s) => self.symbols.get(s.0 as usize).cloned().unwrap_or_else(|| format!("?{}", s.0)),
        }
    }
    /// Writes a shape with this graph's symbol names.
    pub fn shape_str(&self, shape: &Shape) -> String {
        shape.display(&self.symbols).to_string()
    }
    /// Resolves a symbolic shape with run-time sizes (`sizes[sym]`).
    pub fn resolve_shape(&self, shape: &Shape, sizes: &[u64]) -> Vec<usize> {
        shape
            .0
            .iter()
            .map(|d| match *d {
                Dim::Const(c) => c as usize,
                Dim::Sym(s) => sizes[s.0 as usize] as usize,
            })
            .collect()
    }
    /// For each node, how many times it is used as an operand or output.
    pub fn use_counts(&self) -> Vec<u32> {
        let mut uses = vec![0u32; self.nodes.len()];
        for n in &self.nodes {
            n.op.for_each_operand(&self.lists, |x| uses[x.index()] += 1);
        }
        for o in &self.outputs {
            uses[o.node.index()] += 1;
        }
        uses
    }
    /// Which nodes the outputs depend on (live nodes).
    pub fn live_nodes(&self) -> Vec<bool> {
        let mut live = vec![false; self.nodes.len()];
        for o in &self.outputs {
            live[o.node.index()] = true;
        }
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                self.nodes[i].op.for_each_operand(&self.lists, |x| live[x.index()] = true);
            }
        }
        live
    }
}

impl std::fmt::Display for Graph {
    /// The typed graph, one node per line, as `kfuse check` prints it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, inp) in self.inputs.iter().enumerate() {
            writeln!(f, "input  in{i} {}: {}{}", inp.name, inp.dtype, self.shape_str(&inp.shape))?;
        }
        for c in &self.constraints {
            let name = self.inputs.get(c.input().0 as usize).map_or("?", |i| i.name.as_str());
            writeln!(f, "constraint in{} {name} as {}({})", c.input().0, c.name(), self.dim_str(c.dim()))?;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let ty = format!("{}{}", n.dtype, self.shape_str(&n.shape));
            let body = match n.op {
                Op::Input(id) => format!("input {}", self.input(id).name),
                Op::Const(l) => match l {
                    Literal::Float(b) => format!("const {:?}", f64::from_bits(b)),
                    Literal::Int(v) => format!("const {v}"),
                    Literal::Bool(v) => format!("const {v}"),
                },
                Op::Iota { axis } => format!("iota axis={axis}"),
                Op::Rand { seed } => format!("rand(seed: v{})", seed.0),
                Op::Cast(x) => format!("cast v{}", x.0),
                Op::Unary(op, x) => format!("{} v{}", op.name(), x.0),
                Op::Binary(op, a, b) => format!("v{} {} v{}", a.0, op.name(), b.0),
                Op::Ternary(TernaryOp::Select, c, a, b) => format!("where(v{}, v{}, v{})", c.0, a.0, b.0),
                Op::Ternary(TernaryOp::Clamp, x, lo, hi) => format!("clamp(v{}, v{}, v{})", x.0, lo.0, hi.0),
                Op::Ternary(TernaryOp::Fma, a, b, c) => format!("fma(v{}, v{}, v{})", a.0, b.0, c.0),
                Op::Component { x, index } => format!("v{}[.., {index}]", x.0),
                Op::Select { x, axis, index } => format!("select(v{}, axis: {axis}, index: {index})", x.0),
                Op::Slice { x, axis, start, step } => {
                    let end = u64::from(start)
                        + u64::from(step)
                            * n.shape.dims().get(axis as usize).map_or(0, |d| match d {
                                Dim::Const(c) => *c,
                                Dim::Sym(_) => 0,
                            });
                    format!("slice(v{}, axis: {axis}, {start}:{end}:{step})", x.0)
                }
                Op::Transpose { x, a, b } => format!("transpose(v{}, {a}, {b})", x.0),
                Op::Stack(l) => {
                    let parts: Vec<String> = self.list(l).iter().map(|p| format!("v{}", p.0)).collect();
                    format!("stack({})", parts.join(", "))
                }
                Op::ExpandLast(x) => format!("v{}[.., None]", x.0),
                Op::Reshape(x) => format!("reshape(v{}, {})", x.0, n.shape.display(&self.symbols)),
                Op::Unsqueeze { x, axes } => format!("unsqueeze(v{}, axis: {})", x.0, axis_list(axes, n.shape.rank())),
                Op::Gather { x, index, axis } => format!("gather(v{}, v{}, axis: {axis})", x.0, index.0),
                Op::Reduce { op, axis, x, mask } => {
                    let ax = match axis {
                        ReduceAxis::All => String::new(),
                        ReduceAxis::Last => ", axis: -1".to_string(),
                        ReduceAxis::Axes { mask, keepdim } => {
                            let list = axis_list(mask, self.node(x).shape.rank());
                            format!(", axis: {list}{}", if keepdim { ", keepdim: true" } else { "" })
                        }
                    };
                    let m = mask.map(|m| format!(", where: v{}", m.0)).unwrap_or_default();
                    format!("{}(v{}{ax}{m})", op.name(), x.0)
                }
            };
            writeln!(f, "v{i:<5} {ty:<16} = {body}")?;
        }
        for o in &self.outputs {
            let n = self.node(o.node);
            writeln!(f, "output {}: {}{} = v{}", o.name, n.dtype, self.shape_str(&n.shape), o.node.0)?;
        }
        Ok(())
    }
}

/// The axes whose bit is set in `mask`, below `rank`, written as a list: `[0, 2]`.
fn axis_list(mask: u32, rank: usize) -> String {
    let axes: Vec<String> = (0..rank.min(32)).filter(|a| mask >> a & 1 == 1).map(|a| a.to_string()).collect();
    format!("[{}]", axes.join(", "))
}
