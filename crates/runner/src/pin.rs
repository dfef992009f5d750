//! The root manifest: pins archived evidence directories by the SHA-256 of every file in them.
//!
//! `runner pin evidence/packed-kv` (run from the repository root) rewrites `manifest.json` from
//! the files as they are; each directory's manifest.json must declare one of [`KNOWN_FORMATS`]
//! (`packed-kv-evidence/1` or `model-quality-evidence/1`); `audit` with no argument checks those hashes and then audits each
//! pinned directory. Paths are relative to the root manifest's own directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::manifest::sha256_file;

pub const ROOT_MANIFEST_FORMAT: &str = "evidence-pins/1";

/// The evidence formats a pinned directory's manifest.json may declare (the audit picks its
/// checker by this field).
pub const KNOWN_FORMATS: [&str; 2] = [
    crate::manifest::MANIFEST_FORMAT,
    crate::quality_study::QUALITY_MANIFEST_FORMAT,
];

/// The `format` member of a run's manifest.json, or why there is none we know.
fn manifest_format(path: &Path) -> Result<String, PinError> {
    let text = std::fs::read_to_string(path).map_err(io(format!("reading {}", path.display())))?;
    let value: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    let format = match value.get("format").and_then(|f| f.as_str()) {
        Some(format) => format.to_string(),
        None => "missing".to_string(),
    };
    if KNOWN_FORMATS.contains(&format.as_str()) {
        Ok(format)
    } else {
        Err(PinError::UnknownFormat {
            path: path.to_path_buf(),
            format,
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
    #[error("evidence directory {0} holds a subdirectory {1}; pinned directories are flat")]
    Nested(PathBuf, String),
    #[error("evidence directory {0} holds no manifest.json; is it a run?")]
    NotARun(PathBuf),
    #[error(
        "{} is not a run's manifest: its `format` is {format}, not one of {}",
        path.display(),
        KNOWN_FORMATS.join(", ")
    )]
    UnknownFormat { path: PathBuf, format: String },
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

/// Hashes every file of each directory and writes the root manifest at `manifest_path`.
pub fn pin(manifest_path: &Path, dirs: &[PathBuf]) -> Result<RootManifest, PinError> {
    let base = manifest_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut evidence = BTreeMap::new();
    for dir in dirs {
        if dir.is_absolute() {
            return Err(PinError::Absolute(dir.clone()));
        }
        let full = base.join(dir);
        if !full.join("manifest.json").is_file() {
            return Err(PinError::NotARun(full));
        }
        manifest_format(&full.join("manifest.json"))?;
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
        let key: Vec<_> = dir.iter().map(|p| p.to_string_lossy()).collect();
        evidence.insert(key.join("/"), PinnedDir { files });
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
    let mut builder = tempfile::Builder::new();
    // tempfile creates private (0600) files; the manifest is an ordinary file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
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
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn an_unreadable_file_is_reported_once_with_its_cause() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("manifest.json"),
            r#"{ "format": "model-quality-evidence/1" }"#,
        )
        .unwrap();
        // A dangling link cannot be hashed.
        std::os::unix::fs::symlink(tmp.path().join("gone"), dir.join("dangling")).unwrap();
        let err = pin(&tmp.path().join("manifest.json"), &[PathBuf::from("run")]).unwrap_err();
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
    use super::*;

    #[test]
    fn both_evidence_formats_are_pinned_and_an_unknown_one_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for (name, format) in [
            ("kv", "packed-kv-evidence/1"),
            ("quality", "model-quality-evidence/1"),
            ("odd", "other/1"),
        ] {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            let manifest = format!(r#"{{ "format": "{format}" }}"#);
            std::fs::write(dir.join("manifest.json"), manifest).unwrap();
        }
        let root = tmp.path().join("manifest.json");
        let pinned = pin(&root, &[PathBuf::from("kv"), PathBuf::from("quality")]).unwrap();
        assert_eq!(
            pinned.evidence.keys().collect::<Vec<_>>(),
            ["kv", "quality"]
        );
        let err = pin(&root, &[PathBuf::from("odd")]).unwrap_err();
        assert!(
            matches!(&err, PinError::UnknownFormat { format, .. } if format == "other/1"),
            "{err}"
        );
    }
}
