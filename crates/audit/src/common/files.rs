//! Confined reads: every file the audit opens is a regular file inside the directory or tree it
//! was given, reached without symbolic links, and read with a size cap.
//!
//! Paths come from manifests the audit does not trust, so a path is a list of plain components
//! (no `..`, `.`, empty or absolute parts, no backslash, colon or NUL, and no name Windows
//! reserves for a device, such as `NUL` or `CON`, on any platform); each directory on the way and the
//! file itself are checked with `lstat` (a symbolic link is refused, not followed); the file is
//! opened with `O_NOFOLLOW | O_NONBLOCK` (so a FIFO swapped in cannot block the audit) and must
//! still be a regular file, within the cap, once open; and reading stops one byte past the cap.
//!
//! A file is read whole ([`ConfinedDir::read`], [`read_confined`] for the source tree) only when
//! it is parsed whole (JSON, markdown, SVG, sources, all under their caps); a file that is only
//! hashed is hashed as it is read ([`ConfinedDir::sha256`], [`sha256_confined`] for a model's
//! weight file), and arrays.npz is opened ([`ConfinedDir::open_file`]) and read by position, its
//! one sequential pass giving its hash.
//!
//! **An evidence directory is opened once** ([`ConfinedDir`]): a directory handle (`O_DIRECTORY`),
//! and every file the audit checks in it is opened relative to that handle (`openat`,
//! `O_NOFOLLOW`), listed from it (`readdir` on the handle), and read once: the bytes hashed are the
//! bytes parsed, and the handle records each file's SHA-256 as it is read
//! ([`ConfinedDir::hashes`]), so the root manifest's pins are compared with what the audit read,
//! not with a second read. Renaming another directory into the path while the audit runs changes
//! nothing it reads (the handle keeps the directory it opened). A directory reached from the root
//! manifest ([`ConfinedDir::open_dir`]) is opened one name at a time with `O_NOFOLLOW`: a pinned
//! directory that is a symbolic link, or lies under one, is refused.
//!
//! **On Windows** (the `sys` module there says how): the same checks with handles held open
//! without delete sharing (a held directory cannot be renamed or removed), reparse points
//! (links, junctions) refused rather than followed, and only disk files read.

use std::cell::RefCell;
use std::collections::BTreeMap;
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
    #[error(
        "{path:?} is not a plain relative path (absolute, `..`, `.`, an empty part, a backslash or colon, or a name Windows reserves)"
    )]
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
    /// Something other than a directory where an evidence directory must be.
    #[error("{path} is not a directory")]
    NotADirectory {
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
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && !p.contains(['\\', '\0', ':'])
            && !windows_reserved(p)
    });
    if plain {
        Ok(parts)
    } else {
        Err(FileError::NotPlain {
            path: path.to_string(),
        })
    }
}

/// A name Windows does not treat as an ordinary file name in any directory: a device (`CON`,
/// `PRN`, `AUX`, `NUL`, `COM0`-`COM9`, `LPT0`-`LPT9`, also with superscript digits, with any
/// extension, in any case), or one ending in a dot or a space (which Windows strips). Refused on
/// every platform: a path in a manifest must name the same file wherever it is audited.
fn windows_reserved(name: &str) -> bool {
    if name.ends_with(['.', ' ']) {
        return true;
    }
    let stem = name.split('.').next().unwrap_or(name).trim_end_matches(' ');
    let upper = stem.to_ascii_uppercase();
    match upper.as_str() {
        "CON" | "PRN" | "AUX" | "NUL" | "CONIN$" | "CONOUT$" => true,
        _ => upper
            .strip_prefix("COM")
            .or_else(|| upper.strip_prefix("LPT"))
            .is_some_and(|digit| {
                (digit.len() == 1 && digit.as_bytes()[0].is_ascii_digit())
                    || matches!(digit, "\u{b9}" | "\u{b2}" | "\u{b3}")
            }),
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

#[cfg(windows)]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    use std::os::windows::fs::OpenOptionsExt;
    use windows_sys::Win32::Storage::FileSystem::{FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_READ};
    OpenOptions::new()
        .read(true)
        .share_mode(FILE_SHARE_READ)
        .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path)
}

/// What a directory entry is, without following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// Anything else: a directory, a link, a device, a FIFO or a socket.
    Other,
}

/// An evidence directory opened once, and everything the audit reads in it read through that
/// handle, each file once (see the module docs).
#[derive(Debug)]
pub struct ConfinedDir {
    /// The open directory.
    #[cfg(unix)]
    fd: std::os::fd::OwnedFd,
    /// The open directory, held without delete sharing so that it cannot be renamed or removed
    /// while the audit reads it.
    #[cfg(windows)]
    handle: File,
    /// The directory's path as it was named (reports and messages print it).
    path: PathBuf,
    /// The SHA-256 of every read of each file, in order (one per read: the audit reads each
    /// file once, so two entries for one name are a second read, which [`pins`] refuses if
    /// they differ).
    ///
    /// [`pins`]: crate::common::pins
    hashes: RefCell<BTreeMap<String, Vec<String>>>,
}

impl ConfinedDir {
    /// Opens the directory `path` names, as the user gave it (a link the user names is the
    /// user's choice; a pinned directory is opened with [`ConfinedDir::open_dir`], which follows
    /// none). An empty path is the current directory.
    pub fn open(path: &Path) -> Result<ConfinedDir, FileError> {
        let at = if path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            path
        };
        let fd = sys::open_dir(None, at, false).map_err(|e| classify(e, path, || None))?;
        Ok(ConfinedDir::new(fd, path.to_path_buf()))
    }

    #[cfg(unix)]
    fn new(fd: std::os::fd::OwnedFd, path: PathBuf) -> ConfinedDir {
        ConfinedDir {
            fd,
            path,
            hashes: RefCell::default(),
        }
    }

    #[cfg(windows)]
    fn new(handle: File, path: PathBuf) -> ConfinedDir {
        ConfinedDir {
            handle,
            path,
            hashes: RefCell::default(),
        }
    }

    /// The directory's path as it was named.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory at the plain relative `path` below this one (from a manifest: `..`, `.`,
    /// absolute and empty parts are refused), opened one name at a time relative to the handle
    /// before it, none of them a symbolic link.
    pub fn open_dir(&self, path: &str) -> Result<ConfinedDir, FileError> {
        let parts = plain_components(path)?;
        let mut full = self.path.clone();
        let mut current: Option<ConfinedDir> = None;
        for part in parts {
            full.push(part);
            let parent = current.as_ref().unwrap_or(self);
            let fd = sys::open_dir(Some(parent), Path::new(part), true)
                .map_err(|e| classify(e, &full, || sys::is_symlink(parent, part)))?;
            current = Some(ConfinedDir::new(fd, full.clone()));
        }
        Ok(current.expect("a plain path has a part"))
    }

    /// The regular file `name` (one plain name) in this directory, opened relative to the
    /// handle without following a link or blocking on a FIFO, at most `cap` bytes: the open
    /// file and its length. Not recorded: a caller that hashes it records the hash
    /// ([`ConfinedDir::record`]).
    pub fn open_file(&self, name: &str, cap: u64) -> Result<(File, u64), FileError> {
        let full = self.path.join(name);
        match plain_components(name)?.as_slice() {
            [_] => {}
            _ => return Err(FileError::NotPlain { path: name.into() }),
        }
        // Looked at before it is opened (a device is never opened), and again once open (it
        // could have been swapped in between).
        match sys::entry_kind(self, name) {
            Ok(Kind::File) => {}
            Ok(Kind::Symlink) => return Err(FileError::Symlink { path: full }),
            Ok(Kind::Other) => return Err(FileError::NotRegular { path: full }),
            Err(e) => return Err(classify(e, &full, || None)),
        }
        let file = sys::open_file(self, name)
            .map_err(|e| classify(e, &full, || sys::is_symlink(self, name)))?;
        let metadata = file.metadata().map_err(|error| FileError::Io {
            path: full.clone(),
            error,
        })?;
        if !metadata.is_file() {
            return Err(FileError::NotRegular { path: full });
        }
        if metadata.len() > cap {
            return Err(FileError::TooLarge { path: full, cap });
        }
        Ok((file, metadata.len()))
    }

    /// Reads the regular file `name` whole (at most `cap` bytes), once, and records its
    /// SHA-256: what the caller parses is what the pins are compared with.
    pub fn read(&self, name: &str, cap: u64) -> Result<Vec<u8>, FileError> {
        let (file, _) = self.open_file(name, cap)?;
        let full = self.path.join(name);
        let mut bytes = Vec::new();
        file.take(cap + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| FileError::Io {
                path: full.clone(),
                error,
            })?;
        if bytes.len() as u64 > cap {
            return Err(FileError::TooLarge { path: full, cap });
        }
        self.record(name, &hex::encode(Sha256::digest(&bytes)));
        Ok(bytes)
    }

    /// Hashes the regular file `name` (at most `cap` bytes) as it reads it, never holding it
    /// whole, and records the hash: for a file the audit does not parse.
    pub fn sha256(&self, name: &str, cap: u64) -> Result<String, FileError> {
        let (file, _) = self.open_file(name, cap)?;
        let full = self.path.join(name);
        let mut hash = Sha256::new();
        let mut chunk = vec![0u8; 1 << 20];
        let mut total = 0u64;
        let mut reader = file.take(cap + 1);
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(FileError::Io { path: full, error }),
            };
            hash.update(&chunk[..n]);
            total += n as u64;
        }
        if total > cap {
            return Err(FileError::TooLarge { path: full, cap });
        }
        let hex = hex::encode(hash.finalize());
        self.record(name, &hex);
        Ok(hex)
    }

    /// Records that `name` was read and hashed `sha256` (for a file read through
    /// [`ConfinedDir::open_file`], such as arrays.npz, whose one pass computes its hash).
    pub fn record(&self, name: &str, sha256: &str) {
        self.hashes
            .borrow_mut()
            .entry(name.to_string())
            .or_default()
            .push(sha256.to_string());
    }

    /// Every file read through this handle, with the SHA-256 of each read, in order.
    pub fn hashes(&self) -> BTreeMap<String, Vec<String>> {
        self.hashes.borrow().clone()
    }

    /// The names and kinds of the directory's entries (not following links), sorted by name,
    /// listed from the handle itself.
    pub fn list(&self) -> Result<Vec<(String, EntryKind)>, FileError> {
        let mut entries = sys::list(self).map_err(|error| FileError::Io {
            path: self.path.clone(),
            error,
        })?;
        entries.sort();
        Ok(entries)
    }
}

/// What a name in a directory is, not following links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Symlink,
    Other,
}

/// A failed open as a [`FileError`]: a missing path, a link (asked of `is_link`, which looks at
/// the name without following it), something that is not a directory, or an I/O error.
fn classify(
    error: std::io::Error,
    path: &Path,
    is_link: impl FnOnce() -> Option<bool>,
) -> FileError {
    let path = path.to_path_buf();
    match error.kind() {
        std::io::ErrorKind::NotFound => FileError::Missing { path },
        _ if is_link() == Some(true) => FileError::Symlink { path },
        std::io::ErrorKind::NotADirectory => FileError::NotADirectory { path },
        _ => FileError::Io { path, error },
    }
}

/// The system calls behind [`ConfinedDir`].
#[cfg(unix)]
mod sys {
    use std::ffi::{CStr, CString};
    use std::fs::File;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use super::{ConfinedDir, EntryKind, Kind};

    fn c_path(path: &Path) -> io::Result<CString> {
        CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))
    }

    fn checked(fd: libc::c_int) -> io::Result<OwnedFd> {
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the call just opened, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Opens a directory: `path` from the working directory, or one name relative to `parent`;
    /// with `no_follow`, a link there is not followed (the open fails).
    pub(super) fn open_dir(
        parent: Option<&ConfinedDir>,
        path: &Path,
        no_follow: bool,
    ) -> io::Result<OwnedFd> {
        let name = c_path(path)?;
        let mut flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        if no_follow {
            flags |= libc::O_NOFOLLOW;
        }
        let at = parent.map_or(libc::AT_FDCWD, |p| p.fd.as_raw_fd());
        // SAFETY: a valid directory descriptor (or AT_FDCWD) and a NUL-terminated name.
        checked(unsafe { libc::openat(at, name.as_ptr(), flags) })
    }

    /// Opens the file `name` in `dir` for reading: no link followed, no blocking on a FIFO.
    pub(super) fn open_file(dir: &ConfinedDir, name: &str) -> io::Result<File> {
        let name = c_path(Path::new(name))?;
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        let fd = checked(unsafe { libc::openat(dir.fd.as_raw_fd(), name.as_ptr(), flags) })?;
        Ok(File::from(fd))
    }

    fn stat_kind(dir: &ConfinedDir, name: &CStr) -> io::Result<Kind> {
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory descriptor, a NUL-terminated name and a stat to fill.
        let done = unsafe {
            libc::fstatat(
                dir.fd.as_raw_fd(),
                name.as_ptr(),
                &mut stat,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if done != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(match stat.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        })
    }

    /// What `name` in `dir` is, not following a link.
    pub(super) fn entry_kind(dir: &ConfinedDir, name: &str) -> io::Result<Kind> {
        stat_kind(dir, &c_path(Path::new(name))?)
    }

    /// Whether `name` in `dir` is a symbolic link (`None`: cannot tell).
    pub(super) fn is_symlink(dir: &ConfinedDir, name: &str) -> Option<bool> {
        entry_kind(dir, name).ok().map(|kind| kind == Kind::Symlink)
    }

    #[cfg(any(target_os = "linux", target_os = "android", target_os = "emscripten"))]
    fn clear_errno() {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno_location() = 0 }
    }

    #[cfg(any(
        target_os = "macos",
        target_os = "ios",
        target_os = "freebsd",
        target_os = "dragonfly"
    ))]
    fn clear_errno() {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__error() = 0 }
    }

    #[cfg(any(target_os = "openbsd", target_os = "netbsd"))]
    fn clear_errno() {
        // SAFETY: the calling thread's errno.
        unsafe { *libc::__errno() = 0 }
    }

    /// The entries of `dir` read from its own descriptor (a duplicate, rewound: the handle's
    /// offset is not the listing's), each with its kind from `fstatat` without following links.
    pub(super) fn list(dir: &ConfinedDir) -> io::Result<Vec<(String, EntryKind)>> {
        // SAFETY: duplicating a valid descriptor.
        let copy = checked(unsafe { libc::fcntl(dir.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
        let raw = copy.as_raw_fd();
        // SAFETY: a valid directory descriptor; on success the stream owns it (closedir closes it).
        let stream = unsafe { libc::fdopendir(raw) };
        if stream.is_null() {
            return Err(io::Error::last_os_error()); // `copy` still owns and closes the descriptor
        }
        std::mem::forget(copy);
        // SAFETY: a valid stream, rewound to the start whatever the shared offset was.
        unsafe { libc::rewinddir(stream) };
        let mut entries = Vec::new();
        let result = loop {
            clear_errno();
            // SAFETY: a valid stream; the entry is read before the next call.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let error = io::Error::last_os_error();
                break match error.raw_os_error() {
                    Some(0) | None => Ok(()),
                    Some(_) => Err(error),
                };
            }
            // SAFETY: readdir's entry holds a NUL-terminated name.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            let kind = match stat_kind(dir, name) {
                Ok(Kind::File) => EntryKind::File,
                _ => EntryKind::Other,
            };
            entries.push((name.to_string_lossy().into_owned(), kind));
        };
        // SAFETY: the stream opened above, closed once.
        unsafe { libc::closedir(stream) };
        result.map(|()| entries)
    }
}

/// Windows: each directory is held open (`FILE_FLAG_BACKUP_SEMANTICS`) without delete sharing,
/// so it cannot be renamed or removed while the audit reads it, and nothing is opened through a
/// reparse point (`FILE_FLAG_OPEN_REPARSE_POINT`, then the open handle's attributes checked: a
/// symbolic link, junction or mount point is refused, never followed). A file is opened by its
/// path under the held directory, shared for reading only (nobody writes, renames or removes it
/// while it is read), and must be a disk file (`GetFileType`): a device name such as `NUL` or
/// `CON`, which Windows resolves in any directory, is refused by [`plain_components`] before any
/// open, and a pipe or console handle is refused once open.
#[cfg(windows)]
mod sys {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::windows::fs::{MetadataExt, OpenOptionsExt};
    use std::os::windows::io::AsRawHandle;
    use std::path::Path;

    use windows_sys::Win32::Storage::FileSystem::{
        FILE_ATTRIBUTE_DIRECTORY, FILE_ATTRIBUTE_REPARSE_POINT, FILE_FLAG_BACKUP_SEMANTICS,
        FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_READ, FILE_SHARE_WRITE, FILE_TYPE_DISK,
        GetFileType,
    };

    use super::{ConfinedDir, EntryKind, Kind};

    fn reparse_point(attributes: u32) -> bool {
        attributes & FILE_ATTRIBUTE_REPARSE_POINT != 0
    }

    pub(super) fn open_dir(
        parent: Option<&ConfinedDir>,
        path: &Path,
        no_follow: bool,
    ) -> io::Result<File> {
        let full = parent.map_or(path.to_path_buf(), |p| p.path.join(path));
        let mut flags = FILE_FLAG_BACKUP_SEMANTICS;
        if no_follow {
            flags |= FILE_FLAG_OPEN_REPARSE_POINT;
        }
        let handle = OpenOptions::new()
            .read(true)
            .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE)
            .custom_flags(flags)
            .open(&full)?;
        let attributes = handle.metadata()?.file_attributes();
        if no_follow && reparse_point(attributes) {
            return Err(io::Error::other("a reparse point (link or junction)"));
        }
        if attributes & FILE_ATTRIBUTE_DIRECTORY == 0 {
            return Err(io::Error::from(io::ErrorKind::NotADirectory));
        }
        Ok(handle)
    }

    pub(super) fn open_file(dir: &ConfinedDir, name: &str) -> io::Result<File> {
        let file = OpenOptions::new()
            .read(true)
            .share_mode(FILE_SHARE_READ)
            .custom_flags(FILE_FLAG_OPEN_REPARSE_POINT)
            .open(dir.path.join(name))?;
        // SAFETY: a handle `file` owns, valid for the call.
        if unsafe { GetFileType(file.as_raw_handle()) } != FILE_TYPE_DISK {
            return Err(io::Error::other(
                "not a disk file (a device, pipe or console)",
            ));
        }
        if reparse_point(file.metadata()?.file_attributes()) {
            return Err(io::Error::other("a reparse point (link or junction)"));
        }
        Ok(file)
    }

    pub(super) fn entry_kind(dir: &ConfinedDir, name: &str) -> io::Result<Kind> {
        let metadata = std::fs::symlink_metadata(dir.path.join(name))?;
        Ok(if reparse_point(metadata.file_attributes()) {
            Kind::Symlink
        } else if metadata.is_file() {
            Kind::File
        } else {
            Kind::Other
        })
    }

    pub(super) fn is_symlink(dir: &ConfinedDir, name: &str) -> Option<bool> {
        entry_kind(dir, name).ok().map(|kind| kind == Kind::Symlink)
    }

    pub(super) fn list(dir: &ConfinedDir) -> io::Result<Vec<(String, EntryKind)>> {
        // The handle is held for the directory's whole audit, so the path still names it.
        let _held = &dir.handle;
        let at = if dir.path.as_os_str().is_empty() {
            Path::new(".")
        } else {
            &dir.path
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(at)? {
            let entry = entry?;
            // An entry's metadata here is what the directory listing says: links not followed.
            let kind = match entry.metadata() {
                Ok(m) if m.is_file() && !reparse_point(m.file_attributes()) => EntryKind::File,
                _ => EntryKind::Other,
            };
            out.push((entry.file_name().to_string_lossy().into_owned(), kind));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_leave_the_base_are_refused() {
        for path in [
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "",
            "a\\b",
            "NUL",
            "evidence/con.txt",
            "run/Lpt1",
            "com\u{b9}.json",
            "aux ",
            "summary.md.",
            "results.json:stream",
            "C:x",
        ] {
            assert!(
                matches!(plain_components(path), Err(FileError::NotPlain { .. })),
                "{path}"
            );
        }
        assert_eq!(plain_components("crates/a/src/lib.rs").unwrap().len(), 4);
        // Near misses are ordinary names, and no name makes the check panic.
        for path in [
            "console.md",
            "nul1",
            "com10",
            "lpt",
            "éé",
            "ÉCOM1",
            "auxiliary/x",
            "a.b",
        ] {
            assert!(plain_components(path).is_ok(), "{path}");
        }
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

        // The same through a directory handle.
        let dir = ConfinedDir::open(base).unwrap();
        assert_eq!(dir.read("file", 5).unwrap(), b"12345");
        assert!(matches!(
            dir.read("file", 4),
            Err(FileError::TooLarge { cap: 4, .. })
        ));
        assert!(matches!(
            dir.read("link", 99),
            Err(FileError::Symlink { .. })
        ));
        assert!(matches!(
            dir.read("fifo", 99),
            Err(FileError::NotRegular { .. })
        ));
        assert!(matches!(
            dir.read("dirlink", 99),
            Err(FileError::Symlink { .. })
        ));
        assert!(matches!(
            dir.read("nothing", 99),
            Err(FileError::Missing { .. })
        ));
        assert!(matches!(
            dir.read("dirlink/file", 99),
            Err(FileError::NotPlain { .. })
        ));
        let dev = ConfinedDir::open(Path::new("/dev")).unwrap();
        assert!(matches!(
            dev.read("zero", 99),
            Err(FileError::NotRegular { .. })
        ));
    }

    /// The handle is the directory it opened: a directory renamed into its path afterwards (the
    /// time-of-check-to-time-of-use swap) is not what it reads or lists, and every read is
    /// recorded with the hash of the bytes it returned.
    #[cfg(unix)]
    #[test]
    fn a_handle_reads_the_directory_it_opened_whatever_is_renamed_into_its_path() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("results.json"), b"honest").unwrap();
        std::fs::write(path.join("arrays.npz"), b"zip").unwrap();
        let dir = ConfinedDir::open(&path).unwrap();
        std::fs::rename(&path, tmp.path().join("aside")).unwrap();
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("results.json"), b"forged").unwrap();
        std::fs::write(path.join("extra"), b"").unwrap();

        assert_eq!(dir.read("results.json", 99).unwrap(), b"honest");
        assert_eq!(
            dir.list().unwrap(),
            [
                ("arrays.npz".to_string(), EntryKind::File),
                ("results.json".to_string(), EntryKind::File)
            ]
        );
        let (_, len) = dir.open_file("arrays.npz", 99).unwrap();
        assert_eq!(len, 3);
        dir.record("arrays.npz", "scanned");
        let sha = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
        assert_eq!(
            dir.hashes(),
            BTreeMap::from([
                ("arrays.npz".to_string(), vec!["scanned".to_string()]),
                ("results.json".to_string(), vec![sha(b"honest")]),
            ])
        );
        // A second listing starts from the beginning again.
        assert_eq!(dir.list().unwrap().len(), 2);
        assert_eq!(dir.sha256("results.json", 99).unwrap(), sha(b"honest"));
        assert_eq!(dir.hashes()["results.json"].len(), 2);
    }

    /// A directory reached from the root manifest is opened one name at a time, none a link.
    #[cfg(unix)]
    #[test]
    fn a_pinned_directory_that_is_a_link_or_under_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::create_dir_all(base.join("evidence/run")).unwrap();
        std::fs::write(base.join("evidence/file"), b"").unwrap();
        std::os::unix::fs::symlink(base.join("evidence/run"), base.join("evidence/link")).unwrap();
        std::os::unix::fs::symlink(base.join("evidence"), base.join("ev")).unwrap();
        let root = ConfinedDir::open(base).unwrap();
        let run = root.open_dir("evidence/run").unwrap();
        assert_eq!(run.path(), base.join("evidence/run"));
        for (path, is) in [
            ("evidence/link", "link"),
            ("ev/run", "link"),
            ("evidence/file", "file"),
            ("evidence/none", "missing"),
            ("../evidence/run", "plain"),
        ] {
            let err = root.open_dir(path).unwrap_err();
            let matched = match is {
                "link" => matches!(err, FileError::Symlink { .. }),
                "file" => matches!(err, FileError::NotADirectory { .. }),
                "missing" => matches!(err, FileError::Missing { .. }),
                _ => matches!(err, FileError::NotPlain { .. }),
            };
            assert!(matched, "{path}: {err:?}");
        }
        // A path the user names is followed as named.
        assert!(ConfinedDir::open(&base.join("evidence/link")).is_ok());
        assert!(matches!(
            ConfinedDir::open(&base.join("evidence/file")),
            Err(FileError::NotADirectory { .. })
        ));
    }

    #[cfg(windows)]
    #[test]
    fn on_windows_devices_links_and_renames_cannot_redirect_a_read() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::create_dir(base.join("run")).unwrap();
        std::fs::write(base.join("run").join("file"), b"12345").unwrap();
        let dir = ConfinedDir::open(base).unwrap();
        let run = dir.open_dir("run").unwrap();
        assert_eq!(run.read("file", 5).unwrap(), b"12345");
        assert!(matches!(
            run.read("file", 4),
            Err(FileError::TooLarge { cap: 4, .. })
        ));
        // Device names resolve in every directory on Windows: refused before any open.
        for name in ["NUL", "con", "aux.json", "COM1", "file:stream"] {
            assert!(
                matches!(run.read(name, 99), Err(FileError::NotPlain { .. })),
                "{name}"
            );
        }
        assert!(matches!(
            read_confined(base, "run/NUL", 99),
            Err(FileError::NotPlain { .. })
        ));
        // The held directory cannot be renamed away (and another swapped in) while it is read.
        assert!(std::fs::rename(base.join("run"), base.join("moved")).is_err());
        drop(run);
        std::fs::rename(base.join("run"), base.join("moved")).unwrap();
        // A symbolic link, to a file or to a directory, is refused, not followed: checked where
        // this account may make links (Windows asks for a privilege or developer mode) and the
        // system shows them as reparse points (Wine 8.0 makes a Unix link it does not).
        let moved = base.join("moved");
        let reparse = |path: &Path| {
            use std::os::windows::fs::MetadataExt;
            std::fs::symlink_metadata(path).is_ok_and(|m| m.file_attributes() & 0x400 != 0)
        };
        if std::os::windows::fs::symlink_file(moved.join("file"), base.join("link")).is_ok()
            && reparse(&base.join("link"))
        {
            assert!(matches!(
                dir.read("link", 99),
                Err(FileError::Symlink { .. })
            ));
            assert!(matches!(
                read_confined(base, "link", 99),
                Err(FileError::Symlink { .. })
            ));
        }
        if std::os::windows::fs::symlink_dir(&moved, base.join("dirlink")).is_ok()
            && reparse(&base.join("dirlink"))
        {
            assert!(matches!(
                dir.open_dir("dirlink"),
                Err(FileError::Symlink { .. })
            ));
            assert!(matches!(
                read_confined(base, "dirlink/file", 99),
                Err(FileError::Symlink { .. })
            ));
        }
    }
}
