//! The MLP path's one error type. Every variant says what was wrong and where (file, layer,
//! tensor), so that a user can fix a model.json without reading kfuse's source.

use std::path::PathBuf;

use kfuse_ir::DType;

/// Why a model could not be loaded, run, compiled or benchmarked.
#[derive(Debug, thiserror::Error)]
pub enum MlpError {
    #[error("cannot write {what} `{path}`: {error}")]
    Io { what: &'static str, path: PathBuf, error: std::io::Error },
    /// The model description or its weights file could not be read (missing, not a regular
    /// file, too large).
    #[error(transparent)]
    File(#[from] kfuse_lang::files::FileError),
    #[error("`{path}` is not a valid kfuse MLP description: {message}")]
    Json { path: PathBuf, message: String },
    #[error("`{path}`: unsupported format `{found}`; expected \"kfuse-mlp/1\"")]
    Format { path: PathBuf, found: String },
    #[error("`{path}`: unsupported weight dtype `{found}`; expected \"f16\" or \"bf16\"")]
    ModelDType { path: PathBuf, found: String },
    #[error("`{path}` describes no layers; an MLP needs at least one")]
    NoLayers { path: PathBuf },
    #[error("weights file `{path}` is not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("layer {layer}: tensor `{tensor}` ({role}) is not in `{path}`, which holds: {available}")]
    MissingTensor { layer: usize, role: &'static str, tensor: String, path: PathBuf, available: String },
    #[error(
        "layer {layer}: tensor `{tensor}` ({role}) has shape {shape:?}, but a {role} must have rank {want} ({layout})"
    )]
    TensorRank {
        layer: usize,
        role: &'static str,
        tensor: String,
        shape: Vec<usize>,
        want: usize,
        layout: &'static str,
    },
    #[error("layer {layer}: tensor `{tensor}` has dtype {dtype}; weights and biases must be F16, BF16 or F32")]
    TensorDType { layer: usize, tensor: String, dtype: String },
    #[error("layer {layer}: tensor `{tensor}` has a zero-sized shape {shape:?}; every width must be at least 1")]
    EmptyTensor { layer: usize, tensor: String, shape: Vec<usize> },
    #[error("layer {layer}: widths do not chain: its weight `{tensor}` takes {input} inputs, but layer {prev} produces {prev_out} outputs")]
    WidthChain { layer: usize, tensor: String, input: usize, prev: usize, prev_out: usize },
    #[error("layer {layer}: bias `{tensor}` has {got} elements, but the layer has {want} outputs")]
    BiasShape { layer: usize, tensor: String, got: usize, want: usize },
    #[error("layer {layer}: unknown activation `{name}`; known: {known}; or write a .kf expression in x such as \"x * sigmoid(1.702 * x)\"")]
    UnknownActivation { layer: usize, name: String, known: String },
    #[error("layer {layer}: activation `{expression}` is not a valid expression in x:\n{message}")]
    ActivationParse { layer: usize, expression: String, message: String },
    #[error(
        "layer {layer}: activation `{expression}` must produce one float value per element, but it produces {found}"
    )]
    ActivationType { layer: usize, expression: String, found: String },
    #[error("layer {layer}: evaluating activation `{expression}` failed: {message}")]
    ActivationEval { layer: usize, expression: String, message: String },
    #[error("layer {layer}: generating CUDA for activation `{expression}` failed: {message}")]
    ActivationCodegen { layer: usize, expression: String, message: String },
    #[error("the input must be a matrix [rows, {want}], but it has shape {shape:?}")]
    InputRank { shape: Vec<usize>, want: usize },
    #[error("the input has {got} columns, but the model's first layer takes {want}")]
    InputWidth { got: usize, want: usize },
    #[error("the input has 0 rows; give at least one row")]
    EmptyBatch,
    #[error("the input has dtype {dtype}; inputs must be f32, f16 or bf16")]
    InputDType { dtype: DType },
    #[error("output dtype {dtype} is not supported; use f32, f16 or bf16")]
    OutputDType { dtype: DType },
    #[error("{what} = {value} is too large for the GPU path (limit {limit})")]
    TooLarge { what: &'static str, value: u64, limit: u64 },
    #[error("kernel options: {message}")]
    KernelOption { message: String },
    #[error("the fused kernel needs {needed} bytes of shared memory for {what}, but the limit is {limit}")]
    SharedMemory { what: String, needed: u64, limit: u64 },
    #[error("the optimised kernel `{kernel}` for {arch} did not compile in the background ({message}); launches keep its fast-compiled form")]
    OptimizedCompile { kernel: String, arch: kfuse_arch::Arch, message: String },
    #[error("the model was prepared for {what} dtype {prepared}, but {given} was given; prepare it for {given}")]
    PreparedDType { what: &'static str, prepared: DType, given: DType },
    #[error("the {tier} kernel of `{kernel}` cannot be launched: {why}")]
    TierUnavailable { tier: &'static str, kernel: String, why: &'static str },
}

/// Shorthand for results of this crate.
pub type Result<T, E = MlpError> = std::result::Result<T, E>;
