//! The disk tier: one folder per arch under the cache root, one `<key>.kfc` entry per module
//! with the source beside it as `<key>.cu`, per-key lock files, LRU eviction by file
//! modification time and persisted counters; the maintenance (`list`, `verify`, `clear`) is in
//! `maintain`.
//!
//! The root is used only when it is kfuse's (see `owner`): the first write tags a folder it
//! creates or an empty one, adopts an older kfuse cache, and refuses any other folder, which
//! lookups then leave alone (neither read nor written). Writes go to a temporary file in the same
//! folder and are renamed into place, so readers see a whole entry or none; a file in an entry's
//! place that is not kfuse's is never replaced. Cross-process exclusion uses advisory file locks
//! (fs4), which the OS drops when a holder dies; a holder that hangs is waited for at most
//! `LOCK_WAIT`, with a line on stderr after `LOCK_NOTICE`. Nothing here decides what a failure
//! means: the caller turns I/O errors into warnings.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use super::entry::{self, MAX_ENTRY_BYTES};
use super::owner::{self, ArchFile, RootState, ENTRY_EXT, LOCKS_DIR, LOCK_EXT, SOURCE_EXT, STATS_FILE, STATS_LOCK};
use super::CacheCounters;
use crate::nvrtc::CompiledModule;
use crate::{Arch, CacheKey, RuntimeError};

/// How long a process waits for another to finish compiling the same key.
const LOCK_WAIT: Duration = Duration::from_secs(120);
/// After this long waiting for a key's lock, say on stderr what is being waited for.
const LOCK_NOTICE: Duration = Duration::from_secs(2);
/// Temporary files older than this are leftovers of killed writers.
pub(super) const STALE_TEMP_AGE: Duration = Duration::from_secs(600);

/// What reading an entry found.
pub(crate) enum ReadOutcome {
    Hit(CompiledModule),
    Missing,
    /// A damaged entry of kfuse's (it is rewritten).
    Bad {
        path: PathBuf,
        reason: String,
    },
    /// A file in the entry's place that is not kfuse's (it is left alone).
    Foreign {
        path: PathBuf,
        reason: String,
    },
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

/// Why the root is not used.
#[derive(Debug, Clone)]
pub(crate) enum Refusal {
    NotOwned(String),
    NotAFolder,
}

impl Refusal {
    pub fn error(&self, root: &Path) -> RuntimeError {
        match self {
            Refusal::NotOwned(reason) => {
                RuntimeError::CacheNotOwned { path: root.to_path_buf(), reason: reason.clone() }
            }
            Refusal::NotAFolder => RuntimeError::CacheNotAFolder { path: root.to_path_buf() },
        }
    }
}

pub(crate) struct DiskStore {
    root: PathBuf,
    max_bytes: u64,
    /// Running estimate of the bytes on disk; `None` until the first scan.
    approx_bytes: Mutex<Option<u64>>,
    temp_counter: AtomicU64,
    /// Set once the root is known to be kfuse's (tagged, found so or by this process).
    owned: AtomicBool,
    /// Set once the root is known not to be kfuse's: lookups leave it alone from then on.
    refused: OnceLock<Refusal>,
}

impl DiskStore {
    pub fn new(root: PathBuf, max_bytes: u64) -> DiskStore {
        DiskStore {
            root,
            max_bytes,
            approx_bytes: Mutex::new(None),
            temp_counter: AtomicU64::new(0),
            owned: AtomicBool::new(false),
            refused: OnceLock::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// What the root is now (not remembered; see `refusal` for the lookups' view).
    pub fn state(&self) -> Result<RootState, RuntimeError> {
        owner::inspect(&self.root).map_err(|source| RuntimeError::CacheIo { path: self.root.clone(), error: source })
    }

    /// Why lookups must leave the root alone, if they must (remembered once found). A missing
    /// or unreadable root is not refused: reads find nothing and writes fail with a warning. An
    /// older kfuse cache (untagged) is adopted here.
    pub fn refusal(&self) -> Option<Refusal> {
        if self.owned.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(refused) = self.refused.get() {
            return Some(refused.clone());
        }
        match owner::inspect(&self.root) {
            Ok(RootState::Marked) => {
                self.owned.store(true, Ordering::Relaxed);
                None
            }
            Ok(RootState::Legacy) => {
                // An older kfuse's cache: adopted now, so that it is not walked again. A tag that
                // cannot be written (a read-only folder) changes nothing: it is still read.
                let _ = self.write_tag();
                self.owned.store(true, Ordering::Relaxed);
                None
            }
            Ok(RootState::Foreign(reason)) => Some(self.refused.get_or_init(|| Refusal::NotOwned(reason)).clone()),
            Ok(RootState::NotAFolder) => Some(self.refused.get_or_init(|| Refusal::NotAFolder).clone()),
            Ok(RootState::Missing | RootState::Empty) | Err(_) => None,
        }
    }

    /// Makes sure the root is kfuse's before anything is written: creates and tags a missing
    /// folder, tags an empty one or an older kfuse cache; refuses any other.
    pub fn claim(&self) -> io::Result<()> {
        if self.owned.load(Ordering::Relaxed) {
            return Ok(());
        }
        if let Some(refused) = self.refused.get() {
            return Err(io::Error::other(refused.error(&self.root).to_string()));
        }
        let mut state = owner::inspect(&self.root)?;
        if state == RootState::Missing {
            fs::create_dir_all(&self.root)?;
            state = owner::inspect(&self.root)?;
        }
        match state {
            RootState::Marked => {}
            RootState::Empty | RootState::Legacy => self.write_tag()?,
            RootState::Missing => return Err(io::Error::new(io::ErrorKind::NotFound, "the folder vanished")),
            RootState::Foreign(reason) => {
                let refused = self.refused.get_or_init(|| Refusal::NotOwned(reason));
                return Err(io::Error::other(refused.error(&self.root).to_string()));
            }
            RootState::NotAFolder => {
                let refused = self.refused.get_or_init(|| Refusal::NotAFolder);
                return Err(io::Error::other(refused.error(&self.root).to_string()));
            }
        }
        self.owned.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Writes kfuse's `CACHEDIR.TAG` (atomically: a reader never sees half a tag).
    pub fn write_tag(&self) -> io::Result<()> {
        self.write_atomically(&self.root, &owner::tag_path(&self.root), owner::tag_text().as_bytes())
    }

    fn arch_dir(&self, arch: Arch) -> PathBuf {
        self.root.join(arch.to_string())
    }

    pub fn entry_path(&self, key: &CacheKey, arch: Arch) -> PathBuf {
        self.arch_dir(arch).join(format!("{}.{ENTRY_EXT}", key.to_hex()))
    }

    pub(super) fn source_path(&self, key: &CacheKey, arch: Arch) -> PathBuf {
        self.arch_dir(arch).join(format!("{}.{SOURCE_EXT}", key.to_hex()))
    }

    fn lock_path(&self, key: &CacheKey, arch: Arch) -> PathBuf {
        self.arch_dir(arch).join(LOCKS_DIR).join(format!("{}.{LOCK_EXT}", key.to_hex()))
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
            Err(reason) if is_ours(&path) => ReadOutcome::Bad { path, reason },
            Err(reason) => ReadOutcome::Foreign { path, reason },
        }
    }

    /// Writes an entry (atomically) and its source beside it; returns the bytes written. A file
    /// in the entry's place that is not kfuse's is left as it is and the write fails.
    pub fn write(&self, module: &CompiledModule, source: &str) -> io::Result<u64> {
        self.claim()?;
        let dir = self.arch_dir(module.arch);
        fs::create_dir_all(&dir)?;
        let entry_path = self.entry_path(&module.key, module.arch);
        if fs::symlink_metadata(&entry_path).is_ok() && !is_ours(&entry_path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is not a kfuse cache entry; left alone", entry_path.display()),
            ));
        }
        let bytes = entry::encode(module);
        self.write_atomically(&dir, &entry_path, &bytes)?;
        // The source is for people debugging; losing it costs nothing.
        let source_path = self.source_path(&module.key, module.arch);
        let source_written = self.write_atomically(&dir, &source_path, source.as_bytes()).is_ok();
        let total = bytes.len() as u64 + if source_written { source.len() as u64 } else { 0 };
        Ok(total)
    }

    fn write_atomically(&self, dir: &Path, target: &Path, bytes: &[u8]) -> io::Result<()> {
        let nonce = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        // The name `owner::is_temp_name` recognises.
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

    /// Takes the cross-process lock of `key`, waiting up to `LOCK_WAIT` for another holder and
    /// saying once on stderr, after `LOCK_NOTICE`, what it waits for.
    pub fn lock(&self, key: &CacheKey, arch: Arch) -> io::Result<KeyLock> {
        self.claim()?;
        let path = self.lock_path(key, arch);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        let started = Instant::now();
        let mut noticed = false;
        let mut pause = Duration::from_millis(1);
        loop {
            match fs4::FileExt::try_lock(&file) {
                Ok(()) => return Ok(KeyLock { file }),
                Err(fs4::TryLockError::WouldBlock) => {
                    let waited = started.elapsed();
                    if waited >= LOCK_WAIT {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the lock file {} of kernel {key} ({arch}) is still held by another kfuse process after {} s",
                                path.display(),
                                LOCK_WAIT.as_secs()
                            ),
                        ));
                    }
                    if !noticed && waited >= LOCK_NOTICE {
                        noticed = true;
                        eprintln!(
                            "kfuse: waiting for the lock file {}: another kfuse process is compiling kernel {key} for {arch} \
                             (waiting up to {} s; a stopped or hung process holding it delays this one)",
                            path.display(),
                            LOCK_WAIT.as_secs()
                        );
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

    /// Sets the running size estimate (`None`: recount at the next write).
    pub(super) fn set_approx_bytes(&self, bytes: Option<u64>) {
        *self.approx_bytes.lock().unwrap_or_else(|e| e.into_inner()) = bytes;
    }

    /// Removes an entry found by `scan` (kfuse's by name and header) and its source.
    pub(super) fn remove_entry(&self, entry: &EntryFile) -> io::Result<()> {
        if !is_ours(&entry.path) {
            return Err(io::Error::other(format!("{} is not kfuse's; left alone", entry.path.display())));
        }
        fs::remove_file(&entry.path)?;
        let _ = fs::remove_file(self.source_path(&entry.key, entry.arch));
        Ok(())
    }

    /// Every entry file that is kfuse's by name and header (contents not checked), with its
    /// source's size included; nothing in a root that lookups leave alone.
    pub fn scan(&self) -> io::Result<Vec<EntryFile>> {
        let mut entries = Vec::new();
        if self.refusal().is_some() {
            return Ok(entries);
        }
        for (arch, dir) in self.arch_dirs()? {
            for item in fs::read_dir(&dir)? {
                let item = item?;
                let path = item.path();
                if !item.file_type()?.is_file() {
                    continue;
                }
                let Ok(Some(ArchFile::Entry(key))) = owner::classify_in_arch(&path) else { continue };
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

    /// The `sm_*` folders of the root, each with its arch.
    pub(super) fn arch_dirs(&self) -> io::Result<Vec<(Arch, PathBuf)>> {
        let mut dirs = Vec::new();
        let listing = match fs::read_dir(&self.root) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(dirs),
            Err(e) => return Err(e),
        };
        for item in listing {
            let item = item?;
            if !item.file_type()?.is_dir() {
                continue;
            }
            if let Some(arch) = owner::arch_of_dir(&item.path()) {
                dirs.push((arch, item.path()));
            }
        }
        dirs.sort();
        Ok(dirs)
    }

    /// The counters recorded on disk by every process using this folder.
    pub fn load_counters(&self) -> CacheCounters {
        if self.refusal().is_some() {
            return CacheCounters::default();
        }
        fs::read(self.root.join(STATS_FILE))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<CacheCounters>(&bytes).ok())
            .unwrap_or_default()
    }

    /// Adds `delta` to the counters on disk under a lock.
    pub fn add_counters(&self, delta: &CacheCounters) -> io::Result<()> {
        self.claim()?;
        let stats = self.root.join(STATS_FILE);
        if let Ok(meta) = fs::symlink_metadata(&stats) {
            if owner::classify_in_root(&stats, &meta).ok().flatten().is_none() {
                return Err(io::Error::other(format!("{} is not kfuse's; left alone", stats.display())));
            }
        }
        let lock =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.root.join(STATS_LOCK))?;
        fs4::FileExt::lock(&lock)?;
        let mut counters = self.load_counters();
        counters.add(delta);
        let json = serde_json::to_vec_pretty(&counters).map_err(io::Error::other)?;
        let result = self.write_atomically(&self.root, &stats, &json);
        let _ = fs4::FileExt::unlock(&lock);
        result
    }
}

/// Whether the file at `path` is kfuse's entry by its header (an empty or torn one included);
/// `false` when it cannot be read, so that nothing unknown is removed.
pub(super) fn is_ours(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_file()) && owner::has_entry_header(path).unwrap_or(false)
}

/// `Ok(None)` when there is no entry; `Err(reason)` when there is a bad one.
pub(super) fn read_entry(path: &Path, key: &CacheKey, arch: Arch) -> Result<Option<CompiledModule>, String> {
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
