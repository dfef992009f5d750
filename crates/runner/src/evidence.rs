//! Writes a run's evidence directory.
//!
//! Contents:
//! - `arrays.npz` (uncompressed, fixed timestamps, so the same run gives the same bytes):
//!   per input `<input>_q`, `_k`, `_v` (f32) and `_ref` (f64); per comparison
//!   `<id>_k_codes`, `_v_codes` (u8 stream), `_k_scales`, `_v_scales` (f32 [rows, groups]),
//!   `_k_shape`, `_v_shape` (i32 [N, D]) and `_out` (f64);
//!   Budget comparisons store every token segment as its own tensor, with the segment index as a
//!   suffix: `<id>_k_codes_s0`, `_k_scales_s0`, `_k_shape_s0` for a quantized segment,
//!   `<id>_k_values_s1` (f32 [len, D]) and `_k_shape_s1` for a float32 one;
//! - `results.json`: one row per comparison;
//! - `summary.json`: the tables; `summary.md`: the same in markdown, with median timings;
//! - `error-vs-bytes.svg`: relative error against payload bytes;
//! - `timings.json`: every raw timing (when the protocol asks for timings);
//! - `manifest.json`: provenance and SHA-256 of every other file.
//!
//! The directory must not exist. Everything is written into a hidden temporary sibling that is
//! renamed into place only when complete, and removed if anything fails, so an interrupted run
//! never leaves a directory that looks finished.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use ndarray::{Array1, ArrayBase, Data, Dimension};
use ndarray_npy::{NpzWriter, WritableElement};
use serde::Serialize;
use thiserror::Error;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime};

use crate::manifest::{Manifest, sha256_file};
use crate::study::{Plan, ResultRow, SegmentData, StudyRun};
use crate::summary::Summary;
use crate::timing::Timings;
use crate::{plot, report};

pub const ARRAYS: &str = "arrays.npz";
pub const RESULTS: &str = "results.json";
pub const SUMMARY: &str = "summary.json";
pub const SUMMARY_MD: &str = "summary.md";
pub const PLOT: &str = "error-vs-bytes.svg";
pub const TIMINGS: &str = "timings.json";
pub const MANIFEST: &str = "manifest.json";

#[derive(Debug, Error)]
pub enum EvidenceError {
    #[error("output directory {0} already exists; choose a new directory (runs never overwrite)")]
    Exists(PathBuf),
    #[error("output path {0} has no final component to name a directory")]
    NoName(PathBuf),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {ARRAYS}: {0}")]
    Npz(#[from] ndarray_npy::WriteNpzError),
    #[error("drawing {PLOT}: {0}")]
    Plot(String),
    #[error("encoding {file}: {source}")]
    Json {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EvidenceError {
    let context = context.into();
    move |source| EvidenceError::Io { context, source }
}

/// Refuses an output path that already exists (file, directory or dangling link).
pub fn check_new(out: &Path) -> Result<(), EvidenceError> {
    if out.symlink_metadata().is_ok() {
        return Err(EvidenceError::Exists(out.to_path_buf()));
    }
    if out.file_name().is_none() {
        return Err(EvidenceError::NoName(out.to_path_buf()));
    }
    Ok(())
}

/// Writes the evidence directory at `out` (which must not exist) and returns its manifest.
pub fn write(
    out: &Path,
    run: &StudyRun,
    summary: &Summary,
    timings: Option<&Timings>,
    mut manifest: Manifest,
) -> Result<Manifest, EvidenceError> {
    check_new(out)?;
    let name = out
        .file_name()
        .ok_or_else(|| EvidenceError::NoName(out.into()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(io(format!("creating {}", parent.display())))?;
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{}.partial-", name.to_string_lossy()))
        .tempdir_in(&parent)
        .map_err(io(format!(
            "creating a temporary directory in {}",
            parent.display()
        )))?;

    let dir = staging.path();
    write_arrays(&dir.join(ARRAYS), run)?;
    let rows: Vec<ResultRow> = run.comparisons.iter().map(|c| c.row.clone()).collect();
    write_json(&dir.join(RESULTS), RESULTS, &rows)?;
    write_json(&dir.join(SUMMARY), SUMMARY, summary)?;
    let markdown = report::summary_markdown(&run.protocol, summary, &manifest);
    write_text(&dir.join(SUMMARY_MD), &markdown)?;
    let svg = plot::error_vs_bytes(&run.protocol, &rows).map_err(EvidenceError::Plot)?;
    write_text(&dir.join(PLOT), &svg)?;
    let mut files = vec![ARRAYS, RESULTS, SUMMARY, SUMMARY_MD, PLOT];
    if let Some(timings) = timings {
        write_json(&dir.join(TIMINGS), TIMINGS, timings)?;
        files.push(TIMINGS);
    }
    for file in files {
        let path = staging.path().join(file);
        let hash = sha256_file(&path).map_err(io(format!("hashing {}", path.display())))?;
        manifest.outputs.insert(file.to_string(), hash);
    }
    write_json(&staging.path().join(MANIFEST), MANIFEST, &manifest)?;

    // Re-check just before the rename: renaming onto an empty directory would succeed silently.
    check_new(out)?;
    let staged = staging.keep();
    std::fs::rename(&staged, out).map_err(|source| {
        let _ = std::fs::remove_dir_all(&staged);
        EvidenceError::Io {
            context: format!("moving the finished run into {}", out.display()),
            source,
        }
    })?;
    Ok(manifest)
}

fn write_json<T: Serialize + ?Sized>(
    path: &Path,
    file: &'static str,
    value: &T,
) -> Result<(), EvidenceError> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|source| EvidenceError::Json { file, source })?;
    text.push('\n');
    write_text(path, &text)
}

fn write_text(path: &Path, text: &str) -> Result<(), EvidenceError> {
    std::fs::write(path, text).map_err(io(format!("writing {}", path.display())))
}

fn write_arrays(path: &Path, run: &StudyRun) -> Result<(), EvidenceError> {
    let file = File::create(path).map_err(io(format!("creating {}", path.display())))?;
    // Stored entries with a fixed timestamp and mode: the archive's bytes depend only on the run.
    let options = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Stored)
        .last_modified_time(DateTime::default())
        .unix_permissions(0o644);
    let mut npz = Archive(NpzWriter::new_with_options(BufWriter::new(file), options));
    for input in &run.inputs {
        npz.add(&input.id, "q", &input.q)?;
        npz.add(&input.id, "k", &input.k)?;
        npz.add(&input.id, "v", &input.v)?;
        npz.add(&input.id, "ref", &input.reference)?;
    }
    for c in &run.comparisons {
        let id = &c.row.id;
        // Packed-KV comparisons keep the unsuffixed names of a single tensor per K and V.
        let suffixed = matches!(c.plan, Plan::Budget { .. });
        for (tensor, segments) in [("k", &c.k), ("v", &c.v)] {
            for (index, segment) in segments.iter().enumerate() {
                let suffix = if suffixed {
                    format!("_s{index}")
                } else {
                    String::new()
                };
                let name = |part: &str| format!("{tensor}_{part}{suffix}");
                match &segment.data {
                    SegmentData::Packed(packed) => {
                        npz.add(
                            id,
                            &name("codes"),
                            &Array1::from(packed.code_bytes().to_vec()),
                        )?;
                        npz.add(id, &name("scales"), packed.scales())?;
                        npz.add(
                            id,
                            &name("shape"),
                            &Array1::from(packed.shape_i32().to_vec()),
                        )?;
                    }
                    SegmentData::Float32(values) => {
                        npz.add(id, &name("values"), values)?;
                        let shape = [values.nrows() as i32, values.ncols() as i32];
                        npz.add(id, &name("shape"), &Array1::from(shape.to_vec()))?;
                    }
                }
            }
        }
        npz.add(id, "out", &c.out)?;
    }
    let mut writer = npz.0.finish()?;
    writer
        .flush()
        .map_err(io(format!("writing {}", path.display())))?;
    Ok(())
}

/// NpzWriter with the `<id>_<name>` key convention.
struct Archive<W: Write + std::io::Seek>(NpzWriter<W>);

impl<W: Write + std::io::Seek> Archive<W> {
    fn add<A, S, D>(
        &mut self,
        id: &str,
        name: &str,
        array: &ArrayBase<S, D>,
    ) -> Result<(), EvidenceError>
    where
        A: WritableElement,
        S: Data<Elem = A>,
        D: Dimension,
    {
        self.0.add_array(format!("{id}_{name}"), array)?;
        Ok(())
    }
}
