//! Where an evidence directory is made, and how it survives a crash.
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
//!   the parent is fsynced after it, so a run reported as written survives a crash. Windows has
//!   no directory fsync: there the rename is made with `MoveFileExW(MOVEFILE_WRITE_THROUGH)`,
//!   which returns once the move is on disk, and a lock file's identity (is it still the file
//!   this run locked?) is its file index.
//! - On any error (a full disk, say) the staging directory, its lock file and any parent
//!   directories this run created are removed, and the error is reported once.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{EvidenceError, io};

/// Between an output name and the random suffix of its staging directory.
const PARTIAL: &str = ".partial-";
/// Appended to a staging directory's name to name its lock file.
const LOCK_SUFFIX: &str = ".lock";
/// Random characters in a staging name.
const RANDOM_CHARS: usize = 6;
/// Names tried before giving up on claiming a staging directory (each failure means a race with
/// another run or a leftover of the same random name, both rare).
const STAGING_ATTEMPTS: usize = 16;

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

/// Creates `parent` and its missing ancestors; returns those this call created, deepest first,
/// so a failed run can remove them again.
pub(crate) fn create_parent(parent: &Path) -> Result<Vec<PathBuf>, EvidenceError> {
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
pub(crate) struct Staging {
    pub(crate) dir: PathBuf,
    lock_path: PathBuf,
    /// Held (locked) for as long as this value lives.
    _lock: File,
    renamed: bool,
}

impl Staging {
    /// Creates and locks `.NAME.partial-XXXXXX.lock` in `parent`, then creates the staging
    /// directory `.NAME.partial-XXXXXX`.
    pub(crate) fn create(parent: &Path, name: &OsStr) -> Result<Staging, EvidenceError> {
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
    pub(crate) fn commit(mut self, out: &Path, parent: &Path) -> Result<(), EvidenceError> {
        sync_dir(&self.dir).map_err(io(format!("syncing {}", self.dir.display())))?;
        // Re-check just before the rename: renaming onto an empty directory would succeed
        // silently.
        check_new(out)?;
        move_into_place(&self.dir, out).map_err(io(format!(
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

/// On Windows a file's identity within a volume is its file index; the lock file and the path
/// are in one directory, so on one volume. (The volume serial number is not compared: Wine 8.0
/// reports different ones for two handles to one file.)
#[cfg(windows)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::windows::fs::OpenOptionsExt;
    use windows_sys::Win32::Storage::FileSystem::{
        FILE_FLAG_BACKUP_SEMANTICS, FILE_FLAG_OPEN_REPARSE_POINT, FILE_SHARE_DELETE,
        FILE_SHARE_READ, FILE_SHARE_WRITE,
    };
    // Opened for its attributes only, sharing everything, through no reparse point.
    let other = std::fs::OpenOptions::new()
        .access_mode(0)
        .share_mode(FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE)
        .custom_flags(FILE_FLAG_BACKUP_SEMANTICS | FILE_FLAG_OPEN_REPARSE_POINT)
        .open(path);
    match (file_id(file), other.map(|other| file_id(&other))) {
        (Some(a), Ok(Some(b))) => a == b,
        _ => false,
    }
}

/// The file index of an open file.
#[cfg(windows)]
fn file_id(file: &File) -> Option<(u32, u32)> {
    use std::os::windows::io::AsRawHandle;
    use windows_sys::Win32::Storage::FileSystem::{
        BY_HANDLE_FILE_INFORMATION, GetFileInformationByHandle,
    };
    // SAFETY: zeroed is a valid BY_HANDLE_FILE_INFORMATION (integers and FILETIMEs); the handle
    // is `file`'s, open for the call.
    let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
    let ok = unsafe { GetFileInformationByHandle(file.as_raw_handle(), &mut info) };
    (ok != 0).then_some((info.nFileIndexHigh, info.nFileIndexLow))
}

#[cfg(not(any(unix, windows)))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

/// Makes a directory's entries durable: on Unix, fsync the directory itself. Windows cannot
/// open a directory for syncing; there the rename itself is written through ([`move_into_place`]).
#[cfg(unix)]
fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

#[cfg(not(unix))]
fn sync_dir(_path: &Path) -> io::Result<()> {
    Ok(())
}

/// Renames the finished staging directory to `out`. On Windows with `MOVEFILE_WRITE_THROUGH`,
/// which returns only once the move is on disk (and never replaces an existing `out`).
#[cfg(not(windows))]
fn move_into_place(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)
}

#[cfg(windows)]
fn move_into_place(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::windows::ffi::OsStrExt;
    use windows_sys::Win32::Storage::FileSystem::{MOVEFILE_WRITE_THROUGH, MoveFileExW};
    let wide = |p: &Path| -> Vec<u16> { p.as_os_str().encode_wide().chain([0]).collect() };
    let (from, to) = (wide(from), wide(to));
    // SAFETY: two NUL-terminated UTF-16 strings that outlive the call.
    if unsafe { MoveFileExW(from.as_ptr(), to.as_ptr(), MOVEFILE_WRITE_THROUGH) } != 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[cfg(windows)]
    #[test]
    fn on_windows_a_file_is_told_apart_by_identity_and_the_move_is_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a.lock"), tmp.path().join("b.lock"));
        std::fs::write(&a, "a").unwrap();
        std::fs::write(&b, "b").unwrap();
        let file = File::open(&a).unwrap();
        assert!(same_file(&file, &a));
        assert!(!same_file(&file, &b), "another file");
        assert!(!same_file(&file, &tmp.path().join("gone")), "nothing there");
        std::fs::rename(&a, tmp.path().join("moved")).unwrap();
        assert!(!same_file(&file, &a), "the name no longer names the file");
        assert!(same_file(&file, &tmp.path().join("moved")));

        let staged = tmp.path().join(".run.partial-abc123");
        std::fs::create_dir(&staged).unwrap();
        std::fs::write(staged.join("results.json"), "{}").unwrap();
        let out = tmp.path().join("run");
        move_into_place(&staged, &out).unwrap();
        assert_eq!(std::fs::read(out.join("results.json")).unwrap(), b"{}");
        // Never onto something that exists.
        std::fs::create_dir(&staged).unwrap();
        assert!(move_into_place(&staged, &out).is_err());
        assert!(staged.is_dir());
    }
}
