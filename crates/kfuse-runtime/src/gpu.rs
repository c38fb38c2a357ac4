//! One CUDA device: a context, one stream, device buffers, kernel loading through the kernel
//! cache, launches and timing events.
//!
//! All work of a `Gpu` goes to its own stream, so stream order alone orders allocation, use and
//! free; buffers, functions, events and streams carry the id of the `Gpu` that made them and are
//! refused by any other.
//!
//! The door for a framework's memory and streams: [`Gpu::borrow_memory`] wraps a device pointer
//! the `Gpu` did not allocate (never freed by kfuse), [`Gpu::borrow_stream`] a stream handle it did
//! not create (never destroyed), and [`Gpu::launch`] queues a kernel on any [`Stream`] of the
//! device with no host synchronisation. Ordering work across streams is then the caller's task.
//! Does not handle: graphs, peer copies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys::{self, CUdevice_attribute, CUfunction_attribute, CUresult};
use cudarc::driver::{
    result as dresult, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DriverError,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::cache::{CacheOutcome, KernelCache};
use crate::device_errors::{DeviceViolation, ErrorRecord};
use crate::lookup::{LookupKey, SourceMap};
use crate::nvrtc::{check_no_nul, CompileOptions, CompiledModule};
use crate::stream::Stream;
use crate::timing;
use crate::{Arch, CacheKey, RuntimeError};

/// Dynamic shared memory a kernel may use without opting in.
const DEFAULT_DYNAMIC_SHARED_LIMIT: u32 = 48 * 1024;

/// Whether libcuda can be loaded; checked once because cudarc panics on a missing library.
pub fn driver_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries to dlopen candidate library names; no preconditions.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// Runs `f`, then gives the calling thread back the CUDA context that was current before when
/// `f` left another one current (kfuse's driver calls make their device's context current).
/// Frameworks keep their current device in the thread's context (PyTorch's
/// `torch.cuda.current_device()` reads it), so work kfuse does for them on another device, opening
/// it included, must not move it. Without a driver it only runs `f`.
pub fn preserving_thread_context<T>(f: impl FnOnce() -> T) -> T {
    if !driver_available() {
        return f();
    }
    let before = cudarc::driver::result::ctx::get_current().ok();
    let out = f();
    if let Some(before) = before {
        if cudarc::driver::result::ctx::get_current().ok() != Some(before) {
            let ctx = before.unwrap_or(std::ptr::null_mut());
            // SAFETY: `ctx` is null (no context) or the context that was current on this thread
            // when `f` began; `f` cannot destroy it (kfuse releases primary contexts only when a
            // Gpu is dropped, and a framework's contexts outlive its calls into kfuse). On failure
            // the thread keeps kfuse's context, as it would have without this function.
            let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx) };
        }
    }
    out
}

/// A process-unique id for each opened `Gpu` (32 bits keep a `DeviceBuffer` small).
fn next_gpu_id() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A module loaded on this device and the functions looked up in it.
struct LoadedModule {
    module: Arc<CudaModule>,
    functions: HashMap<String, GpuFunction>,
}

/// One CUDA device with its own stream (and any other [`Stream`]s it creates or borrows).
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    id: u32,
    ordinal: usize,
    arch: Arch,
    /// What NVRTC builds for this device, asked only when someone wants to know (see
    /// [`Gpu::compile_arch`]): lookups are keyed by the device's own arch.
    compile_arch: OnceLock<Arch>,
    name: String,
    sm_count: u32,
    l2_bytes: usize,
    max_shared_optin: u32,
    /// Whether the device runs cooperative launches (all blocks resident at once).
    cooperative: bool,
    cache: Arc<KernelCache>,
    modules: Mutex<HashMap<CacheKey, LoadedModule>>,
    /// First-level lookup: (source, function, extra options) → loaded function.
    functions: SourceMap<GpuFunction>,
    /// The record that checking kernels write a violation of their inputs' values into
    /// (allocated on first need).
    error_record: OnceLock<ErrorRecord>,
}

/// A kernel function loaded on one `Gpu`.
#[derive(Clone)]
pub struct GpuFunction {
    function: CudaFunction,
    name: Arc<str>,
    key: CacheKey,
    gpu_id: u32,
    ordinal: usize,
    /// The largest dynamic shared memory size this function has been opted in to.
    shared_opt_in: Arc<AtomicU32>,
}

impl GpuFunction {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The cache key of the module holding it.
    pub fn key(&self) -> CacheKey {
        self.key
    }
}

/// Device memory of one `Gpu`: an allocation it owns, freed when dropped (in its stream's order, or
/// at once for [`Gpu::alloc_long_lived`]'s), or memory borrowed from its owner
/// ([`Gpu::borrow_memory`]), never freed by kfuse.
pub struct DeviceBuffer {
    memory: Memory,
    gpu_id: u32,
    /// The device ordinal (32 bits, with the id, keep the buffer at its allocation's size plus 8).
    ordinal: u32,
}

/// Who owns a buffer's memory.
enum Memory {
    /// No memory: CUDA cannot allocate zero bytes, kernels see a null pointer.
    Empty,
    /// Allocated by this runtime, in its stream's order (the driver's stream-ordered pool).
    Owned(CudaSlice<u8>),
    /// Allocated by this runtime with plain `cuMemAlloc` ([`Gpu::alloc_long_lived`]).
    Plain { address: u64, bytes: usize, ctx: Arc<CudaContext> },
    /// Someone else's allocation.
    Borrowed { address: u64, bytes: usize },
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Freeing makes the device's context current on this thread: give the thread back the
        // context it had (a framework's current device; buffers are often dropped by its GC).
        match std::mem::replace(&mut self.memory, Memory::Empty) {
            Memory::Owned(slice) => preserving_thread_context(move || drop(slice)),
            Memory::Plain { address, ctx, .. } => preserving_thread_context(|| {
                // A failure cannot be reported from Drop; it leaks the allocation.
                if ctx.bind_to_thread().is_ok() {
                    // SAFETY: `address` came from cuMemAlloc in `ctx` (alloc_long_lived), which is
                    // current, and is freed only here; its contract says no queued kernel uses it.
                    let _ = unsafe { dresult::free_sync(address) };
                }
            }),
            Memory::Empty | Memory::Borrowed { .. } => {}
        }
    }
}

impl DeviceBuffer {
    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        match &self.memory {
            Memory::Empty => 0,
            Memory::Owned(slice) => slice.len(),
            Memory::Plain { bytes, .. } | Memory::Borrowed { bytes, .. } => *bytes,
        }
    }
    /// The device address of the first byte (0 for an empty buffer).
    pub fn address(&self) -> u64 {
        match &self.memory {
            Memory::Empty => 0,
            // With event tracking off (see `Gpu::open_with_cache`), taking the pointer records
            // nothing.
            Memory::Owned(slice) => slice.device_ptr(slice.stream()).0,
            Memory::Plain { address, .. } | Memory::Borrowed { address, .. } => *address,
        }
    }
    /// The ordinal of the device the memory is on.
    pub fn ordinal(&self) -> usize {
        self.ordinal as usize
    }
    /// Whether the memory is borrowed ([`Gpu::borrow_memory`]) rather than owned.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.memory, Memory::Borrowed { .. })
    }
}

/// A kernel argument. `Buffer` passes the buffer's device pointer.
#[derive(Clone, Copy)]
pub enum KernelArg<'a> {
    /// A device pointer (`T*` in the kernel).
    Buffer(&'a DeviceBuffer),
    /// `long long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `unsigned int`.
    U32(u32),
    /// `float`.
    F32(f32),
    /// `unsigned long long*`: with `true` the device address of this Gpu's error record (see
    /// [`Gpu::error_record_address`]), with `false` a null pointer (the kernel checks nothing).
    ErrorRecord(bool),
}

mod sealed {
    pub trait Sealed {}
}

/// A primitive host element type without padding, uploadable by [`Gpu::upload_slice`].
pub trait HostElement: sealed::Sealed + Copy {}

macro_rules! host_elements {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl HostElement for $t {}
    )*};
}
host_elements!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, bool);

/// A recorded point on a `Gpu`'s stream, for timing.
pub struct GpuEvent {
    event: CudaEvent,
    gpu_id: u32,
    ordinal: usize,
}

/// How one kernel is launched: a 1-D grid of `grid` blocks of `block` threads each, with
/// `shared_bytes` of dynamic shared memory, through `cuLaunchKernel` or, when `cooperative`,
/// `cuLaunchCooperativeKernel` (every block resident at once, so the kernel may wait on a
/// grid-wide barrier). [`Gpu::launch`] takes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLaunch {
    /// Blocks in the grid.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// Whether every block must be resident at once.
    pub cooperative: bool,
}

impl KernelLaunch {
    /// A plain launch of `grid` blocks of `block` threads without dynamic shared memory.
    pub fn new(grid: u32, block: u32) -> KernelLaunch {
        KernelLaunch { grid, block, shared_bytes: 0, cooperative: false }
    }

    /// The same launch with `bytes` of dynamic shared memory per block.
    pub fn with_shared_bytes(self, bytes: u32) -> KernelLaunch {
        KernelLaunch { shared_bytes: bytes, ..self }
    }

    /// The same launch, cooperative.
    pub fn cooperative(self) -> KernelLaunch {
        KernelLaunch { cooperative: true, ..self }
    }
}

/// Argument values owned for the duration of one launch (the driver reads them by address).
enum ArgValue {
    Pointer(u64),
    I64(i64),
    I32(i32),
    U32(u32),
    F32(f32),
}

impl Gpu {
    /// Opens device `ordinal` with the process-wide kernel cache ([`KernelCache::try_global`]:
    /// an invalid cache setting in the environment is an error).
    pub fn open(ordinal: usize) -> Result<Gpu, RuntimeError> {
        Gpu::open_with_cache(ordinal, KernelCache::try_global()?)
    }

    /// Opens device `ordinal` with a given kernel cache.
    pub fn open_with_cache(ordinal: usize, cache: Arc<KernelCache>) -> Result<Gpu, RuntimeError> {
        let opened = Instant::now();
        if !driver_available() {
            return Err(RuntimeError::DriverMissing);
        }
        timing::log("open: load libcuda", opened);
        let step = Instant::now();
        dresult::init().map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE => {
                RuntimeError::NoDevice { detail: "cuInit reports CUDA_ERROR_NO_DEVICE".to_string() }
            }
            _ => RuntimeError::Driver { call: "cuInit", ordinal, error: e },
        })?;
        let count = dresult::device::get_count().map_err(|error| RuntimeError::Driver {
            call: "cuDeviceGetCount",
            ordinal,
            error,
        })?;
        let count = usize::try_from(count).unwrap_or(0);
        if count == 0 {
            return Err(RuntimeError::NoDevice { detail: "cuDeviceGetCount returned 0".to_string() });
        }
        if ordinal >= count {
            return Err(RuntimeError::DeviceOutOfRange { ordinal, count });
        }
        timing::log("open: cuInit + device count", step);
        let step = Instant::now();
        let driver = |call: &'static str| move |error| RuntimeError::Driver { call, ordinal, error };
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        timing::log("open: primary context", step);
        let step = Instant::now();
        // SAFETY: this context object is private to this Gpu, and every buffer it allocates is
        // allocated, copied and freed on this Gpu's own stream (buffers carry the Gpu id and other
        // Gpus refuse them), so stream order orders allocation, use and free; a launch on another
        // stream is documented to need its buffers ready and kept alive by the caller. cudarc's
        // per-buffer events would only add overhead.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let (major, minor) = ctx.compute_capability().map_err(driver("cuDeviceGetAttribute(compute capability)"))?;
        let arch = Arch::new(u32::try_from(major).unwrap_or(0), u32::try_from(minor).unwrap_or(0));
        let attribute = |attr: CUdevice_attribute, call: &'static str| {
            ctx.attribute(attr).map_err(driver(call)).map(|v| u32::try_from(v).unwrap_or(0))
        };
        let sm_count = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)",
        )?;
        let l2_bytes =
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, "cuDeviceGetAttribute(L2_CACHE_SIZE)")?;
        let max_shared_optin = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)",
        )?;
        let cooperative = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH,
            "cuDeviceGetAttribute(COOPERATIVE_LAUNCH)",
        )? != 0;
        let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
        timing::log("open: stream + attributes", step);
        // Nothing is allocated here: the first allocation of the stream-ordered pool sets the pool
        // up (8-11 ms on an H100), which a framework's process, whose own allocations use plain
        // cuMemAlloc, never pays otherwise; launches on its memory allocate with
        // `alloc_long_lived`. Nor is NVRTC asked anything (see `compile_arch`).
        timing::log("open: total", opened);
        Ok(Gpu {
            compile_arch: OnceLock::new(),
            ctx,
            stream,
            id: next_gpu_id(),
            ordinal,
            arch,
            name,
            sm_count,
            l2_bytes: usize::try_from(l2_bytes).unwrap_or(0),
            max_shared_optin,
            cooperative,
            cache,
            modules: Mutex::new(HashMap::new()),
            functions: SourceMap::new(),
            error_record: OnceLock::new(),
        })
    }

    /// The device's compute capability.
    pub fn arch(&self) -> Arch {
        self.arch
    }
    /// The architecture NVRTC builds this device's kernels for: the device's, or the newest one
    /// NVRTC supports below it (then the PTX fallback is what loads). Asks NVRTC on the first
    /// call (loading it); kernel lookups do not need it: they are keyed by [`Gpu::arch`].
    pub fn compile_arch(&self) -> Arch {
        *self.compile_arch.get_or_init(|| crate::nvrtc::build_arch(self.arch).unwrap_or(self.arch))
    }
    /// The device's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> String {
        self.name.clone()
    }
    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }
    /// L2 cache size in bytes.
    pub fn l2_bytes(&self) -> usize {
        self.l2_bytes
    }
    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    /// Largest dynamic shared memory per block after opting in.
    pub fn max_shared_bytes(&self) -> u32 {
        self.max_shared_optin
    }
    /// The kernel cache this Gpu compiles through.
    pub fn cache(&self) -> &Arc<KernelCache> {
        &self.cache
    }

    /// How many kernel functions are loaded on this device (each module's functions, counted
    /// once however many lookups reached them). With the cache bypassed (`KFUSE_NO_CACHE=1`)
    /// loads are not kept, so this stays 0.
    pub fn loaded_functions(&self) -> usize {
        self.modules.lock().unwrap_or_else(|e| e.into_inner()).values().map(|m| m.functions.len()).sum()
    }

    /// The device address of this Gpu's error record: 8 words of page-locked host memory mapped
    /// into the device, which kernels that check their inputs' values write a violation into
    /// (the first one only) and [`Gpu::take_device_error`] reads without synchronising. Allocated
    /// on the first call (outside a CUDA graph capture: run a call before capturing), then fixed.
    pub fn error_record_address(&self) -> Result<u64, RuntimeError> {
        if let Some(r) = self.error_record.get() {
            return Ok(r.device_address());
        }
        let r = ErrorRecord::new(&self.ctx).map_err(|(call, error)| RuntimeError::Driver {
            call,
            ordinal: self.ordinal,
            error,
        })?;
        let _ = self.error_record.set(r); // a record another thread set first wins; this one is freed
        self.error_record.get().map(|r| r.device_address()).ok_or(RuntimeError::Driver {
            call: "cuMemHostAlloc (error record)",
            ordinal: self.ordinal,
            error: DriverError(CUresult::CUDA_ERROR_NOT_INITIALIZED),
        })
    }

    /// The violation a kernel recorded on this device, if one is complete, and the record reset
    /// for the next one. No synchronisation: it sees what the device has written so far
    /// (synchronise first to see everything queued before).
    pub fn take_device_error(&self) -> Option<DeviceViolation> {
        self.error_record.get().and_then(|r| r.take())
    }

    fn driver_error(&self, call: &'static str) -> impl Fn(DriverError) -> RuntimeError {
        let ordinal = self.ordinal;
        move |error| RuntimeError::Driver { call, ordinal, error }
    }

    /// Compiles `source` for this device through the cache, loads it (cubin first, PTX
    /// fallback) and looks up `fn_name`. A second call with the same source and name costs a
    /// fast hash of the source, one map probe and one comparison of the source (see
    /// [`crate::lookup`]). Compiles with [`Gpu::kernel_options`].
    pub fn load_kernel(&self, source: &str, fn_name: &str) -> Result<GpuFunction, RuntimeError> {
        self.load_kernel_with_options(source, fn_name, crate::nvrtc::kernel_extras())
    }

    /// The options [`Gpu::load_kernel`] compiles with: [`CompileOptions::for_kernels`] of this
    /// device's arch. Compiling ahead through the cache with them makes `load_kernel`'s later
    /// lookups hit.
    pub fn kernel_options(&self) -> CompileOptions {
        CompileOptions::for_kernels(self.arch)
    }

    /// [`Gpu::load_kernel`] with extra NVRTC options (e.g. `--use_fast_math`), appended after
    /// kfuse's fixed ones in this order. The extras are part of the cache key: the same source
    /// with different extras is a different kernel.
    pub fn load_kernel_with_options(
        &self,
        source: &str,
        fn_name: &str,
        extra: &[String],
    ) -> Result<GpuFunction, RuntimeError> {
        self.load_kernel_for(source, fn_name, self.arch, extra)
    }

    /// [`Gpu::load_kernel_with_options`] for an explicit target, e.g. `sm_90a` for a kernel that
    /// uses architecture-specific instructions. An `a` target must be this device's exact
    /// compute capability ([`RuntimeError::ArchMismatch`] otherwise).
    ///
    /// A module the cache had (from memory or disk) that does not load, or that an older NVRTC
    /// built for a stand-in arch that the NVRTC found now no longer needs, is rebuilt with
    /// [`KernelCache::rebuild`] and loaded again: the cache does not key by NVRTC version, so this
    /// is how an entry of another NVRTC or driver is replaced.
    pub fn load_kernel_for(
        &self,
        source: &str,
        fn_name: &str,
        target: Arch,
        extra: &[String],
    ) -> Result<GpuFunction, RuntimeError> {
        if target.accel && !target.cubin_loads_on(self.arch) {
            return Err(RuntimeError::ArchMismatch {
                fn_name: fn_name.to_string(),
                target,
                ordinal: self.ordinal,
                device: self.arch,
            });
        }
        let lookup = LookupKey { source, name: fn_name, arch: target, extra };
        let bypass = self.cache.is_bypassed();
        if !bypass {
            if let Some(function) = self.functions.get(&lookup) {
                return Ok(function);
            }
        }
        let opts = CompileOptions { arch: target, extra: extra.to_vec() };
        check_no_nul("the kernel name", fn_name)?;
        let step = Instant::now();
        let (compiled, outcome) = self.cache.get_or_compile(source, &opts)?;
        if timing::enabled() {
            timing::log(&format!("load_kernel {fn_name}: cache lookup ({outcome:?})"), step);
        }
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = match modules.entry(compiled.key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let step = Instant::now();
                let module = self.load_cached_module(compiled.clone(), outcome, source, &opts)?;
                timing::log("load_kernel: cuModuleLoadData", step);
                entry.insert(LoadedModule { module, functions: HashMap::new() })
            }
        };
        let step = Instant::now();
        if let Some(function) = loaded.functions.get(fn_name) {
            return Ok(function.clone());
        }
        let function = loaded.module.load_function(fn_name).map_err(|e| match e.0 {
            CUresult::CUDA_ERROR_NOT_FOUND => {
                RuntimeError::FunctionNotFound { fn_name: fn_name.to_string(), key: compiled.key.to_hex() }
            }
            _ => RuntimeError::Driver { call: "cuModuleGetFunction", ordinal: self.ordinal, error: e },
        })?;
        timing::log("load_kernel: cuModuleGetFunction", step);
        let function = GpuFunction {
            function,
            name: Arc::from(fn_name),
            key: compiled.key,
            gpu_id: self.id,
            ordinal: self.ordinal,
            shared_opt_in: Arc::new(AtomicU32::new(DEFAULT_DYNAMIC_SHARED_LIMIT)),
        };
        if bypass {
            return Ok(function);
        }
        loaded.functions.insert(fn_name.to_string(), function.clone());
        Ok(self.functions.insert(&lookup, function))
    }

    /// Loads a module from the cache; one that came from the cache rather than from a compile
    /// just now is rebuilt when it does not load or is a stand-in NVRTC no longer needs.
    fn load_cached_module(
        &self,
        compiled: Arc<CompiledModule>,
        outcome: CacheOutcome,
        source: &str,
        opts: &CompileOptions,
    ) -> Result<Arc<CudaModule>, RuntimeError> {
        let from_cache = matches!(outcome, CacheOutcome::MemoryHit | CacheOutcome::DiskHit);
        // A stand-in's cubin never loads here (the PTX does, through the JIT, on every process):
        // worth one question to NVRTC, which such a device needed anyway to build it.
        let outdated_stand_in = from_cache
            && compiled.built_for != compiled.arch
            && crate::nvrtc::build_arch(compiled.arch).is_ok_and(|now| now != compiled.built_for);
        if !outdated_stand_in {
            match self.load_module(&compiled) {
                Ok(module) => return Ok(module),
                Err(e) if !from_cache => return Err(e),
                Err(e) => eprintln!(
                    "kfuse: warning: cached kernel {} (built by NVRTC {}.{}) does not load: {e}; rebuilding it",
                    compiled.key, compiled.nvrtc_version.0, compiled.nvrtc_version.1
                ),
            }
        }
        let rebuilt = self.cache.rebuild(source, opts)?;
        self.load_module(&rebuilt)
    }

    /// Loads a compiled module: the cubin first; the PTX (driver JIT, slow) only if the cubin
    /// is refused.
    pub fn load_module(&self, compiled: &CompiledModule) -> Result<Arc<CudaModule>, RuntimeError> {
        let started = Instant::now();
        let cubin_error = match self.ctx.load_module(Ptx::from_binary(compiled.cubin.clone())) {
            Ok(module) => return Ok(module),
            Err(e) => e.to_string(),
        };
        let ptx_error = if compiled.ptx.is_empty() {
            "no PTX kept".to_string()
        } else if let Err(e) = check_no_nul("the PTX", &compiled.ptx) {
            e.to_string()
        } else {
            match self.ctx.load_module(Ptx::from_src(compiled.ptx.clone())) {
                Ok(module) => {
                    eprintln!(
                        "kfuse: warning: cubin of {} ({}) refused by device {} ({}): {cubin_error}; loaded its PTX through the driver JIT in {:.1} ms",
                        compiled.key, compiled.built_for, self.ordinal, self.arch,
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    return Ok(module);
                }
                Err(e) => e.to_string(),
            }
        };
        Err(RuntimeError::ModuleLoad {
            key: compiled.key.to_hex(),
            arch: compiled.built_for,
            ordinal: self.ordinal,
            cubin_error,
            ptx_error,
        })
    }

    /// Allocates `bytes` of zeroed device memory, in this Gpu's stream order, from the driver's
    /// stream-ordered pool (see [`Gpu::alloc_long_lived`] for memory outside it).
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        if bytes == 0 {
            return Ok(self.empty_buffer());
        }
        let slice = self.stream.alloc_zeros::<u8>(bytes).map_err(|e| self.alloc_error(e, bytes))?;
        Ok(self.wrap(slice))
    }

    /// Allocates `bytes` of device memory with plain `cuMemAlloc`, zeroed on this Gpu's stream
    /// (`cuMemsetD8Async`: ready for another stream once that stream is synchronised), freed with
    /// `cuMemFree` when dropped. The one place for the small long-lived buffers that launches on a
    /// framework's memory need (a program's workspace): [`Gpu::alloc_zeroed`] uses the driver's
    /// stream-ordered pool, whose first use in a process costs 8-11 ms to set up, and a framework's
    /// process (PyTorch's allocator uses plain `cudaMalloc`) would pay that only for kfuse.
    ///
    /// The buffer must be dropped only once no queued kernel uses it any more (synchronise the
    /// device first): `cuMemFree` does not wait for kernels on other streams.
    pub fn alloc_long_lived(&self, bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        if bytes == 0 {
            return Ok(self.empty_buffer());
        }
        self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))?;
        // SAFETY: this Gpu's context is current on this thread (just bound); the allocation is
        // owned by the returned buffer and freed once, in its Drop.
        let address = unsafe { dresult::malloc_sync(bytes) }.map_err(|e| self.alloc_error(e, bytes))?;
        let buf = DeviceBuffer {
            memory: Memory::Plain { address, bytes, ctx: self.ctx.clone() },
            gpu_id: self.id,
            ordinal: self.buffer_ordinal(),
        };
        // SAFETY: `address` addresses the `bytes` bytes just allocated, alive while `buf` is.
        unsafe { dresult::memset_d8_async(address, 0, bytes, self.stream.cu_stream()) }
            .map_err(self.driver_error("cuMemsetD8Async"))?;
        Ok(buf)
    }

    /// Copies `bytes` to a new device buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBuffer, RuntimeError> {
        if bytes.is_empty() {
            return Ok(self.empty_buffer());
        }
        let slice = self.stream.clone_htod(bytes).map_err(|e| self.alloc_error(e, bytes.len()))?;
        Ok(self.wrap(slice))
    }

    /// Copies a slice of plain host values (f32, i32, u16 bit patterns of f16/bf16, bool, ...)
    /// to a new device buffer in their native (little-endian) layout, without an intermediate
    /// byte vector.
    pub fn upload_slice<T: HostElement>(&self, values: &[T]) -> Result<DeviceBuffer, RuntimeError> {
        let bytes = std::mem::size_of_val(values);
        // SAFETY: `HostElement` is sealed and implemented only for primitive types without padding
        // (every byte of a `[T]` is initialised); the byte view covers exactly the slice's
        // `size_of_val` bytes, is only read, and lives no longer than the borrow of `values`.
        let view = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), bytes) };
        self.upload(view)
    }

    /// Copies a buffer back to the host (waits for prior work on the stream).
    pub fn download(&self, buf: &DeviceBuffer) -> Result<Vec<u8>, RuntimeError> {
        self.check_owner("buffer", buf.gpu_id, buf.ordinal())?;
        if buf.bytes() == 0 {
            return Ok(Vec::new());
        }
        self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))?;
        let mut host = vec![0u8; buf.bytes()];
        // SAFETY: `buf.address()` addresses `buf.bytes()` bytes of device memory of this context, alive
        // while `buf` is (owned) or by the contract of `borrow_memory` (borrowed); `host` has
        // exactly that many bytes and outlives the copy, which is waited for before returning.
        unsafe { dresult::memcpy_dtoh_async(host.as_mut_slice(), buf.address(), self.stream.cu_stream()) }
            .map_err(self.driver_error("cuMemcpyDtoHAsync"))?;
        self.synchronize()?;
        Ok(host)
    }

    /// Sets every byte of `buf` to `byte` (to poison outputs in tests).
    pub fn fill(&self, buf: &DeviceBuffer, byte: u8) -> Result<(), RuntimeError> {
        self.check_owner("buffer", buf.gpu_id, buf.ordinal())?;
        if buf.bytes() == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))?;
        // SAFETY: `buf.address()` addresses `buf.bytes()` bytes of this Gpu's context, kept alive by
        // `buf` (owned) or by the contract of `borrow_memory` (borrowed); the memset is queued on
        // this Gpu's stream, which orders it with every other use of an owned buffer.
        unsafe { dresult::memset_d8_async(buf.address(), byte, buf.bytes(), self.stream.cu_stream()) }
            .map_err(self.driver_error("cuMemsetD8Async"))
    }

    /// Queues `f` on `stream` (one this Gpu created or borrowed; [`Gpu::default_stream`] is its
    /// own) as `launch` says, with `args` in the kernel's parameter order, and returns: no host
    /// synchronisation. This is the one way kfuse launches a kernel. The buffers must be ready
    /// for `stream` (allocated or written on another stream, they need that stream synchronised
    /// or ordered first). Dynamic shared memory above 48 KiB opts the function in to that much
    /// (up to the device's limit); a cooperative grid larger than [`Gpu::max_resident_blocks`]
    /// is refused with an error, never run.
    pub fn launch(
        &self,
        stream: &Stream,
        f: &GpuFunction,
        launch: KernelLaunch,
        args: &[KernelArg<'_>],
    ) -> Result<(), RuntimeError> {
        self.check_owner("stream", stream.gpu_id, stream.ordinal)?;
        if launch.cooperative {
            self.check_cooperative(f)?;
        }
        self.launch_as(&stream.stream, f, launch, args)
    }

    /// The Gpu's own stream (where `launch`, uploads and downloads go), as a [`Stream`].
    pub fn default_stream(&self) -> Stream {
        Stream { stream: self.stream.clone(), gpu_id: self.id, ordinal: self.ordinal, borrowed: false }
    }

    /// Creates a new stream on this device (destroyed when its last clone drops).
    pub fn create_stream(&self) -> Result<Stream, RuntimeError> {
        let stream = self.ctx.new_stream().map_err(self.driver_error("cuStreamCreate"))?;
        Ok(Stream { stream, gpu_id: self.id, ordinal: self.ordinal, borrowed: false })
    }

    /// Wraps a stream that someone else created (for example PyTorch's
    /// `torch.cuda.current_stream().cuda_stream`), so that kernels can be queued on it with
    /// [`Gpu::launch`]. kfuse never destroys it.
    ///
    /// # Safety
    ///
    /// `handle` must be a live `CUstream` of this device's primary context (the context every
    /// `Gpu` and the CUDA runtime use; 0 names the legacy default stream), and it must stay alive
    /// for as long as the returned `Stream`, or any clone of it, is used.
    pub unsafe fn borrow_stream(&self, handle: usize) -> Stream {
        // SAFETY: the caller promises a live stream of this context that outlives the wrapper;
        // cudarc's wrapper does not destroy a borrowed stream.
        let stream = unsafe { self.ctx.wrap_borrowed_stream(handle as sys::CUstream) };
        Stream { stream, gpu_id: self.id, ordinal: self.ordinal, borrowed: true }
    }

    /// Wraps `bytes` of device memory at `ptr` that someone else allocated (a framework's tensor),
    /// so that it can be passed to a kernel as a [`KernelArg::Buffer`]. kfuse never frees it.
    /// This is the one exception to "the runtime allocates what it launches on".
    ///
    /// # Safety
    ///
    /// `ptr` must address at least `bytes` bytes of device memory usable in this device's primary
    /// context, and that memory must stay allocated for as long as the returned buffer is used,
    /// including by kernels queued with it that have not finished yet. `ptr` should be 16-byte
    /// aligned for kfuse's generated kernels (they load small trailing axes as vectors).
    pub unsafe fn borrow_memory(&self, ptr: u64, bytes: usize) -> DeviceBuffer {
        DeviceBuffer {
            memory: Memory::Borrowed { address: ptr, bytes },
            gpu_id: self.id,
            ordinal: self.buffer_ordinal(),
        }
    }

    fn check_cooperative(&self, f: &GpuFunction) -> Result<(), RuntimeError> {
        if self.cooperative {
            return Ok(());
        }
        Err(RuntimeError::InvalidLaunch {
            fn_name: f.name.to_string(),
            ordinal: self.ordinal,
            reason: format!(
                "{} does not support cooperative launches (CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH is 0)",
                self.name
            ),
        })
    }

    /// How many blocks of `block` threads with `shared_bytes` of dynamic shared memory can be
    /// resident on the whole device at once (the occupancy calculator's blocks per
    /// multiprocessor times the multiprocessor count): the largest cooperative grid.
    pub fn max_resident_blocks(&self, f: &GpuFunction, block: u32, shared_bytes: u32) -> Result<u32, RuntimeError> {
        self.check_owner("kernel function", f.gpu_id, f.ordinal)?;
        self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))?;
        let shared = usize::try_from(shared_bytes).unwrap_or(usize::MAX);
        let per_sm = f
            .function
            .occupancy_max_active_blocks_per_multiprocessor(block, shared, None)
            .map_err(self.driver_error("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?;
        Ok(per_sm.saturating_mul(self.sm_count))
    }

    fn launch_as(
        &self,
        stream: &Arc<CudaStream>,
        f: &GpuFunction,
        launch: KernelLaunch,
        args: &[KernelArg<'_>],
    ) -> Result<(), RuntimeError> {
        let KernelLaunch { grid, block, shared_bytes, cooperative } = launch;
        self.check_owner("kernel function", f.gpu_id, f.ordinal)?;
        let invalid =
            |reason: String| RuntimeError::InvalidLaunch { fn_name: f.name.to_string(), ordinal: self.ordinal, reason };
        if grid == 0 || block == 0 {
            return Err(invalid(format!(
                "grid ({grid}) and block ({block}) must both be at least 1; skip the launch for empty work"
            )));
        }
        if shared_bytes > self.max_shared_optin.max(DEFAULT_DYNAMIC_SHARED_LIMIT) {
            return Err(invalid(format!(
                "{shared_bytes} bytes of dynamic shared memory requested; this device allows at most {} per block",
                self.max_shared_optin
            )));
        }
        if shared_bytes > f.shared_opt_in.load(Ordering::Acquire) {
            self.ctx.bind_to_thread().map_err(self.driver_error("cuCtxSetCurrent"))?;
            let value =
                i32::try_from(shared_bytes).map_err(|_| invalid(format!("shared_bytes {shared_bytes} exceeds i32")))?;
            f.function
                .set_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value)
                .map_err(self.driver_error("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"))?;
            f.shared_opt_in.fetch_max(shared_bytes, Ordering::AcqRel);
        }
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            values.push(match *arg {
                KernelArg::Buffer(buf) => {
                    self.check_owner("buffer", buf.gpu_id, buf.ordinal())?;
                    ArgValue::Pointer(buf.address())
                }
                KernelArg::I64(v) => ArgValue::I64(v),
                KernelArg::I32(v) => ArgValue::I32(v),
                KernelArg::U32(v) => ArgValue::U32(v),
                KernelArg::F32(v) => ArgValue::F32(v),
                KernelArg::ErrorRecord(on) => ArgValue::Pointer(if on { self.error_record_address()? } else { 0 }),
            });
        }
        let mut builder = stream.launch_builder(&f.function);
        for value in &values {
            match value {
                ArgValue::Pointer(v) => builder.arg(v),
                ArgValue::I64(v) => builder.arg(v),
                ArgValue::I32(v) => builder.arg(v),
                ArgValue::U32(v) => builder.arg(v),
                ArgValue::F32(v) => builder.arg(v),
            };
        }
        let config = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: shared_bytes };
        // SAFETY: every pointer argument is the live device memory of a DeviceBuffer of this Gpu
        // borrowed for this call (an owned one is freed only in its stream's order after the
        // kernel; a borrowed one is kept alive by the contract of `borrow_memory`), scalars are
        // plain values in `values`, which outlives the launch call. That the argument list
        // matches the kernel's signature is the caller's contract, as in any CUDA launch.
        let launched = if cooperative {
            // SAFETY: as above; the driver checks that the grid can be resident at once.
            unsafe { builder.launch_cooperative(config) }
        } else {
            // SAFETY: as above.
            unsafe { builder.launch(config) }
        };
        launched.map(|_| ()).map_err(|error| RuntimeError::Launch {
            fn_name: f.name.to_string(),
            grid,
            block,
            shared_bytes,
            ordinal: self.ordinal,
            error,
        })?;
        Ok(())
    }

    /// Waits for all work queued on this Gpu's stream.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.stream.synchronize().map_err(self.driver_error("cuStreamSynchronize"))
    }

    /// Waits for all work queued on any stream of this device's context (its own, created and
    /// borrowed streams alike): `cuCtxSynchronize`.
    pub fn synchronize_device(&self) -> Result<(), RuntimeError> {
        self.ctx.synchronize().map_err(self.driver_error("cuCtxSynchronize"))
    }

    /// Records a timing event at the current end of the stream.
    pub fn record_event(&self) -> Result<GpuEvent, RuntimeError> {
        let event = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(self.driver_error("cuEventRecord"))?;
        Ok(GpuEvent { event, gpu_id: self.id, ordinal: self.ordinal })
    }

    /// Milliseconds between two events of this Gpu (waits for `end`).
    pub fn elapsed_ms(&self, start: &GpuEvent, end: &GpuEvent) -> Result<f32, RuntimeError> {
        self.check_owner("event", start.gpu_id, start.ordinal)?;
        self.check_owner("event", end.gpu_id, end.ordinal)?;
        start.event.elapsed_ms(&end.event).map_err(self.driver_error("cuEventElapsedTime"))
    }

    /// The ordinal as buffers store it (device ordinals are far below 2^32).
    fn buffer_ordinal(&self) -> u32 {
        u32::try_from(self.ordinal).unwrap_or(u32::MAX)
    }

    fn empty_buffer(&self) -> DeviceBuffer {
        DeviceBuffer { memory: Memory::Empty, gpu_id: self.id, ordinal: self.buffer_ordinal() }
    }

    fn wrap(&self, slice: CudaSlice<u8>) -> DeviceBuffer {
        DeviceBuffer { memory: Memory::Owned(slice), gpu_id: self.id, ordinal: self.buffer_ordinal() }
    }

    fn alloc_error(&self, error: DriverError, bytes: usize) -> RuntimeError {
        match error.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => RuntimeError::OutOfMemory { bytes, ordinal: self.ordinal },
            _ => RuntimeError::Driver { call: "cuMemAlloc", ordinal: self.ordinal, error },
        }
    }

    fn check_owner(&self, what: &'static str, gpu_id: u32, ordinal: usize) -> Result<(), RuntimeError> {
        if gpu_id == self.id {
            Ok(())
        } else {
            Err(RuntimeError::ForeignHandle { what, owner_ordinal: ordinal, ordinal: self.ordinal })
        }
    }
}

/// Opens device 0, or the ordinal in `KFUSE_DEVICE`.
pub fn open_default() -> Result<Gpu, RuntimeError> {
    let ordinal = match std::env::var("KFUSE_DEVICE") {
        Ok(value) => value.trim().parse::<usize>().map_err(|_| RuntimeError::InvalidEnv {
            name: "KFUSE_DEVICE",
            value: value.clone(),
            expected: "a device ordinal such as 0 or 1",
        })?,
        Err(_) => 0,
    };
    Gpu::open(ordinal)
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .field("arch", &self.arch)
            .field("sm_count", &self.sm_count)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GpuFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuFunction")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("bytes", &self.bytes())
            .field("ordinal", &self.ordinal)
            .field("borrowed", &self.is_borrowed())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for GpuEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuEvent").field("ordinal", &self.ordinal).finish_non_exhaustive()
    }
}
