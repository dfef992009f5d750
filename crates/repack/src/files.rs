//! Files: reading an input whole, with its size known before anything is allocated, and
//! writing an output atomically, never over an existing file. The byte-level readers
//! ([`crate::checkpoint`], [`crate::npy`]) know nothing about files; the functions here give
//! them their bytes and name the file in every error.
//!
//! Reading:
//! `std::fs::read` reads until end of file, however far that is: given `/dev/zero` (or a pipe
//! that never closes) it grows its buffer until the process runs out of memory and aborts. Every
//! reader here instead reads a regular file only, up to the length the file system reports for
//! it, into a buffer reserved with `try_reserve_exact`, so a length that cannot be allocated is
//! an error rather than an abort. The formats' own sizes (a header's declared length, a shape)
//! are then checked against the bytes actually read, by each format's parser.
//!
//! Writing: the bytes go to a temporary file in the destination's directory that is renamed into
//! place only if the destination still does not exist. A failed run leaves nothing behind.

use std::io::{Read, Write};
use std::path::Path;

use ndarray::Array2;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::npy::parse_npy_matrix;

/// The whole of the regular file at `path`: at most the length its metadata reports (a file that
/// grows while it is read is cut there; one that shrinks gives what remains).
///
/// The file is opened non-blocking (`O_NONBLOCK`): opening a FIFO for reading blocks until a
/// writer appears, so a FIFO with no writer would hang a plain `open` before its type could be
/// checked; opened this way it is refused at once, as every input that is not a regular file.
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    let file = open_input(path).map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            Error::Missing {
                path: path.to_path_buf(),
            }
        } else {
            Error::io(path)(err)
        }
    })?;
    let metadata = file.metadata().map_err(Error::io(path))?;
    if !metadata.is_file() {
        return Err(Error::NotARegularFile {
            path: path.to_path_buf(),
        });
    }
    read_at_most(file, metadata.len(), path)
}

/// Opens `path` for reading without blocking on it (`O_NONBLOCK`: a FIFO with no writer opens at
/// once instead of waiting for one). The caller checks the open file's type; for a regular file
/// the flag changes nothing.
#[cfg(unix)]
fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::File::open(path)
}

/// Up to `len` bytes of `reader`, into a buffer reserved up front (and only if it can be).
pub(crate) fn read_at_most(reader: impl Read, len: u64, path: &Path) -> Result<Vec<u8>> {
    let too_large = || Error::InputTooLarge {
        path: path.to_path_buf(),
        bytes: len,
    };
    let capacity = usize::try_from(len).map_err(|_| too_large())?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(capacity).map_err(|_| too_large())?;
    reader
        .take(len)
        .read_to_end(&mut bytes)
        .map_err(Error::io(path))?;
    Ok(bytes)
}

/// Reads the safetensors file at `path` ([`Checkpoint::from_bytes`] on its bytes).
pub fn read_checkpoint(path: &Path) -> Result<Checkpoint> {
    let bytes = read_input(path)?;
    Checkpoint::from_bytes(&bytes).map_err(|source| Error::SafeTensors {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `checkpoint` to `path`, which must not exist; nothing is left behind on failure.
pub fn write_checkpoint(checkpoint: &Checkpoint, path: &Path) -> Result<()> {
    let bytes = checkpoint.to_bytes().map_err(|source| Error::Serialize {
        path: path.to_path_buf(),
        source,
    })?;
    write_new_file(path, &bytes)
}

/// Reads the 2-D float32 matrix in the `.npy` file at `path` ([`parse_npy_matrix`] on its
/// bytes).
pub fn read_npy_matrix(path: &Path) -> Result<Array2<f32>> {
    let bytes = read_input(path)?;
    parse_npy_matrix(&bytes).map_err(|source| Error::Npy {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `bytes` to `path` through a temporary sibling; refuses if `path` exists.
pub fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if path.exists() {
        return Err(Error::OutputExists(path.to_path_buf()));
    }
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(Error::OutputDirMissing {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    let mut builder = tempfile::Builder::new();
    // tempfile creates private (0600) files; an output is an ordinary file, 0666 minus the umask.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    let mut temp = builder
        .prefix(".repack-")
        .tempfile_in(dir)
        .map_err(Error::io(dir))?;
    temp.write_all(bytes).map_err(Error::io(temp.path()))?;
    temp.as_file().sync_all().map_err(Error::io(temp.path()))?;
    temp.persist_noclobber(path).map_err(|err| {
        if path.exists() {
            Error::OutputExists(path.to_path_buf())
        } else {
            Error::io(path)(err.error)
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_length_that_cannot_be_allocated_is_an_error_not_an_abort() {
        let err = read_at_most(std::io::empty(), u64::MAX, Path::new("huge")).unwrap_err();
        assert!(
            matches!(
                err,
                Error::InputTooLarge {
                    bytes: u64::MAX,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn reads_no_further_than_the_reported_length() {
        let bytes = read_at_most(std::io::repeat(7), 5, Path::new("endless")).unwrap();
        assert_eq!(bytes, [7; 5]);
    }

    #[cfg(unix)]
    #[test]
    fn a_device_that_never_ends_is_refused_before_reading() {
        let err = read_input(Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(err, Error::NotARegularFile { .. }), "{err:?}");
    }

    /// A FIFO with no writer used to block `open` forever; it is refused at once.
    #[cfg(unix)]
    #[test]
    fn a_fifo_with_no_writer_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path and a mode; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let err = read_input(&fifo).unwrap_err();
        assert!(matches!(err, Error::NotARegularFile { .. }), "{err:?}");
    }

    #[test]
    fn a_regular_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(read_input(&path).unwrap(), b"abc");
    }

    #[test]
    fn an_output_in_a_missing_directory_says_so_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs").join("w.gguf");
        let err = write_new_file(&path, b"x").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}: directory {} does not exist; create it first (mkdir -p {})",
                path.display(),
                dir.path().join("runs").display(),
                dir.path().join("runs").display()
            )
        );
    }

    #[test]
    fn refuses_to_overwrite_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.bin");
        write_new_file(&path, b"first").unwrap();
        let err = write_new_file(&path, b"second").unwrap_err();
        assert!(
            matches!(&err, Error::OutputExists(p) if p == &path),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
