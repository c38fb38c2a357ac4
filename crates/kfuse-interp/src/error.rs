//! The interpreter's error type: everything that can stop an evaluation, each variant saying what
//! and where. NaN and infinities in the data are never errors; they propagate per IEEE 754.

use kfuse_ir::{BindError, DType, IrError};

/// Why a graph could not be evaluated on the given inputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// The graph breaks the IR's typing rules (the verifier's message).
    #[error("the graph cannot be evaluated: {0}")]
    Graph(IrError),
    /// The input tensors do not fit the graph's declarations.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The same input name appears twice in the list of inputs.
    #[error("input `{name}` is given more than once")]
    DuplicateInput { name: String },
    /// A tensor's element count disagrees with its own shape.
    #[error("input `{name}` has shape {shape:?}, which holds {expected} elements, but {got} values were given")]
    DataLength { name: String, shape: Vec<usize>, expected: usize, got: usize },
    /// A shape's element count does not fit in this machine's address space.
    #[error("the shape {shape:?} of `{what}` has more elements than this machine can address")]
    SizeOverflow { what: String, shape: Vec<usize> },
    /// A resolved operand shape does not broadcast to the shape its node needs. The IR rules make
    /// this impossible for graphs bound through `SymbolBindings`; it guards hand-edited graphs.
    #[error("v{node}: operand shape {operand:?} does not broadcast to {target:?}")]
    Broadcast { node: u32, operand: Vec<usize>, target: Vec<usize> },
    /// An `i32` sum or count whose exact value an `i32` cannot hold: refused rather than wrapped.
    #[error("v{node}: the i32 `{op}` is {value}, outside the i32 range -2147483648..=2147483647; sum floats instead (sum(f32(x))) if such totals are expected")]
    IntOverflow { node: u32, op: &'static str, value: f64 },
    /// A `gather` index outside the source's axis (`0..size`; negative indices are out of
    /// range too, as in `torch.gather` on CUDA).
    #[error("v{node}: `gather` index {value} at position {position:?} of the index is out of range for axis {axis} of the source, of size {size} (an index must be in 0..{size})")]
    GatherIndex { node: u32, value: i64, position: Vec<usize>, axis: usize, size: usize },
    /// An op meets a dtype it has no meaning for (only possible in a graph the verifier missed).
    #[error("v{node}: `{op}` is not defined for {dtype} operands")]
    Unsupported { node: u32, op: &'static str, dtype: DType },
}

// By hand rather than `#[from]`: the message includes the IR error, so it is not also the
// `source` (a printer of the source chain would show it twice).
impl From<IrError> for InterpError {
    fn from(e: IrError) -> InterpError {
        InterpError::Graph(e)
    }
}
