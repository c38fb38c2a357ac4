//! The process-wide engine and its devices, the one place where the bindings borrow a framework's
//! memory and stream, and the runtime figures `kfuse.cache_info()` reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use kfuse::{DeviceBuffer, Engine, Gpu, Stream};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{self, Kind};

/// The process-wide engine: the kernel cache (shared with the command-line tool through the disk
/// cache) and the devices, each opened once. An invalid setting of the cache's environment
/// (`KFUSE_NO_CACHE=maybe`, `KFUSE_CACHE_MAX_BYTES=lots`, ...) is a `kfuse.ConfigError` naming the
/// variable and the accepted values, raised by every call that needs the engine (`kfuse.load`,
/// `kfuse.compile`, `kfuse.cache_info()`, ...), CPU-only ones included.
pub fn engine() -> PyResult<&'static Engine> {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    if let Some(engine) = ENGINE.get() {
        return Ok(engine);
    }
    let engine = Engine::new().map_err(errors::kfuse)?;
    // Two threads may get here at once; both engines share the process-wide cache, and the first
    // one stored is kept.
    Ok(ENGINE.get_or_init(|| engine))
}

/// The ordinals (below 64) of the devices this module has opened, one bit each.
static OPENED: AtomicU64 = AtomicU64::new(0);

/// Device `ordinal` of the engine, opened on first use; a device that cannot be opened (no
/// driver, no such device) is a `kfuse.DeviceError` saying what to install.
pub fn device(ordinal: usize) -> PyResult<Arc<Gpu>> {
    // Opening a device makes its context current; PyTorch's current device is left as it was.
    let engine = engine()?;
    let gpu = kfuse::preserving_thread_context(|| engine.device(ordinal)).map_err(errors::kfuse)?;
    if ordinal < 64 {
        OPENED.fetch_or(1 << ordinal, Ordering::Relaxed);
    }
    Ok(gpu)
}

/// Checks that each `(role, name, address)` is 16-byte aligned, as kfuse's kernels need (they
/// load small trailing axes as vectors). A null address (an empty tensor) is accepted.
pub fn check_aligned<'a>(args: impl IntoIterator<Item = (&'static str, &'a str, u64)>) -> PyResult<()> {
    for (role, name, address) in args {
        if address % 16 != 0 {
            return Err(errors::raise(
                Kind::Input,
                format!("{role} `{name}` starts at {address:#x}, which is not 16-byte aligned; pass a fresh tensor"),
            ));
        }
    }
    Ok(())
}

/// Borrows the framework's stream `stream` (a `cudaStream_t` of device `gpu`, 0 for the legacy
/// default stream) and each `(address, bytes)` of its memory, for one launch.
///
/// The caller (kfuse's Python glue) passes, for the duration of the call that uses the result:
/// `torch.cuda.current_stream(device).cuda_stream` of the tensors' device, and for each tensor
/// `data_ptr()` with `numel() * element_size()` bytes of a tensor on that device that it keeps
/// referenced until the call returns.
#[allow(unsafe_code)]
pub fn borrow(gpu: &Gpu, stream: u64, memory: &[(u64, u64)]) -> PyResult<(Stream, Vec<DeviceBuffer>)> {
    let stream = usize::try_from(stream)
        .map_err(|_| errors::raise(Kind::Input, format!("stream handle {stream:#x} is not a pointer")))?;
    let mut buffers = Vec::with_capacity(memory.len());
    for &(address, bytes) in memory {
        let bytes = usize::try_from(bytes)
            .map_err(|_| errors::raise(Kind::Input, format!("{bytes} bytes do not fit in this machine's memory")))?;
        // SAFETY: the address and byte count come from a live torch tensor on this device
        // (`data_ptr()`, `numel() * element_size()`), allocated by PyTorch in the primary context
        // that kfuse's `Gpu` uses too; torch keeps the tensor alive for the call, and kernels
        // queued on the borrowed stream are ordered before any reuse of the memory by torch's
        // caching allocator (which frees in that stream's order).
        buffers.push(unsafe { gpu.borrow_memory(address, bytes) });
    }
    // SAFETY: `stream` is torch's current stream of this device (a live `CUstream` of the
    // primary context, or 0 for the legacy default stream), and the wrapper lives only for the
    // call that queues kernels on it.
    let stream = unsafe { gpu.borrow_stream(stream) };
    Ok((stream, buffers))
}

/// `kfuse.cache_info()`: this process's kernel-cache counters (compiles, disk hits, memory
/// hits), the cache folder, the compiles running in the background, and the kernel functions
/// loaded on each device opened so far.
#[pyfunction]
pub fn cache_info(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let engine = engine()?;
    let cache = engine.cache();
    let counters = cache.stats().session;
    let info = PyDict::new(py);
    info.set_item("compiles", counters.compiles)?;
    info.set_item("disk_hits", counters.disk_hits)?;
    info.set_item("memory_hits", counters.memory_hits)?;
    info.set_item("cache_dir", cache.dir().map(|d| d.display().to_string()))?;
    info.set_item("background_compiles", cache.background_compiles())?;
    let loaded = PyDict::new(py);
    let opened = OPENED.load(Ordering::Relaxed);
    for ordinal in (0..64).filter(|o| opened & (1 << o) != 0) {
        let gpu = engine.device(ordinal).map_err(errors::kfuse)?;
        loaded.set_item(ordinal, gpu.loaded_functions())?;
    }
    info.set_item("loaded_functions", loaded)?;
    Ok(info)
}

/// `kfuse.wait_for_compiles()`: blocks (without the GIL) until the optimised kernels that first
/// calls left compiling in the background are compiled; later calls launch them. Makes no engine
/// (the package also runs it at exit, so that no compile is cut off).
#[pyfunction]
pub fn wait_for_compiles(py: Python<'_>) {
    py.detach(kfuse::KernelCache::wait_for_global_background);
}

/// Waits for every device this module opened and raises the violation of a lengths/offsets
/// layout that kernels recorded there (`kfuse.InputError`); nothing without a device.
#[pyfunction]
pub fn check_errors(py: Python<'_>) -> PyResult<()> {
    let opened = OPENED.load(Ordering::Relaxed);
    if opened == 0 {
        return Ok(());
    }
    let engine = engine()?;
    for ordinal in (0..64).filter(|o| opened & (1 << o) != 0) {
        py.detach(|| engine.check_errors(ordinal)).map_err(errors::kfuse)?;
    }
    Ok(())
}
