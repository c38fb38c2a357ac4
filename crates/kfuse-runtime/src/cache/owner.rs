//! Which folders and files are kfuse's: the cache folder's `CACHEDIR.TAG` and the names and
//! headers of the files kfuse writes. Nothing that is not kfuse's by this module is ever removed
//! or overwritten.
//!
//! - A cache folder is kfuse's when it holds a `CACHEDIR.TAG` (the <https://bford.info/cachedir/>
//!   convention, which backup tools honour) whose first line is the standard signature and which
//!   holds kfuse's line [`TAG_KFUSE_LINE`]; another tool's tag does not count. kfuse writes the tag
//!   in a folder it creates and in an existing empty folder it is pointed at.
//! - A folder without the tag whose every file is kfuse's by name and header (a cache written
//!   before the tag existed) is adopted: the tag is written, nothing else changes.
//! - Any other folder is foreign: lookups neither read nor write it, and maintenance refuses it.
//! - Inside kfuse's folder: `sm_*/<64 hex>.kfc` entries whose bytes start as a kfuse entry does
//!   (an empty or torn one included), `sm_*/<64 hex>.cu` sources, `.tmp-<pid>-<nanos>-<n>`
//!   temporary files, empty `sm_*/locks/<64 hex>.lock` and `stats.lock` files, and a
//!   `stats.json` holding only kfuse's counters. Anything else is foreign and left alone.

use std::fs::{self, DirEntry, Metadata};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use super::entry;
use crate::{Arch, CacheKey};

/// The tag's file name.
pub(crate) const TAG_NAME: &str = "CACHEDIR.TAG";
/// The convention's signature: the first line of every cache directory tag.
pub(crate) const TAG_SIGNATURE: &str = "Signature: 8a477f597d28d172789f06886806bc55";
/// The line that makes a tag kfuse's.
pub(crate) const TAG_KFUSE_LINE: &str = "# This file is a cache directory tag created by kfuse.";
pub(crate) const ENTRY_EXT: &str = "kfc";
pub(crate) const SOURCE_EXT: &str = "cu";
pub(crate) const LOCK_EXT: &str = "lock";
pub(crate) const STATS_FILE: &str = "stats.json";
pub(crate) const STATS_LOCK: &str = "stats.lock";
pub(crate) const LOCKS_DIR: &str = "locks";

/// The whole tag kfuse writes.
pub(crate) fn tag_text() -> String {
    format!(
        "{TAG_SIGNATURE}\n{TAG_KFUSE_LINE}\n# It holds compiled kernels, which kfuse rebuilds when they are missing.\n\
         # For information about cache directory tags see https://bford.info/cachedir/\n"
    )
}

/// What a cache folder is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RootState {
    /// Nothing at that path.
    Missing,
    /// An empty folder (kfuse adopts it when it writes).
    Empty,
    /// A folder with kfuse's tag.
    Marked,
    /// A folder without the tag holding only kfuse's files (an older kfuse's cache).
    Legacy,
    /// A folder holding something that is not kfuse's; the text says what.
    Foreign(String),
    /// Something other than a folder.
    NotAFolder,
}

/// Looks at `root` (reading only names, sizes and the first bytes of entries).
pub(crate) fn inspect(root: &Path) -> io::Result<RootState> {
    let meta = match fs::metadata(root) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(RootState::Missing),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return Ok(RootState::NotAFolder);
    }
    let tag = root.join(TAG_NAME);
    match fs::read(&tag) {
        Ok(bytes) if is_kfuse_tag(&bytes) => return Ok(RootState::Marked),
        Ok(_) => {
            return Ok(RootState::Foreign(format!(
                "its {TAG_NAME} is another tool's, not kfuse's: it is that tool's cache folder"
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut empty = true;
    for item in fs::read_dir(root)? {
        empty = false;
        if let Some(why) = unless_vanished(foreign_in_root(&item?))? {
            return Ok(RootState::Foreign(why));
        }
    }
    Ok(if empty { RootState::Empty } else { RootState::Legacy })
}

/// Whether `bytes` are a tag kfuse wrote: the signature on the first line, kfuse's line after.
pub(crate) fn is_kfuse_tag(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.lines();
    lines.next() == Some(TAG_SIGNATURE) && lines.any(|l| l.trim_end() == TAG_KFUSE_LINE)
}

/// `None` when the root's item is kfuse's (recursively for arch folders), else why not.
fn foreign_in_root(item: &DirEntry) -> io::Result<Option<String>> {
    let path = item.path();
    let kind = item.file_type()?;
    let not_ours = |what: &str| Ok(Some(format!("it holds {}, {what}", path.display())));
    if kind.is_dir() {
        if arch_of_dir(&path).is_none() {
            return not_ours("a folder kfuse did not make");
        }
        for inner in fs::read_dir(&path)? {
            if let Some(why) = unless_vanished(foreign_in_arch(&inner?))? {
                return Ok(Some(why));
            }
        }
        return Ok(None);
    }
    if !kind.is_file() {
        return not_ours("which is neither a file nor a folder kfuse made");
    }
    match classify_in_root(&path, &item.metadata()?)? {
        Some(_) => Ok(None),
        None => not_ours("which kfuse did not write"),
    }
}

/// `None` when the arch folder's item is kfuse's (its `locks` folder's files included), else why not.
fn foreign_in_arch(inner: &DirEntry) -> io::Result<Option<String>> {
    let path = inner.path();
    let not_written = |path: &Path| Ok(Some(format!("it holds {}, which kfuse did not write", path.display())));
    let kind = inner.file_type()?;
    if kind.is_dir() && inner.file_name() == LOCKS_DIR {
        for lock in fs::read_dir(&path)? {
            let lock = lock?;
            // (The metadata of a link is the link's: not a file.)
            let ours = match lock.metadata() {
                Ok(meta) => is_lock_file(&lock.path(), &meta),
                Err(e) if e.kind() == io::ErrorKind::NotFound => true, // removed meanwhile
                Err(e) => return Err(e),
            };
            if !ours {
                return not_written(&lock.path());
            }
        }
        return Ok(None);
    }
    if !kind.is_file() || classify_in_arch(&path)?.is_none() {
        return not_written(&path);
    }
    Ok(None)
}

/// What the check of one folder item found, where an item that vanished while it was looked at
/// counts as kfuse's: another kfuse process renamed its temporary file into place or removed an
/// entry meanwhile (sixteen processes starting on one empty folder each write its tag).
fn unless_vanished(found: io::Result<Option<String>>) -> io::Result<Option<String>> {
    match found {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        found => found,
    }
}

/// A file of kfuse's at the root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootFile {
    Tag,
    Stats,
    StatsLock,
    Temp,
}

/// What the root file `path` is when it is kfuse's.
pub(crate) fn classify_in_root(path: &Path, meta: &Metadata) -> io::Result<Option<RootFile>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
    Ok(match name {
        TAG_NAME => fs::read(path).map(|b| is_kfuse_tag(&b))?.then_some(RootFile::Tag),
        STATS_FILE => is_stats_file(path)?.then_some(RootFile::Stats),
        STATS_LOCK => (meta.len() == 0).then_some(RootFile::StatsLock),
        _ if is_temp_name(name) => Some(RootFile::Temp),
        _ => None,
    })
}

/// A file of kfuse's in an arch folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArchFile {
    /// An entry whose bytes start as kfuse's entries do (its contents may still be bad).
    Entry(CacheKey),
    /// A kernel's source beside its entry.
    Source(CacheKey),
    /// A temporary file of a write.
    Temp,
}

/// What the arch-folder file `path` is when it is kfuse's by name and header.
pub(crate) fn classify_in_arch(path: &Path) -> io::Result<Option<ArchFile>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return Ok(None) };
    if is_temp_name(name) {
        return Ok(Some(ArchFile::Temp));
    }
    if let Some(key) = keyed_name(path, ENTRY_EXT) {
        return Ok(has_entry_header(path)?.then_some(ArchFile::Entry(key)));
    }
    Ok(keyed_name(path, SOURCE_EXT).map(ArchFile::Source))
}

/// Whether `path` is an empty `<64 hex>.lock` file, as kfuse's key locks are.
pub(crate) fn is_lock_file(path: &Path, meta: &Metadata) -> bool {
    meta.is_file() && meta.len() == 0 && keyed_name(path, LOCK_EXT).is_some()
}

/// The key of a `<64 hex>.<ext>` file name.
pub(crate) fn keyed_name(path: &Path, ext: &str) -> Option<CacheKey> {
    if path.extension()? != ext {
        return None;
    }
    CacheKey::from_hex(path.file_stem()?.to_str()?)
}

/// The arch of an `sm_*` folder named exactly as kfuse names it.
pub(crate) fn arch_of_dir(path: &Path) -> Option<Arch> {
    let name = path.file_name()?.to_str()?;
    let arch = name.strip_prefix("sm_").and(name.parse::<Arch>().ok())?;
    (arch.to_string() == name).then_some(arch)
}

/// `.tmp-<pid>-<nanos>-<counter>`, the names of kfuse's temporary files.
pub(crate) fn is_temp_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(".tmp-") else { return false };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether the file's first bytes are (a prefix of) a kfuse entry's header. An empty file
/// counts: it holds nothing of anyone's (a torn write).
pub(crate) fn has_entry_header(path: &Path) -> io::Result<bool> {
    let mut head = Vec::with_capacity(entry::MAGIC.len());
    fs::File::open(path)?.take(entry::MAGIC.len() as u64).read_to_end(&mut head)?;
    Ok(entry::MAGIC.starts_with(&head))
}

/// Whether `stats.json` holds a JSON object of kfuse's counters and nothing else.
fn is_stats_file(path: &Path) -> io::Result<bool> {
    let bytes = fs::read(path)?;
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(false);
    };
    Ok(map.iter().all(|(k, v)| super::CacheCounters::FIELDS.contains(&k.as_str()) && v.is_u64()))
}

/// The path of the tag in `root`.
pub(crate) fn tag_path(root: &Path) -> PathBuf {
    root.join(TAG_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kfuse_tags_are_told_from_other_tools_tags() {
        assert!(is_kfuse_tag(tag_text().as_bytes()));
        assert!(!is_kfuse_tag(b"Signature: 8a477f597d28d172789f06886806bc55\n# created by cargo\n"));
        assert!(!is_kfuse_tag(format!("{TAG_KFUSE_LINE}\n{TAG_SIGNATURE}\n").as_bytes()));
        assert!(!is_kfuse_tag(b""));
    }

    #[test]
    fn a_folder_another_process_writes_into_meanwhile_is_still_kfuses() {
        // Another process writes its tag and a lock and removes an entry while this one looks:
        // items vanish between the listing and the look at each, never an error or foreign.
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let locks = root.join("sm_90").join(LOCKS_DIR);
        fs::create_dir_all(&locks).expect("locks folder");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (root, stop) = (root.clone(), stop.clone());
            std::thread::spawn(move || {
                let key = "ab".repeat(32);
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let temp = root.join(format!(".tmp-1-2-{n}"));
                    fs::write(&temp, tag_text()).expect("temp");
                    fs::rename(&temp, root.join(TAG_NAME)).expect("rename");
                    let lock = root.join("sm_90").join(LOCKS_DIR).join(format!("{key}.{LOCK_EXT}"));
                    fs::write(&lock, b"").expect("lock");
                    fs::remove_file(&lock).expect("unlock");
                    fs::remove_file(root.join(TAG_NAME)).expect("untag");
                    n += 1;
                }
            })
        };
        let started = std::time::Instant::now();
        let mut looks = 0;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            let state = inspect(&root).expect("no error while another process writes");
            assert!(matches!(state, RootState::Marked | RootState::Legacy), "{state:?}");
            looks += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().expect("writer");
        assert!(looks > 0);
    }

    #[test]
    fn temp_names() {
        assert!(is_temp_name(".tmp-12-345-0"));
        for other in [".tmp-", ".tmp-1-2", ".tmp-a-1-2", ".tmp-1-2-3-4", "tmp-1-2-3", ".tmp-1--2"] {
            assert!(!is_temp_name(other), "{other}");
        }
    }

    #[test]
    fn arch_folders_are_named_exactly() {
        assert_eq!(arch_of_dir(Path::new("/x/sm_90")), Some(Arch::new(9, 0)));
        assert_eq!(arch_of_dir(Path::new("/x/sm_90a")), Some(Arch::accelerated(9, 0)));
        for other in ["/x/90", "/x/sm_9.0", "/x/sm_", "/x/SM_90", "/x/sm_90x"] {
            assert_eq!(arch_of_dir(Path::new(other)), None, "{other}");
        }
    }
}
