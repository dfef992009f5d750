//! Where an archive's bytes come from, read by position: a file (the audit's case, so that an
//! archive of up to 4 GiB is never held in memory) or bytes already in memory (tests, fuzzing).
//!
//! Every read names its offset and fills its buffer exactly, so the ZIP reader can check each
//! size against the archive's length before it reads or allocates, and read only what it needs.
//! Reads go through the one descriptor the archive was opened with: once open, renaming or
//! replacing the path changes nothing the audit reads.

use std::fs::File;
use std::io;
use std::ops::Range;

/// Bytes read per call when a member or the whole archive is streamed: large enough that the
/// system calls cost nothing next to hashing, small enough to hold at any size of archive. A
/// multiple of every element size, so each chunk of a member's data holds whole elements.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Bytes that can be read at any offset.
pub trait ReadAt {
    /// Fills `buf` with the bytes at `offset`, or fails (past the end included).
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// The length now, to see whether it changed since it was first taken.
    fn current_len(&self) -> io::Result<u64>;
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).ok();
        let range = start.and_then(|s| Some(s..s.checked_add(buf.len())?));
        match range.and_then(|r| self.get(r)) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }

    fn current_len(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
}

impl ReadAt for File {
    #[cfg(unix)]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }

    /// Elsewhere a seek and a read on the shared descriptor: correct as long as one thread reads
    /// at a time, which the audit does.
    #[cfg(not(unix))]
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = self;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }

    fn current_len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
}

/// Reads `range` of `source` in order, at most [`CHUNK_BYTES`] at a time, into `buf` (grown to
/// one chunk once), and hands each chunk to `each`.
pub fn for_each_chunk<R: ReadAt + ?Sized>(
    source: &R,
    range: Range<u64>,
    buf: &mut Vec<u8>,
    mut each: impl FnMut(&[u8]),
) -> io::Result<()> {
    let mut at = range.start;
    while at < range.end {
        let n = (range.end - at).min(CHUNK_BYTES as u64) as usize;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        source.read_exact_at(&mut buf[..n], at)?;
        each(&buf[..n]);
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_reads_are_exact_and_bounded() {
        let bytes: &[u8] = b"0123456789";
        let mut buf = [0u8; 3];
        bytes.read_exact_at(&mut buf, 7).unwrap();
        assert_eq!(&buf, b"789");
        assert!(bytes.read_exact_at(&mut buf, 8).is_err());
        assert!(bytes.read_exact_at(&mut buf, u64::MAX).is_err());
        let mut seen = Vec::new();
        let mut chunk = Vec::new();
        for_each_chunk(bytes, 2..9, &mut chunk, |c| seen.extend_from_slice(c)).unwrap();
        assert_eq!(seen, b"2345678");
    }
}
