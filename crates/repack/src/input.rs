//! Reading an input file whole, with its size known before anything is allocated.
//!
//! `std::fs::read` reads until end of file, however far that is: given `/dev/zero` (or a pipe
//! that never closes) it grows its buffer until the process runs out of memory and aborts. Every
//! reader here instead reads a regular file only, up to the length the file system reports for
//! it, into a buffer reserved with `try_reserve_exact`, so a length that cannot be allocated is
//! an error rather than an abort. The formats' own sizes (a header's declared length, a shape)
//! are then checked against the bytes actually read, by each format's parser.

use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// The whole of the regular file at `path`: at most the length its metadata reports (a file that
/// grows while it is read is cut there; one that shrinks gives what remains).
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(Error::io(path))?;
    let metadata = file.metadata().map_err(Error::io(path))?;
    if !metadata.is_file() {
        return Err(Error::NotARegularFile {
            path: path.to_path_buf(),
        });
    }
    read_at_most(file, metadata.len(), path)
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

    #[test]
    fn a_regular_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(read_input(&path).unwrap(), b"abc");
    }
}
