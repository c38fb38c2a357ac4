//! Reading a user's files with a size limit: a source, a model description, a weights file.
//!
//! Only regular files are read: a directory, a FIFO, a device (`/dev/zero`) or a socket is
//! refused before it is opened (opening a FIFO would wait for a writer; reading `/dev/zero` would
//! never end). A file larger than the limit its caller gives is refused without being read, and
//! one that grows past the limit while it is read stops at the limit with the same error.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// The largest `.kf` source read from a file (64 MiB; real programs are a few kilobytes).
pub const MAX_SOURCE_BYTES: u64 = 64 << 20;

/// Why a user's file could not be read. `Display` says which file and why, cause included.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The operating system refused (missing file, no permission, I/O error).
    #[error("cannot read {what} {}: {error}", path.display())]
    Io {
        /// What the file was read as ("kfuse source", "weights file", ".npy file").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        error: std::io::Error,
    },
    /// A directory, FIFO, device or socket where a file was expected.
    #[error("cannot read {what} {}: it is {kind}, not a regular file", path.display())]
    NotRegular {
        /// What the file was to be read as.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// What it is instead ("a directory", "a FIFO (named pipe)", "a character device", ...).
        kind: &'static str,
    },
    /// A file larger than what it may hold.
    #[error("cannot read {what} {}: it holds more than {limit} bytes, the most kfuse reads from a {what}{}", path.display(), size.map(|s| format!(" (it has {s})")).unwrap_or_default())]
    TooLarge {
        /// What the file was read as.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
        /// The file's size, when its metadata says it.
        size: Option<u64>,
    },
}

impl FileError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Io { path, .. } | FileError::NotRegular { path, .. } | FileError::TooLarge { path, .. } => path,
        }
    }
}

/// What a path that is not a regular file is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "something other than a file"
    }
}

/// Opens `path` for reading if it is a regular file (symbolic links followed), with its size as
/// its metadata says. Anything else is [`FileError::NotRegular`], refused before opening. `what`
/// names the file in errors (".npy file").
pub fn open_regular(path: &Path, what: &'static str) -> Result<(File, u64), FileError> {
    let io = |error| FileError::Io { what, path: path.to_path_buf(), error };
    let regular = |m: &std::fs::Metadata| {
        if m.is_file() {
            Ok(m.len())
        } else {
            Err(FileError::NotRegular { what, path: path.to_path_buf(), kind: kind_of(m.file_type()) })
        }
    };
    regular(&std::fs::metadata(path).map_err(io)?)?;
    let file = File::open(path).map_err(io)?;
    // The path may have been replaced between the two looks; the open file is what counts.
    let len = regular(&file.metadata().map_err(io)?)?;
    Ok((file, len))
}

/// Reads a regular file of at most `limit` bytes; `what` names it in the error when it is larger.
pub fn read_regular(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>, FileError> {
    let (file, len) = open_regular(path, what)?;
    let too_large = |size| FileError::TooLarge { path: path.to_path_buf(), what, limit, size };
    if len > limit {
        return Err(too_large(Some(len)));
    }
    // Files such as those of /proc say 0 bytes and hold more: the limit bounds the read, not the
    // size the metadata gave.
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|error| FileError::Io {
        what,
        path: path.to_path_buf(),
        error,
    })?;
    if bytes.len() as u64 > limit {
        return Err(too_large(None));
    }
    Ok(bytes)
}

/// Reads a `.kf` source file: a regular file of at most [`MAX_SOURCE_BYTES`], as bytes; the
/// text is checked by [`crate::source_text`].
pub fn read_source_bytes(path: &Path) -> Result<Vec<u8>, FileError> {
    read_regular(path, MAX_SOURCE_BYTES, "kfuse source")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_and_devices_are_refused_and_limits_hold() {
        let dir = std::env::temp_dir();
        let e = read_regular(&dir, 10, "test file").err();
        assert!(matches!(e, Some(FileError::NotRegular { kind: "a directory", .. })), "{e:?}");
        #[cfg(unix)]
        {
            let e = read_regular(Path::new("/dev/zero"), 10, "test file").err();
            assert!(matches!(e, Some(FileError::NotRegular { kind: "a character device", .. })), "{e:?}");
        }
        let missing = dir.join("kfuse-files-test-missing-file");
        let e = read_regular(&missing, 10, "test file").err();
        assert!(matches!(e, Some(FileError::Io { .. })), "{e:?}");
    }
}
