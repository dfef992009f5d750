//! Writing a model-quality study as an evidence directory (format
//! [`QUALITY_MANIFEST_FORMAT`]): its arrays, results, summary, markdown, chart and manifest,
//! staged and moved into place like every evidence directory. The study itself (protocol, run,
//! summary) is [`crate::study`]'s; the markdown and the chart are [`crate::report`]'s and
//! [`crate::chart`]'s.

use std::collections::BTreeMap;
use std::path::Path;

use models::ModelFiles;
use ndarray::{Array1, Array2, Array3, Array4};
use serde::{Deserialize, Serialize};

use evidence::provenance::{Git, Platform, Tool, git_info, source_hashes, source_roots};
use evidence::shard::MergedShard;
use evidence::{EvidenceError, Writer};
use models::ModelRecord;

use crate::attention_error::{ChannelStats, LayerStats};
use crate::study::{
    PLOT, QUALITY_MANIFEST_FORMAT, QualityProtocol, QualityStudyError, RESULTS, ResultRow, SUMMARY,
    SUMMARY_MD, Study, run_study, summarize,
};

/// manifest.json of a model-quality run: the packed-KV manifest's provenance fields, this
/// protocol and the model's ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityManifest {
    /// [`QUALITY_MANIFEST_FORMAT`].
    pub format: String,
    /// The runner and its crates.
    pub tool: Tool,
    /// Where it ran.
    pub platform: Platform,
    /// The protocol file's path.
    pub protocol_source: String,
    /// The protocol as read.
    pub protocol: QualityProtocol,
    /// The model file and, per text (`t{i}`), the ids scored.
    pub model: ModelRecord,
    /// Worker threads (the outputs do not depend on it); for a merged run, shard 1's (each
    /// shard's manifest has its own).
    pub threads: usize,
    /// For a run merged from shards ([`crate::shard`]): each shard's index and manifest hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merged_from: Option<Vec<MergedShard>>,
    /// The commit, when built in a repository.
    pub git: Option<Git>,
    /// Files and directories whose contents produce a run.
    pub source_roots: Vec<String>,
    /// SHA-256 of each source file, LF-normalised.
    pub sources: BTreeMap<String, String>,
    /// SHA-256 of each output file's raw bytes.
    pub outputs: BTreeMap<String, String>,
}

fn i64s(xs: &[u32]) -> Array1<i64> {
    xs.iter().map(|&x| i64::from(x)).collect()
}

/// Writes `study` into the new directory `out` (staged, then moved into place).
pub fn write(
    out: &Path,
    protocol: &QualityProtocol,
    protocol_source: String,
    study: &Study,
    threads: usize,
) -> Result<QualityManifest, QualityStudyError> {
    write_with(out, protocol, protocol_source, study, (threads, None))
}

/// [`write`], recording the shards a merged study came from.
pub(crate) fn write_with(
    out: &Path,
    protocol: &QualityProtocol,
    protocol_source: String,
    study: &Study,
    (threads, merged_from): (usize, Option<Vec<MergedShard>>),
) -> Result<QualityManifest, QualityStudyError> {
    let mut writer = Writer::create(out)?;
    if let Some(calibration) = &study.calibration {
        writer.add_array("calibration", "ids", &i64s(&calibration.ids))?;
        for (scheme, fitted) in &calibration.fitted {
            let id = format!("calibration_{scheme}");
            // Every layer's rows are as wide (`Calibration::fit` checks the shapes).
            let table = |rows: Vec<Vec<f32>>| {
                let width = rows.first().map_or(0, Vec::len);
                Array2::from_shape_fn((rows.len(), width), |(i, j)| rows[i][j])
            };
            let widen = |xs: &[half::f16]| xs.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
            let layers = &fitted.layers;
            let upper = table(layers.iter().map(|l| widen(&l.key_upper)).collect());
            let lower = table(layers.iter().map(|l| widen(&l.key_lower)).collect());
            let key_levels = table(layers.iter().map(|l| l.key_levels.clone()).collect());
            let value_levels = table(layers.iter().map(|l| l.value_levels.clone()).collect());
            for (name, array) in [
                ("key_upper", upper),
                ("key_lower", lower),
                ("key_levels", key_levels),
                ("value_levels", value_levels),
            ] {
                writer.add_array(&id, name, &array)?;
            }
        }
    }
    for (t, text) in study.texts.iter().enumerate() {
        let id = format!("t{t}");
        writer.add_array(&id, "ids", &i64s(&text.ids))?;
        writer.add_array(&id, "f32_logp", &Array1::from(text.logp.clone()))?;
        writer.add_array(&id, "f32_argmax", &i64s(&text.argmax))?;
        if let Some(g) = &text.generated {
            writer.add_array(&id, "f32_generated", &i64s(g))?;
        }
        if let Some(m) = &text.mechanisms {
            let heads = m.first().map_or(0, Vec::len);
            let table = Array3::from_shape_fn((m.len(), heads, 4), |(l, h, i)| m[l][h][i]);
            writer.add_array(&id, "mechanisms", &table)?;
        }
    }
    for row in &study.rows {
        let id = &row.result.id;
        writer.add_array(id, "logp", &Array1::from(row.logp.clone()))?;
        writer.add_array(id, "kl", &Array1::from(row.kl.clone()))?;
        writer.add_array(id, "argmax", &i64s(&row.argmax))?;
        if let Some(outliers) = &row.outliers {
            let counts: Array1<i64> = outliers.iter().map(|&n| n as i64).collect();
            writer.add_array(id, "outliers", &counts)?;
        }
        if let Some(g) = &row.generated {
            writer.add_array(id, "generated", &i64s(g))?;
        }
    }
    if let Some(attention) = &study.attention {
        let table =
            |layers: &[[f64; 2]]| Array2::from_shape_fn((layers.len(), 2), |(l, i)| layers[l][i]);
        for (t, runs) in attention.texts.iter().enumerate() {
            for (run, layers) in protocol.runs.iter().zip(runs) {
                writer.add_array(&run.row_id(t), "attention", &table(layers))?;
            }
        }
        for (g, runs) in attention.gaussian.iter().enumerate() {
            for (run, measured) in protocol.runs.iter().zip(runs) {
                writer.add_array(&run.gaussian_id(g), "attention", &table(&measured.layers))?;
            }
        }
        if let Some(stats) = &attention.stats {
            type Side = fn(&LayerStats) -> &ChannelStats;
            let sides: [(&str, Side); 3] = [
                ("q_stats", |s| &s.q),
                ("k_stats", |s| &s.k),
                ("v_stats", |s| &s.v),
            ];
            for (name, side) in sides {
                let heads = stats.first().map_or(0, |s| side(s).len());
                let dim = stats
                    .first()
                    .and_then(|s| side(s).first())
                    .map_or(0, Vec::len);
                let array = Array4::from_shape_fn((stats.len(), heads, dim, 2), |(l, h, c, i)| {
                    side(&stats[l])[h][c][i]
                });
                writer.add_array("matched", name, &array)?;
            }
        }
        for (g, runs) in attention.matched.iter().enumerate() {
            for (run, measured) in protocol.runs.iter().zip(runs) {
                writer.add_array(&run.matched_id(g), "attention", &table(&measured.layers))?;
            }
        }
    }
    for row in &study.sensitivity {
        writer.add_array(&row.id, "logp", &Array1::from(row.logp.clone()))?;
        writer.add_array(&row.id, "kl", &Array1::from(row.kl.clone()))?;
        writer.add_array(&row.id, "argmax", &i64s(&row.argmax))?;
    }
    let results: Vec<ResultRow> = study.rows.iter().map(|r| r.result.clone()).collect();
    let summary = summarize(protocol, study);
    let markdown = crate::report::summary_markdown(protocol, study, &summary);
    let svg = crate::chart::quality_vs_bytes(protocol, &summary).map_err(|message| {
        EvidenceError::Chart {
            file: PLOT,
            message,
        }
    })?;
    let files: Vec<(&str, Vec<u8>)> = vec![
        (RESULTS, evidence::json_bytes(RESULTS, &results)?),
        (SUMMARY, evidence::json_bytes(SUMMARY, &summary)?),
        (SUMMARY_MD, markdown.into_bytes()),
        (PLOT, svg.into_bytes()),
    ];
    let ids = study
        .texts
        .iter()
        .enumerate()
        .map(|(t, text)| (format!("t{t}"), text.ids.clone()))
        .collect();
    let mut manifest = QualityManifest {
        format: QUALITY_MANIFEST_FORMAT.into(),
        tool: Tool::current(),
        platform: Platform::current(),
        protocol_source,
        protocol: protocol.clone(),
        model: ModelRecord::new(protocol.model, ids),
        threads,
        merged_from,
        git: git_info(),
        source_roots: source_roots(),
        sources: source_hashes(),
        outputs: BTreeMap::new(),
    };
    writer.finish_files(&files, |outputs| {
        manifest.outputs = outputs;
        evidence::json_bytes(evidence::MANIFEST, &manifest)
    })?;
    Ok(manifest)
}

/// Loads the protocol's model, runs `protocol` and writes it into `out`; `progress` as in [`run_study`].
pub fn run(
    protocol: &QualityProtocol,
    protocol_source: String,
    out: &Path,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<(QualityManifest, Study), QualityStudyError> {
    evidence::check_new(out)?;
    protocol.validate()?;
    let files = ModelFiles::locate(protocol.model)?;
    let decoder = crate::decoder::Decoder::load(&files)?;
    let study = run_study(protocol, &decoder, threads, progress)?;
    let manifest = write(out, protocol, protocol_source, &study, threads)?;
    Ok((manifest, study))
}
