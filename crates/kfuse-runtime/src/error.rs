//! The runtime's one error type: every failure of NVRTC, the driver, device memory, kernel
//! launches and cache maintenance, each variant carrying what failed and where.
//!
//! Cache *lookups* never produce these for disk problems: a bad, unwritable or foreign cache folder
//! is a warning and a recompile (see `cache`). Only explicit maintenance (`clear`, `verify`,
//! `list`) reports I/O errors and folders that are not kfuse's as values; an invalid cache
//! setting in the environment is an error of every lookup.

use std::path::PathBuf;

use cudarc::driver::DriverError;
use cudarc::nvrtc::result::NvrtcError;

use crate::Arch;

/// Everything that can go wrong in kfuse-runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// libnvrtc could not be loaded; NVRTC compilation is impossible in this process.
    #[error("NVRTC is not available: no loadable libnvrtc.so.13 (install the CUDA 13.0 NVRTC libraries or add their folder to LD_LIBRARY_PATH)")]
    NvrtcMissing,
    /// libcuda could not be loaded; no GPU can be used in this process.
    #[error("the CUDA driver is not available: no loadable libcuda.so (is an NVIDIA driver installed?)")]
    DriverMissing,
    /// The driver loaded but reports no CUDA device.
    #[error("no CUDA device found ({detail})")]
    NoDevice {
        /// What the driver said.
        detail: String,
    },
    /// A device ordinal beyond the number of devices present.
    #[error("CUDA device {ordinal} does not exist: this machine has {count} device(s), ordinals 0..{count}")]
    DeviceOutOfRange {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// An architecture string that is not `sm_XY`, `XY` or `X.Y` (with an optional `a`).
    #[error(transparent)]
    InvalidArch(#[from] kfuse_arch::ParseArchError),
    /// A kernel compiled for an architecture-specific target (`sm_90a`) that the device cannot
    /// run (its code runs on that exact compute capability only).
    #[error("kernel `{fn_name}` targets {target}, which device {ordinal} ({device}) cannot run")]
    ArchMismatch {
        /// The kernel's name.
        fn_name: String,
        /// The target it is compiled for.
        target: Arch,
        /// The device's ordinal.
        ordinal: usize,
        /// The device's compute capability.
        device: Arch,
    },
    /// An environment variable with a value kfuse cannot use.
    #[error("environment variable {name}={value:?} is invalid: expected {expected}")]
    InvalidEnv {
        /// The variable's name.
        name: &'static str,
        /// Its value.
        value: String,
        /// What a valid value looks like.
        expected: &'static str,
    },
    /// A string handed to a C API contains a NUL byte.
    #[error("{what} contains a NUL byte at offset {offset}; CUDA APIs take NUL-terminated strings")]
    InteriorNul {
        /// Which string (source, option, kernel name, PTX).
        what: &'static str,
        /// Byte offset of the first NUL.
        offset: usize,
    },
    /// An NVRTC call other than the compilation itself failed.
    #[error("NVRTC call {call} failed: {code:?}")]
    Nvrtc {
        /// The NVRTC function.
        call: &'static str,
        /// NVRTC's status code.
        code: NvrtcError,
    },
    /// NVRTC rejected the source; `log` holds its diagnostics.
    #[error("NVRTC compilation for {arch} failed ({code:?}) with options {options:?}:\n{log}")]
    Compile {
        /// Target architecture.
        arch: Arch,
        /// The full option list given to NVRTC.
        options: Vec<String>,
        /// NVRTC's program log.
        log: String,
        /// NVRTC's status code.
        code: NvrtcError,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed on device {ordinal}: {error}")]
    Driver {
        /// What was being done.
        call: &'static str,
        /// The device.
        ordinal: usize,
        /// The driver's status.
        error: DriverError,
    },
    /// A device allocation failed for lack of memory.
    #[error("out of device memory: could not allocate {bytes} bytes on device {ordinal}")]
    OutOfMemory {
        /// Requested size.
        bytes: usize,
        /// The device.
        ordinal: usize,
    },
    /// Neither the cubin nor the PTX of a compiled module could be loaded.
    #[error(
        "could not load module {key} ({arch}) on device {ordinal}: cubin: {cubin_error}; PTX fallback: {ptx_error}"
    )]
    ModuleLoad {
        /// Cache key of the module.
        key: String,
        /// Architecture it was compiled for.
        arch: Arch,
        /// The device.
        ordinal: usize,
        /// Why the cubin failed.
        cubin_error: String,
        /// Why the PTX failed (or why it was not tried).
        ptx_error: String,
    },
    /// The module loaded but holds no function of that name.
    #[error("kernel function `{fn_name}` not found in module {key} (is it declared extern \"C\" __global__?)")]
    FunctionNotFound {
        /// The name looked up.
        fn_name: String,
        /// Cache key of the module.
        key: String,
    },
    /// A buffer, function or event of one `Gpu` handed to another.
    #[error("{what} belongs to another Gpu handle (device {owner_ordinal}); it can only be used with the Gpu that created it (device {ordinal})")]
    ForeignHandle {
        /// Buffer, function or event.
        what: &'static str,
        /// Device of the owner.
        owner_ordinal: usize,
        /// Device of the Gpu it was used with.
        ordinal: usize,
    },
    /// An invalid launch configuration, refused before reaching the driver.
    #[error("invalid launch of `{fn_name}` on device {ordinal}: {reason}")]
    InvalidLaunch {
        /// Kernel name.
        fn_name: String,
        /// The device.
        ordinal: usize,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// The driver refused or failed a kernel launch.
    #[error("launch of `{fn_name}` (grid {grid}, block {block}, {shared_bytes} B shared) on device {ordinal} failed: {error}")]
    Launch {
        /// Kernel name.
        fn_name: String,
        /// Blocks.
        grid: u32,
        /// Threads per block.
        block: u32,
        /// Dynamic shared memory.
        shared_bytes: u32,
        /// The device.
        ordinal: usize,
        /// The driver's status.
        error: DriverError,
    },
    /// A cache maintenance operation hit an I/O error.
    #[error("kernel cache I/O error at {}: {error}", path.display())]
    CacheIo {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The cache has no disk folder (no home/cache dir and no KFUSE_CACHE_DIR).
    #[error("the kernel cache has no disk folder: set KFUSE_CACHE_DIR")]
    NoCacheDir,
    /// The cache folder holds files kfuse did not write and has no kfuse `CACHEDIR.TAG`: kfuse
    /// removes nothing from it and writes nothing into it.
    #[error(
        "{} is not a kfuse cache folder ({reason}); kfuse removes nothing from it and writes nothing into it. \
         Point KFUSE_CACHE_DIR at a folder of its own (a new or empty one), or empty this one",
        path.display()
    )]
    CacheNotOwned {
        /// The cache folder.
        path: PathBuf,
        /// What in it is not kfuse's.
        reason: String,
    },
    /// The cache folder's path exists but is not a folder.
    #[error("the kernel cache folder {} is not a folder (it is a file or another kind of entry); set KFUSE_CACHE_DIR to a folder", path.display())]
    CacheNotAFolder {
        /// The path.
        path: PathBuf,
    },
}

impl From<crate::env::EnvError> for RuntimeError {
    fn from(e: crate::env::EnvError) -> RuntimeError {
        RuntimeError::InvalidEnv { name: e.name, value: e.value, expected: e.expected }
    }
}
