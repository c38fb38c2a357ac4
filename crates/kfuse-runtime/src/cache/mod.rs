//! The kernel cache (issue 3): (key) → compiled cubin + PTX in memory and on disk.
//!
//! PLACEHOLDER (phase 1): memory tier only; the disk tier follows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::nvrtc::{compile, key_with_options, nvrtc_version, CompileOptions, CompiledModule};
use crate::{CacheKey, RuntimeError};

/// How a lookup was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CacheOutcome {
    /// Found in this process's memory.
    MemoryHit,
    /// Read from a valid disk entry.
    DiskHit,
    /// Compiled with NVRTC (nothing usable was cached).
    Compiled,
    /// A bad disk entry was found, recompiled and rewritten.
    Repaired,
}

#[derive(Default)]
struct Slot {
    module: Mutex<Option<Arc<CompiledModule>>>,
}

/// Event counters of a cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheCounters {
    /// Lookups served from memory.
    pub memory_hits: u64,
    /// NVRTC compilations performed.
    pub compiles: u64,
}

/// A snapshot of the cache's counters.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheStats {
    /// Counted in this process.
    pub session: CacheCounters,
}

/// Compiled kernels, keyed by content.
pub struct KernelCache {
    bypass: bool,
    memory: Mutex<HashMap<CacheKey, Arc<Slot>>>,
    compiles: AtomicU64,
    memory_hits: AtomicU64,
}

impl KernelCache {
    /// The process-wide cache, configured from the environment on first use.
    pub fn global() -> Arc<KernelCache> {
        static GLOBAL: OnceLock<Arc<KernelCache>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                Arc::new(KernelCache {
                    bypass: std::env::var("KFUSE_NO_CACHE").map(|v| v == "1").unwrap_or(false),
                    memory: Mutex::new(HashMap::new()),
                    compiles: AtomicU64::new(0),
                    memory_hits: AtomicU64::new(0),
                })
            })
            .clone()
    }

    /// Whether caching is switched off (`KFUSE_NO_CACHE=1`).
    pub fn is_bypassed(&self) -> bool {
        self.bypass
    }

    /// Counters of this cache.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            session: CacheCounters {
                memory_hits: self.memory_hits.load(Ordering::Relaxed),
                compiles: self.compiles.load(Ordering::Relaxed),
            },
        }
    }

    /// Returns the compiled module for `source`, compiling it at most once.
    pub fn get_or_compile(
        &self,
        source: &str,
        opts: &CompileOptions,
    ) -> Result<(Arc<CompiledModule>, CacheOutcome), RuntimeError> {
        if self.bypass {
            self.compiles.fetch_add(1, Ordering::Relaxed);
            return Ok((Arc::new(compile(source, opts)?), CacheOutcome::Compiled));
        }
        let key = key_with_options(source, &opts.nvrtc_options(), opts.arch, nvrtc_version()?);
        let slot = {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            memory.entry(key).or_default().clone()
        };
        let mut module = slot.module.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = module.as_ref() {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((found.clone(), CacheOutcome::MemoryHit));
        }
        let compiled = Arc::new(compile(source, opts)?);
        self.compiles.fetch_add(1, Ordering::Relaxed);
        *module = Some(compiled.clone());
        Ok((compiled, CacheOutcome::Compiled))
    }
}
