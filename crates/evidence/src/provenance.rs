//! Provenance: what produced a run. The tool and the crates it was built from, the platform, the
//! git commit, and the SHA-256 of every source file that can change a study's output.
//!
//! Source hashes are computed at build time (see build.rs) over LF-normalised bytes, so a binary
//! run outside the repository still knows them; the git commit is read at run time from the
//! workspace the binary was built in, when there is one.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::hashing::source_hash;

/// The name every study's manifest records as its tool: the `runner` binary, whichever crate
/// wrote the files.
pub const TOOL_NAME: &str = "runner";

/// Build-time facts: SOURCE_ROOTS, SOURCES, CRATE_VERSIONS, RUSTC_VERSION, TARGET, PROFILE,
/// WORKSPACE_ROOT.
pub mod build_info {
    include!(concat!(env!("OUT_DIR"), "/build_info.rs"));
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    pub version: String,
    pub rustc: String,
    pub profile: String,
    pub crates: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Git {
    pub commit: String,
    /// False when a source file differs from that commit (the run came from uncommitted code).
    pub sources_match_commit: bool,
}

impl Tool {
    /// The runner: its name and version, rustc, profile and the recorded crates' versions.
    pub fn current() -> Tool {
        Tool {
            name: TOOL_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            rustc: build_info::RUSTC_VERSION.into(),
            profile: build_info::PROFILE.into(),
            crates: build_info::CRATE_VERSIONS
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }
}

impl Platform {
    /// The platform this binary runs on.
    pub fn current() -> Platform {
        Platform {
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            target: build_info::TARGET.into(),
        }
    }
}

/// The source roots the build script hashed under, as the manifest records them.
pub fn source_roots() -> Vec<String> {
    build_info::SOURCE_ROOTS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The build-time source hashes.
pub fn source_hashes() -> BTreeMap<String, String> {
    build_info::SOURCES
        .iter()
        .map(|(p, h)| (p.to_string(), h.to_string()))
        .collect()
}

/// The commit the binary's workspace is at, and whether the sources match it.
pub fn git_info() -> Option<Git> {
    let root = build_info::WORKSPACE_ROOT;
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"])?;
    let mut status_args = vec!["status", "--porcelain", "--"];
    status_args.extend(build_info::SOURCE_ROOTS);
    let status = git(&status_args)?;
    // The build-time hashes must also match the tree, or the binary is older than the checkout.
    Some(Git {
        commit,
        sources_match_commit: status.is_empty() && build_differs_from_checkout().is_none(),
    })
}

/// How the checkout this binary was built in differs from what it was built from, if it does:
/// the first source file (under the source roots) added, removed or changed since the build.
/// A binary older than its checkout writes evidence whose recorded sources are not its commit's,
/// which the audit refuses; the runner warns before it runs.
pub fn build_differs_from_checkout() -> Option<String> {
    let root = Path::new(build_info::WORKSPACE_ROOT);
    if !root.is_dir() {
        return None; // installed elsewhere: there is no checkout to compare
    }
    differs(root, build_info::SOURCE_ROOTS, build_info::SOURCES)
}

/// [`build_differs_from_checkout`] for `built` (path, hash) files under `roots` of `root`.
fn differs(root: &Path, roots: &[&str], built: &[(&str, &str)]) -> Option<String> {
    let built: BTreeMap<&str, &str> = built.iter().copied().collect();
    for source_root in roots {
        for entry in walkdir::WalkDir::new(root.join(source_root))
            .into_iter()
            .flatten()
        {
            if !entry.file_type().is_file() {
                continue;
            }
            let Ok(relative) = entry.path().strip_prefix(root) else {
                continue;
            };
            let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
            let path = parts.join("/");
            if !built.contains_key(path.as_str()) {
                return Some(format!("{path} was added since the build"));
            }
        }
    }
    for (path, hash) in built {
        match std::fs::read(root.join(path)) {
            Err(_) => return Some(format!("{path} was removed since the build")),
            Ok(bytes) if source_hash(&bytes) != hash => {
                return Some(format!("{path} changed since the build"));
            }
            Ok(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkout_that_is_not_what_was_built_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/a.rs"), "fn a() {}\n").unwrap();
        let hash = source_hash(b"fn a() {}\n");
        let built = [("src/a.rs", hash.as_str())];
        assert_eq!(differs(root, &["src"], &built), None);
        // The same file with Windows line endings is the same source.
        std::fs::write(root.join("src/a.rs"), "fn a() {}\r\n").unwrap();
        assert_eq!(differs(root, &["src"], &built), None);
        std::fs::write(root.join("src/b.rs"), "").unwrap();
        assert_eq!(
            differs(root, &["src"], &built).as_deref(),
            Some("src/b.rs was added since the build")
        );
        std::fs::remove_file(root.join("src/b.rs")).unwrap();
        std::fs::write(root.join("src/a.rs"), "fn b() {}\n").unwrap();
        assert_eq!(
            differs(root, &["src"], &built).as_deref(),
            Some("src/a.rs changed since the build")
        );
        std::fs::remove_file(root.join("src/a.rs")).unwrap();
        assert_eq!(
            differs(root, &["src"], &built).as_deref(),
            Some("src/a.rs was removed since the build")
        );
    }
}
