//! The disk tier's maintenance: `list`, `verify` and `clear`.
//!
//! Each works only on a folder that is kfuse's (see `owner`): a missing or empty folder has
//! nothing to do, an older kfuse cache is adopted (tagged) first, and any other folder is refused
//! with [`RuntimeError::CacheNotOwned`] or [`RuntimeError::CacheNotAFolder`]. Inside kfuse's
//! folder only kfuse's files (by name and header) are removed; everything else is reported as left
//! alone. Folders are removed only when empty, never recursively.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::disk::{is_ours, DiskStore, STALE_TEMP_AGE};
use super::entry::{self, HEADER_LEN};
use super::owner::{self, ArchFile, RootFile, RootState, ENTRY_EXT, LOCKS_DIR};
use super::{CacheEntryInfo, ClearReport, VerifyAction, VerifyProblem, VerifyReport};
use crate::RuntimeError;

impl DiskStore {
    fn io_error(&self, path: &Path) -> impl Fn(io::Error) -> RuntimeError + '_ {
        let path = path.to_path_buf();
        move |source| RuntimeError::CacheIo { path: path.clone(), error: source }
    }

    /// Whether there is a folder of kfuse's to work on (adopting an older kfuse cache by tagging
    /// it); an error for a folder that is not kfuse's.
    fn owned_for_maintenance(&self) -> Result<bool, RuntimeError> {
        match self.state()? {
            RootState::Missing | RootState::Empty => Ok(false),
            RootState::Marked => Ok(true),
            RootState::Legacy => {
                self.write_tag().map_err(self.io_error(self.root()))?;
                Ok(true)
            }
            RootState::Foreign(reason) => Err(RuntimeError::CacheNotOwned { path: self.root().to_path_buf(), reason }),
            RootState::NotAFolder => Err(RuntimeError::CacheNotAFolder { path: self.root().to_path_buf() }),
        }
    }

    /// The entries, most recently used first.
    pub fn list(&self) -> Result<Vec<CacheEntryInfo>, RuntimeError> {
        match self.state()? {
            RootState::Missing | RootState::Empty => return Ok(Vec::new()),
            RootState::Marked | RootState::Legacy => {}
            RootState::Foreign(reason) => {
                return Err(RuntimeError::CacheNotOwned { path: self.root().to_path_buf(), reason })
            }
            RootState::NotAFolder => return Err(RuntimeError::CacheNotAFolder { path: self.root().to_path_buf() }),
        }
        let mut entries: Vec<CacheEntryInfo> = self
            .scan()
            .map_err(self.io_error(self.root()))?
            .into_iter()
            .map(|e| CacheEntryInfo {
                key: e.key,
                arch: e.arch,
                bytes: e.bytes,
                last_used_unix_s: e.modified.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
                nvrtc_version: header_of(&e.path).as_deref().and_then(entry::nvrtc_version_of),
                path: e.path,
            })
            .collect();
        entries.sort_by(|a, b| b.last_used_unix_s.cmp(&a.last_used_unix_s).then(a.key.cmp(&b.key)));
        Ok(entries)
    }

    /// Checks every file under the root: removes kfuse's bad entries, orphaned sources and stale
    /// temporary files; reports everything that is not kfuse's and leaves it alone.
    pub fn verify(&self) -> Result<VerifyReport, RuntimeError> {
        let mut report = VerifyReport::default();
        if !self.owned_for_maintenance()? {
            return Ok(report);
        }
        let remove = |path: PathBuf, reason: &str, report: &mut VerifyReport| {
            let action = match fs::remove_file(&path) {
                Ok(()) => VerifyAction::Removed,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(e) => VerifyAction::RemoveFailed(e.to_string()),
            };
            report.problems.push(VerifyProblem { path, reason: reason.to_string(), action });
        };
        let left_alone = |path: PathBuf, reason: &str, report: &mut VerifyReport| {
            report.problems.push(VerifyProblem { path, reason: reason.to_string(), action: VerifyAction::LeftAlone });
        };
        for item in fs::read_dir(self.root()).map_err(self.io_error(self.root()))? {
            let item = item.map_err(self.io_error(self.root()))?;
            let path = item.path();
            let kind = item.file_type().map_err(self.io_error(&path))?;
            if kind.is_dir() {
                if owner::arch_of_dir(&path).is_none() {
                    left_alone(path, "a folder kfuse did not make", &mut report);
                }
                continue;
            }
            let meta = item.metadata().map_err(self.io_error(&path))?;
            match kind.is_file().then(|| owner::classify_in_root(&path, &meta)).transpose() {
                Ok(Some(Some(RootFile::Temp))) if is_stale(&meta) => {
                    remove(path, "temporary file left by an interrupted write", &mut report)
                }
                Ok(Some(Some(_))) => {}
                _ => left_alone(path, "not a kfuse cache file", &mut report),
            }
        }
        for (arch, dir) in self.arch_dirs().map_err(self.io_error(self.root()))? {
            for item in fs::read_dir(&dir).map_err(self.io_error(&dir))? {
                let item = item.map_err(self.io_error(&dir))?;
                let path = item.path();
                let kind = item.file_type().map_err(self.io_error(&path))?;
                if kind.is_dir() && item.file_name() == LOCKS_DIR {
                    for lock in fs::read_dir(&path).map_err(self.io_error(&path))? {
                        let lock = lock.map_err(self.io_error(&path))?;
                        if !lock.metadata().is_ok_and(|m| owner::is_lock_file(&lock.path(), &m)) {
                            left_alone(lock.path(), "not a kfuse lock file", &mut report);
                        }
                    }
                    continue;
                }
                if !kind.is_file() {
                    left_alone(path, "not a file kfuse wrote", &mut report);
                    continue;
                }
                match owner::classify_in_arch(&path).map_err(self.io_error(&path))? {
                    Some(ArchFile::Temp) => {
                        if item.metadata().is_ok_and(|m| is_stale(&m)) {
                            remove(path, "temporary file left by an interrupted write", &mut report);
                        }
                    }
                    Some(ArchFile::Entry(key)) => {
                        report.checked += 1;
                        match super::disk::read_entry(&path, &key, arch) {
                            Ok(Some(_)) => report.valid += 1,
                            Ok(None) => {}
                            Err(reason) => {
                                let _ = fs::remove_file(self.source_path(&key, arch));
                                remove(path, &reason, &mut report);
                            }
                        }
                    }
                    Some(ArchFile::Source(_)) => {
                        if !path.with_extension(ENTRY_EXT).exists() {
                            remove(path, "source without its entry", &mut report);
                        }
                    }
                    None if owner::keyed_name(&path, ENTRY_EXT).is_some() => {
                        left_alone(path, "named like a cache entry, but its header is not kfuse's", &mut report)
                    }
                    None => left_alone(path, "not a kfuse cache file", &mut report),
                }
            }
        }
        self.set_approx_bytes(None);
        Ok(report)
    }

    /// Removes every kfuse file (entries, sources, temporary files, locks, counters) and the
    /// folders that this empties; the tag stays, and so does everything that is not kfuse's.
    pub fn clear(&self) -> Result<ClearReport, RuntimeError> {
        let mut report = ClearReport::default();
        if !self.owned_for_maintenance()? {
            return Ok(report);
        }
        let remove = |path: &Path| match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(RuntimeError::CacheIo { path: path.to_path_buf(), error: e })
            }
            _ => Ok(()),
        };
        for (_, dir) in self.arch_dirs().map_err(self.io_error(self.root()))? {
            for item in fs::read_dir(&dir).map_err(self.io_error(&dir))? {
                let item = item.map_err(self.io_error(&dir))?;
                let path = item.path();
                let kind = item.file_type().map_err(self.io_error(&path))?;
                if kind.is_dir() && item.file_name() == LOCKS_DIR {
                    for lock in fs::read_dir(&path).map_err(self.io_error(&path))? {
                        let lock = lock.map_err(self.io_error(&path))?;
                        if lock.metadata().is_ok_and(|m| owner::is_lock_file(&lock.path(), &m)) {
                            remove(&lock.path())?;
                        } else {
                            report.left_alone.push(lock.path());
                        }
                    }
                    let _ = fs::remove_dir(&path);
                    continue;
                }
                let class = if kind.is_file() { owner::classify_in_arch(&path).ok().flatten() } else { None };
                let bytes = item.metadata().map_or(0, |m| m.len());
                match class {
                    Some(ArchFile::Entry(_)) if is_ours(&path) => {
                        remove(&path)?;
                        report.entries += 1;
                        report.bytes += bytes;
                    }
                    Some(ArchFile::Source(_)) => {
                        remove(&path)?;
                        report.bytes += bytes;
                    }
                    Some(ArchFile::Temp) => remove(&path)?,
                    _ => report.left_alone.push(path),
                }
            }
            // Only when nothing is left in it.
            let _ = fs::remove_dir(&dir);
        }
        for item in fs::read_dir(self.root()).map_err(self.io_error(self.root()))? {
            let item = item.map_err(self.io_error(self.root()))?;
            let path = item.path();
            let kind = item.file_type().map_err(self.io_error(&path))?;
            if kind.is_dir() {
                if owner::arch_of_dir(&path).is_none() {
                    report.left_alone.push(path);
                }
                continue;
            }
            let class = match item.metadata() {
                Ok(meta) if kind.is_file() => owner::classify_in_root(&path, &meta).ok().flatten(),
                _ => None,
            };
            match class {
                Some(RootFile::Tag) => {}
                Some(RootFile::Stats | RootFile::StatsLock | RootFile::Temp) => remove(&path)?,
                None => report.left_alone.push(path),
            }
        }
        self.set_approx_bytes(None);
        Ok(report)
    }
}

fn is_stale(meta: &fs::Metadata) -> bool {
    meta.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age > STALE_TEMP_AGE)
}

/// The first [`HEADER_LEN`] bytes of an entry file, if it has that many.
fn header_of(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut header = vec![0u8; HEADER_LEN];
    fs::File::open(path).and_then(|mut file| file.read_exact(&mut header)).ok()?;
    Some(header)
}
