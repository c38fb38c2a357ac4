//! The disk tier: one folder per arch under the cache root, one `<key>.kfc` entry per module
//! with the source beside it as `<key>.cu`, per-key lock files, LRU eviction by file
//! modification time, persisted counters, and the `list` / `verify` / `clear` maintenance.
//!
//! Writes go to a temporary file in the same folder and are renamed into place, so readers see
//! a whole entry or none. Cross-process exclusion uses advisory file locks (fs4), which the OS
//! drops when a holder dies; a holder that hangs is waited for at most `LOCK_WAIT`. Nothing here
//! decides what a failure means: the caller turns I/O errors into warnings.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use super::entry::{self, MAX_ENTRY_BYTES};
use super::{CacheCounters, CacheEntryInfo, VerifyProblem, VerifyReport};
use crate::nvrtc::CompiledModule;
use crate::{Arch, CacheKey};

/// How long a process waits for another to finish compiling the same key.
const LOCK_WAIT: Duration = Duration::from_secs(120);
/// Temporary files older than this are leftovers of killed writers.
const STALE_TEMP_AGE: Duration = Duration::from_secs(600);
const ENTRY_EXT: &str = "kfc";
const SOURCE_EXT: &str = "cu";
const STATS_FILE: &str = "stats.json";
const STATS_LOCK: &str = "stats.lock";
const LOCKS_DIR: &str = "locks";

/// What reading an entry found.
pub(crate) enum ReadOutcome {
    Hit(CompiledModule),
    Missing,
    Bad { path: PathBuf, reason: String },
}

/// An entry file found by a scan.
pub(crate) struct EntryFile {
    pub key: CacheKey,
    pub arch: Arch,
    pub path: PathBuf,
    pub bytes: u64,
    pub modified: SystemTime,
}

/// A held per-key lock; released when dropped (and by the OS if the process dies).
pub(crate) struct KeyLock {
    file: File,
}

impl Drop for KeyLock {
    fn drop(&mut self) {
        let _ = fs4::FileExt::unlock(&self.file);
    }
}

pub(crate) struct DiskStore {
    root: PathBuf,
    max_bytes: u64,
    /// Running estimate of the bytes on disk; `None` until the first scan.
    approx_bytes: Mutex<Option<u64>>,
    temp_counter: AtomicU64,
}

impl DiskStore {
    pub fn new(root: PathBuf, max_bytes: u64) -> DiskStore {
        DiskStore { root, max_bytes, approx_bytes: Mutex::new(None), temp_counter: AtomicU64::new(0) }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn arch_dir(&self, arch: Arch) -> PathBuf {
        self.root.join(arch.to_string())
    }

    pub fn entry_path(&self, key: &CacheKey, arch: Arch) -> PathBuf {
        self.arch_dir(arch).join(format!("{}.{ENTRY_EXT}", key.to_hex()))
    }

    fn source_path(&self, key: &CacheKey, arch: Arch) -> PathBuf {
        self.arch_dir(arch).join(format!("{}.{SOURCE_EXT}", key.to_hex()))
    }

    /// Reads and checks the entry of `key`; a valid hit refreshes its LRU time.
    pub fn read(&self, key: &CacheKey, arch: Arch) -> ReadOutcome {
        let path = self.entry_path(key, arch);
        match read_entry(&path, key, arch) {
            Ok(Some(module)) => {
                touch(&path);
                ReadOutcome::Hit(module)
            }
            Ok(None) => ReadOutcome::Missing,
            Err(reason) => ReadOutcome::Bad { path, reason },
        }
    }

    /// Writes an entry (atomically) and its source beside it; returns the bytes written.
    pub fn write(&self, module: &CompiledModule, source: &str) -> io::Result<u64> {
        let dir = self.arch_dir(module.arch);
        fs::create_dir_all(&dir)?;
        let bytes = entry::encode(module);
        self.write_atomically(&dir, &self.entry_path(&module.key, module.arch), &bytes)?;
        // The source is for people debugging; losing it costs nothing.
        let source_path = self.source_path(&module.key, module.arch);
        let source_written = self.write_atomically(&dir, &source_path, source.as_bytes()).is_ok();
        let total = bytes.len() as u64 + if source_written { source.len() as u64 } else { 0 };
        Ok(total)
    }

    fn write_atomically(&self, dir: &Path, target: &Path, bytes: &[u8]) -> io::Result<()> {
        let nonce = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let temp = dir.join(format!(".tmp-{}-{nanos}-{nonce}", std::process::id()));
        let result = (|| {
            let mut file = OpenOptions::new().write(true).create_new(true).open(&temp)?;
            // No fsync: a crash can leave a torn entry, which the checksum turns into a repair;
            // syncing would cost milliseconds on every write, counters included.
            file.write_all(bytes)?;
            drop(file);
            fs::rename(&temp, target)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// Takes the cross-process lock of `key`, waiting up to `LOCK_WAIT` for another holder.
    pub fn lock(&self, key: &CacheKey, arch: Arch) -> io::Result<KeyLock> {
        let dir = self.arch_dir(arch).join(LOCKS_DIR);
        fs::create_dir_all(&dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(format!("{}.lock", key.to_hex())))?;
        let deadline = Instant::now() + LOCK_WAIT;
        let mut pause = Duration::from_millis(1);
        loop {
            match fs4::FileExt::try_lock(&file) {
                Ok(()) => return Ok(KeyLock { file }),
                Err(fs4::TryLockError::WouldBlock) => {
                    if Instant::now() >= deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("lock of {key} still held after {} s", LOCK_WAIT.as_secs()),
                        ));
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(fs4::TryLockError::Error(e)) => return Err(e),
            }
        }
    }

    /// Counts `written` new bytes and evicts least-recently-used entries beyond the cap,
    /// never the entry at `keep`. Returns how many entries were evicted.
    pub fn account_and_evict(&self, written: u64, keep: &Path) -> io::Result<u64> {
        let mut approx = self.approx_bytes.lock().unwrap_or_else(|e| e.into_inner());
        let estimate = match *approx {
            Some(bytes) => bytes.saturating_add(written),
            None => self.scan()?.iter().map(|e| e.bytes).sum(),
        };
        if estimate <= self.max_bytes {
            *approx = Some(estimate);
            return Ok(0);
        }
        let mut entries = self.scan()?;
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        entries.sort_by_key(|e| e.modified);
        let mut evicted = 0;
        for entry in &entries {
            if total <= self.max_bytes {
                break;
            }
            if entry.path == keep {
                continue;
            }
            if self.remove_entry(entry).is_ok() {
                total = total.saturating_sub(entry.bytes);
                evicted += 1;
            }
        }
        *approx = Some(total);
        Ok(evicted)
    }

    fn remove_entry(&self, entry: &EntryFile) -> io::Result<()> {
        fs::remove_file(&entry.path)?;
        let _ = fs::remove_file(self.source_path(&entry.key, entry.arch));
        Ok(())
    }

    /// Every well-named entry file (contents not checked), with its source's size included.
    pub fn scan(&self) -> io::Result<Vec<EntryFile>> {
        let mut entries = Vec::new();
        for (arch, dir) in self.arch_dirs()? {
            for item in fs::read_dir(&dir)? {
                let item = item?;
                let path = item.path();
                let Some(key) = entry_key(&path) else { continue };
                let Ok(meta) = item.metadata() else { continue };
                let source_bytes = fs::metadata(self.source_path(&key, arch)).map_or(0, |m| m.len());
                entries.push(EntryFile {
                    key,
                    arch,
                    bytes: meta.len() + source_bytes,
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    path,
                });
            }
        }
        Ok(entries)
    }

    fn arch_dirs(&self) -> io::Result<Vec<(Arch, PathBuf)>> {
        let mut dirs = Vec::new();
        let listing = match fs::read_dir(&self.root) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(dirs),
            Err(e) => return Err(e),
        };
        for item in listing {
            let item = item?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with("sm_") || !item.file_type()?.is_dir() {
                continue;
            }
            if let Ok(arch) = name.parse::<Arch>() {
                if arch.to_string() == name {
                    dirs.push((arch, item.path()));
                }
            }
        }
        dirs.sort();
        Ok(dirs)
    }

    pub fn list(&self) -> io::Result<Vec<CacheEntryInfo>> {
        let mut entries: Vec<CacheEntryInfo> = self
            .scan()?
            .into_iter()
            .map(|e| CacheEntryInfo {
                key: e.key,
                arch: e.arch,
                bytes: e.bytes,
                last_used_unix_s: e.modified.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
                path: e.path,
            })
            .collect();
        entries.sort_by(|a, b| b.last_used_unix_s.cmp(&a.last_used_unix_s).then(a.key.cmp(&b.key)));
        Ok(entries)
    }

    /// Checks every file under the root; removes bad entries and foreign files.
    pub fn verify(&self) -> io::Result<VerifyReport> {
        let mut report = VerifyReport::default();
        let problem = |path: PathBuf, reason: String, report: &mut VerifyReport| {
            let removed = fs::remove_file(&path).is_ok();
            report.problems.push(VerifyProblem { path, reason, removed });
        };
        let arch_dirs = self.arch_dirs()?;
        if let Ok(listing) = fs::read_dir(&self.root) {
            for item in listing {
                let item = item?;
                let name = item.file_name();
                let known =
                    arch_dirs.iter().any(|(_, d)| *d == item.path()) || name == STATS_FILE || name == STATS_LOCK;
                if !known && item.file_type()?.is_file() {
                    problem(item.path(), "not a kfuse cache file".to_string(), &mut report);
                }
            }
        }
        for (arch, dir) in arch_dirs {
            for item in fs::read_dir(&dir)? {
                let item = item?;
                let path = item.path();
                let name = item.file_name().to_string_lossy().into_owned();
                if name == LOCKS_DIR {
                    continue;
                }
                if !item.file_type()?.is_file() {
                    report.problems.push(VerifyProblem {
                        path,
                        reason: "unexpected folder (left in place)".to_string(),
                        removed: false,
                    });
                    continue;
                }
                if name.starts_with(".tmp-") {
                    let age = item
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .unwrap_or_default();
                    if age > STALE_TEMP_AGE {
                        problem(path, "temporary file left by an interrupted write".to_string(), &mut report);
                    }
                    continue;
                }
                if let Some(key) = entry_key(&path) {
                    report.checked += 1;
                    match read_entry(&path, &key, arch) {
                        Ok(Some(_)) => report.valid += 1,
                        Ok(None) => {}
                        Err(reason) => {
                            let _ = fs::remove_file(self.source_path(&key, arch));
                            problem(path, reason, &mut report);
                        }
                    }
                    continue;
                }
                let is_source = path.extension().is_some_and(|e| e == SOURCE_EXT)
                    && path.file_stem().and_then(|s| s.to_str()).and_then(CacheKey::from_hex).is_some();
                if is_source {
                    if !path.with_extension(ENTRY_EXT).exists() {
                        problem(path, "source without its entry".to_string(), &mut report);
                    }
                    continue;
                }
                problem(path, "not a kfuse cache file".to_string(), &mut report);
            }
        }
        *self.approx_bytes.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(report)
    }

    /// Removes every entry, source, lock and the persisted counters; returns (entries, bytes).
    pub fn clear(&self) -> io::Result<(u64, u64)> {
        let entries = self.scan()?;
        let count = entries.len() as u64;
        let bytes = entries.iter().map(|e| e.bytes).sum();
        for (_, dir) in self.arch_dirs()? {
            fs::remove_dir_all(&dir)?;
        }
        for name in [STATS_FILE, STATS_LOCK] {
            match fs::remove_file(self.root.join(name)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        *self.approx_bytes.lock().unwrap_or_else(|e| e.into_inner()) = Some(0);
        Ok((count, bytes))
    }

    /// The counters recorded on disk by every process using this folder.
    pub fn load_counters(&self) -> CacheCounters {
        fs::read(self.root.join(STATS_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<CacheCounters>(&bytes).ok())
            .unwrap_or_default()
    }

    /// Adds `delta` to the counters on disk under a lock.
    pub fn add_counters(&self, delta: &CacheCounters) -> io::Result<()> {
        fs::create_dir_all(&self.root)?;
        let lock =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.root.join(STATS_LOCK))?;
        fs4::FileExt::lock(&lock)?;
        let mut counters = self.load_counters();
        counters.add(delta);
        let json = serde_json::to_vec_pretty(&counters).map_err(io::Error::other)?;
        let result = self.write_atomically(&self.root, &self.root.join(STATS_FILE), &json);
        let _ = fs4::FileExt::unlock(&lock);
        result
    }
}

/// The key of `<64 hex>.kfc`, or `None` for any other file name.
fn entry_key(path: &Path) -> Option<CacheKey> {
    if path.extension()? != ENTRY_EXT {
        return None;
    }
    CacheKey::from_hex(path.file_stem()?.to_str()?)
}

/// `Ok(None)` when there is no entry; `Err(reason)` when there is a bad one.
fn read_entry(path: &Path, key: &CacheKey, arch: Arch) -> Result<Option<CompiledModule>, String> {
    let meta = match fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // No folder to hold it (e.g. a path component is a file): nothing is stored there.
        Err(_) if !path.parent().is_some_and(Path::is_dir) => return Ok(None),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > MAX_ENTRY_BYTES {
        return Err(format!("implausibly large ({} bytes)", meta.len()));
    }
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    entry::decode(&bytes, key, arch).map(Some)
}

/// Marks an entry as just used (its mtime is the LRU clock). Fails silently when read-only.
fn touch(path: &Path) {
    if let Ok(file) = OpenOptions::new().write(true).open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}
