//! The engine: the kernel cache and the devices opened through it, shared by every program.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kfuse_runtime::{Gpu, KernelCache};

use crate::Result;

/// The kernel cache (with its configuration) and the GPUs opened with it. Cheap to clone: clones
/// share everything. Each device is opened once, on first use, and then shared by every
/// [`crate::Program`] made with this engine.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    cache: Arc<KernelCache>,
    devices: Mutex<HashMap<usize, Arc<Gpu>>>,
}

impl Engine {
    /// An engine with the process-wide kernel cache, configured from the environment
    /// (`KFUSE_CACHE_DIR`, `KFUSE_NO_CACHE`, ...; see [`KernelCache::global`]); an invalid setting
    /// there is an error ([`kfuse_runtime::RuntimeError::InvalidEnv`]).
    pub fn new() -> Result<Engine> {
        Ok(Engine::with_cache(KernelCache::try_global()?))
    }

    /// An engine compiling through `cache`.
    pub fn with_cache(cache: Arc<KernelCache>) -> Engine {
        Engine { inner: Arc::new(Inner { cache, devices: Mutex::new(HashMap::new()) }) }
    }

    /// GPU `ordinal`, opened on the first call (a context, its stream and attributes) and shared
    /// afterwards.
    pub fn device(&self, ordinal: usize) -> Result<Arc<Gpu>> {
        // Held while opening, so that two threads asking at once open the device once.
        let mut devices = self.inner.devices.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(gpu) = devices.get(&ordinal) {
            return Ok(gpu.clone());
        }
        let gpu = Arc::new(Gpu::open_with_cache(ordinal, self.inner.cache.clone())?);
        devices.insert(ordinal, gpu.clone());
        Ok(gpu)
    }

    /// Waits for every stream of GPU `ordinal` and returns the violation of a lengths/offsets
    /// layout that kernels recorded there since it was last taken
    /// ([`Error::DeviceInput`](crate::Error::DeviceInput)), resetting it. A device this engine
    /// has not opened has nothing to report (it is not opened for this).
    pub fn check_errors(&self, ordinal: usize) -> Result<()> {
        let gpu = self.inner.devices.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal).cloned();
        let Some(gpu) = gpu else { return Ok(()) };
        kfuse_runtime::preserving_thread_context(|| gpu.synchronize_device())?;
        crate::checks::take_pending(&gpu)
    }

    /// Returns the violation pending on GPU `ordinal` (see [`Engine::check_errors`]) without
    /// waiting: what the device has recorded so far. What every launch does first.
    pub fn take_pending_error(&self, ordinal: usize) -> Result<()> {
        let gpu = self.inner.devices.lock().unwrap_or_else(|e| e.into_inner()).get(&ordinal).cloned();
        gpu.map_or(Ok(()), |gpu| crate::checks::take_pending(&gpu))
    }

    /// The ordinals of the GPUs this engine has opened, in increasing order.
    pub fn opened_devices(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.inner.devices.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The kernel cache every device of this engine compiles through.
    pub fn cache(&self) -> &Arc<KernelCache> {
        &self.inner.cache
    }

    /// Blocks until the optimised builds that first calls left compiling in the background are
    /// compiled (at once when none is); each program's next launch then switches to them. For
    /// benchmarks, before they time anything.
    pub fn wait_for_background_compiles(&self) {
        self.inner.cache.wait_for_background();
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.inner.devices.lock().map(|d| d.keys().copied().collect()).unwrap_or_default();
        f.debug_struct("Engine").field("cache_dir", &self.inner.cache.dir()).field("devices", &devices).finish()
    }
}
