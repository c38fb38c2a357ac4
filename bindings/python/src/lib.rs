//! `kfuse._kfuse`: the native half of the `kfuse` Python package.
//!
//! It exposes `Program` (a `kfuse::Program` of the process-wide engine: its interface, generated
//! CUDA, derived backward programs and the CPU reference interpreter), `Binding` (a program bound
//! to input shapes: output shapes, the lengths/offsets value check and the CUDA launch), `Mlp` (a
//! fused MLP: its CPU path, and its fused kernel per device and dtype), `scale_by_upstream` (the
//! backward of a loss computed with its gradients, on CUDA), `check_errors()` (waits and raises a
//! lengths/offsets violation the kernels recorded on a device) and `cache_info()` (kernel-cache
//! counters and the functions loaded per device). Tensors cross the boundary as plain values:
//! `(name, bytes, dtype, shape)` for host data, `(name, dtype, shape)` for shapes, and raw device
//! addresses for CUDA memory, so this module knows nothing of
//! PyTorch; the glue in `kfuse/_program.py` does.
//!
//! Errors become the exceptions of `kfuse._errors` (`ParseError`, `InputError`, `DeviceError`,
//! `ConfigError`, `Error`), see the `errors` module.
//!
//! Unsafe code is denied except in one function, `device::borrow`, which borrows PyTorch's
//! memory and stream for a launch.
#![deny(unsafe_code)]

mod binding;
mod device;
mod dtypes;
mod errors;
mod mlp;
mod program;
mod shapes;

use pyo3::prelude::*;

/// The module `kfuse._kfuse`.
#[pymodule]
fn _kfuse(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<program::Program>()?;
    m.add_class::<binding::Binding>()?;
    m.add_class::<mlp::Mlp>()?;
    m.add_function(wrap_pyfunction!(device::cache_info, m)?)?;
    m.add_function(wrap_pyfunction!(binding::scale_by_upstream, m)?)?;
    m.add_function(wrap_pyfunction!(device::check_errors, m)?)?;
    m.add_function(wrap_pyfunction!(device::wait_for_compiles, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("_RECOMPUTED_EXTENT_LIMIT", kfuse::RECOMPUTED_EXTENT_LIMIT)?;
    Ok(())
}
