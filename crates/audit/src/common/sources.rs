//! Source pinning and provenance: the sources a manifest says produced the run must be exactly
//! the runner's own source files, at the git commit it records or, failing that, in the tree
//! being audited.
//!
//! - [`SOURCE_ROOTS`] is the list of files and directories the runner hashes at build time (the
//!   evidence crate's `build.rs`); a manifest with no sources, with other roots, or with a source
//!   outside them fails.
//! - **At the recorded commit**, when the manifest records one and says `sources_match_commit`
//!   (the run was made from a clean checkout) and the tree is the top of a git work tree that
//!   holds that commit: every regular file under the roots at that commit must be listed, and
//!   every listed file must be there with the same LF-normalised SHA-256 (`git ls-tree`,
//!   `git cat-file --batch`). Archived evidence is thereby tied to the commit that made it, not
//!   to the working tree: a later change to a source (a comment, say) does not fail its audit,
//!   and the report notes how many sources the tree has changed since (`scripts/refresh-evidence
//!   --check` says whether the archive is stale). Git is run as a separate program; the audit
//!   links none of it.
//! - **Against the tree** otherwise (no commit recorded, uncommitted sources, no git, a commit
//!   this clone lacks): every regular file under the roots in the tree must be listed, and every
//!   listed file must be in the tree with the same LF-normalised SHA-256. A recorded commit must
//!   still be a full hexadecimal object id, and must exist unless the clone is shallow.

pub use crate::common::problem::SourceProblem;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::files::{self, MAX_SOURCE_BYTES};
use crate::common::hashes::{short, source_hash};
use crate::common::manifest::Git;
use crate::common::report::{Checked, Note, Problem, Report};

/// The files and directories, relative to the workspace root, whose contents produce a run: what
/// the evidence crate's build script hashes, listed independently here.
pub const SOURCE_ROOTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "experiments",
    "crates/bitpack/Cargo.toml",
    "crates/bitpack/src",
    "crates/evidence/Cargo.toml",
    "crates/evidence/build.rs",
    "crates/evidence/src",
    "crates/gguf-file/Cargo.toml",
    "crates/gguf-file/src",
    "crates/kvcodec/Cargo.toml",
    "crates/kvcodec/src",
    "crates/kvschemes/Cargo.toml",
    "crates/kvschemes/src",
    "crates/kvstudy/Cargo.toml",
    "crates/kvstudy/src",
    "crates/models/Cargo.toml",
    "crates/models/src",
    "crates/nprand/Cargo.toml",
    "crates/nprand/src",
    "crates/quality/Cargo.toml",
    "crates/quality/src",
    "crates/runner/Cargo.toml",
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
    match commit_to_check(tree, git, report) {
        Some(commit) => check_at_commit(tree, &commit, &listed, report),
        None => check_tree(tree, &listed, report),
    }
}

/// Checks the listed sources against the tree: every regular file under the roots listed, every
/// listed file there with its recorded hash.
fn check_tree(tree: &Path, listed: &BTreeMap<&str, &str>, report: &mut Report) {
    let comparison = compare_tree(tree, listed);
    report.count(Checked::SourceHashes, listed.len());
    for problem in comparison.problems(tree) {
        report.fail(Problem::Source(problem));
    }
    report.note(Note::Tree(tree.display().to_string()));
}

/// How the tree's sources differ from the listed ones.
#[derive(Default)]
struct TreeComparison {
    /// Roots the tree lacks.
    missing_roots: Vec<String>,
    /// Listed files whose hash differs: (path, recorded, tree).
    differs: Vec<(String, String, String)>,
    /// Listed files the tree does not hold as a regular file, and why.
    not_in_tree: Vec<(String, String)>,
    /// Regular files under the roots that are not listed.
    unlisted: Vec<String>,
}

impl TreeComparison {
    /// Files that differ, are missing or were added (a missing root counts through its files).
    fn changed(&self) -> usize {
        self.differs.len() + self.not_in_tree.len() + self.unlisted.len()
    }

    fn problems(self, tree: &Path) -> Vec<SourceProblem> {
        let tree = tree.display().to_string();
        let roots = self
            .missing_roots
            .into_iter()
            .map(|root| SourceProblem::RootMissing {
                root,
                tree: tree.clone(),
            });
        let differs =
            self.differs
                .into_iter()
                .map(|(path, recorded, tree)| SourceProblem::Differs {
                    path,
                    recorded: short(&recorded),
                    tree: short(&tree),
                });
        let missing = self
            .not_in_tree
            .into_iter()
            .map(|(path, why)| SourceProblem::NotInTree { path, why });
        let unlisted = self
            .unlisted
            .into_iter()
            .map(|path| SourceProblem::Unlisted { path });
        roots
            .chain(differs)
            .chain(missing)
            .chain(unlisted)
            .collect()
    }
}

/// The tree's regular files under the roots, hashed and compared with `listed`.
fn compare_tree(tree: &Path, listed: &BTreeMap<&str, &str>) -> TreeComparison {
    let mut comparison = TreeComparison::default();
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
            _ => comparison.missing_roots.push(root.to_string()),
        }
    }
    for (&path, &recorded) in listed {
        match files::read_confined(tree, path, MAX_SOURCE_BYTES) {
            Ok(bytes) => {
                let actual = source_hash(&bytes);
                if actual != recorded {
                    comparison
                        .differs
                        .push((path.to_string(), recorded.to_string(), actual));
                }
            }
            Err(e) => comparison
                .not_in_tree
                .push((path.to_string(), e.to_string())),
        }
    }
    comparison.unlisted = in_tree
        .into_iter()
        .filter(|p| !listed.contains_key(p.as_str()))
        .collect();
    comparison
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

/// Runs git in `tree` with no input; None if it cannot be started.
fn git(tree: &Path, args: &[&str]) -> Option<Output> {
    Command::new("git")
        .arg("-C")
        .arg(tree)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
}

/// The recorded commit, when the sources are to be checked at it (see the module comment);
/// otherwise None, having failed a malformed or missing commit and noted why it is not used.
fn commit_to_check(tree: &Path, git_record: Option<&Git>, report: &mut Report) -> Option<String> {
    let Some(git_record) = git_record else {
        report.note(Note::CommitNotChecked(
            "the manifest records none (the run was not made in a git work tree)".into(),
        ));
        return None;
    };
    let commit = &git_record.commit;
    let hex = commit
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex || !(commit.len() == 40 || commit.len() == 64) {
        report.fail(Problem::Source(SourceProblem::CommitForm {
            commit: commit.clone(),
        }));
        return None;
    }
    let top = git(tree, &["rev-parse", "--show-toplevel"])
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let is_top =
        top.is_some_and(|top| Path::new(&top).canonicalize().ok() == tree.canonicalize().ok());
    if !is_top {
        report.note(Note::CommitNotChecked(
            "the tree is not the top of a git work tree (or git is not installed)".into(),
        ));
        return None;
    }
    let object = format!("{commit}^{{commit}}");
    let exists = git(tree, &["cat-file", "-e", &object]).is_some_and(|o| o.status.success());
    if !exists {
        let shallow = git(tree, &["rev-parse", "--is-shallow-repository"])
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
        return None;
    }
    if !git_record.sources_match_commit {
        report.note(Note::CommitNotChecked(format!(
            "the run was made from sources that differ from {commit} (sources_match_commit is \
             false)"
        )));
        return None;
    }
    Some(commit.clone())
}

/// Checks the listed sources at `commit`: every regular file under the roots there listed, every
/// listed file there with its recorded hash; then notes how far the tree has moved on. Falls
/// back to the tree if git cannot list or read the commit.
fn check_at_commit(tree: &Path, commit: &str, listed: &BTreeMap<&str, &str>, report: &mut Report) {
    let at_commit = match files_at(tree, commit).and_then(|paths| {
        let blobs = blobs_at(tree, commit, listed.keys().copied())?;
        Ok((paths, blobs))
    }) {
        Ok(found) => found,
        Err(why) => {
            report.note(Note::CommitNotChecked(format!(
                "git could not read {commit} ({why})"
            )));
            return check_tree(tree, listed, report);
        }
    };
    let (paths, blobs) = at_commit;
    for (&path, &recorded) in listed {
        report.count(Checked::SourcesAtCommit, 1);
        let how = match blobs.get(path) {
            Some(Some(bytes)) if paths.contains(path) => {
                if source_hash(bytes) == recorded {
                    continue;
                }
                "differs"
            }
            _ => "does not exist",
        };
        report.fail(Problem::Source(SourceProblem::DiffersFromCommit {
            commit: commit.to_string(),
            path: path.to_string(),
            how,
        }));
    }
    for path in paths.iter().filter(|p| !listed.contains_key(p.as_str())) {
        report.fail(Problem::Source(SourceProblem::UnlistedAtCommit {
            commit: commit.to_string(),
            path: path.clone(),
        }));
    }
    report.note(Note::Commit {
        commit: commit.to_string(),
        changed_in_tree: compare_tree(tree, listed).changed(),
    });
}

/// The regular files (modes 100644 and 100755; not links or submodules) under the roots at
/// `commit`, as '/'-separated paths from the top of the repository.
fn files_at(tree: &Path, commit: &str) -> Result<BTreeSet<String>, String> {
    let mut args = vec!["ls-tree", "-r", "-z", "--full-tree", commit, "--"];
    args.extend(SOURCE_ROOTS);
    let out = git(tree, &args).ok_or("git did not start")?;
    if !out.status.success() {
        return Err(format!("git ls-tree exited with {}", out.status));
    }
    let mut paths = BTreeSet::new();
    // Each entry: "<mode> <type> <object>\t<path>\0".
    for entry in out.stdout.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        let text = std::str::from_utf8(entry).map_err(|_| "a path that is not UTF-8")?;
        let (meta, path) = text.split_once('\t').ok_or("an entry without a path")?;
        if meta.starts_with("100644 blob ") || meta.starts_with("100755 blob ") {
            paths.insert(path.to_string());
        }
    }
    Ok(paths)
}

/// The bytes of each path at `commit` (None where there is no blob), read through one
/// `git cat-file --batch`; each size is checked against [`MAX_SOURCE_BYTES`] before reading.
fn blobs_at<'a>(
    tree: &Path,
    commit: &str,
    paths: impl Iterator<Item = &'a str>,
) -> Result<BTreeMap<String, Option<Vec<u8>>>, String> {
    let mut child = Command::new("git")
        .arg("-C")
        .arg(tree)
        .args(["cat-file", "--batch"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("git did not start: {e}"))?;
    let read = (|| {
        let mut input = child.stdin.take().ok_or("no stdin")?;
        let mut output = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut blobs = BTreeMap::new();
        let failed = |e: std::io::Error| format!("talking to git cat-file: {e}");
        for path in paths {
            // One request at a time, so neither pipe can fill while the other waits.
            writeln!(input, "{commit}:{path}").map_err(failed)?;
            input.flush().map_err(failed)?;
            let mut header = String::new();
            output.read_line(&mut header).map_err(failed)?;
            // "<object> <type> <size>", or "<name> missing".
            let fields: Vec<&str> = header.split_whitespace().collect();
            let blob = match fields.as_slice() {
                [_, kind, size] => {
                    let size: u64 = size.parse().map_err(|_| format!("a header {header:?}"))?;
                    if size > MAX_SOURCE_BYTES {
                        return Err(format!("{path} has {size} bytes at {commit}"));
                    }
                    let mut bytes = vec![0; size as usize + 1];
                    output.read_exact(&mut bytes).map_err(failed)?;
                    bytes.pop();
                    (*kind == "blob").then_some(bytes)
                }
                _ => None,
            };
            blobs.insert(path.to_string(), blob);
        }
        Ok(blobs)
    })();
    let _ = child.kill();
    let _ = child.wait();
    read
}
