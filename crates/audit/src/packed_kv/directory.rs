//! One packed-KV evidence directory (`packed-kv-evidence/1`), checked from its manifest down:
//! the protocol and the manifest's records, the files, the sources, the model record, then
//! everything inside the files.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::files::ConfinedDir;
use crate::common::npz;
use crate::common::options::Options;
use crate::common::outputs::{MANIFEST, Texts, parse_json, read_files};
use crate::common::report::{Checked, Problem, Report};
use crate::common::sources;
use crate::packed_kv::manifest::{self, Manifest, Scope, check_manifest_fields, check_scope};
use crate::packed_kv::{
    RUN_FILES, TIMINGS, chart, comparisons, markdown, model_inputs, plan, results, summary, timings,
};

/// Audits a directory whose manifest has format [`manifest::MANIFEST_FORMAT`] (or none).
pub fn audit(
    dir: &ConfinedDir,
    tree: &Path,
    options: &Options,
    manifest_bytes: &[u8],
    report: &mut Report,
) {
    let manifest: Manifest = match parse_json(MANIFEST, manifest_bytes) {
        Ok(m) => m,
        Err(problem) => {
            report.fail(problem);
            return;
        }
    };
    if let Err(e) = manifest.protocol.validate() {
        report.fail(Problem::Protocol(e));
        return;
    }
    let Some(scope) = check_scope(&manifest, manifest_bytes, report) else {
        return;
    };
    let (outputs, archive) = read_outputs(dir, &manifest, report);
    sources::check_recorded(
        tree,
        &manifest.source_roots,
        &manifest.sources,
        manifest.git.as_ref(),
        report,
    );
    check_manifest_fields(tree, &manifest, scope, report);
    manifest::check_model(
        &manifest,
        &plan::inputs_of(&manifest.protocol, scope.shard),
        report,
    );
    check_contents(&manifest, scope, options, outputs, archive, report);
}

/// The files a run of this manifest's protocol writes, besides the manifest.
fn run_files(manifest: &Manifest) -> Vec<&'static str> {
    let mut files = RUN_FILES.to_vec();
    if manifest.protocol.timing.is_some() {
        files.push(TIMINGS);
    }
    files
}

/// Checks the directory holds exactly the run's files, that the manifest lists exactly those,
/// and that each hashes as recorded; returns the bytes of the text files that could be read, and
/// arrays.npz opened and checked (or the rule it breaks) if it could be read.
///
/// arrays.npz is never read whole: its one sequential pass ([`npz::Archive::open`]) computes the
/// hash checked here and checks the archive's rules, and its arrays are read when the checks of
/// [`comparisons`] ask for them, each verified to be the bytes that pass hashed.
fn read_outputs(
    dir: &ConfinedDir,
    manifest: &Manifest,
    report: &mut Report,
) -> (Texts, Option<Result<npz::Archive, npz::NpzError>>) {
    read_files(dir, &run_files(manifest), &manifest.outputs, report)
}

/// Everything inside the files: results, arrays, summary, markdown, chart, timings.
fn check_contents(
    manifest: &Manifest,
    scope: Scope,
    options: &Options,
    outputs: Texts,
    archive: Option<Result<npz::Archive, npz::NpzError>>,
    report: &mut Report,
) {
    let p = &manifest.protocol;
    let inputs = plan::inputs_of(p, scope.shard);
    let comparisons = plan::comparisons(p, &inputs);
    let configs = plan::configs(p);
    let labels: Vec<String> = configs.iter().map(|c| c.label()).collect();
    let parsed = |name: &'static str| outputs.get(name).map(|bytes| (name, bytes));

    let rows =
        match parsed("results.json").map(|(n, b)| parse_json::<Vec<results::ResultRow>>(n, b)) {
            Some(Ok(rows)) => results::check(p, &inputs, &comparisons, rows, report),
            Some(Err(problem)) => {
                report.fail(problem);
                BTreeMap::new()
            }
            None => BTreeMap::new(),
        };
    let recomputed = match archive {
        Some(Ok(archive)) => {
            report.count(Checked::ArchiveMembers, archive.names().len());
            let recomputed = comparisons::check(p, &inputs, &comparisons, &rows, &archive, report);
            model_inputs::check(manifest, &inputs, &archive, options, report);
            recomputed
        }
        Some(Err(e)) => {
            report.fail(Problem::Archive(e));
            BTreeMap::new()
        }
        None => BTreeMap::new(),
    };
    let timings = match (p.timing, parsed(TIMINGS)) {
        (Some(timing), Some((name, bytes))) => match parse_json::<timings::Timings>(name, bytes) {
            Ok(t) => {
                // In a merged run each measurement records the shard that made it.
                let shard_of = scope.merged.map(|count| {
                    let all = inputs.len();
                    comparisons
                        .iter()
                        .map(|e| {
                            let shard = (1..=count)
                                .find(|i| {
                                    ((i - 1) * all / count..i * all / count).contains(&e.input)
                                })
                                .unwrap_or(0);
                            (e.id.clone(), shard)
                        })
                        .collect::<BTreeMap<String, usize>>()
                });
                timings::check(&timing, &comparisons, &t, shard_of.as_ref(), report);
                Some(t)
            }
            Err(problem) => {
                report.fail(problem);
                None
            }
        },
        _ => None,
    };
    let complete = recomputed.len() == comparisons.len();
    let summary = match parsed("summary.json").map(|(n, b)| parse_json::<summary::Summary>(n, b)) {
        Some(Ok(s)) => s,
        Some(Err(problem)) => return report.fail(problem),
        None => return,
    };
    let tables = summary::Tables::new(p, &inputs, &comparisons, &recomputed);
    if complete {
        summary::check(p, &tables, &summary, report);
    }
    timings::check_medians(
        &inputs,
        &comparisons,
        &labels,
        &p.tokens,
        timings.as_ref(),
        &summary,
        report,
    );
    if let Some(md) = outputs.get("summary.md") {
        match std::str::from_utf8(md) {
            Ok(text) => markdown::check(text, p, scope, &summary, manifest, report),
            Err(_) => report.fail(Problem::Markdown(markdown::MarkdownProblem::Markup {
                what: "bytes that are not UTF-8".into(),
            })),
        }
    }
    if let Some(svg) = outputs.get("error-vs-bytes.svg")
        && complete
    {
        match std::str::from_utf8(svg) {
            Ok(text) => chart::check(
                text,
                p,
                &inputs,
                &comparisons,
                &configs,
                &recomputed,
                report,
            ),
            Err(_) => report.fail(Problem::Chart(chart::ChartProblem::Document {
                reason: "not UTF-8".into(),
            })),
        }
    }
}
