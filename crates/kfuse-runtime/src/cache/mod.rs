//! The kernel cache: compiled cubin + PTX by content key, in memory and on disk.
//!
//! - Memory: (source, arch, extra options) → `Arc<CompiledModule>` first (a [`SourceMap`]: a
//!   repeat costs a fast hash, one map probe and one source comparison), then (key) → slot for
//!   what is not there yet. Each key has its own slot mutex, so threads asking for the same new kernel compile it once while
//!   different kernels compile in parallel. (The (key, device) → loaded function tier lives in
//!   [`crate::Gpu`].)
//! - Disk: see `disk` for the layout. Bad entries are warnings and recompiles (`Repaired`); a
//!   failed write is a warning; a per-key file lock makes concurrent processes compile once.
//! - Background: [`KernelCache::compile_in_background`] compiles on its own thread and returns
//!   a handle to poll (`background`).
//! - Environment: `KFUSE_CACHE_DIR`, `KFUSE_CACHE_MAX_BYTES`, `KFUSE_NO_CACHE=1` (compile every
//!   time, touch no cache), `KFUSE_LOG_COMPILES=1` (print each compile and its time).
//!
//! Without NVRTC nothing can be looked up: the key includes NVRTC's version.

mod background;
mod disk;
mod entry;
mod probe;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

pub use background::{BackgroundCompile, BackgroundFailure, BackgroundOutcome};
use disk::{DiskStore, ReadOutcome};

use crate::lookup::{LookupKey, SourceMap};

use crate::nvrtc::{compile, key_with_options, nvrtc_version, CompileOptions, CompiledModule};
use crate::{Arch, CacheKey, RuntimeError};

/// Default size cap of the disk tier: 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// How a lookup was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum CacheOutcome {
    /// Found in this process's memory.
    MemoryHit,
    /// Read from a valid disk entry.
    DiskHit,
    /// Compiled with NVRTC (nothing was cached).
    Compiled,
    /// A bad disk entry was found; the kernel was recompiled and the entry rewritten.
    Repaired,
}

/// Event counters. `compiles` counts misses (every NVRTC run, repairs included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CacheCounters {
    /// Lookups served from memory (never persisted: too frequent).
    pub memory_hits: u64,
    /// Lookups served from a disk entry.
    pub disk_hits: u64,
    /// NVRTC compilations, i.e. misses.
    pub compiles: u64,
    /// Bad disk entries found during lookups, recompiled and rewritten.
    pub repairs: u64,
    /// Disk writes that failed (warned, never fatal).
    pub write_failures: u64,
    /// Entries evicted by the size cap.
    pub evictions: u64,
}

impl CacheCounters {
    fn add(&mut self, other: &CacheCounters) {
        self.memory_hits += other.memory_hits;
        self.disk_hits += other.disk_hits;
        self.compiles += other.compiles;
        self.repairs += other.repairs;
        self.write_failures += other.write_failures;
        self.evictions += other.evictions;
    }
}

/// A snapshot for `kfuse cache stats`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheStats {
    /// The disk folder, if any.
    pub dir: Option<PathBuf>,
    /// The disk size cap.
    pub max_bytes: u64,
    /// Entries on disk.
    pub entries: u64,
    /// Bytes on disk (entries and their sources).
    pub bytes: u64,
    /// Whether `KFUSE_NO_CACHE=1` switched the cache off.
    pub bypassed: bool,
    /// Counted by this process.
    pub session: CacheCounters,
    /// Counted by every process that used this folder, as recorded on disk (memory hits are
    /// not recorded).
    pub persisted: CacheCounters,
}

/// One entry on disk, for `kfuse cache list`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheEntryInfo {
    /// The key.
    pub key: CacheKey,
    /// Its arch folder.
    pub arch: Arch,
    /// Bytes of the entry and its source.
    pub bytes: u64,
    /// Last use (the entry's modification time), seconds since the Unix epoch.
    pub last_used_unix_s: u64,
    /// The entry file.
    pub path: PathBuf,
}

/// One problem found by [`KernelCache::verify`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyProblem {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
    /// Whether it was removed.
    pub removed: bool,
}

/// The result of [`KernelCache::verify`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Entry files checked.
    pub checked: u64,
    /// Entry files found valid.
    pub valid: u64,
    /// Bad entries and foreign files.
    pub problems: Vec<VerifyProblem>,
}

/// The result of [`KernelCache::clear`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ClearReport {
    /// Entries removed from disk.
    pub entries: u64,
    /// Bytes removed from disk.
    pub bytes: u64,
}

/// Whether lookups use the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// Memory and disk tiers in use.
    Enabled,
    /// Every lookup compiles; nothing is read or written.
    Bypassed,
}

/// How a cache is set up.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Disk folder; `None` keeps the cache in memory only.
    pub dir: Option<PathBuf>,
    /// Disk size cap in bytes.
    pub max_bytes: u64,
    /// Enabled or bypassed.
    pub mode: CacheMode,
    /// Print each compile with its time to stderr.
    pub log_compiles: bool,
}

impl CacheConfig {
    /// The configuration the environment asks for (see the module docs). Bad values are
    /// warned about and replaced by defaults: the cache never stops a run.
    pub fn from_env() -> CacheConfig {
        let flag = |name: &str| std::env::var(name).map(|v| v.trim() == "1").unwrap_or(false);
        let dir = match std::env::var_os("KFUSE_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
            _ => dirs::cache_dir().map(|d| d.join("kfuse")),
        };
        if dir.is_none() {
            warn("no user cache folder found and KFUSE_CACHE_DIR unset; kernels are cached in memory only");
        }
        let max_bytes = match std::env::var("KFUSE_CACHE_MAX_BYTES") {
            Ok(text) => parse_size(&text).unwrap_or_else(|| {
                warn(&format!("KFUSE_CACHE_MAX_BYTES={text:?} is not a size (e.g. 1073741824, 512M, 2G); using 1G"));
                DEFAULT_MAX_BYTES
            }),
            Err(_) => DEFAULT_MAX_BYTES,
        };
        CacheConfig {
            dir,
            max_bytes,
            mode: if flag("KFUSE_NO_CACHE") { CacheMode::Bypassed } else { CacheMode::Enabled },
            log_compiles: flag("KFUSE_LOG_COMPILES"),
        }
    }
}

/// Parses `1234`, `64K`, `512M`, `2G` (binary units).
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last()? {
        (i, 'k' | 'K') => (&text[..i], 10),
        (i, 'm' | 'M') => (&text[..i], 20),
        (i, 'g' | 'G') => (&text[..i], 30),
        _ => (text, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

fn warn(message: &str) {
    eprintln!("kfuse: warning: {message}");
}

/// What [`KernelCache::memory_probe`] found.
enum MemoryProbe<'a> {
    /// The module, through the source map.
    Found(Arc<CompiledModule>),
    /// Not in the source map: the lookup key, the cache key and the key's slot.
    Slot { lookup: LookupKey<'a>, key: CacheKey, slot: Arc<Slot> },
}

#[derive(Default)]
struct Slot {
    module: Mutex<Option<Arc<CompiledModule>>>,
}

#[derive(Default)]
struct AtomicCounters {
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiles: AtomicU64,
    repairs: AtomicU64,
    write_failures: AtomicU64,
    evictions: AtomicU64,
}

impl AtomicCounters {
    fn add(&self, delta: &CacheCounters) {
        self.memory_hits.fetch_add(delta.memory_hits, Ordering::Relaxed);
        self.disk_hits.fetch_add(delta.disk_hits, Ordering::Relaxed);
        self.compiles.fetch_add(delta.compiles, Ordering::Relaxed);
        self.repairs.fetch_add(delta.repairs, Ordering::Relaxed);
        self.write_failures.fetch_add(delta.write_failures, Ordering::Relaxed);
        self.evictions.fetch_add(delta.evictions, Ordering::Relaxed);
    }

    fn snapshot(&self) -> CacheCounters {
        CacheCounters {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            repairs: self.repairs.load(Ordering::Relaxed),
            write_failures: self.write_failures.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }
}

/// Compiled kernels by content key, in memory and (optionally) on disk. Thread-safe.
pub struct KernelCache {
    config: CacheConfig,
    disk: Option<DiskStore>,
    memory: Mutex<HashMap<CacheKey, Arc<Slot>>>,
    /// First-level lookup of modules already in `memory`.
    by_source: SourceMap<Arc<CompiledModule>>,
    counters: AtomicCounters,
    warned_lock: AtomicBool,
    warned_stats: AtomicBool,
}

impl KernelCache {
    /// The process-wide cache, configured from the environment on first use.
    pub fn global() -> Arc<KernelCache> {
        static GLOBAL: OnceLock<Arc<KernelCache>> = OnceLock::new();
        GLOBAL.get_or_init(|| Arc::new(KernelCache::new(CacheConfig::from_env()))).clone()
    }

    /// A cache on folder `dir` with size cap `max_bytes` (for tests and tools); compile
    /// logging still follows `KFUSE_LOG_COMPILES`.
    pub fn with_dir(dir: impl Into<PathBuf>, max_bytes: u64) -> KernelCache {
        KernelCache::new(CacheConfig {
            dir: Some(dir.into()),
            max_bytes,
            mode: CacheMode::Enabled,
            log_compiles: CacheConfig::from_env_log_flag(),
        })
    }

    /// A cache with no disk tier.
    pub fn memory_only() -> KernelCache {
        KernelCache::new(CacheConfig {
            dir: None,
            max_bytes: 0,
            mode: CacheMode::Enabled,
            log_compiles: CacheConfig::from_env_log_flag(),
        })
    }

    /// A cache with an explicit configuration.
    pub fn new(config: CacheConfig) -> KernelCache {
        let disk = match (&config.dir, config.mode) {
            (Some(dir), CacheMode::Enabled) => Some(DiskStore::new(dir.clone(), config.max_bytes)),
            _ => None,
        };
        KernelCache {
            config,
            disk,
            memory: Mutex::new(HashMap::new()),
            by_source: SourceMap::new(),
            counters: AtomicCounters::default(),
            warned_lock: AtomicBool::new(false),
            warned_stats: AtomicBool::new(false),
        }
    }

    /// The configuration in use.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Whether caching is switched off (`KFUSE_NO_CACHE=1`).
    pub fn is_bypassed(&self) -> bool {
        self.config.mode == CacheMode::Bypassed
    }

    /// The disk folder, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.root())
    }

    /// Returns the compiled module for (`source`, `opts`): from memory, else from disk, else
    /// compiled with NVRTC (once per key across threads and processes) and stored.
    pub fn get_or_compile(
        &self,
        source: &str,
        opts: &CompileOptions,
    ) -> Result<(Arc<CompiledModule>, CacheOutcome), RuntimeError> {
        if self.is_bypassed() {
            let module = self.compile_logged(source, opts, CacheOutcome::Compiled)?;
            self.record(CacheCounters { compiles: 1, ..Default::default() }, false);
            return Ok((Arc::new(module), CacheOutcome::Compiled));
        }
        let (lookup, key, slot) = match self.memory_probe(source, opts)? {
            MemoryProbe::Found(found) => return Ok((found, CacheOutcome::MemoryHit)),
            MemoryProbe::Slot { lookup, key, slot } => (lookup, key, slot),
        };
        let mut held = slot.module.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = held.as_ref() {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok((found.clone(), CacheOutcome::MemoryHit));
        }
        let (module, outcome) = match &self.disk {
            Some(disk) => self.load_or_compile(disk, source, opts, &key)?,
            None => {
                let module = self.compile_logged(source, opts, CacheOutcome::Compiled)?;
                self.record(CacheCounters { compiles: 1, ..Default::default() }, false);
                (module, CacheOutcome::Compiled)
            }
        };
        let module = Arc::new(module);
        *held = Some(module.clone());
        self.by_source.insert(&lookup, module.clone());
        Ok((module, outcome))
    }

    /// The first steps of every lookup: the source map (a memory hit without hashing the key),
    /// else the key and its memory slot (created empty when new).
    fn memory_probe<'a>(&self, source: &'a str, opts: &'a CompileOptions) -> Result<MemoryProbe<'a>, RuntimeError> {
        let lookup = LookupKey { source, name: "", arch: opts.arch, extra: &opts.extra };
        if let Some(found) = self.by_source.get(&lookup) {
            self.counters.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(MemoryProbe::Found(found));
        }
        let key = key_with_options(source, &opts.nvrtc_options(), opts.arch, nvrtc_version()?);
        let slot = {
            let mut memory = self.memory.lock().unwrap_or_else(|e| e.into_inner());
            memory.entry(key).or_default().clone()
        };
        Ok(MemoryProbe::Slot { lookup, key, slot })
    }

    /// The disk path of a lookup: read; on a miss take the key's lock, read again (another
    /// process may have finished meanwhile), compile, write, evict.
    fn load_or_compile(
        &self,
        disk: &DiskStore,
        source: &str,
        opts: &CompileOptions,
        key: &CacheKey,
    ) -> Result<(CompiledModule, CacheOutcome), RuntimeError> {
        let arch = opts.arch;
        let mut damaged = false;
        let mut check = |found: ReadOutcome| -> Option<CompiledModule> {
            match found {
                ReadOutcome::Hit(module) => Some(module),
                ReadOutcome::Missing => None,
                ReadOutcome::Bad { path, reason } => {
                    if !damaged {
                        warn(&format!(
                            "kernel cache entry {} is bad ({reason}); recompiling and rewriting it",
                            path.display()
                        ));
                    }
                    damaged = true;
                    None
                }
            }
        };
        if let Some(module) = check(disk.read(key, arch)) {
            self.record(CacheCounters { disk_hits: 1, ..Default::default() }, true);
            self.log_hit(key, arch);
            return Ok((module, CacheOutcome::DiskHit));
        }
        let _lock = match disk.lock(key, arch) {
            Ok(lock) => Some(lock),
            Err(e) => {
                if !self.warned_lock.swap(true, Ordering::Relaxed) {
                    warn(&format!(
                        "cannot lock kernel cache entries under {} ({e}); compiling without cross-process exclusion",
                        disk.root().display()
                    ));
                }
                None
            }
        };
        if let Some(module) = check(disk.read(key, arch)) {
            self.record(CacheCounters { disk_hits: 1, ..Default::default() }, true);
            self.log_hit(key, arch);
            return Ok((module, CacheOutcome::DiskHit));
        }
        let outcome = if damaged { CacheOutcome::Repaired } else { CacheOutcome::Compiled };
        let module = self.compile_logged(source, opts, outcome)?;
        let mut delta = CacheCounters { compiles: 1, repairs: u64::from(damaged), ..Default::default() };
        let entry_path = disk.entry_path(key, arch);
        match disk.write(&module, source) {
            Ok(written) => match disk.account_and_evict(written, &entry_path) {
                Ok(evicted) => delta.evictions = evicted,
                Err(e) => warn(&format!("kernel cache eviction under {} failed: {e}", disk.root().display())),
            },
            Err(e) => {
                delta.write_failures = 1;
                warn(&format!(
                    "could not write kernel cache entry {} ({e}); continuing without caching it",
                    entry_path.display()
                ));
            }
        }
        self.record(delta, true);
        Ok((module, outcome))
    }

    fn compile_logged(
        &self,
        source: &str,
        opts: &CompileOptions,
        outcome: CacheOutcome,
    ) -> Result<CompiledModule, RuntimeError> {
        let started = Instant::now();
        let module = compile(source, opts)?;
        if self.config.log_compiles {
            eprintln!(
                "kfuse: compiled {} for {} in {:.1} ms ({} B source, {} B cubin, {outcome:?})",
                module.key,
                module.arch,
                started.elapsed().as_secs_f64() * 1e3,
                source.len(),
                module.cubin.len()
            );
        }
        Ok(module)
    }

    fn log_hit(&self, key: &CacheKey, arch: Arch) {
        if self.config.log_compiles {
            eprintln!("kfuse: disk cache hit {key} for {arch}");
        }
    }

    /// Counts events in this process and, when asked, in the folder's persisted counters.
    fn record(&self, delta: CacheCounters, persist: bool) {
        self.counters.add(&delta);
        if !persist {
            return;
        }
        if let Some(disk) = &self.disk {
            if let Err(e) = disk.add_counters(&delta) {
                if !self.warned_stats.swap(true, Ordering::Relaxed) {
                    warn(&format!("could not update kernel cache counters under {} ({e})", disk.root().display()));
                }
            }
        }
    }

    /// Entries, bytes and counters.
    pub fn stats(&self) -> CacheStats {
        let (entries, bytes, persisted) = match &self.disk {
            Some(disk) => {
                let files = disk.scan().unwrap_or_default();
                (files.len() as u64, files.iter().map(|f| f.bytes).sum(), disk.load_counters())
            }
            None => (0, 0, CacheCounters::default()),
        };
        CacheStats {
            dir: self.dir().map(Path::to_path_buf),
            max_bytes: self.config.max_bytes,
            entries,
            bytes,
            bypassed: self.is_bypassed(),
            session: self.counters.snapshot(),
            persisted,
        }
    }

    /// The entries on disk, most recently used first (contents not checked: see `verify`).
    pub fn list(&self) -> Result<Vec<CacheEntryInfo>, RuntimeError> {
        let disk = self.disk.as_ref().ok_or(RuntimeError::NoCacheDir)?;
        disk.list().map_err(|error| RuntimeError::CacheIo { path: disk.root().to_path_buf(), error })
    }

    /// Removes every entry from disk and memory.
    pub fn clear(&self) -> Result<ClearReport, RuntimeError> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.by_source.clear();
        let Some(disk) = &self.disk else {
            return Ok(ClearReport::default());
        };
        let (entries, bytes) =
            disk.clear().map_err(|error| RuntimeError::CacheIo { path: disk.root().to_path_buf(), error })?;
        Ok(ClearReport { entries, bytes })
    }

    /// Checks every file in the disk folder; removes and reports bad entries and foreign files.
    pub fn verify(&self) -> Result<VerifyReport, RuntimeError> {
        let disk = self.disk.as_ref().ok_or(RuntimeError::NoCacheDir)?;
        disk.verify().map_err(|error| RuntimeError::CacheIo { path: disk.root().to_path_buf(), error })
    }

    /// The disk path an entry for (`source`, `opts`) has (whether or not it exists).
    pub fn entry_path(&self, source: &str, opts: &CompileOptions) -> Result<Option<PathBuf>, RuntimeError> {
        let key = crate::nvrtc::cache_key(source, opts)?;
        Ok(self.disk.as_ref().map(|d| d.entry_path(&key, opts.arch)))
    }
}

impl CacheConfig {
    fn from_env_log_flag() -> bool {
        std::env::var("KFUSE_LOG_COMPILES").map(|v| v.trim() == "1").unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1234"), Some(1234));
        assert_eq!(parse_size("64K"), Some(64 << 10));
        assert_eq!(parse_size("512m"), Some(512 << 20));
        assert_eq!(parse_size(" 2G "), Some(2 << 30));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999G"), None);
    }
}
