//! A real model's inputs (`t{text}_n{N}_l{layer}_h{head}`), re-derived by re-running the model.
//!
//! For every model pass (a text's first N tokens) the audit
//! 1. re-tokenizes the text written in the protocol and requires the manifest's ids
//!    ([`model_files::LoadedModel::encode_prefix`]);
//! 2. runs the model on those ids from the pinned weights it hashed itself
//!    ([`crate::common::model_files`]);
//! 3. takes each input's q, k and v from that pass by the evidence format's rule and requires
//!    the archived `<id>_q`, `<id>_k` and `<id>_v` bit for bit, naming the pass, the array and
//!    the first element that differs. The rule, per (layer, KV head): k and v are the head's
//!    [N, head_dim] cache (K after RoPE for SmolLM2); with g query heads per KV head and
//!    P = queries / g positions, q row r is query head `kv_head * g + r % g` at position
//!    `N - P + r / g`.
//!
//! Before any of that, and without the model, passes of one text must agree where a model makes
//! them agree (`check_prefixes`): a shorter pass's ids are the longer pass's first ids (MiniLM:
//! up to its closing `[SEP]`), and for a causal model (SmolLM2) a shorter pass's K and V are,
//! bit for bit, the first rows of the longer pass's (position t sees only tokens 0..=t).
//!
//! Without the model (not in the cache, or `--no-models`) the inputs are checked for shape and
//! finiteness only and the report is UNVERIFIED, not PASS.

use std::collections::BTreeMap;

use ndarray::{Array2, s};

use crate::common::model_files;
use crate::common::models::ModelName;
use crate::common::npz::Archive;
use crate::common::options::Options;
use crate::common::report::{Checked, Note, Problem, Report};
use crate::common::sample;
use crate::packed_kv::manifest::Manifest;
use crate::packed_kv::plan::{InputPlan, InputSource};

/// The inputs of each model pass, by pass id, in run order.
fn passes(inputs: &[InputPlan]) -> BTreeMap<String, Vec<&InputPlan>> {
    let mut out: BTreeMap<String, Vec<&InputPlan>> = BTreeMap::new();
    for input in inputs {
        if let Some(pass) = input.pass() {
            out.entry(pass).or_default().push(input);
        }
    }
    out
}

/// The first flat index where two f32 arrays differ in their bits.
fn first_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
        .or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

/// Re-runs every model pass (or a sample) and holds the archived q, k and v to it; checks the
/// prefix identities first. `inputs` are this directory's.
pub fn check(
    manifest: &Manifest,
    inputs: &[InputPlan],
    archive: &Archive,
    options: &Options,
    report: &mut Report,
) {
    let (Some(source), Some(record)) = (&manifest.protocol.model, &manifest.model) else {
        return;
    };
    let by_pass = passes(inputs);
    check_prefixes(
        source.name,
        &by_pass,
        &record.ids,
        archive,
        manifest,
        report,
    );
    let all: Vec<String> = by_pass.keys().cloned().collect();
    let Some(model) = model_files::load(source.name, &options.models, report) else {
        report.unverified(format!(
            "{} model passes (q, k and v of {} inputs) were not re-run",
            all.len(),
            inputs.iter().filter(|i| i.pass().is_some()).count()
        ));
        return;
    };
    let seed = manifest
        .outputs
        .get("arrays.npz")
        .map_or("", String::as_str);
    let chosen = sample::choose(&all, seed, options.sample);
    if chosen.len() < all.len() {
        report.note(Note::Sampled {
            passes: chosen.clone(),
            of: all.len(),
        });
    }
    let features = manifest.protocol.features;
    let queries = manifest.protocol.queries;
    let shape = source.name.shape();
    for pass in &chosen {
        let plans = &by_pass[pass];
        let (text, tokens) = match plans.first().map(|p| (p.source, p.tokens)) {
            Some((InputSource::Model { text, .. }, tokens)) => (text, tokens),
            _ => continue,
        };
        let Some(written) = source.texts.get(text) else {
            continue;
        };
        let Some(ids) = model.encode_prefix(&written.text, tokens) else {
            report.fail(Problem::RerunFailed {
                pass: pass.clone(),
                reason: format!("texts[{text}] does not give {tokens} tokens"),
            });
            continue;
        };
        if let Some(recorded) = record.ids.get(pass)
            && let Some(i) = recorded.iter().zip(&ids).position(|(a, b)| a != b)
        {
            report.fail(Problem::Rerun {
                pass: pass.clone(),
                array: format!("manifest model.ids.{pass}"),
                index: i,
                found: recorded[i].to_string(),
                expected: format!("{} (the text's tokenization)", ids[i]),
            });
        }
        let capture = match model.forward(&ids) {
            Ok(c) => c,
            Err(reason) => {
                report.fail(Problem::RerunFailed {
                    pass: pass.clone(),
                    reason,
                });
                continue;
            }
        };
        report.count(Checked::PassesRerun, 1);
        let group = shape.group();
        for plan in plans {
            let InputSource::Model { layer, kv_head, .. } = plan.source else {
                continue;
            };
            let Some(cache) = capture.layers.get(layer) else {
                continue;
            };
            // A validated protocol keeps every index in range; anything else is named, not a
            // panic.
            let positions = queries / group;
            let q: Option<Vec<f32>> = (0..queries * features)
                .map(|i| {
                    let (r, f) = (i / features, i % features);
                    let position = (tokens + r / group).checked_sub(positions)?;
                    cache
                        .q
                        .get([kv_head * group + r % group, position, f])
                        .copied()
                })
                .collect();
            let Some(q) = q.and_then(|q| Array2::from_shape_vec((queries, features), q).ok())
            else {
                report.fail(Problem::RerunFailed {
                    pass: pass.clone(),
                    reason: format!("{}: its queries are not in the model's pass", plan.id),
                });
                continue;
            };
            if kv_head >= cache.k.dim().0 {
                continue;
            }
            let k = cache.k.slice(s![kv_head, .., ..]).to_owned();
            let v = cache.v.slice(s![kv_head, .., ..]).to_owned();
            let mut same = true;
            for (part, derived) in [("q", q), ("k", k), ("v", v)] {
                let name = format!("{}_{part}", plan.id);
                let Ok(archived) = archive.matrix::<f32>(&name, [derived.nrows(), features]) else {
                    // Read and shape-checked (and the problem reported) by the input checks.
                    same = false;
                    continue;
                };
                let (a, d) = (archived.as_slice(), derived.as_slice());
                if let (Some(a), Some(d)) = (a, d)
                    && let Some(i) = first_difference(a, d)
                {
                    same = false;
                    report.fail(Problem::Rerun {
                        pass: pass.clone(),
                        array: name,
                        index: i,
                        found: format!("{:?}", a.get(i)),
                        expected: format!("{:?}", d.get(i)),
                    });
                }
            }
            if same {
                report.count(Checked::InputsFromModel, 1);
            }
        }
    }
}

/// Passes of one text agree on their common prefix: ids always, K and V for a causal model.
fn check_prefixes(
    model: ModelName,
    by_pass: &BTreeMap<String, Vec<&InputPlan>>,
    ids: &BTreeMap<String, Vec<u32>>,
    archive: &Archive,
    manifest: &Manifest,
    report: &mut Report,
) {
    // Per text, its passes by length.
    let mut texts: BTreeMap<usize, Vec<(usize, &String)>> = BTreeMap::new();
    for (pass, plans) in by_pass {
        if let Some(InputSource::Model { text, .. }) = plans.first().map(|p| p.source) {
            texts.entry(text).or_default().push((plans[0].tokens, pass));
        }
    }
    let causal = model.shape().causal;
    let features = manifest.protocol.features;
    for lengths in texts.values_mut() {
        lengths.sort();
        let Some(&(long_n, long_pass)) = lengths.last() else {
            continue;
        };
        for &(n, pass) in &lengths[..lengths.len() - 1] {
            // MiniLM's shorter pass closes with its own [SEP]: compare the ids before it.
            let shared = if causal { n } else { n.saturating_sub(1) };
            if let (Some(short), Some(long)) = (ids.get(pass), ids.get(long_pass))
                && let Some(i) = short
                    .iter()
                    .take(shared)
                    .zip(long)
                    .position(|(a, b)| a != b)
            {
                report.fail(Problem::Prefix {
                    array: format!("manifest model.ids.{pass}"),
                    longer: format!("model.ids.{long_pass}"),
                    tokens: shared,
                    index: i,
                });
            }
            if !causal {
                continue;
            }
            for plan in &by_pass[pass] {
                let long_id = plan.id.replacen(pass.as_str(), long_pass, 1);
                for part in ["k", "v"] {
                    let (name, long_name) =
                        (format!("{}_{part}", plan.id), format!("{long_id}_{part}"));
                    let (Ok(short), Ok(long)) = (
                        archive.matrix::<f32>(&name, [n, features]),
                        archive.matrix::<f32>(&long_name, [long_n, features]),
                    ) else {
                        continue;
                    };
                    let prefix = long.slice(s![..n, ..]).to_owned();
                    if let (Some(a), Some(b)) = (short.as_slice(), prefix.as_slice())
                        && let Some(i) = first_difference(a, b)
                    {
                        report.fail(Problem::Prefix {
                            array: name,
                            longer: long_name,
                            tokens: n,
                            index: i,
                        });
                    }
                }
            }
        }
    }
}
