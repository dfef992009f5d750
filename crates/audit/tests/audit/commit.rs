//! Archived evidence is tied to the commit that made it: its sources are checked at the recorded
//! commit, so a later change in the working tree (a comment) does not fail its audit, while a
//! forged hash, an unlisted file or a run from uncommitted sources still does.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use audit::common::hashes::source_hash;
use audit::common::manifest::Git;
use audit::common::sources::{SOURCE_ROOTS, SourceProblem, check_recorded};
use audit::{Note, Problem, Report};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .expect("git starts");
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A repository holding every source root (a file for a file root, one file in a directory
/// root), committed; returns its commit.
fn repository(dir: &Path) -> String {
    git(dir, &["init", "-q"]);
    for root in SOURCE_ROOTS {
        let path = dir.join(root);
        let file = if root.contains('.') {
            path
        } else {
            path.join("lib.rs")
        };
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, format!("// {root}\n")).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "sources"]);
    git(dir, &["rev-parse", "HEAD"])
}

/// Every committed file with its source hash, as a clean run's manifest lists them.
fn listed(dir: &Path) -> BTreeMap<String, String> {
    git(dir, &["ls-files"])
        .lines()
        .map(|p| {
            (
                p.to_string(),
                source_hash(&std::fs::read(dir.join(p)).unwrap()),
            )
        })
        .collect()
}

fn check(dir: &Path, sources: &BTreeMap<String, String>, git: &Git) -> Report {
    let roots: Vec<String> = SOURCE_ROOTS.iter().map(|r| r.to_string()).collect();
    let mut report = Report::new("sources");
    check_recorded(dir, &roots, sources, Some(git), &mut report);
    report
}

fn source_problems(report: &Report) -> Vec<SourceProblem> {
    report
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::Source(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_comment_added_after_the_commit_does_not_fail_the_audit_a_forged_hash_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().canonicalize().unwrap();
    let commit = repository(&dir);
    let sources = listed(&dir);
    let at_commit = Git {
        commit: commit.clone(),
        sources_match_commit: true,
    };

    let report = check(&dir, &sources, &at_commit);
    assert!(report.passed(), "{}", report.render());
    assert!(
        report.notes.contains(&Note::Commit {
            commit: commit.clone(),
            changed_in_tree: 0
        }),
        "{:?}",
        report.notes
    );

    // The tree moves on: a comment. The evidence is still what its commit produced.
    std::fs::write(
        dir.join("crates/kvcodec/src/lib.rs"),
        "// crates/kvcodec/src\n// A comment.\n",
    )
    .unwrap();
    let report = check(&dir, &sources, &at_commit);
    assert!(report.passed(), "{}", report.render());
    assert!(report.notes.contains(&Note::Commit {
        commit: commit.clone(),
        changed_in_tree: 1
    }));

    // A hash the commit does not have fails, whatever the tree holds.
    let mut forged = sources.clone();
    forged.insert(
        "crates/kvcodec/src/lib.rs".into(),
        source_hash(b"// crates/kvcodec/src\n// A comment.\n"),
    );
    let problems = source_problems(&check(&dir, &forged, &at_commit));
    assert!(
        matches!(problems.as_slice(), [SourceProblem::DiffersFromCommit { path, how: "differs", .. }]
            if path == "crates/kvcodec/src/lib.rs"),
        "{problems:?}"
    );

    // A file under the roots at the commit that the manifest leaves out fails.
    let mut partial = sources.clone();
    partial.remove("Cargo.toml");
    let problems = source_problems(&check(&dir, &partial, &at_commit));
    assert!(
        matches!(problems.as_slice(), [SourceProblem::UnlistedAtCommit { path, .. }] if path == "Cargo.toml"),
        "{problems:?}"
    );

    // A run from uncommitted sources is checked against the tree, which has moved on.
    let uncommitted = Git {
        commit,
        sources_match_commit: false,
    };
    let problems = source_problems(&check(&dir, &sources, &uncommitted));
    assert!(
        matches!(problems.as_slice(), [SourceProblem::Differs { path, .. }] if path == "crates/kvcodec/src/lib.rs"),
        "{problems:?}"
    );
}
