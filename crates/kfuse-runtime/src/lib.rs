//! kfuse-runtime: the only layer of kfuse that touches CUDA.
//!
//! - [`compile`] turns CUDA C++ source into a cubin (plus PTX fallback) with NVRTC, no GPU
//!   needed;
//! - [`KernelCache`] keeps compiled modules in memory and on disk, keyed by a stable blake3
//!   [`CacheKey`];
//! - [`lookup::SourceMap`] is the first-level memory lookup both use (a fast hash verified by
//!   equality, so a repeat costs about one map probe);
//! - [`Gpu`] is one device with its own stream: buffers, kernel loading through the cache, launches
//!   and timing events; [`Stream`]s it creates or borrows, and memory it borrows (the foreign
//!   memory door: [`Gpu::borrow_stream`], [`Gpu::borrow_memory`]), and the error record that
//!   checking kernels write a violation of their inputs' values into ([`Gpu::take_device_error`]);
//! - [`env`](mod@env) reads kfuse's environment switches one way everywhere;
//! - [`testing`] gates NVRTC- and GPU-tier tests.
//!
//! It takes CUDA source strings and knows nothing of the IR. Libraries are loaded at run time
//! (cudarc `dynamic-loading`); their absence is an error value, never a panic.

pub mod cache;
mod device_errors;
pub mod env;
mod error;
mod gpu;
mod key;
pub mod lookup;
mod nvrtc;
mod stream;
pub mod testing;
pub mod timing;

pub use cache::{
    BackgroundCompile, BackgroundFailure, BackgroundOutcome, CacheConfig, CacheCounters, CacheEntryInfo, CacheMode,
    CacheOutcome, CacheStats, ClearReport, KernelCache, VerifyAction, VerifyProblem, VerifyReport,
};
pub use device_errors::DeviceViolation;
pub use error::RuntimeError;
pub use gpu::{
    driver_available, open_default, preserving_thread_context, DeviceBuffer, Gpu, GpuEvent, GpuFunction, HostElement,
    KernelArg, KernelLaunch,
};
pub use key::{CacheKey, KeyParts, CACHE_FORMAT_VERSION, KFUSE_VERSION};
pub use kfuse_arch::{Arch, ParseArchError};
pub use nvrtc::{
    build_arch, cache_key, compile, nvrtc_available, nvrtc_calls_on_this_thread, nvrtc_version, supported_archs,
    CompileOptions, CompiledModule,
};
pub use stream::Stream;
