//! `runner quality`: one text through a decoder (SmolLM2 or Gemma 3) with the float32 cache and
//! with a packed cache (the `quality` crate), printed as a short table or one JSON object.
//!
//! Gemma 3's text starts with its BOS (its tokenizer adds it, as llama.cpp does for this file);
//! its sliding-window layers hold, and are billed for, only their last 512 tokens
//! ([`crate::cache`], [`crate::scheme`]).
//!
//! The cache is a codec setting under a policy and schedule, or a named scheme of the literature
//! (`--scheme`: KIVI, llama.cpp's cache types; `quality::scheme`) under a schedule.
//!
//! JSON members: `model`, `setting`, `policy` (`null` for a scheme), `scheme` (`null` for a setting),
//! `schedule`, `tokens`, `nll_f32`, `perplexity_f32`, `nll`, `perplexity`, `kl_mean`, `kl_max`,
//! `top1_agreement`, `bytes_per_token`, `f32_bytes_per_token`, `bits_per_element` (the
//! `quality::Measurement`), and `generation` (`null` when no tokens
//! are generated): `prompt_tokens`, `ids_f32`, `ids`, `text_f32`, `text`, `first_difference`
//! (the first generated position where the packed cache's greedy text departs, or `null`).

use crate::decoder::Decoder;
use crate::generate::{self, Generation};
use crate::{Cache, CacheSpec, KvSetting, Measurement, Policy, QualityError, Schedule, SchemeSpec};
use models::llama::ModelError;
use models::{ModelFiles, ModelName};
use serde::Serialize;
use thiserror::Error;

/// Why `runner quality` cannot measure.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QualityCmdError {
    /// An encoder has no next-token distribution.
    #[error(
        "{0} is an encoder: it has no next-token distribution; `runner quality` measures smollm2 \
         and gemma3"
    )]
    Encoder(ModelName),
    /// A label, the cache or the measurement was refused.
    #[error(transparent)]
    Quality(#[from] QualityError),
    /// The model cannot be loaded or run.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The model files are missing.
    #[error(transparent)]
    Files(#[from] models::files::FilesError),
    /// A calibration text that overlaps the measured text.
    #[error(
        "the calibration text and the text overlap (one contains the other): a KVQuant scheme \
         must not be calibrated on the text it is measured on; give --calibration-file"
    )]
    CalibrationOverlap,
    /// More tokens to generate than the model's context holds after the prompt.
    #[error(
        "--generate {generate} is more than the model's context of {context} tokens leaves \
         after a {prompt}-token prompt (at most {})",
        context.saturating_sub(*prompt)
    )]
    Generate {
        /// Tokens asked for.
        generate: usize,
        /// Tokens in the prompt (1, the fewest, when checked before the prompt is encoded).
        prompt: usize,
        /// The context length.
        context: usize,
    },
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The model (a decoder: SmolLM2 or Gemma 3).
    pub model: ModelName,
    /// Setting label, `g<GROUP>_b<BITS>[_asym][_swap]` (parsed by [`KvSetting`]).
    pub setting: &'a str,
    /// Policy label.
    pub policy: &'a str,
    /// Schedule label.
    pub schedule: &'a str,
    /// A scheme's name (`kivi4`, `llamacpp-q4_0+rot`, ...): the cache instead of `setting` and
    /// `policy`, which are then not read.
    pub scheme: Option<&'a str>,
    /// A KVQuant scheme's calibration text ([`DEFAULT_CALIBRATION`] when `None`); not read
    /// for other caches.
    pub calibration: Option<&'a str>,
    /// The text (teacher forcing).
    pub text: &'a str,
    /// The generation prompt; the text's first [`DEFAULT_PROMPT_TOKENS`] tokens when `None`.
    pub prompt: Option<&'a str>,
    /// Greedy tokens to generate.
    pub generate: usize,
}

/// The measurement and the greedy texts.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The model (`smollm2`, `gemma3`).
    pub model: String,
    /// The teacher-forcing numbers.
    #[serde(flatten)]
    pub measurement: Measurement,
    /// Greedy generation with both caches.
    pub generation: Option<GenerationReport>,
}

/// Greedy generation with its decoded texts.
#[derive(Debug, Clone, Serialize)]
pub struct GenerationReport {
    /// Ids and the first difference.
    #[serde(flatten)]
    pub ids: Generation,
    /// The float32 cache's generated text.
    pub text_f32: String,
    /// The packed cache's generated text.
    pub text: String,
}

/// Without `--prompt`, generation continues the text's first tokens, at most this many: each
/// generated token is one pass over the prompt and what came before (`crate::generate`).
pub const DEFAULT_PROMPT_TOKENS: usize = 32;

/// The calibration text a KVQuant scheme fits its levels on when none is given: docs/audit.md
/// as it was when KVQuant was added (English prose about this project, not any text the studies
/// evaluate; [`crate::study::CALIBRATION_TOKENS`] of its ids are used).
pub const DEFAULT_CALIBRATION: &str = include_str!("../data/calibration.txt");

/// Progress steps of a request: two passes of every layer, then one per generated token.
pub fn steps(request: &Request<'_>) -> usize {
    (2 * request.model.shape().layers).saturating_add(request.generate)
}

/// Parses the labels into a cache configuration and bounds `--generate` by the context
/// (before any model is loaded).
pub fn spec(request: &Request<'_>) -> Result<Cache, QualityCmdError> {
    let shape = request.model.shape();
    if !shape.causal {
        return Err(QualityCmdError::Encoder(request.model));
    }
    let context = shape.max_tokens;
    if request.generate >= context {
        // Even a one-token prompt leaves at most context - 1; the exact bound is checked once
        // the prompt is encoded ([`measure`]).
        return Err(QualityCmdError::Generate {
            generate: request.generate,
            prompt: 1,
            context,
        });
    }
    Ok(parse_cache(
        request.setting,
        request.policy,
        request.schedule,
        request.scheme,
    )?)
}

/// The cache the labels name: a `scheme` under `schedule`, or else `setting` under `policy`
/// and `schedule` (`runner quality`'s and `runner bytes`' flags).
pub fn parse_cache(
    setting: &str,
    policy: &str,
    schedule: &str,
    scheme: Option<&str>,
) -> Result<Cache, QualityError> {
    let schedule: Schedule = schedule.parse()?;
    if let Some(scheme) = scheme {
        let scheme = scheme.parse()?;
        return Ok(SchemeSpec::new(scheme, schedule)?.into());
    }
    let setting: KvSetting = setting.parse().map_err(QualityError::Setting)?;
    let policy = Policy::parse(policy, &setting)?;
    Ok(CacheSpec::new(setting, policy, schedule)?.into())
}

/// Loads the model and measures; `progress` gets the steps done (see [`steps`]).
pub fn run(
    request: &Request<'_>,
    mut progress: impl FnMut(usize),
) -> Result<Report, QualityCmdError> {
    let spec = spec(request)?;
    let files = ModelFiles::locate(request.model)?;
    let decoder = Decoder::load(&files)?;
    measure(&decoder, request, spec, &mut progress)
}

/// [`run`] with a loaded model.
pub fn measure(
    decoder: &Decoder,
    request: &Request<'_>,
    spec: Cache,
    progress: &mut dyn FnMut(usize),
) -> Result<Report, QualityCmdError> {
    let model = decoder.model();
    let ids = decoder.encode(request.text)?;
    let layers = model.layers();
    let spec = calibrated(decoder, request, spec)?;
    let measurement = crate::measure(model, &ids, spec.clone(), &mut *progress)?;
    let generation = if request.generate == 0 {
        None
    } else {
        let prompt = match request.prompt {
            Some(prompt) => decoder.encode(prompt)?,
            None => ids[..ids.len().min(DEFAULT_PROMPT_TOKENS)].to_vec(),
        };
        let context = model.context();
        if prompt
            .len()
            .checked_add(request.generate)
            .is_none_or(|tokens| tokens > context)
        {
            return Err(QualityCmdError::Generate {
                generate: request.generate,
                prompt: prompt.len(),
                context,
            });
        }
        let ids = generate::compare(model, &prompt, request.generate, spec, |n| {
            progress(2 * layers + n)
        })?;
        Some(GenerationReport {
            text_f32: decoder.decode(&ids.ids_f32)?,
            text: decoder.decode(&ids.ids)?,
            ids,
        })
    };
    Ok(Report {
        model: model.name().to_string(),
        measurement,
        generation,
    })
}

/// A KVQuant spec with its calibration fitted on the request's calibration text, which must not
/// overlap the text; any other spec as it is.
fn calibrated(
    decoder: &Decoder,
    request: &Request<'_>,
    spec: Cache,
) -> Result<Cache, QualityCmdError> {
    let Cache::Scheme(scheme) = &spec else {
        return Ok(spec);
    };
    let Some(kvquant) = scheme.kvquant() else {
        return Ok(spec);
    };
    let calibration = request.calibration.unwrap_or(DEFAULT_CALIBRATION);
    let (a, b) = (request.text.trim(), calibration.trim());
    if a.contains(b) || b.contains(a) {
        return Err(QualityCmdError::CalibrationOverlap);
    }
    let mut ids = decoder.encode(calibration)?;
    ids.truncate(crate::study::CALIBRATION_TOKENS);
    let fitted = crate::scheme::calibrate(decoder.model(), &ids, &[kvquant])?;
    let (_, fitted) = fitted
        .into_iter()
        .next()
        .ok_or(QualityError::TooFewTokens(0))?;
    Ok(scheme.clone().with_calibration(fitted)?.into())
}

/// The short table `runner quality` prints without `--json`.
pub fn render(report: &Report) -> String {
    let m = &report.measurement;
    let cache = match (&m.scheme, &m.setting, &m.policy) {
        (Some(scheme), _, _) => format!("scheme {scheme}"),
        (None, setting, policy) => format!(
            "setting {}, policy {}",
            setting.as_deref().unwrap_or("-"),
            policy.as_deref().unwrap_or("-")
        ),
    };
    let mut out = format!(
        "{}, {} tokens: {cache}, schedule {}\n{:<22}{:>16}{:>16}\n",
        report.model, m.tokens, m.schedule, "", "float32 cache", "packed cache"
    );
    let mut row = |name: &str, a: String, b: String| {
        out.push_str(&format!("{name:<22}{a:>16}{b:>16}\n"));
    };
    row(
        "NLL (nats/token)",
        format!("{:.6}", m.nll_f32),
        format!("{:.6}", m.nll),
    );
    row(
        "perplexity",
        format!("{:.4}", m.perplexity_f32),
        format!("{:.4}", m.perplexity),
    );
    row("KL mean", "-".into(), format!("{:.6}", m.kl_mean));
    row("KL max", "-".into(), format!("{:.6}", m.kl_max));
    row(
        "top-1 agreement",
        "-".into(),
        format!("{:.4}", m.top1_agreement),
    );
    row(
        "cache bytes/token",
        crate::report::bytes_or_whole(m.f32_bytes_per_token),
        format!("{:.1}", m.bytes_per_token),
    );
    row(
        "bits per K/V value",
        "32".into(),
        format!("{:.3}", m.bits_per_element),
    );
    if let Some(g) = &report.generation {
        out.push_str(&format!(
            "greedy, {} tokens after {} prompt tokens:\n  float32: {:?}\n  packed:  {:?}\n  {}\n",
            g.ids.ids.len(),
            g.ids.prompt_tokens,
            g.text_f32,
            g.text,
            match g.ids.first_difference {
                Some(i) => format!("first difference at generated token {i}"),
                None => "identical".to_string(),
            }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(model: ModelName, setting: &'static str) -> Request<'static> {
        Request {
            model,
            setting,
            policy: "uniform",
            schedule: "prefill",
            scheme: None,
            calibration: None,
            text: "x",
            prompt: None,
            generate: 0,
        }
    }

    #[test]
    fn a_scheme_is_parsed_in_place_of_the_setting_and_policy() {
        let mut r = request(ModelName::SmolLm2, "not read");
        r.scheme = Some("llamacpp-q4_0+rot");
        assert!(matches!(spec(&r), Ok(Cache::Scheme(_))));
        r.scheme = Some("kivi5");
        let err = spec(&r).unwrap_err().to_string();
        assert!(err.contains("unknown scheme \"kivi5\""), "{err}");
    }

    #[test]
    fn an_encoder_and_unknown_labels_are_refused_before_loading() {
        let err = spec(&request(ModelName::MiniLm, "g32_b4")).unwrap_err();
        assert!(
            err.to_string().contains("no next-token distribution"),
            "{err}"
        );
        let err = spec(&request(ModelName::SmolLm2, "int4")).unwrap_err();
        assert!(
            err.to_string().contains("g<GROUP>_b<BITS>[_asym][_swap]"),
            "{err}"
        );
        let mut r = request(ModelName::SmolLm2, "g32_b4_swap");
        assert!(spec(&r).is_ok());
        // Sizes from flags that used to abort or wrap are refused before loading, by name.
        for (setting, needle) in [
            ("g4294967296_b4", "group size 4294967296 is above"),
            ("g18446744073709551615_b4", "is above 134217728"),
            ("g16384_b4", "context length"),
        ] {
            let err = spec(&request(ModelName::SmolLm2, setting)).unwrap_err();
            assert!(err.to_string().contains(needle), "{setting}: {err}");
        }
        r.generate = usize::MAX;
        assert_eq!(steps(&r), usize::MAX);
        let err = spec(&r).unwrap_err();
        assert!(
            matches!(err, QualityCmdError::Generate { context: 8192, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("at most 8191"), "{err}");
        r.generate = 8191;
        assert!(spec(&r).is_ok());
        r.generate = 0;
        r.schedule = "online";
        assert!(
            spec(&r)
                .unwrap_err()
                .to_string()
                .contains("prefill, streaming")
        );
    }
}
