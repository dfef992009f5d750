//! The root manifest: pins archived evidence directories by the SHA-256 of every file in them.
//!
//! `runner pin evidence/packed-kv` (run from the repository root) adds or updates that
//! directory's pin in `manifest.json` from the files as they are and keeps every other pin;
//! `--replace-all` makes the given directories the whole set. Each directory must audit PASS
//! first (the binary passes the audit in as the check, see [`pin`]) and its manifest.json must
//! declare one of the formats the caller knows (the runner: `packed-kv-evidence/1` and
//! `model-quality-evidence/2`); this crate knows no study, so it is told both.
//! `audit` with no argument checks those hashes and then audits each pinned directory. Paths are
//! relative to the root manifest's own directory. Nothing is written unless every directory
//! passes, and the manifest is replaced atomically.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::hashing::sha256_file;

pub const ROOT_MANIFEST_FORMAT: &str = "evidence-pins/1";

/// The `format` member of a run's manifest.json, or why it is none of `known`.
fn manifest_format(path: &Path, known: &[&str]) -> Result<String, PinError> {
    let text = std::fs::read_to_string(path).map_err(io(format!("reading {}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let format = match value.get("format").and_then(|f| f.as_str()) {
        Some(format) => format.to_string(),
        None => "missing".to_string(),
    };
    if known.contains(&format.as_str()) {
        Ok(format)
    } else {
        Err(PinError::UnknownFormat {
            path: path.to_path_buf(),
            format,
            known: known.join(", "),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootManifest {
    pub format: String,
    pub about: String,
    /// Pinned directories, keyed by path relative to this manifest, '/'-separated.
    pub evidence: BTreeMap<String, PinnedDir>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PinnedDir {
    /// SHA-256 of every file's raw bytes, keyed by file name.
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PinError {
    #[error("evidence path {0} must be relative to the root manifest's directory")]
    Absolute(PathBuf),
    /// A path that leaves the root manifest's tree (`..`), names its directory itself, or has a
    /// component the root audit refuses (not UTF-8, a backslash): its pin would fail the whole
    /// root manifest's audit.
    #[error(
        "evidence path {} is not a directory inside the root manifest's tree ({}): give a path \
         of plain names below {}, without `..`",
        dir.display(),
        why,
        base.display()
    )]
    OutsideTree {
        /// The path given.
        dir: PathBuf,
        /// What is wrong with it.
        why: &'static str,
        /// The root manifest's directory.
        base: PathBuf,
    },
    /// A symbolic link on the way to (or as) the directory: the root audit does not follow
    /// links, so the pin would fail it.
    #[error(
        "evidence path {} passes through the symbolic link {}; the audit does not follow links, \
         so pin the directory by its real path inside the root manifest's tree",
        dir.display(),
        link.display()
    )]
    Symlink {
        /// The path given.
        dir: PathBuf,
        /// The link met on the way.
        link: PathBuf,
    },
    #[error("evidence directory {0} holds a subdirectory {1}; pinned directories are flat")]
    Nested(PathBuf, String),
    #[error("evidence directory {0} holds no manifest.json; is it a run?")]
    NotARun(PathBuf),
    /// The directory does not pass the audit; nothing was written.
    #[error(
        "{} does not pass the audit, so nothing was pinned (run `audit {}` for the whole \
         report):\n{report}",
        dir.display(),
        dir.display()
    )]
    AuditFailed { dir: PathBuf, report: String },
    /// The existing root manifest cannot be read as one; it is left as it is.
    #[error(
        "{} is not a root manifest ({reason}); fix it, or write a new one with \
         `runner pin --replace-all DIR...`",
        path.display()
    )]
    NotARootManifest { path: PathBuf, reason: String },
    #[error(
        "{} is not a run's manifest: its `format` is {format}, not one of {known}",
        path.display()
    )]
    UnknownFormat {
        path: PathBuf,
        format: String,
        known: String,
    },
    /// The cause is the source, so it is printed once, after the context.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(context: String) -> impl FnOnce(std::io::Error) -> PinError {
    move |source| PinError::Io { context, source }
}

/// Whether `runner pin` keeps the pins it is not given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinScope {
    /// Add or update the given directories' pins; keep the others (the default).
    Update,
    /// The given directories become the whole set; every other pin is dropped.
    ReplaceAll,
}

/// What happened to each pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinChange {
    /// Not pinned before.
    Added,
    /// Pinned before with other hashes.
    Updated,
    /// Pinned before with the same hashes.
    Unchanged,
    /// Pinned before and not given: kept as it was ([`PinScope::Update`]).
    Kept,
    /// Pinned before and not given: dropped ([`PinScope::ReplaceAll`]).
    Dropped,
}

/// The manifest written and what changed, per directory key.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinned {
    pub manifest: RootManifest,
    pub changes: BTreeMap<String, PinChange>,
}

/// Reads the root manifest at `path`; None if there is none yet.
fn read_root(path: &Path) -> Result<Option<RootManifest>, PinError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("reading {}", path.display()))(e)),
    };
    match serde_json::from_str::<RootManifest>(&text) {
        Ok(root) if root.format == ROOT_MANIFEST_FORMAT => Ok(Some(root)),
        Ok(root) => Err(PinError::NotARootManifest {
            path: path.to_path_buf(),
            reason: format!(
                "its `format` is {}, not {ROOT_MANIFEST_FORMAT}",
                root.format
            ),
        }),
        Err(e) => Err(PinError::NotARootManifest {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// The plain names of `dir` below `base` (the root manifest's directory): the pin's key, as the
/// root audit reads it (`evidence/packed-kv`). Refused: `..` anywhere (a directory outside the
/// tree, or one reached by leaving and re-entering it), a path naming `base` itself, a name
/// that is not UTF-8 or holds a backslash, and a symbolic link at any step from `base` (the
/// audit reaches a pinned directory one name at a time and follows no link). A leading `./` is
/// dropped.
fn tree_path(base: &Path, dir: &Path) -> Result<Vec<String>, PinError> {
    use std::path::Component;
    let outside = |why| PinError::OutsideTree {
        dir: dir.to_path_buf(),
        why,
        base: base.to_path_buf(),
    };
    let mut names = Vec::new();
    let mut at = base.to_path_buf();
    for component in dir.components() {
        let name = match component {
            Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir => return Err(outside("`..` leaves the tree")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(PinError::Absolute(dir.to_path_buf()));
            }
        };
        let name = name
            .to_str()
            .filter(|n| !n.contains('\\'))
            .ok_or_else(|| outside("a name that is not UTF-8 or holds a backslash"))?;
        at.push(name);
        if at
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(PinError::Symlink {
                dir: dir.to_path_buf(),
                link: at,
            });
        }
        names.push(name.to_string());
    }
    if names.is_empty() {
        return Err(outside("it names the root manifest's directory itself"));
    }
    Ok(names)
}

/// Pins each directory in the root manifest at `manifest_path`: its manifest.json must declare one
/// of the `formats` the caller knows and `check` must accept it (the binary runs the audit),
/// then every file in it is hashed. With [`PinScope::Update`] the other
/// pins are kept. Nothing is written unless every directory is accepted.
pub fn pin(
    manifest_path: &Path,
    dirs: &[PathBuf],
    scope: PinScope,
    formats: &[&str],
    check: &dyn Fn(&Path) -> Result<(), String>,
) -> Result<Pinned, PinError> {
    let base = manifest_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let before = match read_root(manifest_path) {
        Ok(root) => root.map(|r| r.evidence).unwrap_or_default(),
        // A manifest that cannot be read is never silently replaced by a smaller one.
        Err(e) if scope == PinScope::Update => return Err(e),
        Err(_) => BTreeMap::new(),
    };
    let mut evidence = BTreeMap::new();
    for dir in dirs {
        if dir.is_absolute() {
            return Err(PinError::Absolute(dir.clone()));
        }
        let names = tree_path(base, dir)?;
        // Named as given when the root manifest is in the current directory.
        let full = if base == Path::new(".") {
            dir.clone()
        } else {
            base.join(dir)
        };
        if !full.join("manifest.json").is_file() {
            return Err(PinError::NotARun(full));
        }
        manifest_format(&full.join("manifest.json"), formats)?;
        check(&full).map_err(|report| PinError::AuditFailed {
            dir: full.clone(),
            report,
        })?;
        let mut files = BTreeMap::new();
        let entries =
            std::fs::read_dir(&full).map_err(io(format!("reading {}", full.display())))?;
        for entry in entries {
            let entry = entry.map_err(io(format!("reading {}", full.display())))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_dir() {
                return Err(PinError::Nested(full, name));
            }
            let hash = sha256_file(&entry.path())
                .map_err(io(format!("hashing {}", entry.path().display())))?;
            files.insert(name, hash);
        }
        evidence.insert(names.join("/"), PinnedDir { files });
    }
    let mut changes = BTreeMap::new();
    for (key, pinned) in &evidence {
        let change = match before.get(key) {
            None => PinChange::Added,
            Some(old) if old == pinned => PinChange::Unchanged,
            Some(_) => PinChange::Updated,
        };
        changes.insert(key.clone(), change);
    }
    for (key, pinned) in before {
        if evidence.contains_key(&key) {
            continue;
        }
        match scope {
            PinScope::Update => {
                changes.insert(key.clone(), PinChange::Kept);
                evidence.insert(key, pinned);
            }
            PinScope::ReplaceAll => {
                changes.insert(key, PinChange::Dropped);
            }
        }
    }
    let root = RootManifest {
        format: ROOT_MANIFEST_FORMAT.into(),
        about: "Pins the archived evidence: `audit` with no argument checks these hashes, then \
                audits each directory. Refresh with `runner pin`, never by hand."
            .into(),
        evidence,
    };
    let mut text = serde_json::to_string_pretty(&root).expect("a root manifest serializes");
    text.push('\n');
    // tempfile creates private (0600) files; the manifest is an ordinary file.
    #[cfg(unix)]
    let builder = {
        use std::os::unix::fs::PermissionsExt;
        let mut builder = tempfile::Builder::new();
        builder.permissions(std::fs::Permissions::from_mode(0o666));
        builder
    };
    #[cfg(not(unix))]
    let builder = tempfile::Builder::new();
    let mut tmp = builder.tempfile_in(base).map_err(io(format!(
        "creating a temporary file in {}",
        base.display()
    )))?;
    tmp.write_all(text.as_bytes())
        .map_err(io(format!("writing {}", manifest_path.display())))?;
    tmp.persist(manifest_path).map_err(|e| PinError::Io {
        context: format!("replacing {}", manifest_path.display()),
        source: e.error,
    })?;
    Ok(Pinned {
        manifest: root,
        changes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formats the runner pins.
    pub(super) const FORMATS: &[&str] = &["packed-kv-evidence/1", "model-quality-evidence/2"];

    /// A check that accepts every directory (the binary's is the audit).
    pub(super) fn accept(_: &Path) -> Result<(), String> {
        Ok(())
    }

    /// A directory `name` under `root` that looks like a run, holding `extra` as one more file.
    pub(super) fn fake_run(root: &Path, name: &str, extra: &str) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("manifest.json"),
            r#"{ "format": "packed-kv-evidence/1" }"#,
        )
        .unwrap();
        std::fs::write(dir.join("results.json"), extra).unwrap();
    }

    fn keys(pinned: &RootManifest) -> Vec<&str> {
        pinned.evidence.keys().map(String::as_str).collect()
    }

    #[test]
    fn pinning_one_directory_keeps_the_others_and_replacing_all_needs_asking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("manifest.json");
        for name in ["evidence/a", "evidence/b", "evidence/c"] {
            fake_run(tmp.path(), name, "[]");
        }
        let dirs = |names: &[&str]| names.iter().map(PathBuf::from).collect::<Vec<_>>();
        let first = pin(
            &root,
            &dirs(&["evidence/a", "evidence/b"]),
            PinScope::Update,
            FORMATS,
            &accept,
        );
        let first = first.unwrap();
        assert_eq!(keys(&first.manifest), ["evidence/a", "evidence/b"]);
        assert!(first.changes.values().all(|c| *c == PinChange::Added));

        // Re-pinning b after a change updates b only; a is kept as it was; c is added.
        fake_run(tmp.path(), "evidence/b", "[1]");
        let second = pin(
            &root,
            &dirs(&["evidence/b", "evidence/c"]),
            PinScope::Update,
            FORMATS,
            &accept,
        );
        let second = second.unwrap();
        assert_eq!(
            keys(&second.manifest),
            ["evidence/a", "evidence/b", "evidence/c"]
        );
        assert_eq!(second.changes["evidence/a"], PinChange::Kept);
        assert_eq!(second.changes["evidence/b"], PinChange::Updated);
        assert_eq!(second.changes["evidence/c"], PinChange::Added);
        assert_eq!(
            second.manifest.evidence["evidence/a"],
            first.manifest.evidence["evidence/a"]
        );
        let written: RootManifest =
            serde_json::from_str(&std::fs::read_to_string(&root).unwrap()).unwrap();
        assert_eq!(written, second.manifest);

        let third = pin(
            &root,
            &dirs(&["evidence/c"]),
            PinScope::ReplaceAll,
            FORMATS,
            &accept,
        )
        .unwrap();
        assert_eq!(keys(&third.manifest), ["evidence/c"]);
        assert_eq!(third.changes["evidence/a"], PinChange::Dropped);
        assert_eq!(third.changes["evidence/c"], PinChange::Unchanged);
    }

    #[test]
    fn a_directory_the_check_refuses_is_not_pinned_and_nothing_is_written() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("manifest.json");
        fake_run(tmp.path(), "good", "[]");
        fake_run(tmp.path(), "bad", "[]");
        pin(
            &root,
            &[PathBuf::from("good")],
            PinScope::Update,
            FORMATS,
            &accept,
        )
        .unwrap();
        let before = std::fs::read(&root).unwrap();
        let refuse_bad = |dir: &Path| {
            if dir.ends_with("bad") {
                Err("FAIL bad\n  FAIL: results.json: 3 rows, expected 4".to_string())
            } else {
                Ok(())
            }
        };
        let dirs = [PathBuf::from("good"), PathBuf::from("bad")];
        let err = pin(&root, &dirs, PinScope::ReplaceAll, FORMATS, &refuse_bad).unwrap_err();
        let PinError::AuditFailed { dir, report } = &err else {
            panic!("{err:?}");
        };
        assert!(dir.ends_with("bad"));
        assert!(report.contains("3 rows, expected 4"));
        assert!(err.to_string().contains("audit "), "{err}");
        assert_eq!(std::fs::read(&root).unwrap(), before);
    }

    /// `runner pin ../x` used to write the key `../x`, which the root audit refuses, failing the
    /// whole root manifest: a path outside the tree (or through a link) is refused, nothing
    /// written; a leading `./` is dropped from the key.
    #[test]
    fn a_directory_outside_the_root_manifests_tree_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("repo");
        fake_run(&base, "evidence/a", "[]");
        fake_run(tmp.path(), "outside", "[]");
        let root = base.join("manifest.json");
        for dir in [
            "../outside",
            "evidence/../../outside",
            "evidence/../evidence/a",
            ".",
            "./",
        ] {
            let err = pin(
                &root,
                &[PathBuf::from(dir)],
                PinScope::Update,
                FORMATS,
                &accept,
            )
            .unwrap_err();
            assert!(
                matches!(err, PinError::OutsideTree { .. }),
                "{dir}: {err:?}"
            );
            assert!(
                err.to_string().contains("inside the root manifest's tree"),
                "{err}"
            );
        }
        assert!(!root.exists(), "nothing written");
        let pinned = pin(
            &root,
            &[PathBuf::from("./evidence/a")],
            PinScope::Update,
            FORMATS,
            &accept,
        )
        .unwrap();
        assert_eq!(keys(&pinned.manifest), ["evidence/a"]);
        #[cfg(unix)]
        {
            let before = std::fs::read(&root).unwrap();
            std::os::unix::fs::symlink(tmp.path().join("outside"), base.join("link")).unwrap();
            std::os::unix::fs::symlink(base.join("evidence"), base.join("ev")).unwrap();
            for dir in ["link", "ev/a"] {
                let err = pin(
                    &root,
                    &[PathBuf::from(dir)],
                    PinScope::Update,
                    FORMATS,
                    &accept,
                )
                .unwrap_err();
                assert!(
                    matches!(&err, PinError::Symlink { link, .. } if link.ends_with(dir.split('/').next().unwrap())),
                    "{dir}: {err:?}"
                );
            }
            assert_eq!(std::fs::read(&root).unwrap(), before);
        }
    }

    #[test]
    fn an_unreadable_root_manifest_is_left_alone_unless_replaced_on_purpose() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("manifest.json");
        fake_run(tmp.path(), "run", "[]");
        std::fs::write(&root, "{ not json").unwrap();
        let run = [PathBuf::from("run")];
        let err = pin(&root, &run, PinScope::Update, FORMATS, &accept).unwrap_err();
        assert!(matches!(err, PinError::NotARootManifest { .. }), "{err:?}");
        assert!(err.to_string().contains("--replace-all"), "{err}");
        assert_eq!(std::fs::read_to_string(&root).unwrap(), "{ not json");
        let replaced = pin(&root, &run, PinScope::ReplaceAll, FORMATS, &accept).unwrap();
        assert_eq!(keys(&replaced.manifest), ["run"]);
    }

    #[cfg(unix)]
    #[test]
    fn an_unreadable_file_is_reported_once_with_its_cause() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("manifest.json"),
            r#"{ "format": "model-quality-evidence/2" }"#,
        )
        .unwrap();
        // A dangling link cannot be hashed.
        std::os::unix::fs::symlink(tmp.path().join("gone"), dir.join("dangling")).unwrap();
        let err = pin(
            &tmp.path().join("manifest.json"),
            &[PathBuf::from("run")],
            PinScope::Update,
            FORMATS,
            &accept,
        )
        .unwrap_err();
        let PinError::Io { context, source } = &err else {
            panic!("{err:?}");
        };
        assert!(context.starts_with("hashing ") && context.ends_with("dangling"));
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(chain.matches("os error 2").count(), 1, "{chain}");
    }
}

#[cfg(test)]
mod format_tests {
    use super::tests::{FORMATS, accept};
    use super::*;

    #[test]
    fn both_evidence_formats_are_pinned_and_an_unknown_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, format) in [
            ("kv", "packed-kv-evidence/1"),
            ("quality", "model-quality-evidence/2"),
            ("odd", "other/1"),
        ] {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            let manifest = format!(r#"{{ "format": "{format}" }}"#);
            std::fs::write(dir.join("manifest.json"), manifest).unwrap();
        }
        let root = tmp.path().join("manifest.json");
        let dirs = [PathBuf::from("kv"), PathBuf::from("quality")];
        let pinned = pin(&root, &dirs, PinScope::Update, FORMATS, &accept).unwrap();
        assert_eq!(
            pinned.manifest.evidence.keys().collect::<Vec<_>>(),
            ["kv", "quality"]
        );
        let err = pin(
            &root,
            &[PathBuf::from("odd")],
            PinScope::Update,
            FORMATS,
            &accept,
        )
        .unwrap_err();
        assert!(
            matches!(&err, PinError::UnknownFormat { format, .. } if format == "other/1"),
            "{err}"
        );
    }
}
