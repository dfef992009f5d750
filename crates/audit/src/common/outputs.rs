//! What every evidence directory shares: its manifest.json, the output files its manifest lists
//! (exactly those, each hashing as recorded), arrays.npz opened in one confined pass, and JSON
//! read strictly into a format's types. Every file is read once, through the directory's handle
//! ([`ConfinedDir`]), which records the hash of what was read for the root manifest's pins.

use std::collections::{BTreeMap, BTreeSet};

use serde::de::DeserializeOwned;

use crate::common::files::{ConfinedDir, EntryKind, FileError, MAX_TEXT_BYTES};
use crate::common::hashes;
use crate::common::npz;
use crate::common::report::{Checked, Problem, Report};

/// The manifest.
pub const MANIFEST: &str = "manifest.json";

pub(crate) fn parse_json<T: DeserializeOwned>(file: &str, bytes: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(bytes).map_err(|e| Problem::Json {
        file: file.to_string(),
        message: e.to_string(),
    })
}

/// The text files of a run, read whole (each is parsed whole, under [`MAX_TEXT_BYTES`]).
pub(crate) type Texts = BTreeMap<&'static str, Vec<u8>>;

/// The shared part of every format's file check: the directory holds exactly `expected` (and
/// manifest.json), the manifest's `outputs` list exactly those, and each hashes as recorded;
/// returns the text files' bytes and arrays.npz opened (or the rule it breaks).
pub(crate) fn read_files(
    dir: &ConfinedDir,
    expected: &[&'static str],
    outputs: &BTreeMap<String, String>,
    report: &mut Report,
) -> (Texts, Option<Result<npz::Archive, npz::NpzError>>) {
    let expected = expected.to_vec();
    let listed: BTreeSet<&str> = outputs.keys().map(String::as_str).collect();
    for name in &listed {
        if !expected.contains(name) {
            report.fail(Problem::UnexpectedListing {
                name: name.to_string(),
            });
        }
    }
    for name in &expected {
        if !listed.contains(name) {
            report.fail(Problem::MissingListing {
                name: name.to_string(),
            });
        }
    }
    match dir.list() {
        Ok(entries) => {
            for (name, kind) in entries {
                let known = name == MANIFEST || expected.contains(&name.as_str());
                if !known || kind != EntryKind::File {
                    report.fail(Problem::UnexpectedFile { name });
                }
            }
        }
        Err(e) => report.fail(Problem::File(e)),
    }
    let mut texts = BTreeMap::new();
    let mut archive = None;
    for name in expected {
        let read = if name == "arrays.npz" {
            open_archive(dir, name).map(|scanned| {
                archive = Some(scanned.archive);
                scanned.sha256
            })
        } else {
            dir.read(name, MAX_TEXT_BYTES).map(|bytes| {
                let hash = hashes::sha256_hex(&bytes);
                texts.insert(name, bytes);
                hash
            })
        };
        match read {
            Ok(actual) => {
                if let Some(recorded) = outputs.get(name) {
                    if &actual != recorded {
                        report.fail(Problem::Hash {
                            file: name.to_string(),
                            recorded: hashes::short(recorded),
                            actual: hashes::short(&actual),
                        });
                    }
                    report.count(Checked::OutputHashes, 1);
                }
            }
            Err(e) => report.fail(Problem::File(e)),
        }
    }
    (texts, archive)
}

/// Opens arrays.npz through the directory's handle and makes its one pass: its hash (recorded
/// in the handle) and its reading.
pub(crate) fn open_archive(dir: &ConfinedDir, name: &str) -> Result<npz::Scanned, FileError> {
    let (file, len) = dir.open_file(name, npz::zip::MAX_ARCHIVE_BYTES)?;
    let scanned = npz::Archive::open(file, len).map_err(|e| match e {
        npz::ScanError::Io(error) => FileError::Io {
            path: dir.path().join(name),
            error,
        },
        npz::ScanError::Length { before, after } => FileError::Changed {
            path: dir.path().join(name),
            before,
            after,
        },
    })?;
    dir.record(name, &scanned.sha256);
    Ok(scanned)
}
