//! One model-quality evidence directory (`model-quality-evidence/2`), checked from its manifest
//! down: the protocol, the files, the sources, the manifest's fields and model record, then
//! arrays.npz, results.json, summary.json, summary.md and the chart, in that order.

use std::path::Path;

use super::arrays::check_arrays;
use super::manifest::{QualityManifest, check_fields, check_model};
use super::results::{QualityRow, check_results};
use super::summary::{Aggregate, QualitySummary, aggregate, check_summary};
use super::tables::check_markdown;
use super::{QUALITY_CHART, QUALITY_FILES, attention, bootstrap, chart, rerun};
use crate::common::files::ConfinedDir;
use crate::common::npz::{self, Archive};
use crate::common::options::Options;
use crate::common::outputs::{MANIFEST, Texts, parse_json, read_files};
use crate::common::problem::{ChartProblem, MarkdownProblem};
use crate::common::report::{Checked, Problem, Report};

/// Audits a directory whose manifest has format [`super::QUALITY_FORMAT`].
pub fn audit(
    dir: &ConfinedDir,
    tree: &Path,
    options: &Options,
    manifest_bytes: &[u8],
    report: &mut Report,
) {
    let manifest: QualityManifest = match parse_json(MANIFEST, manifest_bytes) {
        Ok(m) => m,
        Err(problem) => return report.fail(problem),
    };
    let p = &manifest.protocol;
    let runs = match p.validate() {
        Ok(runs) => runs,
        Err(e) => return report.fail(Problem::Protocol(e)),
    };
    let (texts, archive) = read_outputs(dir, &manifest, report);
    crate::common::sources::check_recorded(
        tree,
        &manifest.source_roots,
        &manifest.sources,
        manifest.git.as_ref(),
        report,
    );
    check_fields(tree, &manifest, report);
    let Some(tokens) = check_model(&manifest, report) else {
        return;
    };
    let mut attention_expected = None;
    let mut mechanisms_expected = None;
    let mut sensitivity_expected = None;
    let derived = match archive {
        Some(Ok(archive)) => {
            report.count(Checked::ArchiveMembers, archive.names().len());
            let derived = check_arrays(&manifest, &runs, &tokens, &archive, report);
            rerun::check_consistency(p, &runs, &tokens, &archive, report);
            let ids: Vec<Vec<u32>> = (0..p.texts.len())
                .map(|i| manifest.model.ids[&format!("t{i}")].clone())
                .collect();
            let arrays_sha256 = manifest
                .outputs
                .get("arrays.npz")
                .map_or("", String::as_str);
            let rows = texts
                .get("results.json")
                .and_then(|b| serde_json::from_slice::<Vec<QualityRow>>(b).ok())
                .unwrap_or_default();
            let rerun = rerun::Rerun {
                protocol: p,
                runs: &runs,
                ids: &ids,
                rows: &rows,
                arrays_sha256,
            };
            rerun.check(&archive, options, report);
            let gaussian = attention::check_gaussian(p, &runs, &archive, report);
            attention_expected = attention::expected(p, &runs, p.texts.len(), &archive, &gaussian);
            mechanisms_expected = super::mechanisms::read(p, &archive, report)
                .map(|texts| super::mechanisms::expected(&texts));
            sensitivity_expected = derived
                .as_ref()
                .and_then(|d| super::sensitivity::expected(p, &runs, d, &archive, report));
            derived
        }
        Some(Err(e)) => {
            report.fail(Problem::Archive(e));
            None
        }
        None => None,
    };
    if let Some(bytes) = texts.get("results.json") {
        match parse_json::<Vec<QualityRow>>("results.json", bytes) {
            Ok(rows) => check_results(p, &runs, &tokens, derived.as_ref(), &rows, report),
            Err(problem) => report.fail(problem),
        }
    }
    let Some(derived) = derived else {
        return;
    };
    let aggregates: Vec<Aggregate> = (0..runs.len())
        .map(|r| aggregate(&derived, &tokens, r, &p.geometry()))
        .collect();
    let bootstrap_expected = p
        .bootstrap
        .as_ref()
        .and_then(|b| bootstrap::expected(b, p.texts.len(), runs.len(), &derived));
    if let Some(bytes) = texts.get("summary.json") {
        match parse_json::<QualitySummary>("summary.json", bytes) {
            Ok(summary) => {
                check_summary(p.texts.len(), &runs, &aggregates, &summary, report);
                attention::check_summary(
                    p,
                    &runs,
                    attention_expected.as_deref(),
                    summary.attention.as_ref(),
                    report,
                );
                bootstrap::check_summary(
                    p.bootstrap.as_ref(),
                    p.texts.len(),
                    &runs,
                    bootstrap_expected.as_ref(),
                    summary.bootstrap.as_ref(),
                    report,
                );
                super::sensitivity::check_summary(
                    p,
                    sensitivity_expected.as_ref(),
                    summary.sensitivity.as_ref(),
                    report,
                );
                super::mechanisms::check_summary(
                    p,
                    mechanisms_expected.as_deref(),
                    summary.mechanisms.as_ref(),
                    report,
                );
            }
            Err(problem) => report.fail(problem),
        }
    }
    let rows = texts
        .get("results.json")
        .and_then(|b| serde_json::from_slice::<Vec<QualityRow>>(b).ok())
        .unwrap_or_default();
    if let Some(md) = texts.get("summary.md") {
        match std::str::from_utf8(md) {
            Ok(text) => check_markdown(
                text,
                p,
                &runs,
                &tokens,
                (
                    &aggregates,
                    attention_expected.as_deref(),
                    bootstrap_expected.as_ref(),
                    mechanisms_expected.as_deref(),
                    sensitivity_expected.as_ref(),
                ),
                &rows,
                report,
            ),
            Err(_) => report.fail(Problem::Markdown(MarkdownProblem::Markup {
                what: "bytes that are not UTF-8".into(),
            })),
        }
    }
    if let Some(svg) = texts.get(QUALITY_CHART) {
        match std::str::from_utf8(svg) {
            Ok(text) => chart::check_chart(text, &p.study, &runs, &aggregates, report),
            Err(_) => report.fail(Problem::QualityChart(ChartProblem::Document {
                reason: "not UTF-8".into(),
            })),
        }
    }
}

/// Exactly the run's files, listed and hashed as recorded (the check every format shares); the
/// text files read, arrays.npz opened.
fn read_outputs(
    dir: &ConfinedDir,
    manifest: &QualityManifest,
    report: &mut Report,
) -> (Texts, Option<Result<Archive, npz::NpzError>>) {
    read_files(dir, &QUALITY_FILES, &manifest.outputs, report)
}
