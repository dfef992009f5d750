//! The attacks of the "audit that trusts nothing" issue, each with every hash rewritten to match
//! (and, where it matters, everything downstream recomputed), each ending in a FAIL that names
//! it: never a PASS, a panic, a hang or an abort.

use std::path::Path;

use audit::Problem;
#[cfg(unix)]
use audit::common::files::FileError;
use audit::common::npz::{NpyError, NpzError, ZipError};
use audit::common::sources::SourceProblem;
use ndarray::Array2;

use crate::support::{
    SMALL, array, assert_problem, audit, copy_of, edit_arrays, edit_json, edit_text, make_run,
    rehash, small_copy, workspace,
};

/// Attack 1: A run made with another entropy rule, relabelled as the recorded protocol, fails on its
/// first input, re-derived.
#[test]
fn inputs_from_another_entropy_rule_are_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    make_run(&SMALL.replace("\"offset\": 0", "\"offset\": 1"), &dir);
    edit_json(&dir, "manifest.json", |m| {
        m["protocol"]["generator"]["entropy"]["offset"] = 0.into();
    });
    rehash(&dir);
    assert_problem(
        &audit(&dir),
        "input",
        |p| matches!(p, Problem::Input { array, .. } if array == "s3_n24_recent_focus_q"),
    );
}

/// Attack 1: Two seeds' arrays swapped together with their rows (and everything else renamed to
/// match) fail: the arrays are not their seeds' draws.
#[test]
fn swapped_seeds_are_caught() {
    let (_tmp, dir) = small_copy();
    let swap = |name: &str| {
        if let Some(rest) = name.strip_prefix("s3_") {
            format!("s5_{rest}")
        } else if let Some(rest) = name.strip_prefix("s5_") {
            format!("s3_{rest}")
        } else {
            name.to_string()
        }
    };
    edit_arrays(&dir, |arrays| {
        for (name, _) in arrays.iter_mut() {
            *name = swap(name);
        }
    });
    edit_json(&dir, "results.json", |rows| {
        let rows = rows.as_array_mut().unwrap();
        for row in rows.iter_mut() {
            for field in ["id", "input"] {
                row[field] = swap(row[field].as_str().unwrap()).into();
            }
            row["seed"] = (8 - row["seed"].as_u64().unwrap()).into();
        }
        // Back into run order, as an honest file would be.
        let half = rows.len() / 2;
        rows.rotate_left(half);
    });
    edit_json(&dir, "timings.json", |t| {
        for m in t["measurements"].as_array_mut().unwrap() {
            m["comparison"] = swap(m["comparison"].as_str().unwrap()).into();
        }
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "input",
        |p| matches!(p, Problem::Input { array, .. } if array == "s3_n24_recent_focus_q"),
    );
    assert!(
        !report
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Results(_))),
        "the rows themselves are consistent:\n{}",
        report.render()
    );
}

/// Attack 2: An honest archive with a forged one appended (its own end record last, so Python's zipfile
/// and NumPy read the forged arrays) is refused: the audit reads one layout only.
#[test]
fn an_appended_second_archive_is_refused() {
    let (_tmp, dir) = small_copy();
    let honest = std::fs::read(dir.join("arrays.npz")).unwrap();
    let (_tmp2, forged_dir) = small_copy();
    edit_arrays(&forged_dir, |arrays| {
        array(arrays, "s3_n24_clean_g8_b4_out").f64()[[0, 0]] += 1.0;
    });
    let forged = std::fs::read(forged_dir.join("arrays.npz")).unwrap();
    std::fs::write(dir.join("arrays.npz"), [honest, forged].concat()).unwrap();
    rehash(&dir);
    assert_problem(&audit(&dir), "archive", |p| {
        matches!(
            p,
            Problem::Archive(NpzError::Zip(ZipError::DirectoryBounds { .. }))
        )
    });
}

/// Attack 3: The focus shift is checked whatever the order of the distributions: the small protocol
/// lists `recent_focus` first. A gain of 5 relabelled as 2 (summary.md's run table with it) fails.
#[test]
fn a_relabelled_focus_gain_is_caught_in_any_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    make_run(&SMALL.replace("\"gain\": 2.0", "\"gain\": 5.0"), &dir);
    edit_json(&dir, "manifest.json", |m| {
        m["protocol"]["focus"]["gain"] = 2.0.into()
    });
    edit_text(&dir, "summary.md", |md| {
        let lines: Vec<String> = md
            .lines()
            .map(|l| match l.strip_suffix(" 5 |") {
                Some(head) if l.starts_with("| focus gain") => format!("{head} 2 |"),
                _ => l.to_string(),
            })
            .collect();
        lines.join("\n") + "\n"
    });
    rehash(&dir);
    assert_problem(
        &audit(&dir),
        "focus",
        |p| matches!(p, Problem::Input { array, .. } if array == "s3_n24_recent_focus_k"),
    );
}

/// Attack 4: An extra file listed in the manifest (and present) fails: a directory holds exactly what a
/// run writes. (The other readers' views, summary.md and the chart, are in `tampering`.)
#[test]
fn an_extra_claims_file_fails() {
    let (_tmp, dir) = small_copy();
    std::fs::write(dir.join("CLAIMS.md"), "This method is lossless.\n").unwrap();
    edit_json(&dir, "manifest.json", |m| {
        m["outputs"]["CLAIMS.md"] = "0".into()
    });
    rehash(&dir);
    let report = audit(&dir);
    assert_problem(
        &report,
        "listing",
        |p| matches!(p, Problem::UnexpectedListing { name } if name == "CLAIMS.md"),
    );
    assert_problem(
        &report,
        "file",
        |p| matches!(p, Problem::UnexpectedFile { name } if name == "CLAIMS.md"),
    );
}

/// Attack 5: Source pinning is mandatory: no sources, other roots, or a source outside the roots fail,
/// whatever tree is given.
#[test]
fn source_pinning_cannot_be_dropped_or_redirected() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["source_roots"] = serde_json::json!([]);
        m["sources"] = serde_json::json!({});
    });
    let report = audit::audit_dir(&dir, Path::new("/nonexistent"));
    assert_problem(&report, "no sources", |p| {
        matches!(p, Problem::Source(SourceProblem::NoSources))
    });
    assert_problem(&report, "roots", |p| {
        matches!(p, Problem::Source(SourceProblem::Roots { .. }))
    });

    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["source_roots"] = serde_json::json!(["/"])
    });
    assert_problem(
        &audit(&dir),
        "root /",
        |p| matches!(p, Problem::Source(SourceProblem::Roots { found }) if found == &["/"]),
    );

    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["sources"]["crates/runner/src/../../../../etc/passwd"] = "0".into();
    });
    assert_problem(&audit(&dir), "outside", |p| {
        matches!(p, Problem::Source(SourceProblem::OutsideRoots { .. }))
    });

    // A tree that differs from the sources is named file by file.
    let (tmp, dir) = small_copy();
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("experiments/packed-kv")).unwrap();
    std::fs::write(tree.join("experiments/packed-kv/protocol.json"), "{}\n").unwrap();
    let report = audit::audit_dir(&dir, &tree);
    assert_problem(
        &report,
        "differs",
        |p| matches!(p, Problem::Source(SourceProblem::Differs { path, .. }) if path == "experiments/packed-kv/protocol.json"),
    );
    assert_problem(
        &report,
        "not in tree",
        |p| matches!(p, Problem::Source(SourceProblem::NotInTree { path, .. }) if path == "crates/kvcodec/src/lib.rs"),
    );
}

/// Attack 5: A recorded commit must exist, and sources said to match it must.
#[test]
fn git_provenance_is_checked() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["git"] = serde_json::json!({ "commit": "0123456789abcdef0123456789abcdef01234567", "sources_match_commit": false });
    });
    let report = audit(&dir);
    let shallow = report
        .notes
        .iter()
        .any(|n| matches!(n, audit::Note::CommitNotChecked(_)));
    if !shallow {
        assert_problem(&report, "missing commit", |p| {
            matches!(p, Problem::Source(SourceProblem::CommitMissing { .. }))
        });
    }
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["git"] = serde_json::json!({ "commit": "--output=/tmp/x", "sources_match_commit": true });
    });
    assert_problem(&audit(&dir), "commit form", |p| {
        matches!(p, Problem::Source(SourceProblem::CommitForm { .. }))
    });
}

/// Attack 6: A code flipped to the other side of a near-tie stays within scale/2 of its input; with its
/// output, metrics, summary, table and chart all recomputed to match, only the rule catches it.
#[test]
fn a_code_flipped_near_a_tie_is_caught_by_the_rule() {
    let (_tmp, dir) = copy_of(&workspace().join("evidence/packed-kv"));
    let archive =
        audit::common::npz::Archive::new(std::fs::read(dir.join("arrays.npz")).unwrap()).unwrap();
    // Among the 8-bit V codes (feature axis, no padding at D = 32), the element nearest a tie.
    let mut best: Option<(f64, String, usize, u8)> = None;
    for name in archive
        .names()
        .iter()
        .filter(|n| n.contains("_b8_v_codes") && !n.contains("budget"))
    {
        let id = name.trim_end_matches("_v_codes");
        let input = &id[..id.rfind("_g").unwrap()];
        let group: usize = id[id.rfind("_g").unwrap() + 2..id.rfind("_b").unwrap()]
            .parse()
            .unwrap();
        let tokens: usize = input.split('_').nth(1).unwrap()[1..].parse().unwrap();
        let v = archive
            .matrix::<f32>(&format!("{input}_v"), [tokens, 32])
            .unwrap();
        let scales = archive
            .matrix::<f32>(&format!("{id}_v_scales"), [tokens, 32 / group])
            .unwrap();
        let codes = archive.data(name).unwrap();
        for ((t, f), &x) in v.indexed_iter() {
            let scale = scales[[t, f / group]];
            let r = f64::from(x / scale);
            let stored = i32::from(codes[t * 32 + f]);
            let other = if r > f64::from(stored - 127) {
                stored + 1
            } else {
                stored - 1
            };
            let error = (f64::from(other - 127) - r).abs();
            if (0..=254).contains(&other) && best.as_ref().is_none_or(|b| error < b.0) {
                best = Some((error, name.clone(), t * 32 + f, other as u8));
            }
        }
    }
    let (error, name, position, other) = best.unwrap();
    assert!(
        error <= 0.5 + 254.0 / f64::from(1u32 << 22),
        "no near-tie: {error}"
    );
    let id = name.trim_end_matches("_v_codes").to_string();
    edit_arrays(&dir, |arrays| array(arrays, &name).u8()[[position]] = other);
    forge_downstream(&dir, &id);
    let report = audit(&dir);
    assert_problem(
        &report,
        "code rule",
        |p| matches!(p, Problem::Code { array, count: 1, .. } if *array == name),
    );
    assert_eq!(
        report.problems.len(),
        1,
        "only the rule catches it:\n{}",
        report.render()
    );
}

/// Recomputes, as a forger would, everything that depends on comparison `id`'s codes: its
/// output, its results row, the summary means, the summary.md tables and the chart marker.
fn forge_downstream(dir: &Path, id: &str) {
    use audit::packed_kv::decoder::{Grid, GroupAxis, decode, offsets};
    let archive =
        audit::common::npz::Archive::new(std::fs::read(dir.join("arrays.npz")).unwrap()).unwrap();
    let input = &id[..id.rfind("_g").unwrap()];
    let group: usize = id[id.rfind("_g").unwrap() + 2..id.rfind("_b").unwrap()]
        .parse()
        .unwrap();
    let tokens: usize = input.split('_').nth(1).unwrap()[1..].parse().unwrap();
    let decoded = |tensor: &str, axis| {
        let grid = Grid {
            tokens,
            features: 32,
            group_size: group,
            bits: 8,
            axis,
            mode: audit::packed_kv::protocol::Mode::Symmetric,
        };
        let (rows, _, groups) = grid.view();
        let scales = archive
            .matrix::<f32>(&format!("{id}_{tensor}_scales"), [rows, groups])
            .unwrap();
        let codes = archive.data(&format!("{id}_{tensor}_codes")).unwrap();
        decode(&grid, &codes, scales.view(), &offsets(&grid, &[]))
    };
    let q = archive
        .matrix::<f32>(&format!("{input}_q"), [4, 32])
        .unwrap()
        .mapv(f64::from);
    let reference = archive
        .matrix::<f64>(&format!("{input}_ref"), [4, 32])
        .unwrap();
    let out = audit::packed_kv::attention::attention(
        q.view(),
        decoded("k", GroupAxis::Token).view(),
        decoded("v", GroupAxis::Feature).view(),
    );
    edit_arrays(dir, |arrays| {
        let slot = array(arrays, &format!("{id}_out")).f64();
        slot.assign(&out.clone().into_dyn());
    });
    let diff: Array2<f64> = &out - &reference;
    let frob = |a: &Array2<f64>| a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let relative_l2 = frob(&diff) / frob(&reference);
    let max_abs = diff.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let mut rows = Vec::new();
    edit_json(dir, "results.json", |all| {
        for row in all.as_array_mut().unwrap() {
            if row["id"] == id {
                row["relative_l2"] = relative_l2.into();
                row["max_abs"] = max_abs.into();
            }
        }
        rows = all.as_array().unwrap().clone();
    });
    // The setting's means, in run order, as the runner computes them.
    let label = &id[input.len() + 1..];
    let distribution = input.splitn(3, '_').nth(2).unwrap().to_string();
    let mean = |keep: &dyn Fn(&serde_json::Value) -> bool| {
        let values: Vec<f64> = rows
            .iter()
            .filter(|r| r["id"].as_str().unwrap().ends_with(&format!("_{label}")) && keep(r))
            .map(|r| r["relative_l2"].as_f64().unwrap())
            .collect();
        values.iter().sum::<f64>() / values.len() as f64
    };
    let clean = mean(&|r| r["distribution"] == "clean");
    let by_distribution = mean(&|r| r["distribution"] == distribution.as_str());
    let at_length = mean(&|r| r["distribution"] == distribution.as_str() && r["tokens"] == tokens);
    let mut old_cells = Vec::new();
    edit_json(dir, "summary.json", |summary| {
        for row in summary["packed_kv"].as_array_mut().unwrap() {
            let this = format!("g{}_b{}", row["group_size"], row["bits"]);
            if this == label {
                old_cells.push(
                    row["mean_relative_l2_clean_percent"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                );
                old_cells.push(format!(
                    "{:.3}",
                    row["mean_relative_l2"][&distribution].as_f64().unwrap() * 100.0
                ));
                row["mean_relative_l2_clean"] = clean.into();
                row["mean_relative_l2_clean_percent"] = format!("{:.3}", clean * 100.0).into();
                row["mean_relative_l2"][&distribution] = by_distribution.into();
            }
        }
    });
    // A one-step change of one 8-bit code moves no mean by a printed digit; if it did, the forger
    // would rewrite that cell too.
    assert_eq!(old_cells[0], format!("{:.3}", clean * 100.0));
    assert_eq!(old_cells[1], format!("{:.3}", by_distribution * 100.0));
    edit_text(dir, "error-vs-bytes.svg", |svg| {
        svg.lines()
            .map(|line| {
                let marker = format!("data-config=\"{label}\" data-distribution=\"{distribution}\" data-tokens=\"{tokens}\"");
                if line.contains(&marker) {
                    let start = line.find("data-relative-l2=\"").unwrap() + 18;
                    let end = start + line[start..].find('"').unwrap();
                    format!("{}{at_length:?}{}", &line[..start], &line[end..])
                } else {
                    line.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
            + "\n"
    });
    rehash(dir);
}

/// Attack 7: The audit reads only the files a run writes, as regular files inside the directory: a
/// listed path outside it, a link to /dev/zero and a FIFO each fail at once.
#[cfg(unix)]
#[test]
fn reads_are_confined_to_regular_files_in_the_directory() {
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["outputs"]["../../etc/passwd"] = "0".into();
        m["outputs"]["/dev/zero"] = "0".into();
    });
    std::fs::remove_file(dir.join("arrays.npz")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("arrays.npz")).unwrap();
    std::fs::remove_file(dir.join("results.json")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.join("results.json"))
        .status();
    assert!(made.is_ok_and(|s| s.success()));
    let report = audit(&dir);
    assert_problem(
        &report,
        "outside path",
        |p| matches!(p, Problem::UnexpectedListing { name } if name == "../../etc/passwd"),
    );
    assert_problem(
        &report,
        "absolute path",
        |p| matches!(p, Problem::UnexpectedListing { name } if name == "/dev/zero"),
    );
    assert_problem(&report, "link", |p| {
        matches!(p, Problem::File(FileError::Symlink { .. }))
    });
    assert_problem(&report, "fifo", |p| {
        matches!(p, Problem::File(FileError::NotRegular { .. }))
    });

    // A root manifest pinning a directory outside its own.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("manifest.json");
    std::fs::write(
        &root,
        r#"{"format": "evidence-pins/1", "about": "", "evidence": {"../..": {"files": {}}}}"#,
    )
    .unwrap();
    let reports = audit::audit_pins(&root, &workspace());
    assert!(
        reports[0]
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Pin(_))),
        "{}",
        reports[0].render()
    );
}

/// Attack 8: A member whose header declares a huge shape over a few bytes is refused before anything is
/// allocated, and so is a protocol whose sizes the runner would refuse.
#[test]
fn huge_declared_sizes_fail_without_allocating() {
    let (_tmp, dir) = small_copy();
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default());
    zip.start_file("s3_n24_recent_focus_q.npy", options)
        .unwrap();
    let mut header =
        b"{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776)}"
            .to_vec();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut member = b"\x93NUMPY\x01\x00".to_vec();
    member.extend((header.len() as u16).to_le_bytes());
    member.extend(header);
    member.extend([0u8; 16]);
    std::io::Write::write_all(&mut zip, &member).unwrap();
    std::fs::write(dir.join("arrays.npz"), zip.finish().unwrap().into_inner()).unwrap();
    rehash(&dir);
    assert_problem(&audit(&dir), "huge shape", |p| {
        matches!(
            p,
            Problem::Archive(NpzError::Npy {
                error: NpyError::Shape { .. } | NpyError::DataSize { .. },
                ..
            })
        )
    });

    for (field, value) in [("group_size", 1u64 << 62), ("group_size", 1 << 32)] {
        let (_tmp, dir) = small_copy();
        edit_json(&dir, "manifest.json", |m| {
            m["protocol"]["settings"][0][field] = value.into()
        });
        assert_problem(&audit(&dir), "protocol", |p| {
            matches!(p, Problem::Protocol(_))
        });
    }
    let (_tmp, dir) = small_copy();
    edit_json(&dir, "manifest.json", |m| {
        m["protocol"]["budget"]["group_size"] = (1u64 << 40).into()
    });
    assert_problem(&audit(&dir), "budget protocol", |p| {
        matches!(p, Problem::Protocol(_))
    });
}

/// The root-manifest flow: a forged directory re-pinned with `runner pin` passes the pin hashes
/// but fails its own audit.
#[test]
fn re_pinning_a_forged_directory_does_not_make_it_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("evidence/small");
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(crate::support::small_run()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    edit_arrays(&dir, |arrays| {
        array(arrays, "s5_n40_clean_k").f32()[[0, 0]] = 0.0;
    });
    rehash(&dir);
    let root = tmp.path().join("manifest.json");
    // `runner pin` would refuse it; an adversary writes the pins without that check.
    let skip_audit = |_: &Path| Ok(());
    let dirs = [Path::new("evidence/small").to_path_buf()];
    evidence::pin::pin(
        &root,
        &dirs,
        evidence::pin::PinScope::Update,
        &["packed-kv-evidence/1"],
        &skip_audit,
    )
    .unwrap();
    let reports = audit::audit_pins(&root, &workspace());
    assert!(reports[0].passed(), "{}", reports[0].render());
    assert!(!reports[1].passed());
    assert!(
        reports[1]
            .problems
            .iter()
            .any(|p| matches!(p, Problem::Input { array, first: [0, 0], .. } if array == "s5_n40_clean_k")),
        "{}",
        reports[1].render()
    );
}
