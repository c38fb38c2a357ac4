//! The kernel cache: compiled cubin + PTX by content key, in memory and on disk.
//!
//! - Memory: (source, arch, extra options) → `Arc<CompiledModule>` first (a [`SourceMap`]: a
//!   repeat costs a fast hash, one map probe and one source comparison), then (key) → slot for
//!   what is not there yet. Each key has its own slot mutex, so threads asking for the same new kernel compile it once while
//!   different kernels compile in parallel. (The (key, device) → loaded function tier lives in
//!   [`crate::Gpu`].)
//! - Disk: see `disk` for the layout. Bad entries are warnings and recompiles (`Repaired`); a
//!   failed write is a warning; a per-key file lock makes concurrent processes compile once (a
//!   wait of more than 2 s says on stderr which lock file it waits for).
//! - Ownership: kfuse marks its cache folder with a `CACHEDIR.TAG` and removes or overwrites
//!   only its own files in it (`owner`). A folder that holds anything else is left alone: lookups
//!   warn once and compile without the disk tier, and `clear`, `verify` and `list` refuse it with
//!   [`RuntimeError::CacheNotOwned`] (see `maintain`).
//! - Background: [`KernelCache::compile_in_background`] compiles on its own thread and returns
//!   a handle to poll (`background`).
//! - Environment: `KFUSE_CACHE_DIR`, `KFUSE_CACHE_MAX_BYTES` (`0`: lookups keep nothing on disk),
//!   `KFUSE_NO_CACHE=1` (compile every time, touch no cache), `KFUSE_LOG_COMPILES=1` (print each
//!   compile and its time); flags take the words of [`crate::env`](mod@crate::env). An invalid value is an error
//!   ([`RuntimeError::InvalidEnv`]) of [`KernelCache::try_global`] and of every lookup through
//!   [`KernelCache::global`], never a silent default.
//!
//! A lookup that finds its kernel (in memory or on disk) never loads NVRTC: the key does not
//! include NVRTC's version (the entry records it; see `crate::key`). Only a compile does.
//! [`KernelCache::rebuild`] replaces an entry whose cubin the driver refused.

mod background;
mod disk;
mod entry;
mod maintain;
mod owner;
mod probe;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

pub use background::{BackgroundCompile, BackgroundFailure, BackgroundOutcome};
use disk::{DiskStore, ReadOutcome};

use crate::env::{self, EnvError};

use crate::lookup::{LookupKey, SourceMap};

use crate::nvrtc::{cache_key, compile, CompileOptions, CompiledModule};
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
    /// The field names, as `stats.json` holds them.
    pub const FIELDS: [&'static str; 6] =
        ["memory_hits", "disk_hits", "compiles", "repairs", "write_failures", "evictions"];

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
    /// Why lookups do not use the disk folder, when they do not (a folder that is not kfuse's,
    /// not a folder, `KFUSE_CACHE_MAX_BYTES=0`, an invalid setting).
    pub disk_unused: Option<String>,
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
    /// The NVRTC that built it, as its header says (`None` when the header is unreadable: `verify`
    /// tells why).
    pub nvrtc_version: Option<(i32, i32)>,
}

/// What [`KernelCache::verify`] did about a problem.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum VerifyAction {
    /// A file of kfuse's, removed.
    Removed,
    /// A file of kfuse's that could not be removed; the text says why.
    RemoveFailed(String),
    /// Not kfuse's: reported, never removed.
    LeftAlone,
}

/// One problem found by [`KernelCache::verify`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyProblem {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
    /// What was done about it.
    pub action: VerifyAction,
}

/// The result of [`KernelCache::verify`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct VerifyReport {
    /// Entry files checked.
    pub checked: u64,
    /// Entry files found valid.
    pub valid: u64,
    /// Bad entries of kfuse's (removed) and files that are not kfuse's (left alone).
    pub problems: Vec<VerifyProblem>,
}

/// The result of [`KernelCache::clear`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ClearReport {
    /// Entries removed from disk.
    pub entries: u64,
    /// Bytes removed from disk (entries and their sources).
    pub bytes: u64,
    /// Files and folders in the cache folder that are not kfuse's, left as they were.
    pub left_alone: Vec<PathBuf>,
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
    /// The configuration the environment asks for (see the module docs). An invalid value of
    /// `KFUSE_NO_CACHE`, `KFUSE_LOG_COMPILES`, `KFUSE_LOG_TIMING` or `KFUSE_NO_TIERING` (the runtime's
    /// timing log and the facade's tiered loads, checked here so that they fail as early) or
    /// `KFUSE_CACHE_MAX_BYTES` is an error.
    pub fn from_env() -> Result<CacheConfig, RuntimeError> {
        CacheConfig::read_env().map_err(RuntimeError::from)
    }

    fn read_env() -> Result<CacheConfig, EnvError> {
        let bypassed = env::flag("KFUSE_NO_CACHE")?;
        let log_compiles = env::flag("KFUSE_LOG_COMPILES")?;
        env::flag("KFUSE_LOG_TIMING")?;
        env::flag("KFUSE_NO_TIERING")?;
        env::fast_compile()?;
        let max_bytes = env::size("KFUSE_CACHE_MAX_BYTES")?.unwrap_or(DEFAULT_MAX_BYTES);
        let dir = match std::env::var_os("KFUSE_CACHE_DIR") {
            Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
            _ => dirs::cache_dir().map(|d| d.join("kfuse")),
        };
        if dir.is_none() {
            warn("no user cache folder found and KFUSE_CACHE_DIR unset; kernels are cached in memory only");
        }
        Ok(CacheConfig {
            dir,
            max_bytes,
            mode: if bypassed { CacheMode::Bypassed } else { CacheMode::Enabled },
            log_compiles,
        })
    }
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
    /// An invalid setting in the environment: every lookup and maintenance call returns it.
    env_error: Option<EnvError>,
    warned_lock: AtomicBool,
    warned_stats: AtomicBool,
    warned_folder: AtomicBool,
    /// The compiles running in the background (see [`KernelCache::wait_for_background`]).
    background: Arc<background::InFlight>,
}

/// The process-wide cache ([`KernelCache::global`]).
static GLOBAL: OnceLock<Arc<KernelCache>> = OnceLock::new();

impl KernelCache {
    /// The process-wide cache, configured from the environment on first use. When the
    /// environment holds an invalid setting, the cache keeps the error and returns it from every
    /// lookup and maintenance call; [`KernelCache::try_global`] returns it at once.
    pub fn global() -> Arc<KernelCache> {
        GLOBAL
            .get_or_init(|| {
                Arc::new(match CacheConfig::read_env() {
                    Ok(config) => KernelCache::new(config),
                    Err(e) => KernelCache::new(CacheConfig {
                        dir: None,
                        max_bytes: 0,
                        mode: CacheMode::Enabled,
                        log_compiles: false,
                    })
                    .with_env_error(Some(e)),
                })
            })
            .clone()
    }

    /// Waits for the background compiles of the process-wide cache, if it was made
    /// ([`KernelCache::wait_for_background`]): what a process runs before it exits, so that no
    /// compile is cut off and the optimised kernels are on disk for the next process.
    pub fn wait_for_global_background() {
        if let Some(cache) = GLOBAL.get() {
            cache.wait_for_background();
        }
    }

    /// The process-wide cache ([`KernelCache::global`]), or the error of an invalid setting in
    /// the environment.
    pub fn try_global() -> Result<Arc<KernelCache>, RuntimeError> {
        let cache = KernelCache::global();
        cache.check_env()?;
        Ok(cache)
    }

    /// A cache on folder `dir` with size cap `max_bytes` (for tests and tools); compile
    /// logging still follows `KFUSE_LOG_COMPILES` (an invalid value is an error of every lookup).
    pub fn with_dir(dir: impl Into<PathBuf>, max_bytes: u64) -> KernelCache {
        let log = env::flag("KFUSE_LOG_COMPILES");
        KernelCache::new(CacheConfig {
            dir: Some(dir.into()),
            max_bytes,
            mode: CacheMode::Enabled,
            log_compiles: *log.as_ref().unwrap_or(&false),
        })
        .with_env_error(log.err())
    }

    /// A cache with no disk tier (compile logging as for [`KernelCache::with_dir`]).
    pub fn memory_only() -> KernelCache {
        let log = env::flag("KFUSE_LOG_COMPILES");
        KernelCache::new(CacheConfig {
            dir: None,
            max_bytes: 0,
            mode: CacheMode::Enabled,
            log_compiles: *log.as_ref().unwrap_or(&false),
        })
        .with_env_error(log.err())
    }

    fn with_env_error(mut self, error: Option<EnvError>) -> KernelCache {
        self.env_error = error;
        self
    }

    /// The error of an invalid setting in the environment this cache was made from, if any.
    pub fn check_env(&self) -> Result<(), RuntimeError> {
        match &self.env_error {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }

    /// Whether the disk folder can be used: an error for an invalid setting, a folder that is
    /// not kfuse's ([`RuntimeError::CacheNotOwned`]) or a path that is not a folder
    /// ([`RuntimeError::CacheNotAFolder`]). A folder that does not exist yet is fine.
    pub fn check_folder(&self) -> Result<(), RuntimeError> {
        self.check_env()?;
        let Some(disk) = &self.disk else { return Ok(()) };
        match disk.state()? {
            owner::RootState::Foreign(reason) => {
                Err(RuntimeError::CacheNotOwned { path: disk.root().to_path_buf(), reason })
            }
            owner::RootState::NotAFolder => Err(RuntimeError::CacheNotAFolder { path: disk.root().to_path_buf() }),
            _ => Ok(()),
        }
    }

    /// The disk tier lookups use: none without a folder, with `KFUSE_CACHE_MAX_BYTES=0`, or for
    /// a folder that is not kfuse's (warned about once).
    fn lookup_disk(&self) -> Option<&DiskStore> {
        let disk = self.disk.as_ref().filter(|_| self.config.max_bytes > 0)?;
        match disk.refusal() {
            None => Some(disk),
            Some(refusal) => {
                if !self.warned_folder.swap(true, Ordering::Relaxed) {
                    warn(&format!("{}; kernels are compiled without the disk cache", refusal.error(disk.root())));
                }
                None
            }
        }
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
            env_error: None,
            warned_lock: AtomicBool::new(false),
            warned_stats: AtomicBool::new(false),
            warned_folder: AtomicBool::new(false),
            background: Arc::default(),
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
        self.check_env()?;
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
        let (module, outcome) = match self.lookup_disk() {
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
        let key = cache_key(source, opts);
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
        let mut foreign = false;
        let mut check = |found: ReadOutcome| -> Option<CompiledModule> {
            match found {
                ReadOutcome::Hit(module) => Some(module),
                ReadOutcome::Missing => None,
                ReadOutcome::Foreign { path, reason } => {
                    if !foreign {
                        warn(&format!(
                            "{} is in a kernel cache entry's place but is not kfuse's ({reason}); left alone, \
                             the kernel is compiled without caching it",
                            path.display()
                        ));
                    }
                    foreign = true;
                    None
                }
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
        if foreign {
            self.record(delta, true);
            return Ok((module, outcome));
        }
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
        let disk_unused = if let Some(e) = &self.env_error {
            Some(e.to_string())
        } else if let Some(refusal) = self.disk.as_ref().and_then(|d| d.refusal().map(|r| r.error(d.root()))) {
            Some(refusal.to_string())
        } else if self.disk.is_some() && self.config.max_bytes == 0 {
            Some("KFUSE_CACHE_MAX_BYTES=0: lookups keep nothing on disk".to_string())
        } else {
            None
        };
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
            disk_unused,
            session: self.counters.snapshot(),
            persisted,
        }
    }

    /// The entries on disk, most recently used first (contents not checked: see `verify`).
    pub fn list(&self) -> Result<Vec<CacheEntryInfo>, RuntimeError> {
        self.check_env()?;
        self.disk.as_ref().ok_or(RuntimeError::NoCacheDir)?.list()
    }

    /// Removes every kfuse file from disk (a folder that is not kfuse's is refused; files in
    /// kfuse's folder that are not kfuse's are left and listed) and every entry from memory.
    pub fn clear(&self) -> Result<ClearReport, RuntimeError> {
        self.check_env()?;
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.by_source.clear();
        match &self.disk {
            Some(disk) => disk.clear(),
            None => Ok(ClearReport::default()),
        }
    }

    /// Checks every file in the disk folder: removes and reports kfuse's bad entries, reports
    /// files that are not kfuse's and leaves them alone (a folder that is not kfuse's is refused).
    pub fn verify(&self) -> Result<VerifyReport, RuntimeError> {
        self.check_env()?;
        self.disk.as_ref().ok_or(RuntimeError::NoCacheDir)?.verify()
    }

    /// The disk path an entry for (`source`, `opts`) has (whether or not it exists).
    pub fn entry_path(&self, source: &str, opts: &CompileOptions) -> Result<Option<PathBuf>, RuntimeError> {
        let key = cache_key(source, opts);
        Ok(self.disk.as_ref().map(|d| d.entry_path(&key, opts.arch)))
    }

    /// Compiles (`source`, `opts`) again and puts the result in place of what the cache held, in
    /// memory and on disk: for an entry whose cubin the driver refused (built by another NVRTC, or
    /// for another driver). Counted as a repair. A bypassed cache only compiles.
    pub fn rebuild(&self, source: &str, opts: &CompileOptions) -> Result<Arc<CompiledModule>, RuntimeError> {
        self.check_env()?;
        if self.is_bypassed() {
            return self.get_or_compile(source, opts).map(|(module, _)| module);
        }
        let key = cache_key(source, opts);
        let slot = self.memory.lock().unwrap_or_else(|e| e.into_inner()).entry(key).or_default().clone();
        let mut held = slot.module.lock().unwrap_or_else(|e| e.into_inner());
        let module = Arc::new(self.compile_logged(source, opts, CacheOutcome::Repaired)?);
        let mut delta = CacheCounters { compiles: 1, repairs: 1, ..Default::default() };
        if let Some(disk) = self.lookup_disk() {
            let _lock = disk.lock(&key, opts.arch).ok();
            if let Err(e) = disk.write(&module, source) {
                delta.write_failures = 1;
                warn(&format!(
                    "could not rewrite kernel cache entry {} ({e})",
                    disk.entry_path(&key, opts.arch).display()
                ));
            }
        }
        self.record(delta, true);
        *held = Some(module.clone());
        self.by_source.replace(&LookupKey { source, name: "", arch: opts.arch, extra: &opts.extra }, module.clone());
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::CacheCounters;
    use super::{CacheOutcome, KernelCache};
    use crate::nvrtc::{cache_key, nvrtc_calls_on_this_thread, CompileOptions, CompiledModule};
    use crate::Arch;

    const SOURCE: &str = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }";

    /// An entry as another process (another NVRTC, for an arch this NVRTC may not know) left it.
    fn written_entry(dir: &std::path::Path, opts: &CompileOptions) -> CompiledModule {
        let module = CompiledModule {
            key: cache_key(SOURCE, opts),
            arch: opts.arch,
            built_for: Arch::new(10, 0),
            nvrtc_version: (12, 8),
            cubin: b"\x7fELF, a stand-in cubin".to_vec(),
            ptx: ".version 8.7\n.target sm_100\n".to_string(),
            log: String::new(),
        };
        let writer = KernelCache::with_dir(dir, 1 << 30);
        writer.disk.as_ref().expect("a disk tier").write(&module, SOURCE).expect("entry written");
        module
    }

    #[test]
    fn a_cached_module_that_does_not_load_is_rebuilt_in_place() {
        let Some(probe) = crate::testing::gpu_or_skip("a_cached_module_that_does_not_load_is_rebuilt_in_place") else {
            return;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = CompileOptions::for_arch(probe.arch());
        // An entry as an NVRTC this driver cannot read would leave it: a cubin and PTX it refuses.
        let bogus = CompiledModule {
            built_for: probe.arch(),
            cubin: b"\x7fELF, but not a cubin this driver loads".to_vec(),
            ptx: "not PTX either".to_string(),
            ..written_entry(dir.path(), &opts)
        };
        KernelCache::with_dir(dir.path(), 1 << 30).disk.as_ref().expect("disk").write(&bogus, SOURCE).expect("written");
        let cache = std::sync::Arc::new(KernelCache::with_dir(dir.path(), 1 << 30));
        let gpu = crate::Gpu::open_with_cache(probe.ordinal(), cache.clone()).expect("opens");
        gpu.load_kernel(SOURCE, "k").expect("rebuilt and loaded");
        let session = cache.stats().session;
        assert_eq!((session.disk_hits, session.compiles, session.repairs), (1, 1, 1));
        // The entry on disk is now the rebuilt one: the next process loads it as it is.
        let fresh = std::sync::Arc::new(KernelCache::with_dir(dir.path(), 1 << 30));
        let gpu = crate::Gpu::open_with_cache(probe.ordinal(), fresh.clone()).expect("opens");
        gpu.load_kernel(SOURCE, "k").expect("loads");
        let session = fresh.stats().session;
        assert_eq!((session.disk_hits, session.compiles, session.repairs), (1, 0, 0));
    }

    #[test]
    fn a_disk_hit_and_a_memory_hit_ask_nothing_of_nvrtc() {
        // Pure tier: NVRTC may be absent; the lookups below must not need it.
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = CompileOptions::for_arch(Arch::new(12, 0));
        let written = written_entry(dir.path(), &opts);
        let cache = KernelCache::with_dir(dir.path(), 1 << 30);
        let before = nvrtc_calls_on_this_thread();
        let (found, outcome) = cache.get_or_compile(SOURCE, &opts).expect("served from disk");
        assert_eq!(outcome, CacheOutcome::DiskHit);
        assert_eq!(*found, written);
        assert_eq!((found.built_for, found.nvrtc_version), (Arch::new(10, 0), (12, 8)));
        let (_, outcome) = cache.get_or_compile(SOURCE, &opts).expect("served from memory");
        assert_eq!(outcome, CacheOutcome::MemoryHit);
        let probed = KernelCache::with_dir(dir.path(), 1 << 30).get_cached(SOURCE, &opts).expect("probe");
        assert_eq!(probed.map(|(_, o)| o), Some(CacheOutcome::DiskHit));
        assert_eq!(nvrtc_calls_on_this_thread(), before, "a cache hit asked NVRTC something");
        assert_eq!(cache.stats().session.compiles, 0);
    }

    #[test]
    fn cache_list_shows_the_nvrtc_of_each_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = CompileOptions::for_arch(Arch::new(9, 0));
        let written = written_entry(dir.path(), &opts);
        let listed = KernelCache::with_dir(dir.path(), 1 << 30).list().expect("list");
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].key, listed[0].arch, listed[0].nvrtc_version), (written.key, opts.arch, Some((12, 8))));
    }

    #[test]
    fn the_counters_field_list_matches_what_stats_json_holds() {
        let json = serde_json::to_value(CacheCounters::default()).expect("serialises");
        let mut names: Vec<&str> = json.as_object().expect("an object").keys().map(String::as_str).collect();
        names.sort_unstable();
        let mut fields = CacheCounters::FIELDS.to_vec();
        fields.sort_unstable();
        assert_eq!(names, fields);
    }
}
