//! What a packed cache does to a real model: a decoder's forward pass (SmolLM2 or Gemma 3,
//! `models::CausalLm`) with every layer's K and V
//! cache held by the KV codec (`kvcodec`), measured against the float32 cache by teacher
//! forcing (NLL, perplexity, KL, top-1 agreement), by cache bytes per token and by greedy text.
//!
//! Where things live:
//! - [`setting`]: the codec setting (`g32_b4`, `g32_b4_asym`, `g32_b4_swap`, ...), the budget
//!   policy and the schedule, parsed into types;
//! - [`cache`]: the packed cache of one layer, what attention reads from it per schedule and
//!   policy (the rules, written once), and its bytes;
//! - [`scheme`]: a named scheme of the literature (`kvschemes`) as the cache instead, and
//!   [`Cache`], the one value a measurement takes (a setting or a scheme);
//! - [`cost`]: what a cache stores for T tokens of a model, without running it (`runner bytes`);
//! - [`decoder`]: the model measured (SmolLM2 or Gemma 3) with its tokenizer;
//! - [`metrics`]: log-softmax, NLL, KL and top-1 agreement in f64;
//! - [`bootstrap`]: a paired bootstrap over the texts, an interval for every change and
//!   every difference between runs;
//! - [`mechanisms`]: what the float32 cache looks like (outlier key channels, per-channel
//!   offsets, attention on the first token), per layer and KV head;
//! - [`sensitivity`]: named runs re-run with cache inputs perturbed at float32 rounding, and
//!   how far their figures move;
//! - [`generate`]: greedy generation with a packed cache;
//! - [`error`]: typed errors;
//! - [`corpus`]: the public evaluation texts (`scripts/fetch-texts`) as documents, cleaned and
//!   split into evaluation and calibration sets, and a protocol's texts from them (`runner corpus`);
//! - [`one_text`]: `runner quality`, one text under one configuration, with greedy text;
//! - [`study`]: `runner quality --protocol`, an archived study (protocol, runs, summary), with
//!   its summary.md ([`report`]), chart ([`chart`]) and frontier and matched-budget ranking
//!   ([`frontier`]), written as an evidence directory by [`write`](mod@write); [`shard`]
//!   runs it in slices of texts and merges them back, byte-identical to a single run.
//!
//! [`measure`] runs one text under one [`CacheSpec`]: one plain pass (the float32 cache) and
//! one pass on the packed cache (`CausalLm::hidden_with_layer_source`). With a float32 "packed" cache
//! (every unit in the float32 tier) the second pass gives the bits of the first (see the tests).

#![warn(missing_docs)]

pub mod attention_error;
pub mod bootstrap;
pub mod cache;
pub mod chart;
pub mod corpus;
pub mod cost;
pub mod decoder;
pub mod error;
pub mod frontier;
pub mod generate;
pub mod mechanisms;
pub mod metrics;
pub mod one_text;
pub mod reference;
pub mod report;
pub mod scheme;
pub mod sensitivity;
pub mod setting;
pub mod shard;
pub mod study;
pub mod write;

pub use cache::{CacheSpec, PackedLayer};
pub use error::QualityError;
pub use scheme::{Cache, LayerCost, SchemeSpec};
pub use setting::{KvSetting, Policy, Schedule};

use models::CausalLm;
use serde::Serialize;

/// One text under one cache configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    /// The setting's label (`null` for a scheme).
    pub setting: Option<String>,
    /// The policy's label (`null` for a scheme).
    pub policy: Option<String>,
    /// The scheme's name (`null` for a setting).
    pub scheme: Option<String>,
    /// The schedule's label.
    pub schedule: String,
    /// Tokens in the text (T; T - 1 positions are scored).
    pub tokens: usize,
    /// NLL per token with the float32 cache (nats).
    pub nll_f32: f64,
    /// exp(nll_f32).
    pub perplexity_f32: f64,
    /// NLL per token with the packed cache (nats).
    pub nll: f64,
    /// exp(nll).
    pub perplexity: f64,
    /// Mean KL(p_f32 || p_packed).
    pub kl_mean: f64,
    /// Largest KL(p_f32 || p_packed).
    pub kl_max: f64,
    /// Share of positions whose argmax agrees with the float32 cache's.
    pub top1_agreement: f64,
    /// Packed cache bytes per token at the end of the text ([`cache`] docs).
    pub bytes_per_token: f64,
    /// The float32 cache's bytes per token at the end of the text (its sliding layers, if
    /// any, holding their window only).
    #[serde(serialize_with = "cache::whole_as_integer")]
    pub f32_bytes_per_token: f64,
    /// Cache bits per K or V value stored: bytes per token * 32 / the float32 cache's (which
    /// holds the same values); 32 for the float32 cache.
    pub bits_per_element: f64,
    /// Per position numbers (not serialized: the summary above is what a report prints).
    #[serde(skip)]
    pub positions: metrics::Comparison,
}

/// Positions whose logits [`measure`] holds at once: 64 rows of Gemma 3's vocabulary are 64 MiB
/// per cache.
pub const LOGIT_BLOCK: usize = 64;

/// Measures `ids` under `cache` (a [`CacheSpec`] or a [`SchemeSpec`]) on a decoder (SmolLM2 or
/// Gemma 3); `progress` is called with the number of layer passes done out of 2 * layers.
/// Logits are computed [`LOGIT_BLOCK`] positions at a time (`metrics::compare_in_blocks`).
pub fn measure(
    model: &dyn CausalLm,
    ids: &[u32],
    cache: impl Into<Cache>,
    mut progress: impl FnMut(usize),
) -> Result<Measurement, QualityError> {
    let cache = cache.into();
    if ids.len() < 2 {
        return Err(QualityError::TooFewTokens(ids.len()));
    }
    let layers = model.layers();
    let (plain, _) = model.hidden_with(ids, &mut |l, _, _| {
        progress(l + 1);
        Ok(())
    })?;
    let mut bytes = 0usize;
    let (packed, _) = model.hidden_with_layer_source(ids, &mut |l, kv| {
        progress(layers + l + 1);
        let (source, cost) = cache.layer((l, layers), model.window(l), kv)?;
        bytes += cost.bytes;
        Ok(source)
    })?;
    let positions = metrics::compare_in_blocks(ids, LOGIT_BLOCK, |rows| {
        Ok((
            model.logits(plain.slice(ndarray::s![rows.clone(), ..])),
            model.logits(packed.slice(ndarray::s![rows, ..])),
        ))
    })?;
    let (setting, policy, scheme) = match &cache {
        Cache::Codec(spec) => (
            Some(spec.setting.to_string()),
            Some(spec.policy.to_string()),
            None,
        ),
        Cache::Scheme(spec) => (None, None, Some(spec.scheme().to_string())),
    };
    let bytes_per_token = bytes as f64 / ids.len() as f64;
    let windows: Vec<Option<usize>> = (0..layers).map(|l| model.window(l)).collect();
    let f32_bytes_per_token =
        cache::f32_held_bytes_per_token(&windows, model.kv_heads(), model.head_dim(), ids.len());
    Ok(Measurement {
        setting,
        policy,
        scheme,
        schedule: cache.schedule().to_string(),
        tokens: ids.len(),
        nll_f32: positions.nll_f32,
        perplexity_f32: libm::exp(positions.nll_f32),
        nll: positions.nll,
        perplexity: libm::exp(positions.nll),
        kl_mean: positions.kl_mean,
        kl_max: positions.kl_max,
        top1_agreement: positions.top1_agreement,
        bytes_per_token,
        f32_bytes_per_token,
        bits_per_element: bytes_per_token * 32.0 / f32_bytes_per_token,
        positions,
    })
}
