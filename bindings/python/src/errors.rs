//! Rust errors as the Python exceptions of `kfuse._errors`.
//!
//! The exception classes live in Python (so that `ParseError` and `InputError` can also be
//! `ValueError`s); this module looks them up and raises them with the Rust error's message.
//! A diagnostic keeps its file, line and column as attributes of the `ParseError`.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Which Python exception an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `kfuse.Error`: a program that cannot be derived, planned or evaluated.
    Error,
    /// `kfuse.InputError`: inputs that do not fit the program (name, dtype, shape, layout values).
    Input,
    /// `kfuse.DeviceError`: no driver, GPU or NVRTC, or a feature this build lacks.
    Device,
    /// `kfuse.ConfigError`: an environment variable of kfuse's with a value it cannot use.
    Config,
}

impl Kind {
    fn class(self) -> &'static str {
        match self {
            Kind::Error => "Error",
            Kind::Input => "InputError",
            Kind::Device => "DeviceError",
            Kind::Config => "ConfigError",
        }
    }
}

/// Raises `kfuse.<kind>(message)`.
pub fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| instantiate(py, kind.class(), (message,)))
}

/// Raises `kfuse.ParseError` carrying the diagnostic's file, line, column and caret report.
pub fn parse_error(d: &kfuse::Diagnostic) -> PyErr {
    Python::attach(|py| instantiate(py, "ParseError", (d.to_string(), d.file.clone(), d.line, d.column)))
}

/// The exception `kfuse._errors.<name>(*args)`, or why it could not be made.
fn instantiate<'py>(py: Python<'py>, name: &str, args: impl pyo3::call::PyCallArgs<'py>) -> PyErr {
    let class = py.import("kfuse._errors").and_then(|m| m.getattr(name)).map_err(|e| {
        PyRuntimeError::new_err(format!("kfuse._kfuse is used without its package ({e}); import kfuse instead"))
    });
    match class.and_then(|c| c.call1(args)) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// Inputs that do not bind: `kfuse.InputError`.
pub fn bind(e: &kfuse::BindError) -> PyErr {
    raise(Kind::Input, e.to_string())
}

/// A facade error: a diagnostic is a `ParseError`; what the caller's tensors got wrong (an `i32`
/// sum of their values outside the `i32` range included) an `InputError`; the driver, GPU or
/// NVRTC a `DeviceError` (an invalid environment variable a `ConfigError`); anything else an
/// `Error`.
pub fn kfuse(e: kfuse::Error) -> PyErr {
    use kfuse::Error as E;
    use kfuse::InterpError as I;
    let kind = match &e {
        E::Parse(d) => return parse_error(d),
        E::Bind(_)
        | E::DeviceInput { .. }
        | E::DeviceInputUnknown { .. }
        | E::Interp(I::Bind(_) | I::DuplicateInput { .. } | I::DataLength { .. } | I::IntOverflow { .. })
        | E::BufferTooSmall { .. }
        | E::OutputCount { .. }
        | E::OutputDType { .. }
        | E::OutputShape { .. }
        | E::WrongDevice { .. }
        | E::WrongStream { .. }
        | E::Mlp(
            kfuse::mlp::MlpError::InputDType { .. }
            | kfuse::mlp::MlpError::InputRank { .. }
            | kfuse::mlp::MlpError::InputWidth { .. },
        ) => Kind::Input,
        E::Runtime(r) => return runtime(r),
        _ => Kind::Error,
    };
    raise(kind, e.to_string())
}

/// What to install when the driver or NVRTC is missing, appended to the runtime's message.
const INSTALL_DRIVER: &str = "install the NVIDIA driver (kfuse loads libcuda.so from it), or run on CPU tensors";
const INSTALL_NVRTC: &str = "pip install nvidia-cuda-nvrtc==13.0.88 (a dependency of the kfuse package)";

/// A runtime error: `kfuse.DeviceError`, saying what to install when something is missing; an
/// invalid environment variable (`KFUSE_NO_CACHE=maybe`) is a `kfuse.ConfigError`.
pub fn runtime(e: &kfuse::RuntimeError) -> PyErr {
    use kfuse::RuntimeError as R;
    let message = match e {
        R::InvalidEnv { .. } => return raise(Kind::Config, e.to_string()),
        R::DriverMissing => format!("{e}; {INSTALL_DRIVER}"),
        R::NvrtcMissing => format!("{e}; {INSTALL_NVRTC}"),
        _ => e.to_string(),
    };
    raise(Kind::Device, message)
}
