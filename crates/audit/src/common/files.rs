//! Confined reads: every file the audit opens is a regular file inside the directory or tree it
//! was given, reached without symbolic links, and read with a size cap.
//!
//! Paths come from manifests the audit does not trust, so a path is a list of plain components
//! (no `..`, `.`, empty or absolute parts, no backslash or NUL); each directory on the way and the
//! file itself are checked with `lstat` (a symbolic link is refused, not followed); the file is
//! opened with `O_NOFOLLOW | O_NONBLOCK` (so a FIFO swapped in cannot block the audit) and must
//! still be a regular file, within the cap, once open; and reading stops one byte past the cap.
//!
//! A file is read whole ([`read_confined`]) only when it is parsed whole (JSON, markdown, SVG,
//! sources, all under their caps); a file that is only hashed is hashed as it is read
//! ([`sha256_confined`]), and arrays.npz is opened ([`open_confined`]) and read by position.

use std::fs::{File, OpenOptions};
use std::io::Read;

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// Cap on any JSON, markdown or SVG file of an evidence directory.
pub const MAX_TEXT_BYTES: u64 = 256 << 20;
/// Cap on a source file of the tree.
pub const MAX_SOURCE_BYTES: u64 = 16 << 20;

/// Why a file cannot be read as a confined regular file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FileError {
    /// A path from a manifest that is not a plain relative path.
    #[error("{path:?} is not a plain relative path (absolute, `..`, `.`, empty part or backslash)")]
    NotPlain {
        /// The path as written.
        path: String,
    },
    /// Nothing at that path.
    #[error("{path} does not exist")]
    Missing {
        /// The full path.
        path: PathBuf,
    },
    /// A symbolic link on the way or at the end.
    #[error("{path} is a symbolic link; the audit does not follow links")]
    Symlink {
        /// The link.
        path: PathBuf,
    },
    /// A directory, device, FIFO or socket where a regular file must be.
    #[error("{path} is not a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
    },
    /// Over the cap.
    #[error("{path} is larger than {cap} bytes")]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The cap.
        cap: u64,
    },
    /// A file whose length changed while it was read.
    #[error("{path} changed while it was read ({before} bytes, then {after})")]
    Changed {
        /// The path.
        path: PathBuf,
        /// Its length when opened.
        before: u64,
        /// Its length after it was read.
        after: u64,
    },
    /// An I/O error while reading.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What the system said (in the message, not a separate cause: reports print one line).
        error: std::io::Error,
    },
}

/// Splits a '/'-separated path from a manifest into plain components.
pub fn plain_components(path: &str) -> Result<Vec<&str>, FileError> {
    let parts: Vec<&str> = path.split('/').collect();
    let plain = parts.iter().all(|p| {
        !p.is_empty() && *p != "." && *p != ".." && !p.contains('\\') && !p.contains('\0')
    });
    if plain {
        Ok(parts)
    } else {
        Err(FileError::NotPlain {
            path: path.to_string(),
        })
    }
}

/// `base` joined with a plain relative `path`, every directory on the way a real directory (not a
/// link). The last component is not checked.
pub fn confined_path(base: &Path, path: &str) -> Result<PathBuf, FileError> {
    let parts = plain_components(path)?;
    let mut full = base.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        full.push(part);
        if i + 1 < parts.len() {
            match std::fs::symlink_metadata(&full) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(FileError::Symlink { path: full });
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(FileError::NotRegular { path: full }),
                Err(_) => return Err(FileError::Missing { path: full }),
            }
        }
    }
    Ok(full)
}

/// Reads `path` under `base` (a plain relative path), at most `cap` bytes.
pub fn read_confined(base: &Path, path: &str, cap: u64) -> Result<Vec<u8>, FileError> {
    read_regular(&confined_path(base, path)?, cap)
}

/// Opens `path` under `base` (a plain relative path) as [`read_confined`] would read it: the
/// open file and its length, at most `cap`.
pub fn open_confined(base: &Path, path: &str, cap: u64) -> Result<(File, u64), FileError> {
    open_regular(&confined_path(base, path)?, cap)
}

/// Lower-case hex SHA-256 of `path` under `base` (a plain relative path), at most `cap` bytes,
/// hashed as it is read: never held whole.
pub fn sha256_confined(base: &Path, path: &str, cap: u64) -> Result<String, FileError> {
    let full = confined_path(base, path)?;
    let (file, _) = open_regular(&full, cap)?;
    let io = |error| FileError::Io {
        path: full.clone(),
        error,
    };
    let mut hash = Sha256::new();
    let mut chunk = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut reader = file.take(cap + 1);
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        hash.update(&chunk[..n]);
        total += n as u64;
    }
    if total > cap {
        return Err(FileError::TooLarge { path: full, cap });
    }
    Ok(hex::encode(hash.finalize()))
}

/// Reads one regular file (not a link, device or FIFO), at most `cap` bytes.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    let (file, _) = open_regular(path, cap)?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| FileError::Io {
            path: path.to_path_buf(),
            error,
        })?;
    if bytes.len() as u64 > cap {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            cap,
        });
    }
    Ok(bytes)
}

/// Opens one regular file (not a link, device or FIFO) of at most `cap` bytes: the file and its
/// length once open.
pub fn open_regular(path: &Path, cap: u64) -> Result<(File, u64), FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(FileError::Symlink {
                path: path.to_path_buf(),
            });
        }
        Ok(m) if !m.is_file() => {
            return Err(FileError::NotRegular {
                path: path.to_path_buf(),
            });
        }
        Ok(m) if m.len() > cap => {
            return Err(FileError::TooLarge {
                path: path.to_path_buf(),
                cap,
            });
        }
        Ok(_) => {}
        Err(_) => {
            return Err(FileError::Missing {
                path: path.to_path_buf(),
            });
        }
    }
    let io = |error| FileError::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = open_no_follow(path).map_err(io)?;
    // The path could have been swapped between the lstat and the open.
    let metadata = file.metadata().map_err(io)?;
    if !metadata.is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    if metadata.len() > cap {
        return Err(FileError::TooLarge {
            path: path.to_path_buf(),
            cap,
        });
    }
    Ok((file, metadata.len()))
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

/// What a directory entry is, without following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// Anything else: a directory, a link, a device, a FIFO or a socket.
    Other,
}

/// The names and kinds of a directory's entries, sorted by name.
pub fn list_dir(dir: &Path) -> Result<Vec<(String, EntryKind)>, FileError> {
    let io = |error| FileError::Io {
        path: dir.to_path_buf(),
        error,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        let kind = match entry.file_type() {
            Ok(t) if t.is_file() => EntryKind::File,
            _ => EntryKind::Other,
        };
        out.push((entry.file_name().to_string_lossy().into_owned(), kind));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_base_are_refused() {
        for path in ["/etc/passwd", "../x", "a/../b", "a//b", "./a", "", "a\\b"] {
            assert!(
                matches!(plain_components(path), Err(FileError::NotPlain { .. })),
                "{path}"
            );
        }
        assert_eq!(plain_components("crates/a/src/lib.rs").unwrap().len(), 4);
    }

    #[cfg(unix)]
    #[test]
    fn links_fifos_devices_and_big_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::write(base.join("file"), b"12345").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", base.join("link")).unwrap();
        std::os::unix::fs::symlink(base, base.join("dirlink")).unwrap();
        let fifo = base.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");

        assert_eq!(read_confined(base, "file", 5).unwrap(), b"12345");
        assert!(matches!(
            read_confined(base, "file", 4),
            Err(FileError::TooLarge { cap: 4, .. })
        ));
        assert!(matches!(
            read_confined(base, "link", 99),
            Err(FileError::Symlink { .. })
        ));
        assert!(matches!(
            read_confined(base, "dirlink/file", 99),
            Err(FileError::Symlink { .. })
        ));
        assert!(matches!(
            read_confined(base, "fifo", 99),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            read_regular(Path::new("/dev/zero"), 99),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            read_confined(base, "nothing", 99),
            Err(FileError::Missing { .. })
        ));
    }
}
