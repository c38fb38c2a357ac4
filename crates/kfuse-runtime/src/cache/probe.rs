//! A lookup that never compiles and never waits: [`KernelCache::get_cached`] answers whether a
//! kernel is already in memory or valid on disk, so that a caller (kfuse-mlp's tiered
//! compilation) can decide to compile a quick stand-in instead of waiting for a slow compile.
//!
//! Handles: memory hits, disk hits (the module is then kept in memory, so the next
//! [`KernelCache::get_or_compile`] of it is a memory hit), a compile of the same key in progress
//! in this process (answered as "not cached" instead of waiting for it). Does not handle:
//! compiling, repairing bad disk entries (a bad entry is "not cached"; the next
//! `get_or_compile` warns about it and repairs it), a bypassed cache (never cached).

use std::sync::atomic::Ordering;
use std::sync::{Arc, TryLockError};

use crate::nvrtc::{CompileOptions, CompiledModule};
use crate::RuntimeError;

use super::disk::ReadOutcome;
use super::{CacheCounters, CacheOutcome, KernelCache, MemoryProbe};

impl KernelCache {
    /// The compiled module for (`source`, `opts`) if it is already in memory
    /// ([`CacheOutcome::MemoryHit`]) or valid on disk ([`CacheOutcome::DiskHit`]), else `None`.
    /// Never compiles and never blocks on a compile in progress (another thread compiling the
    /// same key makes this `None`). A disk hit is kept in memory. Always `None` when the cache is
    /// bypassed. Errors only when NVRTC's version cannot be read (it is part of the key) or the
    /// environment holds an invalid cache setting.
    pub fn get_cached(
        &self,
        source: &str,
        opts: &CompileOptions,
    ) -> Result<Option<(Arc<CompiledModule>, CacheOutcome)>, RuntimeError> {
        self.check_env()?;
        if self.is_bypassed() {
            return Ok(None);
        }
        let (lookup, key, slot) = match self.memory_probe(source, opts)? {
            MemoryProbe::Found(found) => return Ok(Some((found, CacheOutcome::MemoryHit))),
            MemoryProbe::Slot { lookup, key, slot } => (lookup, key, slot),
        };
        // A held slot lock means a compile (or disk read) of this key is under way: not cached
        // yet, and waiting for it is exactly what the caller wants to avoid.
        let mut held = match slot.module.try_lock() {
            Ok(held) => held,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Ok(None),
        };
        if let Some(found) = held.as_ref() {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Some((found.clone(), CacheOutcome::MemoryHit)));
        }
        let Some(disk) = self.lookup_disk() else {
            return Ok(None);
        };
        match disk.read(&key, opts.arch) {
            ReadOutcome::Hit(module) => {
                self.record(CacheCounters { disk_hits: 1, ..Default::default() }, true);
                self.log_hit(&key, opts.arch);
                let module = Arc::new(module);
                *held = Some(module.clone());
                self.by_source.insert(&lookup, module.clone());
                Ok(Some((module, CacheOutcome::DiskHit)))
            }
            ReadOutcome::Missing | ReadOutcome::Bad { .. } | ReadOutcome::Foreign { .. } => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::testing::nvrtc_or_skip;
    use crate::{Arch, CacheOutcome, CompileOptions, KernelCache};

    const SOURCE: &str = "extern \"C\" __global__ void probe_k(float* x) { x[threadIdx.x] += 1.0f; }";

    fn outcome(cache: &KernelCache, opts: &CompileOptions) -> Option<CacheOutcome> {
        cache.get_cached(SOURCE, opts).expect("probe").map(|(_, o)| o)
    }

    #[test]
    fn probe_sees_memory_and_disk_but_never_compiles() {
        if nvrtc_or_skip("probe_sees_memory_and_disk_but_never_compiles").is_none() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = CompileOptions::for_arch(Arch::new(8, 0));
        let cache = KernelCache::with_dir(dir.path(), 1 << 30);
        assert_eq!(outcome(&cache, &opts), None);
        assert_eq!(cache.stats().session.compiles, 0, "a probe must not compile");
        let (compiled, how) = cache.get_or_compile(SOURCE, &opts).expect("compile");
        assert_eq!(how, CacheOutcome::Compiled);
        assert_eq!(outcome(&cache, &opts), Some(CacheOutcome::MemoryHit));
        // Other options are another kernel.
        let other = CompileOptions { extra: vec!["-lineinfo".to_string()], ..opts.clone() };
        assert_eq!(outcome(&cache, &other), None);
        // A fresh process (a new cache on the same folder) finds it on disk, then in memory.
        let second = KernelCache::with_dir(dir.path(), 1 << 30);
        let (found, how) = second.get_cached(SOURCE, &opts).expect("probe").expect("on disk");
        assert_eq!(how, CacheOutcome::DiskHit);
        assert_eq!(found.cubin, compiled.cubin);
        let (_, how) = second.get_or_compile(SOURCE, &opts).expect("lookup");
        assert_eq!(how, CacheOutcome::MemoryHit, "a disk hit of the probe is kept in memory");
        assert_eq!(second.stats().session.compiles, 0);
    }

    #[test]
    fn probe_does_not_wait_for_a_compile_in_progress() {
        if nvrtc_or_skip("probe_does_not_wait_for_a_compile_in_progress").is_none() {
            return;
        }
        let cache = Arc::new(KernelCache::memory_only());
        // A source big enough that its compile takes a while.
        let mut source = String::from("extern \"C\" __global__ void slow_k(float* x) { float v = x[threadIdx.x];\n");
        for i in 0..60 {
            source.push_str(&format!("  v = sinf(v * {i}.5f) + cosf(v);\n"));
        }
        source.push_str("  x[threadIdx.x] = v; }\n");
        let opts = CompileOptions::for_arch(Arch::new(9, 0));
        let worker = {
            let (cache, source, opts) = (cache.clone(), source.clone(), opts.clone());
            std::thread::spawn(move || cache.get_or_compile(&source, &opts).map(|(_, o)| o))
        };
        let mut answered_none_while_busy = false;
        while !worker.is_finished() {
            let started = std::time::Instant::now();
            let found = cache.get_cached(&source, &opts).expect("probe");
            assert!(started.elapsed().as_millis() < 50, "the probe blocked");
            if found.is_none() {
                answered_none_while_busy = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let joined = worker.join().expect("worker");
        assert_eq!(joined.expect("compile"), CacheOutcome::Compiled);
        assert!(answered_none_while_busy, "the compile finished before the first probe");
        assert_eq!(cache.get_cached(&source, &opts).expect("probe").map(|(_, o)| o), Some(CacheOutcome::MemoryHit));
    }
}
