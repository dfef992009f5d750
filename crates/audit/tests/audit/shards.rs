//! Shards and merged runs: each shard audits on its own (its slice re-derived, its counts and
//! run table checked), a merge of them audits like any run, and what makes a shard a shard, or
//! a merge a merge, is checked.

use audit::timings::TimingProblem;
use audit::{Checked, Problem};

use crate::support::{SMALL, assert_pass, assert_problem, audit, edit_json, make_shard, rehash};

/// The small protocol's 12 inputs in 5 shards, and their merge.
fn shards_and_merge() -> (
    tempfile::TempDir,
    Vec<std::path::PathBuf>,
    std::path::PathBuf,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = (1..=5)
        .map(|index| {
            let dir = tmp.path().join(format!("shard-{index}"));
            make_shard(SMALL, Some((index, 5)), &dir);
            dir
        })
        .collect();
    let merged = tmp.path().join("merged");
    kvstudy::merge::merge(&merged, &dirs).unwrap();
    (tmp, dirs, merged)
}

#[test]
fn each_shard_and_their_merge_pass() {
    let (_tmp, dirs, merged) = shards_and_merge();
    let mut inputs = 0;
    for dir in &dirs {
        let report = audit(dir);
        assert_pass(&report);
        inputs += report.counted(Checked::InputsRederived);
    }
    assert_eq!(inputs, 12, "the slices cover every input once");
    let report = audit(&merged);
    assert_pass(&report);
    assert_eq!(report.counted(Checked::InputsRederived), 12);
}

#[test]
fn what_makes_a_shard_or_a_merge_is_checked() {
    let (_tmp, dirs, merged) = shards_and_merge();
    // A shard claiming another slice: its rows and arrays are not that slice's.
    edit_json(&dirs[1], "manifest.json", |m| {
        m["shard"]["index"] = 3.into()
    });
    rehash(&dirs[1]);
    assert!(!audit(&dirs[1]).passed());
    // A shard whose protocol hash is not its protocol's.
    edit_json(&dirs[2], "manifest.json", |m| {
        m["shard"]["protocol_sha256"] = "0".repeat(64).into()
    });
    assert_problem(&audit(&dirs[2]), "protocol hash", |p| {
        matches!(
            p,
            Problem::Manifest {
                field: "shard.protocol_sha256",
                ..
            }
        )
    });
    // A slice that cannot be.
    edit_json(&dirs[3], "manifest.json", |m| {
        m["shard"]["index"] = 6.into()
    });
    assert_problem(&audit(&dirs[3]), "index", |p| {
        matches!(p, Problem::Manifest { field: "shard", .. })
    });
    // A merged run whose timings do not say which shard made them.
    edit_json(&merged, "timings.json", |t| {
        t["measurements"][0]
            .as_object_mut()
            .unwrap()
            .remove("shard");
    });
    rehash(&merged);
    assert_problem(&audit(&merged), "shard of a measurement", |p| {
        matches!(p, Problem::Timings(TimingProblem::Measurements { .. }))
    });
    // A merge record that is not 1 to N.
    edit_json(&merged, "manifest.json", |m| {
        m["merged_from"][0]["index"] = 2.into()
    });
    assert_problem(&audit(&merged), "merged_from", |p| {
        matches!(
            p,
            Problem::Manifest {
                field: "merged_from",
                ..
            }
        )
    });
}
