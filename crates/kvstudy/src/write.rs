//! The packed-KV study's evidence directory, written through the `evidence` crate's [`Writer`]:
//!
//! - `arrays.npz` (uncompressed, fixed timestamps, so the same run gives the same bytes):
//!   per input `<input>_q`, `_k`, `_v` (f32) and `_ref` (f64); per comparison
//!   `<id>_k_codes`, `_v_codes` (u8 stream), `_k_scales`, `_v_scales` (f32 [rows, groups]),
//!   `_k_shape`, `_v_shape` (i32 [N, D]) and `_out` (f64); asymmetric settings add `_k_zeros`,
//!   `_v_zeros` (u8 b-bit stream of the zero points, one per group in scale order);
//!   Budget comparisons store every token segment as its own tensor, with the segment index as a
//!   suffix: `<id>_k_codes_s0`, `_k_scales_s0`, `_k_shape_s0` for a quantized segment,
//!   `<id>_k_values_s1` (f32 [len, D]) and `_k_shape_s1` for a float32 one;
//! - `results.json`: one row per comparison;
//! - `summary.json`: the tables; `summary.md`: the same in markdown, with median timings;
//! - `error-vs-bytes.svg`: relative error against payload bytes;
//! - `timings.json`: every raw timing (when the protocol asks for timings);
//! - `manifest.json`: provenance and SHA-256 of every other file.
//!
//! Where the directory is made and how it survives a crash is the `evidence` crate's
//! ([`evidence::staging`]).

use std::path::Path;

use evidence::writer::json_bytes;
use evidence::{EvidenceError, Writer};
use ndarray::ArrayView1;
use thiserror::Error;

pub use evidence::{ARRAYS, MANIFEST, RESULTS, SUMMARY, SUMMARY_MD};

use crate::manifest::Manifest;
use crate::pipeline::ArraySink;
use crate::plan::Plan;
use crate::protocol::Protocol;
use crate::study::{Comparison, Input, ResultRow, SegmentData};
use crate::summary::Summary;
use crate::timing::{TimingError, Timings};
use crate::{plot, report};

/// The chart.
pub const PLOT: &str = "error-vs-bytes.svg";
/// Every raw timing.
pub const TIMINGS: &str = "timings.json";

/// Why a run's directory could not be written.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WriteError {
    #[error(transparent)]
    Evidence(#[from] EvidenceError),
    #[error(transparent)]
    Timing(#[from] TimingError),
}

/// Everything but the arrays that a run's directory is written from.
pub struct Outputs<'a> {
    pub protocol: &'a Protocol,
    pub rows: &'a [ResultRow],
    pub summary: &'a Summary,
    pub timings: Option<&'a Timings>,
}

/// Closes arrays.npz, writes the other files and the manifest (with the SHA-256 of every file),
/// and moves the directory to its name. Refuses timings with a 0 ns measurement before writing
/// anything more.
pub fn finish(
    writer: Writer,
    outputs: Outputs<'_>,
    mut manifest: Manifest,
) -> Result<Manifest, WriteError> {
    let Outputs {
        protocol,
        rows,
        summary,
        timings,
    } = outputs;
    if let Some(timings) = timings {
        timings.check_positive()?;
    }
    let markdown = report::summary_markdown(protocol, summary, &manifest);
    let svg = plot::error_vs_bytes(protocol, rows).map_err(|message| EvidenceError::Chart {
        file: PLOT,
        message,
    })?;
    let mut files = vec![
        (RESULTS, json_bytes(RESULTS, rows)?),
        (SUMMARY, json_bytes(SUMMARY, summary)?),
        (SUMMARY_MD, markdown.into_bytes()),
        (PLOT, svg.into_bytes()),
    ];
    if let Some(timings) = timings {
        files.push((TIMINGS, json_bytes(TIMINGS, timings)?));
    }
    let mut written = None;
    writer.finish_files(&files, |outputs| {
        manifest.outputs = outputs;
        let bytes = json_bytes(MANIFEST, &manifest);
        written = Some(manifest);
        bytes
    })?;
    Ok(written.expect("the manifest is made before the directory is committed"))
}

impl ArraySink for Writer {
    type Error = EvidenceError;

    fn input(&mut self, input: &Input) -> Result<(), EvidenceError> {
        let id = input.id();
        self.add_array(&id, "q", &input.q)?;
        self.add_array(&id, "k", &input.k)?;
        self.add_array(&id, "v", &input.v)?;
        self.add_array(&id, "ref", input.reference)
    }

    fn comparison(&mut self, c: &Comparison) -> Result<(), EvidenceError> {
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
                        let codes = ArrayView1::from(packed.code_bytes());
                        self.add_array(id, &name("codes"), &codes)?;
                        self.add_array(id, &name("scales"), packed.scales())?;
                        let shape = packed.shape_i32();
                        self.add_array(id, &name("shape"), &ArrayView1::from(&shape))?;
                        if packed.layout().mode == kvcodec::Mode::Asymmetric {
                            let zeros = ArrayView1::from(packed.zero_point_bytes());
                            self.add_array(id, &name("zeros"), &zeros)?;
                        }
                    }
                    SegmentData::Float32(values) => {
                        self.add_array(id, &name("values"), values)?;
                        let shape = [values.nrows() as i32, values.ncols() as i32];
                        self.add_array(id, &name("shape"), &ArrayView1::from(&shape))?;
                    }
                }
            }
        }
        self.add_array(id, "out", &c.out)
    }
}

/// Writes the evidence directory of a merged run: its arrays are copied, member by member, by
/// `copy`, which hands each one's name (without `.npy`) and `.npy` bytes to the sink it is given,
/// in the order a single run writes them; the rest is written from `outputs` as a run's is.
pub fn write_merged(
    out: &Path,
    copy: &mut CopyMembers<'_>,
    outputs: Outputs<'_>,
    manifest: Manifest,
) -> Result<Manifest, WriteError> {
    if let Some(timings) = outputs.timings {
        timings.check_positive()?;
    }
    let mut writer = Writer::create(out)?;
    copy(&mut |name, bytes| writer.add_member(name, bytes))?;
    finish(writer, outputs, manifest)
}

/// Receives one archive member: its name (without `.npy`) and its `.npy` bytes.
pub type MemberSink<'a> = dyn FnMut(&str, &[u8]) -> Result<(), EvidenceError> + 'a;

/// Feeds every member of a merged archive, in order, to a sink.
pub type CopyMembers<'a> = dyn FnMut(&mut MemberSink<'_>) -> Result<(), EvidenceError> + 'a;

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;
    use crate::archive;
    use crate::manifest::Counts;
    use crate::protocol::Protocol;
    use crate::{pipeline, summary};

    /// Runs `text` into a [`Writer`] for `out`; returns the unfinished writer and what
    /// `finish` needs.
    fn run(out: &Path, text: &str) -> (Writer, Protocol, Vec<ResultRow>, Option<Timings>) {
        let protocol = Protocol::from_json(text).unwrap();
        let mut writer = Writer::create(out).unwrap();
        let record = pipeline::run(&protocol, &protocol.inputs(), 2, &mut writer, |_| {}).unwrap();
        (writer, protocol, record.rows, record.timings)
    }

    fn finish(
        writer: Writer,
        protocol: &Protocol,
        rows: &[ResultRow],
        timings: Option<&Timings>,
    ) -> Result<Manifest, WriteError> {
        let summary = summary::summarize(protocol, rows, timings);
        let counts = Counts {
            inputs: protocol.inputs().len(),
            comparisons: rows.len(),
            timings: timings.map_or(0, |t| t.measurements.len()),
        };
        let manifest = Manifest::new("test".into(), protocol.clone(), counts);
        let outputs = Outputs {
            protocol,
            rows,
            summary: &summary,
            timings,
        };
        super::finish(writer, outputs, manifest)
    }

    /// Asymmetric and symmetric settings, partial groups (N = 20 with g = 8, D = 6 with g = 4)
    /// and every budget policy, float32 windows included.
    const MIXED: &str = r#"{ "study": "mixed", "seeds": [1, 22], "tokens": [20, 8], "features": 6,
        "queries": 2, "distributions": ["clean", "recent_focus"],
        "focus": { "window": 2, "gain": 1.5 },
        "settings": [ { "group_size": 8, "bits": 4 }, { "group_size": 4, "bits": 3, "mode": "asymmetric" } ],
        "generator": { "name": "chacha20",
                       "entropy": { "seed_multiplier": 100, "tokens_multiplier": 1, "offset": 0 } },
        "budget": { "group_size": 8, "low_bits": 2, "window": 8,
                    "policies": ["uniform", "recent8", "early8", "recent_f32", "early_f32"] },
        "timing": { "warmup": 0, "repeats": 1, "shuffle_seed": 1 } }"#;

    #[test]
    fn the_written_archive_is_the_planned_one_within_the_size_estimate() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("run");
        let (writer, protocol, rows, timings) = run(&out, MIXED);
        finish(writer, &protocol, &rows, timings.as_ref()).unwrap();

        let planned = archive::members(&protocol);
        let file = File::open(out.join(ARRAYS)).unwrap();
        let size = file.metadata().unwrap().len();
        let zip = zip::ZipArchive::new(file).unwrap();
        let names: Vec<&str> = zip.file_names().collect();
        let mut written: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut want: Vec<String> = planned.iter().map(|m| format!("{}.npy", m.name)).collect();
        written.sort();
        want.sort();
        assert_eq!(written, want);
        assert_eq!(archive::member_count(&protocol), Some(planned.len() as u64));
        let estimate = archive::estimated_bytes(&planned).unwrap();
        assert!(
            size <= estimate,
            "{size} bytes written, {estimate} estimated"
        );
        // Only the .npy headers are over-estimated: at most 128 - 64 bytes each.
        assert!(
            estimate - size <= 64 * planned.len() as u64,
            "{size} bytes written, {estimate} estimated"
        );
    }

    #[test]
    fn a_zero_timing_is_refused_and_nothing_is_left_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("nested/run");
        let (writer, protocol, rows, timings) = run(&out, MIXED);
        let mut timings = timings.unwrap();
        timings.measurements[3].ns = 0;
        let err = finish(writer, &protocol, &rows, Some(&timings)).unwrap_err();
        assert!(
            matches!(&err, WriteError::Timing(TimingError::ZeroDuration { comparison, .. })
                if *comparison == timings.measurements[3].comparison),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
