//! The evidence directory being written: a staging directory ([`crate::staging`]) holding
//! arrays.npz, streamed member by member, and then the study's other files and its manifest.
//!
//! arrays.npz is uncompressed with fixed timestamps and modes, so the same run gives the same
//! bytes; each member is `<name>.npy` exactly as ndarray-npy's `NpzWriter` writes it (so a copied
//! member and a serialized one give the same bytes). Every file is created new and fsynced.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ndarray::{ArrayBase, Data, Dimension};
use ndarray_npy::WriteNpyExt;

use crate::npy::{Le, LeElement};
use serde::Serialize;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::error::{EvidenceError, io};
use crate::hashing::sha256_file;
use crate::staging::{Staging, check_new, create_parent, parent_dir};
use crate::{ARRAYS, MANIFEST};

/// An evidence directory being written: [`Writer::create`] claims a staging directory and
/// opens arrays.npz in it, the archive is filled member by member as the run makes its arrays
/// (so they are never all held at once), and [`Writer::finish_files`]
/// writes the other files and moves the directory into place. Dropped unfinished (an error
/// anywhere), it leaves nothing behind: no staging directory, no lock file, no parent directory
/// it created.
pub struct Writer {
    out: PathBuf,
    parent: PathBuf,
    /// Parent directories this run created, deepest first.
    created: Vec<PathBuf>,
    arrays_path: PathBuf,
    /// `None` once finished.
    npz: Option<Archive<BufWriter<FirstError<File>>>>,
    /// The archive file's first I/O error, shared with its [`FirstError`] guard.
    state: Rc<RefCell<FirstErrorState>>,
    /// `None` once committed.
    staging: Option<Staging>,
}

impl Writer {
    /// Checks that `out` can be created (see [`check_new`]), creates its missing parents, claims
    /// a staging directory beside it and opens arrays.npz there.
    pub fn create(out: &Path) -> Result<Writer, EvidenceError> {
        check_new(out)?;
        let name = out
            .file_name()
            .ok_or_else(|| EvidenceError::NoName(out.into()))?;
        let parent = parent_dir(out);
        let created = create_parent(&parent)?;
        let remove_created = |err| {
            // Deepest first; remove_dir only removes an empty directory, so nothing else is lost.
            for dir in &created {
                let _ = std::fs::remove_dir(dir);
            }
            err
        };
        let staging = Staging::create(&parent, name).map_err(remove_created)?;
        let arrays_path = staging.dir.join(ARRAYS);
        let file = match File::create_new(&arrays_path) {
            Ok(file) => file,
            Err(source) => {
                drop(staging);
                return Err(remove_created(EvidenceError::Io {
                    context: format!("writing {}", arrays_path.display()),
                    source,
                }));
            }
        };
        let guard = FirstError::new(file);
        let state = Rc::clone(&guard.state);
        // Stored entries with a fixed timestamp and mode: the archive's bytes depend only on the
        // run.
        let options = SimpleFileOptions::default()
            .compression_method(CompressionMethod::Stored)
            .last_modified_time(DateTime::default())
            .unix_permissions(0o644);
        Ok(Writer {
            out: out.to_path_buf(),
            parent,
            created,
            arrays_path,
            npz: Some(Archive {
                zip: ZipWriter::new(BufWriter::with_capacity(1 << 20, guard)),
                options,
            }),
            state,
            staging: Some(staging),
        })
    }

    /// The archive's error, with the first I/O error as its cause when there was one (the
    /// archive's own error then wraps a copy of it).
    fn archive_error(&self, err: EvidenceError) -> EvidenceError {
        match self.state.borrow_mut().error.take() {
            Some(source) => io(format!("writing {}", self.arrays_path.display()))(source),
            None => err,
        }
    }

    fn archive(&mut self) -> &mut Archive<BufWriter<FirstError<File>>> {
        self.npz.as_mut().expect("the archive is open until finish")
    }

    /// Adds array `<id>_<name>` to arrays.npz, little-endian ([`crate::npy`]).
    pub fn add_array<A, S, D>(
        &mut self,
        id: &str,
        name: &str,
        array: &ArrayBase<S, D>,
    ) -> Result<(), EvidenceError>
    where
        A: LeElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        let added = self.archive().add(id, name, array);
        added.map_err(|e| self.archive_error(e))
    }

    /// Adds a member copied as it is: `name` (without `.npy`) and its `.npy` bytes.
    pub fn add_member(&mut self, name: &str, bytes: &[u8]) -> Result<(), EvidenceError> {
        let added = self.archive().add_member(name, bytes);
        added.map_err(|e| self.archive_error(e))
    }

    /// Closes arrays.npz, writes `files` (name and bytes) beside it, then the manifest that
    /// `manifest` makes from the SHA-256 of arrays.npz and every one of `files` (keyed by file
    /// name), and moves the directory to its name: the writing path of an evidence format other
    /// every study's format shares (the packed-KV study's and the model-quality study's).
    pub fn finish_files(
        mut self,
        files: &[(&str, Vec<u8>)],
        manifest: impl FnOnce(BTreeMap<String, String>) -> Result<Vec<u8>, EvidenceError>,
    ) -> Result<(), EvidenceError> {
        self.close_archive()?;
        let dir = self
            .staging
            .as_ref()
            .expect("staged until commit")
            .dir
            .clone();
        for (name, bytes) in files {
            write_file(&dir.join(name), bytes)?;
        }
        let mut outputs = BTreeMap::new();
        for name in std::iter::once(ARRAYS).chain(files.iter().map(|(name, _)| *name)) {
            let path = dir.join(name);
            let hash = sha256_file(&path).map_err(io(format!("hashing {}", path.display())))?;
            outputs.insert(name.to_string(), hash);
        }
        write_file(&dir.join(MANIFEST), &manifest(outputs)?)?;
        let staging = self.staging.take().expect("staged until commit");
        let committed = staging.commit(&self.out, &self.parent);
        if committed.is_ok() {
            self.created.clear();
        }
        committed
    }

    /// Finishes the archive and syncs it to disk.
    fn close_archive(&mut self) -> Result<(), EvidenceError> {
        let npz = self.npz.take().expect("the archive is open until finish");
        let finished = npz.zip.finish();
        let writer = finished.map_err(|e| self.archive_error(EvidenceError::Npz(e.to_string())))?;
        let context = format!("writing {}", self.arrays_path.display());
        let guard = writer
            .into_inner()
            .map_err(|e| self.archive_error(io(context.clone())(e.into_error())))?;
        if let Some(source) = self.state.borrow_mut().error.take() {
            return Err(io(context)(source));
        }
        guard.inner.sync_all().map_err(io(context))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Nothing more reaches the archive file, so the unfinished archive's drop-time finish
        // cannot fail and print; the file goes with the staging directory.
        self.state.borrow_mut().closed = true;
        self.npz = None;
        self.staging = None;
        for dir in &self.created {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// `value` as the pretty JSON (with a final newline) every evidence file is written as.
pub fn json_bytes<T: Serialize + ?Sized>(
    file: &'static str,
    value: &T,
) -> Result<Vec<u8>, EvidenceError> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|source| EvidenceError::Json { file, source })?;
    text.push('\n');
    Ok(text.into_bytes())
}

/// Creates `path` (which must not exist), writes `bytes` and syncs them to disk.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), EvidenceError> {
    let context = || format!("writing {}", path.display());
    let mut file = File::create_new(path).map_err(io(context()))?;
    file.write_all(bytes).map_err(io(context()))?;
    file.sync_all().map_err(io(context()))
}

/// arrays.npz being written: stored members with a fixed timestamp and mode, each `<name>.npy`,
/// exactly as ndarray-npy's `NpzWriter` writes them (so copied members and serialized ones give
/// the same bytes), with the `<id>_<part>` key convention.
struct Archive<W: Write + Seek> {
    zip: ZipWriter<W>,
    options: SimpleFileOptions,
}

impl<W: Write + Seek> Archive<W> {
    fn add<A, S, D>(
        &mut self,
        id: &str,
        name: &str,
        array: &ArrayBase<S, D>,
    ) -> Result<(), EvidenceError>
    where
        A: LeElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        let npz = |e: &dyn std::fmt::Display| EvidenceError::Npz(e.to_string());
        self.zip
            .start_file(format!("{id}_{name}.npy"), self.options)
            .map_err(|e| npz(&e))?;
        let mut member = BufWriter::new(&mut self.zip);
        array.mapv(Le).write_npy(&mut member).map_err(|e| npz(&e))?;
        member.flush().map_err(|e| npz(&e))
    }

    /// A member copied as it is: `name` (without `.npy`) and its `.npy` bytes.
    fn add_member(&mut self, name: &str, bytes: &[u8]) -> Result<(), EvidenceError> {
        let npz = |e: &dyn std::fmt::Display| EvidenceError::Npz(e.to_string());
        self.zip
            .start_file(format!("{name}.npy"), self.options)
            .map_err(|e| npz(&e))?;
        self.zip.write_all(bytes).map_err(|e| npz(&e))
    }
}

/// A writer that passes writes through until one fails, keeps that first error, and from then
/// on accepts and discards every write.
///
/// Why: when writing the archive fails (a full disk), `zip::ZipWriter` is dropped unfinished,
/// and its `Drop` tries to finish the archive again; when that fails too it prints
/// `ZipWriter drop failed: ...` to stderr, a second, stray report of the same cause. With writes
/// discarded after the first error, that drop-time finish has nothing to fail on (the file is
/// removed with the staging directory anyway), and the recorded error is reported once, with
/// its context. The archive is still streamed to the file, never built in memory.
struct FirstError<W> {
    inner: W,
    state: Rc<RefCell<FirstErrorState>>,
}

#[derive(Default)]
struct FirstErrorState {
    /// The first error, until it is taken for reporting.
    error: Option<io::Error>,
    /// Set at the first error (or by the owner): every later write is discarded.
    closed: bool,
}

impl<W> FirstError<W> {
    fn new(inner: W) -> Self {
        FirstError {
            inner,
            state: Rc::default(),
        }
    }

    /// Records `err` as the first error, closes the writer, and returns a copy for the caller.
    fn fail(&self, err: io::Error) -> io::Error {
        // Interrupted is retried by write_all and friends; it is not a failure.
        if err.kind() == io::ErrorKind::Interrupted {
            return err;
        }
        let copy = io::Error::new(err.kind(), err.to_string());
        let mut state = self.state.borrow_mut();
        state.closed = true;
        state.error.get_or_insert(err);
        copy
    }

    fn closed(&self) -> bool {
        self.state.borrow().closed
    }
}

impl<W: Write> Write for FirstError<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed() {
            return Ok(buf.len());
        }
        self.inner.write(buf).map_err(|e| self.fail(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.closed() {
            return Ok(());
        }
        self.inner.flush().map_err(|e| self.fail(e))
    }
}

impl<W: Seek> Seek for FirstError<W> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos).map_err(|e| self.fail(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails every write after `budget` bytes with the OS's "disk full" error (ENOSPC on Unix,
    /// ERROR_DISK_FULL on Windows).
    struct SmallDisk {
        budget: usize,
        written: Vec<u8>,
    }

    #[cfg(unix)]
    const DISK_FULL: i32 = 28; // ENOSPC on Linux and macOS
    #[cfg(windows)]
    const DISK_FULL: i32 = 112; // ERROR_DISK_FULL

    impl Write for SmallDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.written.len() + buf.len() > self.budget {
                return Err(io::Error::from_raw_os_error(DISK_FULL));
            }
            self.written.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_first_write_error_is_kept_and_later_writes_are_discarded() {
        let mut guard = FirstError::new(SmallDisk {
            budget: 4,
            written: Vec::new(),
        });
        guard.write_all(b"abc").unwrap();
        let err = guard.write_all(b"defg").unwrap_err();
        assert_eq!(err.raw_os_error(), None, "the caller gets a copy");
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        // Nothing more reaches the disk, and nothing more fails.
        guard.write_all(b"hij").unwrap();
        guard.flush().unwrap();
        assert_eq!(guard.inner.written, b"abc");
        let first = guard.state.borrow_mut().error.take().unwrap();
        assert_eq!(first.raw_os_error(), Some(DISK_FULL));
    }
}
