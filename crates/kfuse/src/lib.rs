//! kfuse: run-time kernel fusion.
//!
//! A `.kf` description (or a graph built with [`kfuse_ir::GraphBuilder`]) is type-checked into an
//! IR graph, fused into CUDA kernels generated at run time, compiled with NVRTC for the GPU that is
//! found, cached on disk and in memory, and launched. The same graph runs on the CPU through the
//! reference interpreter, which is also the oracle of every GPU test.
//!
//! This crate is the facade. An [`Engine`] owns the kernel cache and the GPUs it opens; a
//! [`Program`] is compiled through it and holds it, so it can live as long as its user (a Python
//! object, a server). A program runs on the CPU ([`Program::run_cpu`]), on host tensors on a GPU
//! ([`Program::run_gpu`]), or in place on a framework's device memory and stream
//! ([`Program::launch`]). [`exec`] is the executor underneath. Every failure is an [`Error`].
//!
//! ```
//! # fn main() -> Result<(), kfuse::Error> {
//! let engine = kfuse::Engine::with_cache(std::sync::Arc::new(kfuse::KernelCache::memory_only()));
//! let p = kfuse::Program::compile(&engine, "input x: f32[N]\noutput y = sum(x * x)\n", "demo.kf")?;
//! let x = kfuse::HostTensor::from_f64(kfuse::DType::F32, vec![3], &[1.0, 2.0, 3.0]);
//! let out = p.run_cpu(&[("x", &x)])?;
//! assert_eq!(out[0].1.scalar_f64(), Some(14.0));
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod checks;
mod engine;
mod error;
pub mod exec;
pub mod mlp;
mod program;
mod scale;
mod tiered;

pub use checks::{violation_error, Validation};
pub use engine::Engine;
pub use error::{Error, Result};
pub use exec::DeviceTensor;
pub use program::{read_source, BuildTarget, DeviceBinding, KernelBuild, Program, RECOMPUTED_EXTENT_LIMIT};
pub use scale::scale_by_upstream;

pub use kfuse_codegen::{BufferKind, CodegenOptions, LengthsGradient, Param, Plan};
pub use kfuse_interp::{run as interpret, InterpError};
pub use kfuse_ir::{
    BindError, Constraint, DType, Dim, Graph, HostTensor, InputId, Interface, Kind, LayoutConstraint, Shape,
    TensorData, TensorDecl,
};
pub use kfuse_lang::Diagnostic;
pub use kfuse_passes::{vjp, with_gradients, DeriveError, Derived};
pub use kfuse_runtime::{
    preserving_thread_context, Arch, CacheOutcome, DeviceBuffer, Gpu, KernelCache, ParseArchError, RuntimeError, Stream,
};

/// The language's parser and file readers, for tools that work on `.kf` text below a [`Program`].
pub mod lang {
    pub use kfuse_lang::{files, parse_program};
}

/// The runtime below the executor, for tools that launch their own kernels (the CLI's bandwidth
/// and tensor-core probes) or manage the cache: devices, the one launch call, NVRTC, the
/// environment settings and the test tiers' helpers.
pub mod runtime {
    pub use kfuse_runtime::{
        cache, compile, driver_available, env, nvrtc_available, open_default, preserving_thread_context, testing,
        timing, Arch, CacheOutcome, CompileOptions, DeviceBuffer, Gpu, GpuFunction, KernelArg, KernelCache,
        KernelLaunch, RuntimeError, Stream, VerifyAction,
    };
}
