//! Source pinning and provenance: the sources a manifest says produced the run must be exactly
//! the runner's own source files, and they must match the tree being audited and, where the
//! manifest says so, the git commit it records.
//!
//! - [`SOURCE_ROOTS`] is the list of files and directories the runner hashes at build time (its
//!   `build.rs`); a manifest with no sources, with other roots, or with a source outside them
//!   fails. Every regular file under those roots in the tree must be listed, and every listed
//!   file must be in the tree with the same LF-normalised SHA-256.
//! - The recorded commit must be a full hexadecimal object id; when the tree is the top of a git
//!   work tree, the commit must exist in it (a shallow clone that lacks it is noted, not failed),
//!   and when the manifest says `sources_match_commit`, every source must hash the same at that
//!   commit (`git show COMMIT:PATH`). Git is run as a separate program; the audit links none of
//!   it.

pub use crate::common::problem::SourceProblem;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use crate::common::files::{self, MAX_SOURCE_BYTES};
use crate::common::hashes::{short, source_hash};
use crate::common::manifest::Git;
use crate::common::report::{Checked, Note, Problem, Report};

/// The files and directories, relative to the workspace root, whose contents produce a run: what
/// the runner's build script hashes, listed independently here.
pub const SOURCE_ROOTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "experiments",
    "crates/bitpack/Cargo.toml",
    "crates/bitpack/src",
    "crates/gguf-file/Cargo.toml",
    "crates/gguf-file/src",
    "crates/kvcodec/Cargo.toml",
    "crates/kvcodec/src",
    "crates/models/Cargo.toml",
    "crates/models/src",
    "crates/nprand/Cargo.toml",
    "crates/nprand/src",
    "crates/quality/Cargo.toml",
    "crates/quality/src",
    "crates/runner/Cargo.toml",
    "crates/runner/build.rs",
    "crates/runner/src",
    "crates/weights/Cargo.toml",
    "crates/weights/src",
];

/// Checks a manifest's sources against the tree and its recorded commit, from the fields
/// themselves, for any manifest format that records sources the same way (the packed-KV and the
/// model-quality manifests).
pub fn check_recorded(
    tree: &Path,
    source_roots: &[String],
    sources: &BTreeMap<String, String>,
    git: Option<&Git>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, p: SourceProblem| report.fail(Problem::Source(p));
    if sources.is_empty() {
        fail(report, SourceProblem::NoSources);
    }
    let expected: BTreeSet<&str> = SOURCE_ROOTS.iter().copied().collect();
    let found: BTreeSet<&str> = source_roots.iter().map(String::as_str).collect();
    if found != expected || found.len() != source_roots.len() {
        fail(
            report,
            SourceProblem::Roots {
                found: source_roots.to_vec(),
            },
        );
        // Walking roots the manifest chose could read anywhere; stop here.
        return;
    }
    let mut listed = BTreeMap::new();
    for (path, hash) in sources {
        if under_roots(path) {
            listed.insert(path.as_str(), hash.as_str());
        } else {
            fail(report, SourceProblem::OutsideRoots { path: path.clone() });
        }
    }
    let mut in_tree = BTreeSet::new();
    for root in SOURCE_ROOTS {
        match files::confined_path(tree, root) {
            Ok(path) if path.symlink_metadata().is_ok() => {
                let walk = walkdir::WalkDir::new(&path).follow_links(false);
                for entry in walk.into_iter().flatten() {
                    if entry.file_type().is_file()
                        && let Ok(relative) = entry.path().strip_prefix(tree)
                    {
                        let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
                        in_tree.insert(parts.join("/"));
                    }
                }
            }
            _ => fail(
                report,
                SourceProblem::RootMissing {
                    root: root.to_string(),
                    tree: tree.display().to_string(),
                },
            ),
        }
    }
    for (&path, &recorded) in &listed {
        report.count(Checked::SourceHashes, 1);
        match files::read_confined(tree, path, MAX_SOURCE_BYTES) {
            Ok(bytes) => {
                let actual = source_hash(&bytes);
                if actual != recorded {
                    fail(
                        report,
                        SourceProblem::Differs {
                            path: path.to_string(),
                            recorded: short(recorded),
                            tree: short(&actual),
                        },
                    );
                }
            }
            Err(e) => fail(
                report,
                SourceProblem::NotInTree {
                    path: path.to_string(),
                    why: e.to_string(),
                },
            ),
        }
    }
    for path in in_tree.iter().filter(|p| !listed.contains_key(p.as_str())) {
        fail(report, SourceProblem::Unlisted { path: path.clone() });
    }
    report.note(Note::Tree(tree.display().to_string()));
    match git {
        Some(git) => check_commit(tree, git, &listed, report),
        None => report.note(Note::CommitNotChecked(
            "the manifest records none (the run was not made in a git work tree)".into(),
        )),
    }
}

/// Whether `path` is a plain relative path equal to, or under, one of the runner's roots.
fn under_roots(path: &str) -> bool {
    files::plain_components(path).is_ok()
        && SOURCE_ROOTS.iter().any(|root| {
            path == *root
                || path
                    .strip_prefix(root)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
}

fn check_commit(tree: &Path, git: &Git, listed: &BTreeMap<&str, &str>, report: &mut Report) {
    let commit = &git.commit;
    let hex = commit
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex || !(commit.len() == 40 || commit.len() == 64) {
        report.fail(Problem::Source(SourceProblem::CommitForm {
            commit: commit.clone(),
        }));
        return;
    }
    let run = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(tree)
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .ok()
    };
    let top = run(&["rev-parse", "--show-toplevel"])
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let is_top =
        top.is_some_and(|top| Path::new(&top).canonicalize().ok() == tree.canonicalize().ok());
    if !is_top {
        report.note(Note::CommitNotChecked(
            "the tree is not the top of a git work tree (or git is not installed)".into(),
        ));
        return;
    }
    let object = format!("{commit}^{{commit}}");
    let exists = run(&["cat-file", "-e", &object]).is_some_and(|o| o.status.success());
    if !exists {
        let shallow = run(&["rev-parse", "--is-shallow-repository"])
            .is_some_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true");
        if shallow {
            report.note(Note::CommitNotChecked(format!(
                "{commit} is not in this shallow clone"
            )));
        } else {
            report.fail(Problem::Source(SourceProblem::CommitMissing {
                commit: commit.clone(),
            }));
        }
        return;
    }
    if !git.sources_match_commit {
        return;
    }
    for (&path, &recorded) in listed {
        report.count(Checked::SourcesAtCommit, 1);
        let shown = run(&["show", &format!("{commit}:{path}")]);
        let how = match shown {
            Some(o) if o.status.success() => {
                if source_hash(&o.stdout) == recorded {
                    continue;
                }
                "differs"
            }
            _ => "does not exist",
        };
        report.fail(Problem::Source(SourceProblem::DiffersFromCommit {
            commit: commit.clone(),
            path: path.to_string(),
            how,
        }));
    }
}
