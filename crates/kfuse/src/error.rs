//! The facade's one error type: every layer's errors, and the executor's own, each variant saying
//! what went wrong and where.

use kfuse_ir::DType;

/// Everything that can go wrong between a description and its results.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A description file could not be read: missing, not a regular file, or too large.
    #[error(transparent)]
    File(#[from] kfuse_lang::files::FileError),
    /// The `.kf` source is wrong (file, line, column, what was expected). Boxed: a diagnostic
    /// carries its source line and is much larger than the other errors.
    #[error(transparent)]
    Parse(Box<kfuse_lang::Diagnostic>),
    #[error(transparent)]
    Ir(#[from] kfuse_ir::IrError),
    /// Inputs that do not fit the declarations: unknown or missing names, dtypes, ranks, constant
    /// dims, symbols that disagree, bad lengths or offsets (naming the input and position).
    #[error(transparent)]
    Bind(#[from] kfuse_ir::BindError),
    /// A derived program (`vjp`, `with_gradients`) that cannot be built.
    #[error(transparent)]
    Derive(#[from] kfuse_passes::DeriveError),
    #[error(transparent)]
    Interp(#[from] kfuse_interp::InterpError),
    #[error(transparent)]
    Codegen(#[from] kfuse_codegen::CodegenError),
    #[error(transparent)]
    Runtime(#[from] kfuse_runtime::RuntimeError),
    #[error(transparent)]
    Mlp(#[from] kfuse_mlp::MlpError),
    /// `with_input_dtypes` on a program built from a graph rather than from `.kf` source.
    #[error("{origin}: input dtypes can only be changed for a program compiled from .kf source")]
    NoSource { origin: String },
    /// A device tensor handed to `launch` whose buffer is smaller than its shape and dtype need.
    #[error("{role} `{name}` is {dtype}{shape:?} ({want} bytes), but its buffer holds only {bytes} bytes")]
    BufferTooSmall { role: &'static str, name: String, dtype: DType, shape: Vec<usize>, want: u64, bytes: usize },
    /// A device tensor's strides that do not fit its shape, or a view that is not contiguous
    /// handed to kernels that read that input as a contiguous array.
    #[error("{role} `{name}`: {why}")]
    Strides { role: &'static str, name: String, why: String },
    /// `launch` given another number of output tensors than the program has outputs.
    #[error("{origin}: {got} output tensors given, but the program has {want} outputs ({names})")]
    OutputCount { origin: String, got: usize, want: usize, names: String },
    /// An output name that the program does not have.
    #[error("no output named `{name}` (outputs: {known})")]
    NoOutput { name: String, known: String },
    /// A bound launch ([`crate::DeviceBinding::launch`]) given another number of buffers than its
    /// inputs and outputs, or a buffer smaller than its bound shape.
    #[error("a bound launch of {origin}: {why}")]
    BoundBuffers { origin: String, why: String },
    /// An output tensor of the wrong dtype.
    #[error("output `{name}` (position {position}) has dtype {got}, but the program writes {want}")]
    OutputDType { name: String, position: usize, got: DType, want: DType },
    /// An output tensor of the wrong shape for these inputs.
    #[error("output `{name}` (position {position}) has shape {got:?}, but these inputs make it {want:?}")]
    OutputShape { name: String, position: usize, got: Vec<usize>, want: Vec<usize> },
    /// A device tensor on another device than the one launched on.
    #[error("{role} `{name}` lives on device {got}, but the launch is on device {want}")]
    WrongDevice { role: &'static str, name: String, got: usize, want: usize },
    /// A stream of another device than the one launched on.
    #[error("the stream belongs to device {got}, but the launch is on device {want}")]
    WrongStream { got: usize, want: usize },
    /// A cooperative kernel that cannot have one block resident.
    #[error("kernel {kernel} cannot have even one block of {block} threads resident on device {ordinal}")]
    NotResident { kernel: String, block: u32, ordinal: usize },
    /// Sizes that need more blocks than a launch can have.
    #[error("kernel {kernel} needs too many blocks for the sizes {sizes:?}")]
    GridTooLarge { kernel: String, sizes: Vec<u64> },
    /// A buffer or tensor whose size overflows for these sizes.
    #[error("{what} does not fit in memory for the sizes {sizes:?}")]
    TooLarge { what: String, sizes: Vec<u64> },
    /// An output that came back from the device with the wrong number of bytes.
    #[error("output `{name}` came back with {bytes} bytes, expected {want}")]
    OutputBytes { name: String, bytes: usize, want: usize },
    /// A gradient or upstream gradient that [`scale_by_upstream`](crate::scale_by_upstream)
    /// cannot take (not a float, an upstream of more than one element).
    #[error("cannot scale a gradient by its upstream gradient: {why}")]
    Scale { why: String },
    /// A lengths/offsets value that broke its layout, found by the kernels of an earlier launch
    /// on device `ordinal` (their outputs were written as NaN meanwhile) and taken from the
    /// device's error record by a later call.
    #[error("{origin}: {source}; found on device {ordinal} by the kernels of an earlier call, which wrote NaN into its outputs (the loss)")]
    DeviceInput { origin: String, ordinal: usize, source: Box<kfuse_ir::BindError> },
    /// A violation recorded on a device by kernels this process cannot name (a record it does not
    /// know how to read).
    #[error("a lengths/offsets value broke its layout on device {ordinal}: input #{input}, position {position}, value {value} (kernels of tag {tag}, not known to this process)")]
    DeviceInputUnknown { ordinal: usize, tag: u32, input: u32, position: u64, value: i64 },
    /// A plan buffer for an input the interface does not declare (a planner bug).
    #[error("the plan has a buffer for input {index}, which its interface does not declare or which was not given (this is a bug in kfuse; please report it)")]
    PlanMissingInput { index: usize },
    /// A plan whose buffers do not list an output (a planner bug).
    #[error("the plan has no buffer for output `{name}` (this is a bug in kfuse; please report it)")]
    PlanMissingOutput { name: String },
}

impl From<kfuse_lang::Diagnostic> for Error {
    fn from(d: kfuse_lang::Diagnostic) -> Error {
        Error::Parse(Box::new(d))
    }
}

/// `Result` with the facade's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
