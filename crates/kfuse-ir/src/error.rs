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
    #[error("the mask of `{op}` has shape {mask}, which does not broadcast to the operand's shape {operand}")]
    MaskShape { op: &'static str, mask: String, operand: String },
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
