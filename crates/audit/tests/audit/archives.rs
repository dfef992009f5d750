//! Hostile archives, made by `tests/data/npz/make_hostile.py` with NumPy beside each one's
//! reading in `expected.json`: each is refused by the rule it breaks, and every archive the audit
//! accepts (the fixtures and the archived evidence) is read exactly as NumPy reads it.

use std::path::{Path, PathBuf};

use audit::common::npz::{Archive, NpzError};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::support::workspace;

#[derive(Deserialize)]
struct Expected {
    archives: Vec<Fixture>,
    evidence: Vec<Evidence>,
}

#[derive(Deserialize)]
struct Fixture {
    file: String,
    about: String,
    audit: Verdict,
    numpy: NumpyReading,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Verdict {
    Accept(String),
    Refuse(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumpyReading {
    Arrays {
        arrays: Vec<NumpyArray>,
    },
    Error {
        #[allow(dead_code)] // Shown when a test fails: what NumPy said.
        error: String,
    },
}

#[derive(Deserialize)]
struct NumpyArray {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    fortran: bool,
    sha256: String,
}

#[derive(Deserialize)]
struct Evidence {
    path: String,
    file_sha256: String,
    arrays: usize,
    digest: String,
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/npz")
}

fn expected() -> Expected {
    let text = std::fs::read_to_string(data_dir().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// What the audit reads, in NumPy's terms: (name, dtype, shape, sha256 of the data), by name.
fn reading(archive: &Archive) -> Vec<(String, String, Vec<usize>, String)> {
    let mut out: Vec<_> = archive
        .names()
        .iter()
        .map(|name| {
            let info = archive.info(name).unwrap();
            let data = archive.data(name).unwrap();
            (
                name.clone(),
                info.dtype.descr().to_string(),
                info.shape.clone(),
                hex::encode(Sha256::digest(data)),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn hostile_archives_are_refused_by_the_rule_they_break() {
    let expected = expected();
    assert!(expected.archives.len() >= 30, "the fixture set shrank");
    for fixture in &expected.archives {
        let bytes = std::fs::read(data_dir().join(&fixture.file)).unwrap();
        let verdict = Archive::new(bytes).map_err(|e: NpzError| e.rule());
        match (&fixture.audit, verdict) {
            (Verdict::Accept(word), Ok(_)) => assert_eq!(word, "accept"),
            (Verdict::Refuse(rules), Err(rule)) => assert!(
                rules.iter().any(|r| r == rule),
                "{}: refused by {rule}, expected one of {rules:?} ({})",
                fixture.file,
                fixture.about
            ),
            (want, got) => panic!(
                "{}: expected {}, got {got:?} ({})",
                fixture.file,
                match want {
                    Verdict::Accept(_) => "accept".to_string(),
                    Verdict::Refuse(r) => format!("{r:?}"),
                },
                fixture.about
            ),
        }
    }
}

#[test]
fn every_archive_the_audit_accepts_numpy_reads_the_same() {
    let mut accepted = 0;
    for fixture in expected().archives {
        let bytes = std::fs::read(data_dir().join(&fixture.file)).unwrap();
        let Ok(archive) = Archive::new(bytes) else {
            continue;
        };
        accepted += 1;
        let NumpyReading::Arrays { arrays } = fixture.numpy else {
            panic!("{}: the audit accepts what NumPy cannot read", fixture.file);
        };
        let mut numpy: Vec<_> = arrays
            .into_iter()
            .map(|a| {
                assert!(
                    !a.fortran,
                    "{}: {} is in Fortran order",
                    fixture.file, a.name
                );
                (a.name, a.dtype, a.shape, a.sha256)
            })
            .collect();
        numpy.sort();
        assert_eq!(reading(&archive), numpy, "{}", fixture.file);
    }
    assert!(accepted >= 2, "no honest fixture accepted");
}

#[test]
fn the_archived_evidence_is_read_as_numpy_reads_it() {
    for evidence in expected().evidence {
        let bytes = std::fs::read(workspace().join(&evidence.path)).unwrap();
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            evidence.file_sha256,
            "{} changed: re-run tests/data/npz/make_hostile.py",
            evidence.path
        );
        let archive = Archive::new(bytes).unwrap();
        let mut names = archive.names().to_vec();
        names.sort();
        let mut digest = Sha256::new();
        for name in &names {
            let info = archive.info(name).unwrap();
            let shape: Vec<String> = info.shape.iter().map(usize::to_string).collect();
            for part in [
                name.as_bytes(),
                info.dtype.descr().as_bytes(),
                shape.join(",").as_bytes(),
            ] {
                digest.update(part);
                digest.update([0]);
            }
            digest.update(archive.data(name).unwrap());
        }
        assert_eq!(names.len(), evidence.arrays, "{}", evidence.path);
        assert_eq!(
            hex::encode(digest.finalize()),
            evidence.digest,
            "{}",
            evidence.path
        );
    }
}
