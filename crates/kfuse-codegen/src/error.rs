//! The one error type of kfuse-codegen. Every variant names what is unsupported or malformed and
//! where (the IR node `n<id>` as `Graph`'s `Display` prints it as `v<id>`).

use kfuse_ir::IrError;

/// Why a graph could not be planned or a device function not emitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// The graph does not pass `kfuse_ir::verify`.
    #[error("the graph is malformed: {0}")]
    InvalidGraph(IrError),
    /// The graph names no output, so there is nothing to compute.
    #[error("the graph has no outputs, so there is nothing to generate")]
    NoOutputs,
    /// `CodegenOptions::block_size` is not a multiple of 32 in `32..=1024`.
    #[error("block size {block_size} is not supported: it must be a multiple of 32 between 32 and 1024")]
    BadBlockSize { block_size: u32 },
    /// `CodegenOptions::elems_per_thread` is outside `1..=16`.
    #[error("{elems_per_thread} elements per thread is not supported: it must be between 1 and 16")]
    BadElemsPerThread { elems_per_thread: u32 },
    /// `CodegenOptions::batched_threads_per_sm` is not a multiple of the block size up to 2048.
    #[error("{threads} threads per multiprocessor is not supported with blocks of {block_size}: it must be a multiple of the block size, at most 2048")]
    BadThreadsPerSm { threads: u32, block_size: u32 },
    /// The rows plan (the one-launch lengths gradient, `LengthsGradient::OnePass` under a lengths
    /// mask) runs blocks of exactly `rows_block` threads; another non-default block size is
    /// refused rather than replaced.
    #[error("block size {block_size} cannot be honoured by the one-launch lengths-gradient plan (the rows plan), whose blocks have {rows_block} threads: use the default block size or {rows_block}, or plan the gradient as two kernels (`--lengths-gradient two-kernels`)")]
    RowsPlanBlockSize { block_size: u32, rows_block: u32 },
    /// `CodegenOptions::strided_inputs` names an input the graph does not have, or a lengths or
    /// offsets input (whose values the kernels read as one contiguous array).
    #[error("input #{input} cannot be read through strides: {why}")]
    StridedInput { input: u32, why: &'static str },
    /// A constant size product overflows `u64`.
    #[error("the constant part of a size at node v{node} overflows 64 bits")]
    SizeOverflow { node: u32 },
    /// A pattern the generator does not handle; `what` says which and what would work instead.
    #[error("unsupported at node v{node}: {what}")]
    Unsupported { node: u32, what: String },
    /// `emit_device_function` needs scalar float inputs.
    #[error("device function input `{name}` is {dtype}{shape}, but only scalar float inputs are supported")]
    DeviceFunctionInput { name: String, dtype: String, shape: String },
    /// `emit_device_function` needs exactly one output.
    #[error("a device function needs exactly one output, the graph has {count}")]
    DeviceFunctionOutputs { count: usize },
    /// `emit_device_function`'s output must be a scalar float.
    #[error("device function output `{name}` is {dtype}{shape}, but it must be a scalar float")]
    DeviceFunctionOutput { name: String, dtype: String, shape: String },
    /// The function name is not a C identifier.
    #[error("`{name}` is not a valid C identifier for a device function")]
    BadFunctionName { name: String },
    /// A kernel would need more named values than [`crate::MAX_KERNEL_VALUES`]. A last-axis
    /// reduction evaluates its operand again inside its row loop, so a long chain through such
    /// reductions (or the gradient of a chain through component accesses) grows with the square
    /// of its length.
    #[error("the kernel needs more than {limit} values by node v{node}: a last-axis reduction (axis: -1, or the gradient of a component access x[.., k]) computes its operand again inside its loop, so a long chain through such reductions grows with the square of its length; split the program into shorter ones, or reduce over every element")]
    TooLarge { node: u32, limit: u32 },
    /// A planner invariant broke: a bug in kfuse-codegen, reported instead of a panic.
    #[error("internal planner error at node v{node}: {what} (please report this with the graph)")]
    Internal { node: u32, what: &'static str },
}

// By hand rather than `#[from]`: the message includes the IR error, so it is not also the
// `source` (a printer of the source chain would show it twice).
impl From<IrError> for CodegenError {
    fn from(e: IrError) -> CodegenError {
        CodegenError::InvalidGraph(e)
    }
}
