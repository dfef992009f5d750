//! Writes a run's evidence directory.
//!
//! Contents:
//! - `arrays.npz` (uncompressed, fixed timestamps, so the same run gives the same bytes):
//!   per input `<input>_q`, `_k`, `_v` (f32) and `_ref` (f64); per comparison
//!   `<id>_k_codes`, `_v_codes` (u8 stream), `_k_scales`, `_v_scales` (f32 [rows, groups]),
//!   `_k_shape`, `_v_shape` (i32 [N, D]) and `_out` (f64); asymmetric settings add `_k_zeros`,
//!   `_v_zeros` (u8 b-bit stream of the zero points, one per group in scale order);
//!   Budget comparisons store every token segment as its own tensor, with the segment index as a
//!   suffix: `<id>_k_codes_s0`, `_k_scales_s0`, `_k_shape_s0` for a quantized segment,
//!   `<id>_k_values_s1` (f32 [len, D]) and `_k_shape_s1` for a float32 one;
//! - `results.json`: one row per comparison;
//! - `summary.json`: the tables; `summary.md`: the same in markdown, with median timings;
//! - `error-vs-bytes.svg`: relative error against payload bytes;
//! - `timings.json`: every raw timing (when the protocol asks for timings);
//! - `manifest.json`: provenance and SHA-256 of every other file.
//!
//! The directory must not exist, and neither may the path's nearest existing ancestor be
//! anything but a directory ([`check_new`], which the runner calls before the study runs).
//!
//! Crash safety:
//! - Everything is written into a hidden staging sibling, `.NAME.partial-XXXXXX`, renamed to
//!   NAME only when complete, so an interrupted run never leaves a directory that looks finished.
//! - Before the staging directory exists, its sibling lock file `.NAME.partial-XXXXXX.lock` is
//!   created and locked (`File::try_lock`, an advisory lock the kernel releases when the process
//!   exits, however it exits). The lock is held until after the rename, then the lock file is
//!   removed. It sits beside the staging directory, not in it, so the finished directory holds
//!   exactly the run's files.
//! - [`remove_stale_staging`], which the runner calls before each run, removes the staging
//!   directory of any run that is no longer alive: one whose lock file exists and can be locked.
//!   A locked one is left alone (its run is still writing), and so is a staging directory with
//!   no lock file (it was not made this way); a lock file whose directory is gone and which can
//!   be locked is removed.
//! - Every file is fsynced (`File::sync_all`) before the rename, and so is the staging directory;
//!   the parent is fsynced after it (directories on Unix only), so a run reported as written
//!   survives a crash.
//! - On any error (a full disk, say) the staging directory, its lock file and any parent
//!   directories this run created are removed, and the error is reported once.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ndarray::{ArrayBase, ArrayView1, Data, Dimension};
use ndarray_npy::{WritableElement, WriteNpyExt};
use serde::Serialize;
use thiserror::Error;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::manifest::{Manifest, sha256_file};
use crate::pipeline::ArraySink;
use crate::plan::Plan;
use crate::protocol::Protocol;
use crate::study::{Comparison, Input, ResultRow, SegmentData};
use crate::summary::Summary;
use crate::timing::{TimingError, Timings};
use crate::{plot, report};

pub const ARRAYS: &str = "arrays.npz";
pub const RESULTS: &str = "results.json";
pub const SUMMARY: &str = "summary.json";
pub const SUMMARY_MD: &str = "summary.md";
pub const PLOT: &str = "error-vs-bytes.svg";
pub const TIMINGS: &str = "timings.json";
pub const MANIFEST: &str = "manifest.json";

/// Between an output name and the random suffix of its staging directory.
const PARTIAL: &str = ".partial-";
/// Appended to a staging directory's name to name its lock file.
const LOCK_SUFFIX: &str = ".lock";
/// Random characters in a staging name.
const RANDOM_CHARS: usize = 6;
/// Names tried before giving up on claiming a staging directory (each failure means a race with
/// another run or a leftover of the same random name, both rare).
const STAGING_ATTEMPTS: usize = 16;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum EvidenceError {
    #[error("output directory {0} already exists; choose a new directory (runs never overwrite)")]
    Exists(PathBuf),
    #[error("output path {0} has no final component to name a directory")]
    NoName(PathBuf),
    #[error("cannot create output directory {out}: {ancestor} is not a directory")]
    NotADirectory { out: PathBuf, ancestor: PathBuf },
    /// The cause is the source, so it is printed once, after the context.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// An archive error that is not an I/O error (those are `Io`), as the npz writer words it.
    #[error("writing {ARRAYS}: {0}")]
    Npz(String),
    #[error("drawing {PLOT}: {0}")]
    Plot(String),
    #[error("encoding {file}")]
    Json {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Timing(#[from] TimingError),
}

fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> EvidenceError {
    let context = context.into();
    move |source| EvidenceError::Io { context, source }
}

/// The directory an output path is created in (`.` for a bare name).
pub fn parent_dir(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuses an output path that already exists (file, directory or dangling link), that has no
/// final component, or whose nearest existing ancestor is not a directory (`--out file/run`).
pub fn check_new(out: &Path) -> Result<(), EvidenceError> {
    if out.symlink_metadata().is_ok() {
        return Err(EvidenceError::Exists(out.to_path_buf()));
    }
    if out.file_name().is_none() {
        return Err(EvidenceError::NoName(out.to_path_buf()));
    }
    let mut ancestor = parent_dir(out);
    loop {
        match std::fs::metadata(&ancestor) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(EvidenceError::NotADirectory {
                    out: out.to_path_buf(),
                    ancestor,
                });
            }
            // Missing, or under a file: look further up for what is there.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                match ancestor.parent() {
                    Some(p) if !p.as_os_str().is_empty() => ancestor = p.to_path_buf(),
                    // A relative path's first component is missing: it will be created in the
                    // working directory.
                    _ => return Ok(()),
                }
            }
            Err(source) => {
                return Err(EvidenceError::Io {
                    context: format!("checking {}", ancestor.display()),
                    source,
                });
            }
        }
    }
}

/// An evidence directory being written: [`Writer::create`] claims a staging directory and
/// opens arrays.npz in it, the archive is filled member by member as the run makes its arrays
/// (so they are never all held at once; see [`crate::pipeline`]), and [`Writer::finish`]
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

/// Everything but the arrays that a run's directory is written from.
pub struct Outputs<'a> {
    pub protocol: &'a Protocol,
    pub rows: &'a [ResultRow],
    pub summary: &'a Summary,
    pub timings: Option<&'a Timings>,
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

    /// Adds array `<id>_<name>` to arrays.npz.
    pub fn add_array<A, S, D>(
        &mut self,
        id: &str,
        name: &str,
        array: &ArrayBase<S, D>,
    ) -> Result<(), EvidenceError>
    where
        A: WritableElement,
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

    /// Closes arrays.npz, writes the other files and the manifest (with the SHA-256 of every
    /// file), and moves the directory to its name. Refuses timings with a 0 ns measurement
    /// before writing anything more.
    pub fn finish(
        mut self,
        outputs: Outputs<'_>,
        mut manifest: Manifest,
    ) -> Result<Manifest, EvidenceError> {
        if let Some(timings) = outputs.timings {
            timings.check_positive()?;
        }
        self.close_archive()?;
        let dir = self
            .staging
            .as_ref()
            .expect("staged until commit")
            .dir
            .clone();
        let Outputs {
            protocol,
            rows,
            summary,
            timings,
        } = outputs;
        write_json(&dir.join(RESULTS), RESULTS, rows)?;
        write_json(&dir.join(SUMMARY), SUMMARY, summary)?;
        let markdown = report::summary_markdown(protocol, summary, &manifest);
        write_file(&dir.join(SUMMARY_MD), markdown.as_bytes())?;
        let svg = plot::error_vs_bytes(protocol, rows).map_err(EvidenceError::Plot)?;
        write_file(&dir.join(PLOT), svg.as_bytes())?;
        let mut files = vec![ARRAYS, RESULTS, SUMMARY, SUMMARY_MD, PLOT];
        if let Some(timings) = timings {
            write_json(&dir.join(TIMINGS), TIMINGS, timings)?;
            files.push(TIMINGS);
        }
        for file in files {
            let path = dir.join(file);
            let hash = sha256_file(&path).map_err(io(format!("hashing {}", path.display())))?;
            manifest.outputs.insert(file.to_string(), hash);
        }
        write_json(&dir.join(MANIFEST), MANIFEST, &manifest)?;
        let staging = self.staging.take().expect("staged until commit");
        let committed = staging.commit(&self.out, &self.parent);
        if committed.is_ok() {
            self.created.clear();
        }
        committed.map(|()| manifest)
    }

    /// Closes arrays.npz, writes `files` (name and bytes) beside it, then the manifest that
    /// `manifest` makes from the SHA-256 of arrays.npz and every one of `files` (keyed by file
    /// name), and moves the directory to its name: the writing path of an evidence format other
    /// than the packed-KV one (see [`crate::quality_study`]).
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

impl ArraySink for Writer {
    type Error = EvidenceError;

    fn input(&mut self, input: &Input) -> Result<(), EvidenceError> {
        let id = input.id();
        self.add_array(&id, "q", &input.q)?;
        self.add_array(&id, "k", &input.k)?;
        self.add_array(&id, "v", &input.v)?;
        self.add_array(&id, "ref", input.reference)
    }

    fn comparison(&mut self, c: &Comparison) -> Result<(), EvidenceError> {
        let id = &c.row.id;
        // Packed-KV comparisons keep the unsuffixed names of a single tensor per K and V.
        let suffixed = matches!(c.plan, Plan::Budget { .. });
        for (tensor, segments) in [("k", &c.k), ("v", &c.v)] {
            for (index, segment) in segments.iter().enumerate() {
                let suffix = if suffixed {
                    format!("_s{index}")
                } else {
                    String::new()
                };
                let name = |part: &str| format!("{tensor}_{part}{suffix}");
                match &segment.data {
                    SegmentData::Packed(packed) => {
                        let codes = ArrayView1::from(packed.code_bytes());
                        self.add_array(id, &name("codes"), &codes)?;
                        self.add_array(id, &name("scales"), packed.scales())?;
                        let shape = packed.shape_i32();
                        self.add_array(id, &name("shape"), &ArrayView1::from(&shape))?;
                        if packed.layout().mode == kvcodec::Mode::Asymmetric {
                            let zeros = ArrayView1::from(packed.zero_point_bytes());
                            self.add_array(id, &name("zeros"), &zeros)?;
                        }
                    }
                    SegmentData::Float32(values) => {
                        self.add_array(id, &name("values"), values)?;
                        let shape = [values.nrows() as i32, values.ncols() as i32];
                        self.add_array(id, &name("shape"), &ArrayView1::from(&shape))?;
                    }
                }
            }
        }
        self.add_array(id, "out", &c.out)
    }
}

/// Writes the evidence directory of a merged run: its arrays are copied, member by member, by
/// `copy`, which hands each one's name (without `.npy`) and `.npy` bytes to the sink it is given,
/// in the order a single run writes them; the rest is written from `outputs` as a run's is.
pub fn write_merged(
    out: &Path,
    copy: &mut CopyMembers<'_>,
    outputs: Outputs<'_>,
    manifest: Manifest,
) -> Result<Manifest, EvidenceError> {
    if let Some(timings) = outputs.timings {
        timings.check_positive()?;
    }
    let mut writer = Writer::create(out)?;
    copy(&mut |name, bytes| writer.add_member(name, bytes))?;
    writer.finish(outputs, manifest)
}

/// Receives one archive member: its name (without `.npy`) and its `.npy` bytes.
pub type MemberSink<'a> = dyn FnMut(&str, &[u8]) -> Result<(), EvidenceError> + 'a;

/// Feeds every member of a merged archive, in order, to a sink.
pub type CopyMembers<'a> = dyn FnMut(&mut MemberSink<'_>) -> Result<(), EvidenceError> + 'a;

/// Creates `parent` and its missing ancestors; returns those this call created, deepest first,
/// so a failed run can remove them again.
fn create_parent(parent: &Path) -> Result<Vec<PathBuf>, EvidenceError> {
    let mut missing = Vec::new();
    let mut dir = parent;
    while dir
        .symlink_metadata()
        .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
    {
        missing.push(dir.to_path_buf());
        match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => dir = p,
            _ => break,
        }
    }
    if let Err(source) = std::fs::create_dir_all(parent) {
        for dir in &missing {
            let _ = std::fs::remove_dir(dir);
        }
        return Err(EvidenceError::Io {
            context: format!("creating {}", parent.display()),
            source,
        });
    }
    Ok(missing)
}

/// A staging directory being written, and the locked lock file beside it that says so.
///
/// Dropped without a successful [`Staging::commit`], it removes the directory and then the lock
/// file; the lock itself is released last, when the file handle closes.
struct Staging {
    dir: PathBuf,
    lock_path: PathBuf,
    /// Held (locked) for as long as this value lives.
    _lock: File,
    renamed: bool,
}

impl Staging {
    /// Creates and locks `.NAME.partial-XXXXXX.lock` in `parent`, then creates the staging
    /// directory `.NAME.partial-XXXXXX`.
    fn create(parent: &Path, name: &OsStr) -> Result<Staging, EvidenceError> {
        let prefix = format!(".{}{PARTIAL}", name.to_string_lossy());
        let context = || format!("creating a staging directory in {}", parent.display());
        for _ in 0..STAGING_ATTEMPTS {
            // tempfile picks a fresh random name and creates the file exclusively.
            let (lock, lock_path) = tempfile::Builder::new()
                .prefix(&prefix)
                .suffix(LOCK_SUFFIX)
                .rand_bytes(RANDOM_CHARS)
                .tempfile_in(parent)
                .map_err(io(context()))?
                .keep()
                .map_err(|e| io(context())(e.error))?;
            // tempfile returns an absolute path; keep the parent as the user gave it, so
            // messages name paths the way --out did.
            let lock_path = match lock_path.file_name() {
                Some(file_name) => parent.join(file_name),
                None => lock_path,
            };
            match lock.try_lock() {
                Ok(()) => {}
                // Another run's cleanup holds it for a moment, taking it for a dead run's
                // leftover; it will remove it. Take another name.
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(source)) => {
                    let _ = std::fs::remove_file(&lock_path);
                    return Err(EvidenceError::Io {
                        context: format!("locking {}", lock_path.display()),
                        source,
                    });
                }
            }
            // The same race the other way: a cleanup that locked and removed the file before we
            // locked it. Ours would then guard nothing, so take another name.
            if !same_file(&lock, &lock_path) {
                continue;
            }
            // `.NAME.partial-XXXXXX.lock` without its `.lock`.
            let dir = lock_path.with_extension("");
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    return Ok(Staging {
                        dir,
                        lock_path,
                        _lock: lock,
                        renamed: false,
                    });
                }
                // A leftover directory of the same name without a lock file: not ours to touch.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let _ = std::fs::remove_file(&lock_path);
                }
                Err(source) => {
                    let _ = std::fs::remove_file(&lock_path);
                    return Err(EvidenceError::Io {
                        context: format!("creating {}", dir.display()),
                        source,
                    });
                }
            }
        }
        Err(EvidenceError::Io {
            context: context(),
            source: io::Error::other(format!(
                "no free staging name after {STAGING_ATTEMPTS} attempts"
            )),
        })
    }

    /// Syncs the staging directory, renames it to `out` and syncs `parent`; then drop removes
    /// the lock file and releases the lock.
    fn commit(mut self, out: &Path, parent: &Path) -> Result<(), EvidenceError> {
        sync_dir(&self.dir).map_err(io(format!("syncing {}", self.dir.display())))?;
        // Re-check just before the rename: renaming onto an empty directory would succeed
        // silently.
        check_new(out)?;
        std::fs::rename(&self.dir, out).map_err(io(format!(
            "moving the finished run into {}",
            out.display()
        )))?;
        self.renamed = true;
        sync_dir(parent).map_err(io(format!(
            "syncing {} after moving the run into {} (the run is complete, but its directory \
             entry may not survive a crash)",
            parent.display(),
            out.display()
        )))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.renamed && std::fs::remove_dir_all(&self.dir).is_err() {
            // Keep the lock file: once this process has exited and the kernel has released the
            // lock, the next run recognises the directory as a dead run's and removes it.
            return;
        }
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// Whether `path` still names the file `file` has open (a lock on a file that was unlinked or
/// replaced guards nothing).
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), path.symlink_metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

/// Makes a directory's entries durable: on Unix, fsync the directory itself.
#[cfg(unix)]
fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// What [`remove_stale_staging`] did.
#[derive(Debug, Default)]
pub struct Cleanup {
    /// Staging directories of runs that are no longer alive, removed with their lock files.
    pub removed: Vec<PathBuf>,
    /// Lock files of runs that are no longer alive whose directory was already gone, removed.
    pub removed_locks: Vec<PathBuf>,
    /// Entries that matched but could not be examined or removed, and why.
    pub failed: Vec<(PathBuf, io::Error)>,
}

/// Whether `name` is a staging directory's name as [`Staging::create`] makes them:
/// `.NAME.partial-XXXXXX`, NAME not empty, XXXXXX ASCII letters and digits.
fn is_staging_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let Some(at) = rest.rfind(PARTIAL) else {
        return false;
    };
    let suffix = &rest[at + PARTIAL.len()..];
    at > 0 && !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Removes from `parent` the staging directories of runs that are no longer alive (see the
/// module comment). Touches only entries named like a staging directory or its lock file.
pub fn remove_stale_staging(parent: &Path) -> Cleanup {
    let mut cleanup = Cleanup::default();
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return cleanup,
        Err(e) => {
            cleanup.failed.push((parent.to_path_buf(), e));
            return cleanup;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                cleanup.failed.push((parent.to_path_buf(), e));
                continue;
            }
        };
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let path = entry.path();
        if is_staging_name(name) {
            if !path.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let lock_path = parent.join(format!("{name}{LOCK_SUFFIX}"));
            match claim(&lock_path) {
                Ok(Some(_lock)) => {
                    if let Err(e) = std::fs::remove_dir_all(&path) {
                        // The lock file stays, so a later run can try again.
                        cleanup.failed.push((path, e));
                        continue;
                    }
                    if let Err(e) = std::fs::remove_file(&lock_path) {
                        cleanup.failed.push((lock_path, e));
                    }
                    cleanup.removed.push(path);
                }
                // Its run is alive, or it has no lock file and is not ours to judge.
                Ok(None) => {}
                Err(e) => cleanup.failed.push((lock_path, e)),
            }
        } else if let Some(stem) = name.strip_suffix(LOCK_SUFFIX)
            && is_staging_name(stem)
        {
            let dir = parent.join(stem);
            if dir.symlink_metadata().is_ok() {
                // Handled with its directory.
                continue;
            }
            match claim(&path) {
                Ok(Some(_lock)) => {
                    // Under the lock no run can create this directory any more (a run creates
                    // it only after locking), so it stays gone.
                    if dir.symlink_metadata().is_ok() {
                        continue;
                    }
                    match std::fs::remove_file(&path) {
                        Ok(()) => cleanup.removed_locks.push(path),
                        Err(e) => cleanup.failed.push((path, e)),
                    }
                }
                Ok(None) => {}
                Err(e) => cleanup.failed.push((path, e)),
            }
        }
    }
    cleanup
}

/// Opens and locks a lock file without waiting: `Ok(None)` when it does not exist, its run
/// still holds it, or the path no longer names the file that was locked.
fn claim(lock_path: &Path) -> io::Result<Option<File>> {
    let file = match OpenOptions::new().read(true).open(lock_path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(None),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    Ok(same_file(&file, lock_path).then_some(file))
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

fn write_json<T: Serialize + ?Sized>(
    path: &Path,
    file: &'static str,
    value: &T,
) -> Result<(), EvidenceError> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|source| EvidenceError::Json { file, source })?;
    text.push('\n');
    write_file(path, text.as_bytes())
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
        A: WritableElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        let npz = |e: &dyn std::fmt::Display| EvidenceError::Npz(e.to_string());
        self.zip
            .start_file(format!("{id}_{name}.npy"), self.options)
            .map_err(|e| npz(&e))?;
        let mut member = BufWriter::new(&mut self.zip);
        array.write_npy(&mut member).map_err(|e| npz(&e))?;
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
    use crate::archive;
    use crate::manifest::Counts;
    use crate::protocol::Protocol;
    use crate::{pipeline, summary};

    /// Runs `text` into a [`Writer`] for `out`; returns the unfinished writer and what
    /// `finish` needs.
    fn run(out: &Path, text: &str) -> (Writer, Protocol, Vec<ResultRow>, Option<Timings>) {
        let protocol = Protocol::from_json(text).unwrap();
        let mut writer = Writer::create(out).unwrap();
        let record = pipeline::run(&protocol, &protocol.inputs(), 2, &mut writer, |_| {}).unwrap();
        (writer, protocol, record.rows, record.timings)
    }

    fn finish(
        writer: Writer,
        protocol: &Protocol,
        rows: &[ResultRow],
        timings: Option<&Timings>,
    ) -> Result<Manifest, EvidenceError> {
        let summary = summary::summarize(protocol, rows, timings);
        let counts = Counts {
            inputs: protocol.inputs().len(),
            comparisons: rows.len(),
            timings: timings.map_or(0, |t| t.measurements.len()),
        };
        let manifest = Manifest::new("test".into(), protocol.clone(), counts);
        let outputs = Outputs {
            protocol,
            rows,
            summary: &summary,
            timings,
        };
        writer.finish(outputs, manifest)
    }

    /// Asymmetric and symmetric settings, partial groups (N = 20 with g = 8, D = 6 with g = 4)
    /// and every budget policy, float32 windows included.
    const MIXED: &str = r#"{ "study": "mixed", "seeds": [1, 22], "tokens": [20, 8], "features": 6,
        "queries": 2, "distributions": ["clean", "recent_focus"],
        "focus": { "window": 2, "gain": 1.5 },
        "settings": [ { "group_size": 8, "bits": 4 }, { "group_size": 4, "bits": 3, "mode": "asymmetric" } ],
        "generator": { "name": "chacha20",
                       "entropy": { "seed_multiplier": 100, "tokens_multiplier": 1, "offset": 0 } },
        "budget": { "group_size": 8, "low_bits": 2, "window": 8,
                    "policies": ["uniform", "recent8", "early8", "recent_f32", "early_f32"] },
        "timing": { "warmup": 0, "repeats": 1, "shuffle_seed": 1 } }"#;

    #[test]
    fn the_written_archive_is_the_planned_one_within_the_size_estimate() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        let (writer, protocol, rows, timings) = run(&out, MIXED);
        finish(writer, &protocol, &rows, timings.as_ref()).unwrap();

        let planned = archive::members(&protocol);
        let file = File::open(out.join(ARRAYS)).unwrap();
        let size = file.metadata().unwrap().len();
        let zip = zip::ZipArchive::new(file).unwrap();
        let names: Vec<&str> = zip.file_names().collect();
        let mut written: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut want: Vec<String> = planned.iter().map(|m| format!("{}.npy", m.name)).collect();
        written.sort();
        want.sort();
        assert_eq!(written, want);
        assert_eq!(archive::member_count(&protocol), Some(planned.len() as u64));
        let estimate = archive::estimated_bytes(&planned).unwrap();
        assert!(
            size <= estimate,
            "{size} bytes written, {estimate} estimated"
        );
        // Only the .npy headers are over-estimated: at most 128 - 64 bytes each.
        assert!(
            estimate - size <= 64 * planned.len() as u64,
            "{size} bytes written, {estimate} estimated"
        );
    }

    #[test]
    fn a_zero_timing_is_refused_and_nothing_is_left_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("nested/run");
        let (writer, protocol, rows, timings) = run(&out, MIXED);
        let mut timings = timings.unwrap();
        timings.measurements[3].ns = 0;
        let err = finish(writer, &protocol, &rows, Some(&timings)).unwrap_err();
        assert!(
            matches!(&err, EvidenceError::Timing(TimingError::ZeroDuration { comparison, .. })
                if *comparison == timings.measurements[3].comparison),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn an_output_under_a_regular_file_is_refused_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("somefile");
        std::fs::write(&file, "x").unwrap();
        for out in [file.join("run"), file.join("a/b/run")] {
            match check_new(&out) {
                Err(EvidenceError::NotADirectory { ancestor, .. }) => assert_eq!(ancestor, file),
                other => panic!("{}: {other:?}", out.display()),
            }
        }
        assert!(check_new(&tmp.path().join("new/deeper/run")).is_ok());
        assert!(matches!(
            check_new(&file),
            Err(EvidenceError::Exists(path)) if path == file
        ));
    }

    #[test]
    fn staging_names_are_recognised_exactly() {
        for name in [
            ".run.partial-abc123",
            ".a.b.partial-Z9",
            ".x.partial-y.partial-QQ",
        ] {
            assert!(is_staging_name(name), "{name}");
        }
        for name in [
            "run.partial-abc123",
            "..partial-abc123",
            ".run.partial-",
            ".run.partial-abc.123",
            ".run.partial-abc123.lock",
            ".run.fresh",
        ] {
            assert!(!is_staging_name(name), "{name}");
        }
    }

    /// Fails every write after `budget` bytes with ENOSPC.
    struct SmallDisk {
        budget: usize,
        written: Vec<u8>,
    }

    impl Write for SmallDisk {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.written.len() + buf.len() > self.budget {
                return Err(io::Error::from_raw_os_error(28));
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
        assert_eq!(first.raw_os_error(), Some(28));
    }

    #[test]
    fn an_io_error_prints_its_cause_once() {
        let err = EvidenceError::Io {
            context: "writing x".into(),
            source: io::Error::from_raw_os_error(28),
        };
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(chain, "writing x: No space left on device (os error 28)");
    }
}
