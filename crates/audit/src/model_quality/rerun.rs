//! Model-quality values re-derived by re-running the protocol's decoder (SmolLM2 or Gemma 3),
//! and the checks that need no model.
//!
//! With the model ([`crate::common::model_files`]), per text the audit re-tokenizes the
//! protocol's text (SmolLM2's BPE, no BOS; Gemma 3's SentencePiece, BOS first; cut to
//! `max_tokens`) and requires the manifest's ids;
//! runs the float32 pass and requires `t{i}_f32_logp` and `t{i}_f32_argmax` bit for bit and
//! `t{i}_f32_generated` (greedy from the first `prompt_tokens` ids, the model's own cached
//! generation); then per run it runs the pass with its own packed cache ([`super::cache`]) in
//! the model's KV hook and requires `<id>_logp`, `<id>_kl` and `<id>_argmax` bit for bit, and
//! `<id>_generated` (each step one pass over the prompt and the tokens so far with that cache,
//! the last position's argmax). The arithmetic is the evidence format's, written here:
//! - log-softmax in f64: m = max of the row, log p(v) = (x_v - m) - log(sum_u exp(x_u - m)),
//!   the sum in id order with `libm::exp`, then `libm::log`;
//! - KL(p_f32 || p_packed) = sum over ids in order of exp(a) * (a - b) with `libm::exp`;
//! - argmax: the largest logit, the lowest id on a tie.
//!
//! Being the same arithmetic in the same order, the values must be the same bits; a difference
//! in the last bit is a different computation, and fails.
//!
//! With an `attention` block, the float32 pass also measures, at every layer, each re-run run's
//! attention error with its own cache of the run ([`super::attention`]) and requires
//! `<id>_attention` bit for bit.
//!
//! With the model, every generated text in results.json must also be its archived ids decoded
//! (the model's tokenizer, UTF-8 with invalid bytes replaced).
//!
//! With a calibration text, before the passes (pass `calibration`): the text's first
//! [`CALIBRATION_TOKENS`] ids (the model's tokenizer) must be `calibration_ids`; when a run is
//! KVQuant, one float32 pass over them keeps every layer's keys before RoPE and values, the
//! audit's own KVQuant ([`kvquant::Calibration::fit`]) fits each KVQuant scheme's calibration
//! once, and `calibration_<scheme>_key_upper`, `_key_lower` (the fp16 thresholds widened),
//! `_key_levels` and `_value_levels` must be its values bit for bit. A KVQuant run's pass (and
//! each greedy step) then reads the audit's KVQuant cache against that calibration
//! ([`cache::layer_source`]), and `<id>_outliers`, each layer's stored outlier count, must be the
//! pass's bit for bit besides the log-probs, KL values, argmaxes and generated ids.
//!
//! Without the model, two things still hold at every position and are checked
//! (`check_consistency`): Pinsker's inequality, KL >= 2 * TV^2 >= 2 * (p_f32(t) - p(t))^2
//! for the scored token t; and the float32 run's first generated token is its argmax at the last
//! prompt position (the cached generation's logits are a full pass's, bit for bit).

use models::CausalLm;
use models::llama::{HookError, OwnKv, argmax};
use ndarray::{Array2, s};
use rayon::prelude::*;

use super::arrays::{CALIBRATION_ARRAYS, calibration_prefix};
use super::attention;
use super::cache;
use super::mechanisms;
use super::protocol::{CALIBRATION_TOKENS, QualityProtocol, Run};
use super::require::{require, require_shaped};
use super::results::QualityRow;
use super::schemes::kvquant::{self, Calibration};
use super::sensitivity;
use crate::common::model_files::{self, DecoderTokenizer};
use crate::common::npz::Archive;
use crate::common::options::Options;
use crate::common::report::{Checked, Note, Problem, Report};
use crate::common::sample;

/// How far below Pinsker's bound a KL value may be (its own rounding and the exp of two
/// log-probs).
const PINSKER_SLACK: f64 = 1e-12;

/// The log-softmax of one row of logits (module docs).
fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    let mut sum = 0f64;
    for &x in logits {
        sum += libm::exp(f64::from(x) - max);
    }
    let log_sum = libm::log(sum);
    logits
        .iter()
        .map(|&x| (f64::from(x) - max) - log_sum)
        .collect()
}

/// KL(p || q) of two log-softmax rows (module docs).
fn kl(log_p: &[f64], log_q: &[f64]) -> f64 {
    let mut sum = 0f64;
    for (&a, &b) in log_p.iter().zip(log_q) {
        sum += libm::exp(a) * (a - b);
    }
    sum
}

/// Positions whose logits a re-run holds at once (Gemma 3's rows are 1 MiB each).
const LOGIT_BLOCK: usize = 64;

/// Most bytes of the float32 pass's log-softmax rows kept per text (8,192 positions of SmolLM2
/// take 3.2 GB). Past it the float32 stream is kept instead and each block's rows are
/// recomputed as a run is scored: a logit is one fixed sum whatever the block, so the rows are
/// the same bits.
const ROWS_BUDGET_BYTES: usize = 2 << 30;

/// What a run's KL is taken against.
enum Reference {
    /// A run's own pass: nothing.
    None,
    /// The float32 pass's log-softmax rows.
    Rows(Vec<Vec<f64>>),
    /// The float32 pass's stream, whose rows are recomputed a block at a time.
    Stream(Array2<f32>),
}

/// The per-position values of one pass.
struct Scored {
    logp: Vec<f64>,
    argmax: Vec<i64>,
    /// For the float32 pass, what each run's KL reads.
    reference: Reference,
    /// KL(p_f32 || p) per position, for a pass scored against the float32 one.
    kl: Vec<f64>,
}

/// The log-softmax rows and argmaxes of positions `block` of the stream `hidden`.
fn block_rows(
    lm: &dyn CausalLm,
    hidden: &Array2<f32>,
    block: std::ops::Range<usize>,
) -> Vec<(Vec<f64>, i64)> {
    let logits = lm.logits(hidden.slice(s![block, ..]));
    logits
        .rows()
        .into_iter()
        .map(|row| {
            let row = row.as_slice().unwrap_or(&[]);
            (log_softmax(row), i64::from(argmax(row)))
        })
        .collect()
}

/// Scores the pass whose stream is `hidden`, its LM head [`LOGIT_BLOCK`] positions at a time:
/// the float32 pass (`reference` None) keeps what its runs' KL reads; a run's pass takes each
/// position's KL against `reference`'s rows.
fn score_blocks(
    lm: &dyn CausalLm,
    ids: &[u32],
    hidden: Array2<f32>,
    reference: Option<&Scored>,
) -> Scored {
    let positions = ids.len().saturating_sub(1);
    let keep_rows = reference.is_none()
        && positions
            .checked_mul(lm.vocab())
            .and_then(|n| n.checked_mul(8))
            .is_some_and(|bytes| bytes <= ROWS_BUDGET_BYTES);
    let mut out = Scored {
        logp: Vec::with_capacity(positions),
        argmax: Vec::with_capacity(positions),
        reference: Reference::None,
        kl: Vec::new(),
    };
    let mut kept = Vec::new();
    for start in (0..positions).step_by(LOGIT_BLOCK) {
        let block = start..(start + LOGIT_BLOCK).min(positions);
        let recomputed = match reference.map(|r| &r.reference) {
            Some(Reference::Stream(f32_hidden)) => block_rows(lm, f32_hidden, block.clone()),
            _ => Vec::new(),
        };
        for ((ls, max), j) in block_rows(lm, &hidden, block.clone())
            .into_iter()
            .zip(block)
        {
            out.logp
                .push(ls.get(ids[j + 1] as usize).copied().unwrap_or(f64::NAN));
            out.argmax.push(max);
            let f32_row = match reference.map(|r| &r.reference) {
                Some(Reference::Rows(rows)) => rows.get(j),
                Some(Reference::Stream(_)) => recomputed.get(j - start).map(|(row, _)| row),
                _ => None,
            };
            match reference {
                Some(_) => out.kl.push(f32_row.map_or(f64::NAN, |a| kl(a, &ls))),
                None if keep_rows => kept.push(ls),
                None => {}
            }
        }
    }
    if reference.is_none() {
        out.reference = if keep_rows {
            Reference::Rows(kept)
        } else {
            Reference::Stream(hidden)
        };
    }
    out
}

/// Each KVQuant scheme's calibration as the audit re-fits it, by (bits, first tokens).
type Calibrations = Vec<((u32, usize), Calibration)>;

/// The calibration of `run`'s KVQuant scheme, if it is one and was re-fitted.
fn calibration_of<'a>(calibrations: &'a Calibrations, run: &Run) -> Option<&'a Calibration> {
    let scheme = run.kvquant()?;
    calibrations
        .iter()
        .find(|(s, _)| *s == scheme)
        .map(|(_, c)| c)
}

/// Greedy tokens with the audit's packed cache: each step a pass over everything so far.
fn greedy(
    model: &dyn CausalLm,
    prompt: &[u32],
    n: usize,
    run: &Run,
    calibration: Option<&Calibration>,
) -> Result<Vec<i64>, String> {
    let mut ids = prompt.to_vec();
    let layers = model.layers();
    for _ in 0..n {
        let (hidden, _) = model
            .hidden_with_layer_source(&ids, &mut |l, kv| {
                Ok(cache::layer_source(run, calibration, (l, layers), kv)?.0)
            })
            .map_err(|e| e.to_string())?;
        let logits = model.logits(hidden.slice(s![hidden.nrows() - 1.., ..]));
        ids.push(argmax(logits.row(0).as_slice().unwrap_or(&[])));
    }
    Ok(ids[prompt.len()..].iter().map(|&t| i64::from(t)).collect())
}

/// Every pass a model-quality directory holds: `t{i}_f32`, then each row id, then each
/// perturbed pass ([`sensitivity::pass_id`]), text by text.
fn pass_ids(p: &QualityProtocol, runs: &[Run]) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..p.texts.len() {
        out.push(format!("t{i}_f32"));
        out.extend(runs.iter().map(|r| r.id(i)));
        out.extend(
            perturbed_passes(p, runs, i)
                .into_iter()
                .map(|(id, _, _)| id),
        );
    }
    out
}

/// Text `t`'s perturbed passes: (pass id, perturbation, run), in archive order.
fn perturbed_passes<'a>(
    p: &'a QualityProtocol,
    runs: &'a [Run],
    t: usize,
) -> Vec<(String, sensitivity::Perturbation, &'a Run)> {
    let Some(block) = &p.sensitivity else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, perturbation) in block.perturbations.iter().enumerate() {
        for &r in &block.runs {
            out.push((
                sensitivity::pass_id(k, &runs[r], t),
                *perturbation,
                &runs[r],
            ));
        }
    }
    out
}

/// Whether a chosen pass runs a KVQuant cache, which reads the calibration: a sampled audit
/// that re-runs none leaves the calibration pass (the model over 2,048 tokens, and every fit)
/// out, as it leaves the passes out.
fn reads_calibration(p: &QualityProtocol, runs: &[Run], chosen: &[String]) -> bool {
    let perturbed = (0..p.texts.len()).any(|t| {
        perturbed_passes(p, runs, t)
            .iter()
            .any(|(id, _, run)| run.kvquant().is_some() && chosen.contains(id))
    });
    perturbed
        || runs
            .iter()
            .filter(|r| r.kvquant().is_some())
            .any(|r| (0..p.texts.len()).any(|t| chosen.contains(&r.id(t))))
}

/// What a re-run checks against.
pub(super) struct Rerun<'a> {
    /// The protocol.
    pub protocol: &'a QualityProtocol,
    /// Its runs.
    pub runs: &'a [Run],
    /// The manifest's ids, per text.
    pub ids: &'a [Vec<u32>],
    /// results.json's rows (none if it does not parse; that is reported with results.json).
    pub rows: &'a [QualityRow],
    /// arrays.npz's SHA-256 as recorded (the sample's seed).
    pub arrays_sha256: &'a str,
}

impl Rerun<'_> {
    /// Re-runs every pass (or a sample) and holds the archive to it, and decodes every
    /// generated text (module docs).
    pub(super) fn check(&self, archive: &Archive, options: &Options, report: &mut Report) {
        let all = pass_ids(self.protocol, self.runs);
        let decoder = self.protocol.geometry().model;
        let Some(model) = model_files::load(decoder, &options.models, report) else {
            let attention = match (self.protocol.attention.is_some(), self.protocol.mechanisms) {
                (true, true) => ", the texts' attention errors, their mechanisms",
                (true, false) => ", the texts' attention errors",
                (false, true) => ", the texts' mechanisms",
                (false, false) => "",
            };
            report.unverified(format!(
                "{} model passes (log-probs, KL values, argmaxes{attention} and generated ids) \
                 were not re-run",
                all.len()
            ));
            if self.protocol.generate.is_some() {
                report.note(Note::GeneratedTextNotDecoded);
            }
            return;
        };
        let Some((lm, tokenizer)) = model.decoder() else {
            return;
        };
        self.check_texts(tokenizer, archive, report);
        let chosen = sample::choose(&all, self.arrays_sha256, options.sample);
        if chosen.len() < all.len() {
            report.note(Note::Sampled {
                passes: chosen.clone(),
                of: all.len(),
            });
        }
        let sampled = chosen.len() < all.len();
        let calibrations = if !sampled || reads_calibration(self.protocol, self.runs, &chosen) {
            self.check_calibration(lm, tokenizer, archive, report)
        } else {
            if self.protocol.calibration.is_some() {
                report.note(Note::CalibrationNotSampled);
            }
            Vec::new()
        };
        passes(
            self.protocol,
            self.runs,
            self.ids,
            &chosen,
            &calibrations,
            tokenizer,
            lm,
            archive,
            report,
        );
    }

    /// The calibration pass (module docs): `calibration_ids` re-tokenized, and each KVQuant
    /// scheme's calibration re-fitted and required bit for bit; returns the calibrations the
    /// KVQuant runs' passes read.
    fn check_calibration(
        &self,
        lm: &dyn CausalLm,
        tokenizer: DecoderTokenizer<'_>,
        archive: &Archive,
        report: &mut Report,
    ) -> Calibrations {
        let pass = "calibration";
        let Some(text) = &self.protocol.calibration else {
            return Vec::new();
        };
        let ids = match tokenizer.encode(&text.text) {
            Ok(mut ids) => {
                ids.truncate(CALIBRATION_TOKENS);
                ids
            }
            Err(e) => {
                report.fail(Problem::RerunFailed {
                    pass: pass.into(),
                    reason: format!("the calibration text does not tokenize: {e}"),
                });
                return Vec::new();
            }
        };
        let archived = match archive.info("calibration_ids").map(|i| i.shape.as_slice()) {
            Some(&[n]) => archive.values::<i64>("calibration_ids", &[n]).ok(),
            _ => None,
        };
        // Its dtype and shape are checked (and reported) with the other arrays.
        if let Some(archived) = archived {
            let derived: Vec<i64> = ids.iter().map(|&x| i64::from(x)).collect();
            let differs = archived
                .iter()
                .zip(&derived)
                .position(|(a, b)| a != b)
                .or((archived.len() != derived.len()).then(|| archived.len().min(derived.len())));
            if let Some(i) = differs {
                report.fail(Problem::Rerun {
                    pass: pass.into(),
                    array: "calibration_ids".into(),
                    index: i,
                    found: archived.get(i).map_or("the end".into(), |x| x.to_string()),
                    expected: derived.get(i).map_or("the end".into(), |x| {
                        format!("{x} (the calibration text's tokenization)")
                    }),
                });
            }
        }
        let schemes = QualityProtocol::kvquant_schemes(self.runs);
        if schemes.is_empty() {
            return Vec::new();
        }
        let mut layers = Vec::with_capacity(lm.layers());
        let plain = lm.hidden_with_layer_source(&ids, &mut |_, kv| {
            layers.push((kv.k_pre_rope.clone(), kv.v.clone()));
            Ok(Box::new(OwnKv::new(kv.k, kv.v)))
        });
        if let Err(e) = plain {
            report.fail(Problem::RerunFailed {
                pass: pass.into(),
                reason: e.to_string(),
            });
            return Vec::new();
        }
        report.count(Checked::PassesRerun, 1);
        let mut out = Vec::new();
        for (bits, first) in schemes {
            let calibration = match Calibration::fit(bits, first, &layers) {
                Ok(c) => c,
                Err(reason) => {
                    report.fail(Problem::RerunFailed {
                        pass: pass.into(),
                        reason: format!("{}: {reason}", kvquant::name(bits, first)),
                    });
                    continue;
                }
            };
            let prefix = calibration_prefix((bits, first));
            let rows = calibration.layers.len();
            let widen = |xs: &[half::f16]| xs.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
            let tables: [Vec<f32>; 4] = [
                calibration
                    .layers
                    .iter()
                    .flat_map(|l| widen(&l.key_upper))
                    .collect(),
                calibration
                    .layers
                    .iter()
                    .flat_map(|l| widen(&l.key_lower))
                    .collect(),
                calibration
                    .layers
                    .iter()
                    .flat_map(|l| l.key_levels.clone())
                    .collect(),
                calibration
                    .layers
                    .iter()
                    .flat_map(|l| l.value_levels.clone())
                    .collect(),
            ];
            for (name, table) in CALIBRATION_ARRAYS.iter().zip(&tables) {
                let shape = [rows, table.len() / rows.max(1)];
                require_shaped(
                    archive,
                    pass,
                    &format!("{prefix}_{name}"),
                    &shape,
                    table,
                    report,
                );
            }
            out.push(((bits, first), calibration));
        }
        out
    }

    /// results.json's generated texts are the archived ids decoded (UTF-8, invalid bytes
    /// replaced), as the format says.
    fn check_texts(&self, tokenizer: DecoderTokenizer<'_>, archive: &Archive, report: &mut Report) {
        let Some(g) = self.protocol.generate else {
            return;
        };
        let decode = |name: &str| -> Option<String> {
            let ids = archive.values::<i64>(name, &[g.tokens]).ok()?;
            let ids: Vec<u32> = ids
                .iter()
                .map(|&x| u32::try_from(x).ok())
                .collect::<Option<_>>()?;
            tokenizer.decode(&ids).ok()
        };
        for row in self.rows {
            for (field, written, array) in [
                (
                    "generated_text",
                    &row.generated_text,
                    format!("{}_generated", row.id),
                ),
                (
                    "f32_generated_text",
                    &row.f32_generated_text,
                    format!("t{}_f32_generated", row.text),
                ),
            ] {
                let Some(decoded) = decode(&array) else {
                    continue;
                };
                if written.as_deref() != Some(decoded.as_str()) {
                    report.fail(Problem::Metric {
                        id: row.id.clone(),
                        field,
                        recorded: format!("{written:?}"),
                        recomputed: format!("{decoded:?} ({array} decoded)"),
                    });
                }
            }
        }
        report.count(Checked::GeneratedTexts, 2 * self.rows.len());
    }
}

/// The chosen passes, re-run text by text.
#[allow(clippy::too_many_arguments)]
fn passes(
    p: &QualityProtocol,
    runs: &[Run],
    ids: &[Vec<u32>],
    chosen: &[String],
    calibrations: &Calibrations,
    tokenizer: DecoderTokenizer<'_>,
    lm: &dyn CausalLm,
    archive: &Archive,
    report: &mut Report,
) {
    for (t, text) in p.texts.iter().enumerate() {
        let Some(recorded) = ids.get(t) else {
            continue;
        };
        let f32_pass = format!("t{t}_f32");
        let rows: Vec<&Run> = runs.iter().filter(|r| chosen.contains(&r.id(t))).collect();
        let perturbed: Vec<(String, sensitivity::Perturbation, &Run)> =
            perturbed_passes(p, runs, t)
                .into_iter()
                .filter(|(id, _, _)| chosen.contains(id))
                .collect();
        if !chosen.contains(&f32_pass) && rows.is_empty() && perturbed.is_empty() {
            continue;
        }
        check_tokens(tokenizer, &text.text, p.max_tokens, recorded, t, report);
        let measure = chosen.contains(&f32_pass);
        let plain = match float32_pass(
            p,
            &rows,
            calibrations,
            lm,
            recorded,
            (t, measure),
            archive,
            report,
        ) {
            Ok(hidden) => hidden,
            Err(e) => {
                return report.fail(Problem::RerunFailed {
                    pass: f32_pass,
                    reason: e.to_string(),
                });
            }
        };
        let f32_scored = score_blocks(lm, recorded, plain, None);
        let prompt = p
            .generate
            .map(|g| &recorded[..g.prompt_tokens.min(recorded.len())]);
        if chosen.contains(&f32_pass) {
            report.count(Checked::PassesRerun, 1);
            require(
                archive,
                &f32_pass,
                &format!("t{t}_f32_logp"),
                &f32_scored.logp,
                report,
            );
            require(
                archive,
                &f32_pass,
                &format!("t{t}_f32_argmax"),
                &f32_scored.argmax,
                report,
            );
            if let (Some(prompt), Some(g)) = (prompt, p.generate) {
                match lm.generate_greedy(prompt, g.tokens) {
                    Ok(generated) => {
                        let generated: Vec<i64> = generated.iter().map(|&x| i64::from(x)).collect();
                        require(
                            archive,
                            &f32_pass,
                            &format!("t{t}_f32_generated"),
                            &generated,
                            report,
                        );
                    }
                    Err(e) => report.fail(Problem::RerunFailed {
                        pass: f32_pass.clone(),
                        reason: e.to_string(),
                    }),
                }
            }
        }
        // Runs are independent: re-run them on every core, then report in run order.
        let reports: Vec<Report> = rows
            .par_iter()
            .map(|run| {
                let mut own = Report::new(String::new());
                check_run(
                    lm,
                    run,
                    calibration_of(calibrations, run),
                    t,
                    recorded,
                    &f32_scored,
                    prompt,
                    p,
                    archive,
                    &mut own,
                );
                own
            })
            .collect();
        for own in reports {
            report.absorb(own);
        }
        let reports: Vec<Report> = perturbed
            .par_iter()
            .map(|(id, perturbation, run)| {
                let mut own = Report::new(String::new());
                let calibration = calibration_of(calibrations, run);
                check_perturbed(
                    lm,
                    (id, *perturbation),
                    run,
                    calibration,
                    recorded,
                    &f32_scored,
                    archive,
                    &mut own,
                );
                own
            })
            .collect();
        for own in reports {
            report.absorb(own);
        }
    }
}

/// A perturbed pass of a named run ([`sensitivity`]) with the audit's own perturbation and
/// cache, against the archive.
#[allow(clippy::too_many_arguments)]
fn check_perturbed(
    lm: &dyn CausalLm,
    (id, perturbation): (&str, sensitivity::Perturbation),
    run: &Run,
    calibration: Option<&Calibration>,
    recorded: &[u32],
    f32_scored: &Scored,
    archive: &Archive,
    report: &mut Report,
) {
    let layers = lm.layers();
    let mut rng = nprand::NumpyRng::default_rng(u128::from(perturbation.seed));
    let packed = match lm.hidden_with_layer_source(recorded, &mut |l, kv| {
        let (after, values, before) = sensitivity::perturb(kv, perturbation.relative, &mut rng)?;
        let moved = kv.positions_from(0, (&after, &values, &before))?;
        Ok(cache::layer_source(run, calibration, (l, layers), &moved)?.0)
    }) {
        Ok((hidden, _)) => hidden,
        Err(e) => {
            return report.fail(Problem::RerunFailed {
                pass: id.to_string(),
                reason: e.to_string(),
            });
        }
    };
    let scored = score_blocks(lm, recorded, packed, Some(f32_scored));
    report.count(Checked::PassesRerun, 1);
    require(archive, id, &format!("{id}_logp"), &scored.logp, report);
    require(archive, id, &format!("{id}_kl"), &scored.kl, report);
    require(archive, id, &format!("{id}_argmax"), &scored.argmax, report);
}

/// Text `t`'s float32 pass: the stream after the last block (bit for bit the plain pass's,
/// its source handing back the layer's own rows), with an `attention` block each run of
/// `rows`' attention error at every layer, re-derived with the audit's cache of the run and
/// required bit for bit ([`attention`]), and with `mechanisms`, when the float32 pass itself is
/// chosen (`measure`), every layer's mechanisms, required bit for bit ([`mechanisms`]); the
/// first text's chosen pass under matched draws also gives every layer's per-channel
/// statistics, required bit for bit ([`attention::stats`]).
#[allow(clippy::too_many_arguments)]
fn float32_pass(
    p: &QualityProtocol,
    rows: &[&Run],
    calibrations: &Calibrations,
    lm: &dyn CausalLm,
    recorded: &[u32],
    (t, measure): (usize, bool),
    archive: &Archive,
    report: &mut Report,
) -> Result<Array2<f32>, models::llama::ModelError> {
    let matched = measure && t == 0 && p.attention.as_ref().is_some_and(|b| b.matched);
    let measure = measure && p.mechanisms;
    if p.attention.is_none() && !measure {
        return lm
            .hidden_with(recorded, &mut |_, _, _| Ok(()))
            .map(|(h, _)| h);
    }
    let layers = lm.layers();
    let mut entries: Vec<Vec<f64>> = vec![Vec::with_capacity(2 * layers); rows.len()];
    let mut measured_mechanisms: Vec<f64> = Vec::new();
    let mut measured_stats: [Vec<f64>; 3] = Default::default();
    let (hidden, _) = lm.hidden_with_layer_source(recorded, &mut |l, kv| {
        let window = lm.window(l);
        if let Some(block) = &p.attention {
            let measured: Vec<Result<attention::LayerError, HookError>> = rows
                .par_iter()
                .map(|run| {
                    let calibration = calibration_of(calibrations, run);
                    let (read, _) = cache::layer_source(run, calibration, (l, layers), kv)?;
                    attention::layer_error(kv, read.as_ref(), window, block.stride)
                })
                .collect();
            for (out, m) in entries.iter_mut().zip(measured) {
                out.extend(m?);
            }
        }
        if measure {
            measured_mechanisms.extend(mechanisms::layer(kv, window).into_iter().flatten());
        }
        if matched {
            for (out, x) in measured_stats.iter_mut().zip([kv.q, kv.k, kv.v]) {
                out.extend(attention::stats(x));
            }
        }
        Ok(Box::new(OwnKv::new(kv.k, kv.v)))
    })?;
    if p.attention.is_some() {
        for (run, derived) in rows.iter().zip(&entries) {
            let name = attention::text_member(run, t);
            require_shaped(archive, &run.id(t), &name, &[layers, 2], derived, report);
        }
    }
    if matched {
        let members = attention::stats_members(&p.geometry());
        for ((name, shape), derived) in members.iter().zip(&measured_stats) {
            require_shaped(archive, &format!("t{t}_f32"), name, shape, derived, report);
        }
    }
    if measure {
        require_shaped(
            archive,
            &format!("t{t}_f32"),
            &mechanisms::member(t),
            &[layers, lm.kv_heads(), 4],
            &measured_mechanisms,
            report,
        );
    }
    Ok(hidden)
}

/// One run's pass (and generation) with the audit's cache, against the archive.
#[allow(clippy::too_many_arguments)]
fn check_run(
    lm: &dyn CausalLm,
    run: &Run,
    calibration: Option<&Calibration>,
    t: usize,
    recorded: &[u32],
    f32_scored: &Scored,
    prompt: Option<&[u32]>,
    p: &QualityProtocol,
    archive: &Archive,
    report: &mut Report,
) {
    let id = run.id(t);
    let layers = lm.layers();
    let mut outliers = vec![0i64; layers];
    let packed = match lm.hidden_with_layer_source(recorded, &mut |l, kv| {
        let (source, count) = cache::layer_source(run, calibration, (l, layers), kv)?;
        if let Some(slot) = outliers.get_mut(l) {
            *slot = i64::try_from(count)?;
        }
        Ok(source)
    }) {
        Ok((hidden, _)) => hidden,
        Err(e) => {
            return report.fail(Problem::RerunFailed {
                pass: id,
                reason: e.to_string(),
            });
        }
    };
    let scored = score_blocks(lm, recorded, packed, Some(f32_scored));
    report.count(Checked::PassesRerun, 1);
    require(archive, &id, &format!("{id}_logp"), &scored.logp, report);
    require(archive, &id, &format!("{id}_kl"), &scored.kl, report);
    require(
        archive,
        &id,
        &format!("{id}_argmax"),
        &scored.argmax,
        report,
    );
    if run.kvquant().is_some() {
        require(archive, &id, &format!("{id}_outliers"), &outliers, report);
    }
    if let (Some(prompt), Some(g)) = (prompt, p.generate) {
        match greedy(lm, prompt, g.tokens, run, calibration) {
            Ok(generated) => {
                require(archive, &id, &format!("{id}_generated"), &generated, report);
            }
            Err(reason) => report.fail(Problem::RerunFailed { pass: id, reason }),
        }
    }
}

/// The manifest's ids for text `t` are the text's tokenization, cut to `max_tokens`.
fn check_tokens(
    tokenizer: DecoderTokenizer<'_>,
    text: &str,
    max_tokens: usize,
    recorded: &[u32],
    t: usize,
    report: &mut Report,
) {
    let pass = format!("t{t}_f32");
    match tokenizer.encode(text) {
        Ok(mut ids) => {
            ids.truncate(max_tokens);
            let differs = recorded
                .iter()
                .zip(&ids)
                .position(|(a, b)| a != b)
                .or((recorded.len() != ids.len()).then(|| recorded.len().min(ids.len())));
            if let Some(i) = differs {
                report.fail(Problem::Rerun {
                    pass,
                    array: format!("manifest model.ids.t{t}"),
                    index: i,
                    found: recorded.get(i).map_or("the end".into(), |x| x.to_string()),
                    expected: ids.get(i).map_or("the end".into(), |x| {
                        format!("{x} (the text's tokenization)")
                    }),
                });
            }
        }
        Err(e) => report.fail(Problem::RerunFailed {
            pass,
            reason: format!("the text does not tokenize: {e}"),
        }),
    }
}

/// Pinsker's inequality at every position of every row, and the float32 run's first generated
/// token (module docs); needs no model.
pub(super) fn check_consistency(
    p: &QualityProtocol,
    runs: &[Run],
    tokens: &[usize],
    archive: &Archive,
    report: &mut Report,
) {
    for (t, &n) in tokens.iter().enumerate() {
        let positions = n.saturating_sub(1);
        let Ok(f32_logp) = archive.values::<f64>(&format!("t{t}_f32_logp"), &[positions]) else {
            continue;
        };
        if let Some(g) = p.generate
            && let (Ok(argmax), Ok(generated)) = (
                archive.values::<i64>(&format!("t{t}_f32_argmax"), &[positions]),
                archive.values::<i64>(&format!("t{t}_f32_generated"), &[g.tokens]),
            )
            && let (Some(&a), Some(&first)) = (argmax.get(g.prompt_tokens - 1), generated.first())
            && a != first
        {
            report.fail(Problem::Value {
                array: format!("t{t}_f32_generated"),
                index: 0,
                found: first.to_string(),
                expected: format!(
                    "{a}, t{t}_f32_argmax[{}]: the first greedy token is the argmax after the \
                     prompt",
                    g.prompt_tokens - 1
                ),
            });
        }
        for run in runs {
            let id = run.id(t);
            let (Ok(logp), Ok(kls)) = (
                archive.values::<f64>(&format!("{id}_logp"), &[positions]),
                archive.values::<f64>(&format!("{id}_kl"), &[positions]),
            ) else {
                continue;
            };
            for j in 0..positions {
                let gap = libm::exp(f32_logp[j]) - libm::exp(logp[j]);
                let bound = 2.0 * gap * gap;
                if kls[j] < bound - PINSKER_SLACK {
                    report.fail(Problem::Value {
                        array: format!("{id}_kl"),
                        index: j,
                        found: format!("{:?}", kls[j]),
                        expected: format!(
                            "at least {bound:?} (Pinsker: KL >= 2 (p_f32 - p)^2 of the scored \
                             token)"
                        ),
                    });
                    break;
                }
            }
        }
    }
}
