//! The errors of building a graph ([`IrError`]) and of binding input tensors to it ([`BindError`]).

use crate::DType;

/// A graph that cannot be built or is malformed. Each variant says what was wrong with which
/// operands; the language layer adds the source position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    #[error("cannot broadcast shape {left} with shape {right}")]
    Broadcast { left: String, right: String },
    #[error("`{op}` does not accept {dtype} operands{hint}")]
    BadDType { op: &'static str, dtype: DType, hint: &'static str },
    #[error("`{op}` needs operands of the same kind, got {left} and {right}")]
    KindMismatch { op: &'static str, left: DType, right: DType },
    #[error("component index {index} is out of range for a last axis of size {size}")]
    ComponentOutOfRange { index: i64, size: u64 },
    #[error("component access needs a last axis of constant size, but the shape is {shape}")]
    ComponentNeedsConstAxis { shape: String },
    #[error("`{op}` needs an operand of rank at least {min}, got shape {shape}")]
    RankTooLow { op: &'static str, min: usize, shape: String },
    #[error("`{op}`: axis {axis} {why}, for an operand of rank {rank}")]
    BadAxis { op: &'static str, axis: i64, rank: usize, why: String },
    #[error("the mask of `{op}` has shape {mask}, which does not broadcast to the operand's shape {operand}")]
    MaskShape { op: &'static str, mask: String, operand: String },
    #[error("`gather` along axis {axis}: the index has shape {index}, but it needs the source's rank and its size on every other axis (the source has shape {operand})")]
    GatherShape { axis: usize, index: String, operand: String },
    #[error("the seed of `rand_like` must be a scalar, but it has shape {shape}")]
    RandSeedShape { shape: String },
    #[error("`{op}` on axis {axis} of shape {shape}: {why}")]
    BadView { op: &'static str, axis: i64, shape: String, why: String },
    #[error("`reshape` from {from} to {to}: {why}")]
    BadReshape { from: String, to: String, why: String },
    #[error("`stack` needs at least one part")]
    EmptyStack,
    #[error("duplicate name `{0}`")]
    DuplicateName(String),
    #[error("unknown dimension symbol `{0}`")]
    UnknownSymbol(String),
    #[error("input `{input}` cannot be declared as {layout}: {why}")]
    BadConstraint { input: String, layout: &'static str, why: String },
    #[error("graph is malformed: {0}")]
    Malformed(String),
    #[error("`{what}` is not differentiable here: {why}")]
    NotDifferentiable { what: String, why: String },
}

/// Why a set of input tensors does not fit a graph. Every message names the input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BindError {
    #[error("missing input `{name}` (declared as {decl})")]
    Missing { name: String, decl: String },
    #[error("unknown input `{name}`; the inputs are: {known}")]
    Unknown { name: String, known: String },
    #[error("input `{name}` has dtype {got}, but is declared as {want}")]
    DType { name: String, got: DType, want: DType },
    #[error("input `{name}` has {got} axes (shape {shape:?}), but is declared with {want}: {decl}")]
    Rank { name: String, got: usize, want: usize, shape: Vec<usize>, decl: String },
    #[error("input `{name}` has size {got} on axis {axis}, but the declaration {decl} fixes it at {want}")]
    ConstDim { name: String, axis: usize, got: usize, want: u64, decl: String },
    #[error("input `{name}` has {sym} = {got} (axis {axis}), but `{first}` already set {sym} = {want}")]
    SymbolClash { name: String, axis: usize, sym: String, got: usize, want: u64, first: String },
    /// A `lengths` input holds a negative count. `index` is written `3` or `1, 2`.
    #[error("input `{name}`: {name}[{index}] = {value} is negative (a length counts valid rows, from 0)")]
    LengthNegative { name: String, index: String, value: i32 },
    /// A `lengths` input holds a count above its declared maximum.
    #[error("input `{name}`: {name}[{index}] = {value} is greater than {dim} = {max}")]
    LengthTooLarge { name: String, index: String, value: i32, dim: String, max: u64 },
    /// An `offsets` input with no element at all.
    #[error("input `{name}` is empty, but offsets need at least one element (offsets[0] = 0; B rows need B + 1)")]
    OffsetsEmpty { name: String },
    /// An `offsets` input whose first element is not 0.
    #[error("input `{name}`: {name}[0] = {value}, but must be 0")]
    OffsetStart { name: String, value: i32 },
    /// An `offsets` input that decreases somewhere.
    #[error("input `{name}`: {name}[{index}] = {value} is less than {name}[{prev_index}] = {prev} (offsets must not decrease)")]
    OffsetDecrease { name: String, index: usize, value: i32, prev_index: usize, prev: i32 },
    /// An `offsets` input with a boundary beyond the packed row count.
    #[error("input `{name}`: {name}[{index}] = {value} is past the end ({dim} = {total})")]
    OffsetPastEnd { name: String, index: usize, value: i32, dim: String, total: u64 },
    /// An `offsets` input whose last boundary is not the packed row count.
    #[error("input `{name}`: the last offset {name}[{index}] = {value} must equal {dim} = {total}")]
    OffsetEnd { name: String, index: usize, value: i32, dim: String, total: u64 },
    /// A symbol bound below the size a slice or an index of its axis needs (`x[.., 2:7]` of an
    /// axis `N` needs `N >= 7`).
    #[error(
        "dimension {sym} = {size} is too small: {why} reads element {last} of it, so {sym} must be at least {min}"
    )]
    SizeTooSmall { sym: String, size: u64, min: u64, last: u64, why: String },
    /// A declaration whose shape names a symbol the interface does not have (a hand-built
    /// interface; graphs from the builder never do this).
    #[error("input `{name}` names dimension symbol ?{sym} on axis {axis}, which the interface does not declare")]
    UnknownSymbol { name: String, axis: usize, sym: u32 },
}
