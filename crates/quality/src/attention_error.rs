//! Attention error: what a run's cache does to each layer's attention output, on the model's own
//! K/V and on Gaussian K/V of the model's shape. This is the attention-error study's metric
//! (`kvstudy`) for every cache a model-quality protocol runs, schemes of the literature included.
//!
//! For layer l, query head h (which reads KV head h / (heads / kv_heads)) and query position i
//! in [`queries`] (every `stride`-th position: stride - 1, 2 stride - 1, ... below T), over the
//! positions the layer lets i read (j <= i, and j > i - W on a sliding layer of window W):
//!
//! - `s_j` = (the sum over features `f` in order of `q[f] * k_j[f]`, in f64) times
//!   `1 / sqrt(head_dim)` (both models' own scale: SmolLM2's, and Gemma 3's 1/16 on q);
//! - `w_j = exp(s_j - max s)` (`libm::exp`), `Z` = the sum of `w_j` in position order;
//! - `o` = the sum over `j` in position order of `(w_j / Z) * v_j`, per feature in f64;
//!
//! once with the float32 K/V (o_ref) and once with what the run's cache hands query i at each
//! position (o). Per layer the study keeps `[sum ||o - o_ref||^2, sum ||o_ref||^2]`, summed over
//! heads, then queries, then features, in order. An input's relative L2 error is
//! sqrt(sum over layers of the first / sum over layers of the second); a run's, pooled over
//! inputs, the same with every input's layers summed (in input order).
//!
//! Model K/V are each text's float32 pass (the run's cache built from them as the quality pass
//! builds it, KVQuant from the keys before RoPE, with the protocol's calibration). Gaussian K/V,
//! per seed s of [`AttentionSpec::gaussian_seeds`]: NumPy's `default_rng(s)`, and per layer in
//! order `q`, `k`, `v` = `standard_normal((heads, T, head_dim))`, `(kv_heads, T, head_dim)`
//! twice, cast to float32 (T = `max_tokens`); such keys have no position, so KVQuant quantizes
//! them as drawn (its "before RoPE" is the draw) and calibrates on the draw of
//! [`AttentionSpec::calibration_seed`]. Gaussian caches are billed as the model's are (sliding
//! layers too), from what they store.
//!
//! Matched draws ([`AttentionSpec::matched`]): i.i.d. keys have no outlier channels and no
//! per-channel offset, so they cannot show what a cache's layout does to the model's keys. With
//! `matched`, each seed also gives a draw with the first text's per-channel mean and spread:
//! per layer, head and channel c of its float32 pass's `q` (as attention reads it, after RoPE),
//! stored `k` (after RoPE) and `v`, over its T0 positions, `mean_c` = (the sum over positions in
//! order of x, in f64) / T0 and `std_c` = sqrt((the sum over positions in order of (x -
//! mean_c)^2) / T0) ([`channel_stats`]); the matched draw takes the seed's standard normals
//! `z` (the same float32 values as its i.i.d. draw, so the two are paired) and stores
//! `(mean_c + std_c * z) as f32`, computed in f64 ([`matched_draw`]). Positions stay
//! independent and channels uncorrelated: only each channel's first two moments are the
//! model's. KVQuant quantizes matched keys as drawn too and is calibrated on the matched draw of
//! the calibration seed.

use std::sync::Arc;

use kvschemes::kvquant::{Calibration, KvQuantScheme};
use models::ModelShape;
use models::llama::{HookError, KvSource, LayerKv, row_of};
use ndarray::Array3;
use nprand::NumpyRng;
use rayon::ThreadPool;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::QualityError;
use crate::scheme::Cache;
use crate::scheme::LayerBuilder;

/// Most Gaussian seeds.
pub const MAX_GAUSSIAN_SEEDS: usize = 8;

/// The protocol's `attention` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionSpec {
    /// Every `stride`-th position is a query (1 to `max_tokens`).
    pub stride: usize,
    /// Seeds of the Gaussian draws (at most [`MAX_GAUSSIAN_SEEDS`], distinct; may be empty).
    pub gaussian_seeds: Vec<u64>,
    /// The seed of the Gaussian draw KVQuant's levels are fitted on (required when a run names
    /// KVQuant and there are Gaussian seeds; not one of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration_seed: Option<u64>,
    /// Whether each seed also gives a draw matched to the first text's per-channel mean and
    /// spread (module docs; needs Gaussian seeds).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub matched: bool,
}

/// One layer's `[sum of squared errors, sum of squared reference outputs]`.
pub type LayerError = [f64; 2];

/// Query positions of a T-token input: stride - 1, 2 stride - 1, ... below T.
pub fn queries(tokens: usize, stride: usize) -> impl Iterator<Item = usize> {
    (stride.max(1) - 1..tokens).step_by(stride.max(1))
}

/// The relative L2 error of errors summed over `layers` (NaN when the reference is all zero).
pub fn relative_l2<'a>(layers: impl IntoIterator<Item = &'a LayerError>) -> f64 {
    let (err, reference) = layers
        .into_iter()
        .fold((0f64, 0f64), |(e, r), x| (e + x[0], r + x[1]));
    (err / reference).sqrt()
}

/// Attention of one query over positions `range`, rows from `rows(j) = (k_j, v_j)` (module docs).
fn attend<'a>(
    query: &[f32],
    range: std::ops::Range<usize>,
    rows: impl Fn(usize) -> (&'a [f32], &'a [f32]),
    out: &mut [f64],
) -> Result<(), HookError> {
    let d = query.len();
    let scale = 1.0 / (d as f64).sqrt();
    let mut scores = Vec::with_capacity(range.len());
    for j in range.clone() {
        let (k, v) = rows(j);
        if k.len() != d || v.len() != out.len() {
            return Err(format!(
                "position {j} reads a key of {} and a value of {} values, where heads have {d}",
                k.len(),
                v.len()
            )
            .into());
        }
        let dot = query
            .iter()
            .zip(k)
            .fold(0f64, |a, (&x, &y)| a + f64::from(x) * f64::from(y));
        scores.push(dot * scale);
    }
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    for s in &mut scores {
        *s = libm::exp(*s - max);
    }
    let total = scores.iter().fold(0f64, |a, &w| a + w);
    out.fill(0.0);
    for (j, w) in range.zip(&scores) {
        let p = w / total;
        for (o, &x) in out.iter_mut().zip(rows(j).1) {
            *o += p * f64::from(x);
        }
    }
    Ok(())
}

/// One layer's error (module docs): the float32 K/V of `kv` against what `read` hands each query;
/// `window` is the layer's sliding window, if it slides.
pub fn layer_error(
    kv: &LayerKv<'_>,
    read: &dyn KvSource,
    window: Option<usize>,
    stride: usize,
) -> Result<LayerError, HookError> {
    let (heads, tokens, d) = kv.q.dim();
    let kv_heads = kv.k.dim().0;
    if kv_heads == 0 || heads % kv_heads != 0 || kv.k.dim() != (kv_heads, tokens, d) {
        return Err(format!(
            "queries {:?} over keys {:?}: heads must be a multiple of KV heads",
            kv.q.dim(),
            kv.k.dim()
        )
        .into());
    }
    let q = kv.q.as_standard_layout();
    let group = heads / kv_heads;
    let (mut o, mut o_ref) = (vec![0f64; d], vec![0f64; d]);
    let (mut err, mut reference) = (0f64, 0f64);
    for h in 0..heads {
        let g = h / group;
        for i in queries(tokens, stride) {
            let first = window.map_or(0, |w| (i + 1).saturating_sub(w));
            let query = &q.as_slice().expect("standard layout")[(h * tokens + i) * d..][..d];
            attend(
                query,
                first..i + 1,
                |j| (row_of(kv.k, g, j), row_of(kv.v, g, j)),
                &mut o_ref,
            )?;
            attend(
                query,
                first..i + 1,
                |j| (read.key(g, i, j), read.value(g, i, j)),
                &mut o,
            )?;
            for (a, b) in o.iter().zip(&o_ref) {
                err += (a - b) * (a - b);
                reference += b * b;
            }
        }
    }
    Ok([err, reference])
}

/// One layer's Gaussian draw: q, k and v (module docs).
pub type GaussianLayer = (Array3<f32>, Array3<f32>, Array3<f32>);

/// The Gaussian draw of `seed` for a model of `layers` layers, `heads` query heads, `kv_heads`
/// KV heads and `head_dim`, over `tokens` positions.
pub fn gaussian(
    seed: u64,
    layers: usize,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    tokens: usize,
) -> Vec<GaussianLayer> {
    let mut rng = NumpyRng::default_rng(u128::from(seed));
    (0..layers)
        .map(|_| {
            let q = rng.normal_array_f32((heads, tokens, head_dim));
            let k = rng.normal_array_f32((kv_heads, tokens, head_dim));
            let v = rng.normal_array_f32((kv_heads, tokens, head_dim));
            (q, k, v)
        })
        .collect()
}

/// Per head, per channel `[mean, std]` of one tensor of a layer ([`channel_stats`]).
pub type ChannelStats = Vec<Vec<[f64; 2]>>;

/// One layer's per-channel statistics of q, k and v.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerStats {
    /// Of the queries (query heads).
    pub q: ChannelStats,
    /// Of the stored keys (KV heads).
    pub k: ChannelStats,
    /// Of the values (KV heads).
    pub v: ChannelStats,
}

/// Per head and channel of `x` (`[heads, T, head_dim]`, T > 0), `[mean, std]` (module docs).
pub fn channel_stats(x: &Array3<f32>) -> ChannelStats {
    let (heads, tokens, dim) = x.dim();
    let n = tokens as f64;
    (0..heads)
        .map(|h| {
            (0..dim)
                .map(|c| {
                    let mean = (0..tokens).fold(0f64, |a, t| a + f64::from(x[[h, t, c]])) / n;
                    let square = (0..tokens).fold(0f64, |a, t| {
                        let d = f64::from(x[[h, t, c]]) - mean;
                        a + d * d
                    });
                    [mean, (square / n).sqrt()]
                })
                .collect()
        })
        .collect()
}

/// One layer's [`LayerStats`] from the layer's float32 pass.
pub fn layer_stats(kv: &LayerKv<'_>) -> LayerStats {
    LayerStats {
        q: channel_stats(kv.q),
        k: channel_stats(kv.k),
        v: channel_stats(kv.v),
    }
}

/// `z` moved to each channel's mean and spread: `(mean + std * z) as f32` in f64.
fn matched(z: &Array3<f32>, stats: &ChannelStats) -> Result<Array3<f32>, QualityError> {
    let (heads, _, dim) = z.dim();
    if stats.len() != heads || stats.iter().any(|h| h.len() != dim) {
        return Err(QualityError::Gaussian(format!(
            "statistics of {} heads for a draw of {heads} heads of {dim} channels",
            stats.len()
        )));
    }
    let mut out = z.clone();
    for ((h, _, c), x) in out.indexed_iter_mut() {
        let [mean, std] = stats[h][c];
        *x = (mean + std * f64::from(*x)) as f32;
    }
    Ok(out)
}

/// The matched draw of `seed` (module docs): the Gaussian draw moved, layer by layer, to
/// `stats`' means and spreads.
pub fn matched_draw(
    seed: u64,
    (heads, kv_heads, head_dim): (usize, usize, usize),
    tokens: usize,
    stats: &[LayerStats],
) -> Result<Vec<GaussianLayer>, QualityError> {
    gaussian(seed, stats.len(), (heads, kv_heads, head_dim), tokens)
        .iter()
        .zip(stats)
        .map(|((q, k, v), s)| Ok((matched(q, &s.q)?, matched(k, &s.k)?, matched(v, &s.v)?)))
        .collect()
}

/// Every run's errors: per text, then per Gaussian seed, per run in protocol order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionResult {
    /// Per text, per run: each layer's error on the text's float32 K/V.
    pub texts: Vec<Vec<Vec<LayerError>>>,
    /// Per Gaussian seed, per run: each layer's error, and the bytes the run's cache stores
    /// for the draw (every layer).
    pub gaussian: Vec<Vec<GaussianRun>>,
    /// The first text's per-layer statistics the matched draws follow, when matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Vec<LayerStats>>,
    /// Per Gaussian seed, per run, as `gaussian`: on the matched draw.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<Vec<GaussianRun>>,
}

/// One run on one Gaussian draw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GaussianRun {
    /// Each layer's error.
    pub layers: Vec<LayerError>,
    /// Bytes stored, every layer.
    pub bytes: usize,
}

/// Every run's cache of one layer (built by `layer`) against the layer's float32 K/V, on
/// `pool`: each run's error, and the bytes its cache stores.
pub(crate) fn layer_errors(
    specs: &[Cache],
    layer: &LayerBuilder,
    (l, layers): (usize, usize),
    window: Option<usize>,
    kv: &LayerKv<'_>,
    stride: usize,
    pool: &ThreadPool,
) -> Result<Vec<(LayerError, usize)>, HookError> {
    pool.install(|| {
        specs
            .par_iter()
            .map(|spec| {
                let (read, cost) = layer(spec, (l, layers), window, kv)?;
                Ok((layer_error(kv, read.as_ref(), window, stride)?, cost.bytes))
            })
            .collect()
    })
}

/// Which draw of a seed: i.i.d. standard normal, or matched to a text's statistics.
#[derive(Debug, Clone, Copy)]
pub enum Draw<'a> {
    /// [`gaussian`].
    Iid,
    /// [`matched_draw`] with these statistics (one entry per layer).
    Matched(&'a [LayerStats]),
}

impl Draw<'_> {
    /// This draw of `seed`, `tokens` positions of a model of `shape`.
    pub fn of(
        self,
        seed: u64,
        shape: &ModelShape,
        tokens: usize,
    ) -> Result<Vec<GaussianLayer>, QualityError> {
        let heads = (shape.query_heads, shape.kv_heads, shape.head_dim);
        match self {
            Draw::Iid => Ok(gaussian(seed, shape.layers, heads, tokens)),
            Draw::Matched(stats) if stats.len() == shape.layers => {
                matched_draw(seed, heads, tokens, stats)
            }
            Draw::Matched(stats) => Err(QualityError::Gaussian(format!(
                "statistics of {} layers for a model of {}",
                stats.len(),
                shape.layers
            ))),
        }
    }
}

/// Every run on `draw` of `seed` (module docs), `tokens` positions of a model of `shape`.
/// KVQuant runs read the calibration `calibrations` holds for their scheme (fitted by
/// [`gaussian_calibrations`] on the same kind of draw).
#[allow(clippy::too_many_arguments)]
pub fn gaussian_runs(
    (seed, draw): (u64, Draw<'_>),
    shape: &ModelShape,
    tokens: usize,
    specs: &[Cache],
    calibrations: &[(KvQuantScheme, Arc<Calibration>)],
    layer: &LayerBuilder,
    stride: usize,
    pool: &ThreadPool,
) -> Result<Vec<GaussianRun>, QualityError> {
    let specs = crate::scheme::with_calibrations(specs, calibrations)?;
    let draw = draw.of(seed, shape, tokens)?;
    let mut runs = vec![
        GaussianRun {
            layers: Vec::with_capacity(shape.layers),
            bytes: 0
        };
        specs.len()
    ];
    for (l, (q, k, v)) in draw.iter().enumerate() {
        let kv = LayerKv::unrotated(q, k, v);
        let window = shape.window(l);
        let measured = layer_errors(&specs, layer, (l, shape.layers), window, &kv, stride, pool)
            .map_err(|e| QualityError::Gaussian(e.to_string()))?;
        for (run, (e, bytes)) in runs.iter_mut().zip(measured) {
            run.layers.push(e);
            run.bytes = run.bytes.saturating_add(bytes);
        }
    }
    Ok(runs)
}

/// Each KVQuant scheme of `specs` fitted on `draw` of `seed` (keys as drawn).
pub fn gaussian_calibrations(
    (seed, draw): (u64, Draw<'_>),
    shape: &ModelShape,
    tokens: usize,
    specs: &[Cache],
) -> Result<Vec<(KvQuantScheme, Arc<Calibration>)>, QualityError> {
    let schemes = crate::scheme::kvquant_schemes(specs);
    if schemes.is_empty() {
        return Ok(Vec::new());
    }
    let layers: Vec<(Array3<f32>, Array3<f32>)> = draw
        .of(seed, shape, tokens)?
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .collect();
    crate::scheme::fit_calibrations(&schemes, &layers)
}

/// summary.json's `attention`: a row per run, in protocol order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionSummary {
    /// The query stride.
    pub stride: usize,
    /// Gaussian draws.
    pub gaussian_draws: usize,
    /// Per run.
    pub rows: Vec<AttentionRow>,
}

/// One run's attention error: its labels and [`AttentionFigures`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionRow {
    /// Setting label; absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setting: Option<String>,
    /// Policy label; absent for a scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Scheme name; absent for a setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Schedule label.
    pub schedule: String,
    /// The figures.
    #[serde(flatten)]
    pub figures: AttentionFigures,
}

/// A run's relative L2 errors ([`relative_l2`]) over the texts and the Gaussian draws.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AttentionFigures {
    /// On the texts' K/V, pooled over the texts.
    pub relative_l2: f64,
    /// The smallest of the texts' own relative L2 errors.
    pub relative_l2_min: f64,
    /// The largest.
    pub relative_l2_max: f64,
    /// Pooled over the Gaussian draws; null without draws.
    pub gaussian_relative_l2: Option<f64>,
    /// The smallest draw's.
    pub gaussian_relative_l2_min: Option<f64>,
    /// The largest draw's.
    pub gaussian_relative_l2_max: Option<f64>,
    /// Bits per element of the Gaussian caches: their mean bytes per token over the float32
    /// cache's, times 32 (KVQuant's outliers make it differ from the texts').
    pub gaussian_bits_per_element: Option<f64>,
    /// The same four over the matched draws; absent unless the protocol asks for them.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<MatchedFigures>,
}

/// A run's figures over the matched draws.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MatchedFigures {
    /// Pooled over the matched draws.
    pub matched_relative_l2: f64,
    /// The smallest draw's.
    pub matched_relative_l2_min: f64,
    /// The largest.
    pub matched_relative_l2_max: f64,
    /// Bits per element of the matched caches, as for the Gaussian ones.
    pub matched_bits_per_element: f64,
}

/// The smallest and largest of `xs` (NaN-free: errors of finite caches).
fn extremes(xs: &[f64]) -> (f64, f64) {
    xs.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

/// Over `draws` of `tokens` positions: pooled, least and most relative L2 error, and bits per
/// element against a float32 cache of `float32_bytes_per_token`.
fn draw_figures(draws: &[&GaussianRun], tokens: usize, float32_bytes_per_token: f64) -> [f64; 4] {
    let per_draw: Vec<f64> = draws.iter().map(|g| relative_l2(&g.layers)).collect();
    let (lo, hi) = extremes(&per_draw);
    let bytes = draws.iter().fold(0f64, |a, g| a + g.bytes as f64) / draws.len() as f64;
    [
        relative_l2(draws.iter().flat_map(|g| &g.layers)),
        lo,
        hi,
        crate::cache::bits_per_element(bytes / tokens as f64, float32_bytes_per_token),
    ]
}

/// One run's figures from its errors on each text, each Gaussian draw and each matched draw
/// (none when not matched) of `tokens` positions, whose float32 cache stores
/// `float32_bytes_per_token`.
pub fn figures(
    texts: &[&[LayerError]],
    (draws, matched): (&[&GaussianRun], &[&GaussianRun]),
    tokens: usize,
    float32_bytes_per_token: f64,
) -> AttentionFigures {
    let per_text: Vec<f64> = texts.iter().map(|l| relative_l2(l.iter())).collect();
    let (lo, hi) = extremes(&per_text);
    let g = (!draws.is_empty()).then(|| draw_figures(draws, tokens, float32_bytes_per_token));
    AttentionFigures {
        relative_l2: relative_l2(texts.iter().flat_map(|l| l.iter())),
        relative_l2_min: lo,
        relative_l2_max: hi,
        gaussian_relative_l2: g.map(|g| g[0]),
        gaussian_relative_l2_min: g.map(|g| g[1]),
        gaussian_relative_l2_max: g.map(|g| g[2]),
        gaussian_bits_per_element: g.map(|g| g[3]),
        matched: (!matched.is_empty()).then(|| {
            let [l2, lo, hi, bits] = draw_figures(matched, tokens, float32_bytes_per_token);
            MatchedFigures {
                matched_relative_l2: l2,
                matched_relative_l2_min: lo,
                matched_relative_l2_max: hi,
                matched_bits_per_element: bits,
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use models::llama::OwnKv;

    fn draw() -> GaussianLayer {
        gaussian(5, 1, (4, 2, 8), 20).pop().expect("one layer")
    }

    #[test]
    fn queries_are_every_stride_th_position() {
        assert_eq!(queries(10, 4).collect::<Vec<_>>(), [3, 7]);
        assert_eq!(queries(3, 1).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(queries(3, 5).count(), 0);
    }

    #[test]
    fn the_float32_cache_has_no_error_and_a_changed_value_has_some() {
        let (q, k, v) = draw();
        let kv = LayerKv::unrotated(&q, &k, &v);
        let same = layer_error(&kv, &OwnKv::new(&k, &v), None, 3).unwrap();
        assert_eq!(same[0], 0.0);
        assert!(same[1] > 0.0);
        let mut v2 = v.clone();
        v2[[1, 0, 0]] += 0.5;
        let changed = layer_error(&kv, &OwnKv::new(&k, &v2), None, 3).unwrap();
        assert!(changed[0] > 0.0);
        assert_eq!(changed[1], same[1]);
    }

    #[test]
    fn one_query_matches_softmax_attention_written_out() {
        // One head over 3 positions with stride 3: the query at position 2 reads positions
        // 0..=2, or only 2 under a window of 1. A cache that reads zero values makes the
        // error the output itself.
        let (q, k, v) = draw();
        let one = |x: &Array3<f32>| x.slice(ndarray::s![1..2, 0..3, ..]).to_owned();
        let (q, k, v) = (one(&q), one(&k), one(&v));
        let naive = |first: usize| -> f64 {
            let s: Vec<f64> = (first..3)
                .map(|j| {
                    (0..8)
                        .map(|f| f64::from(q[[0, 2, f]]) * f64::from(k[[0, j, f]]))
                        .sum::<f64>()
                        / 8f64.sqrt()
                })
                .collect();
            let m = s.iter().copied().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            (0..8)
                .map(|f| {
                    (first..3)
                        .map(|j| (s[j - first] - m).exp() / z * f64::from(v[[0, j, f]]))
                        .sum::<f64>()
                        .powi(2)
                })
                .sum()
        };
        let kv = LayerKv::unrotated(&q, &k, &v);
        let zeros = OwnKv::new(&k, &Array3::zeros(v.dim()));
        for (window, first) in [(None, 0), (Some(1), 2)] {
            let [err, reference] = layer_error(&kv, &zeros, window, 3).unwrap();
            let expected = naive(first);
            assert_eq!(err, reference);
            assert!((reference - expected).abs() <= 1e-12 * expected);
        }
    }

    #[test]
    fn a_source_with_short_rows_is_refused() {
        let (q, k, v) = draw();
        let kv = LayerKv::unrotated(&q, &k, &v);
        let short = k.slice(ndarray::s![.., .., 0..4]).to_owned();
        let err = layer_error(&kv, &OwnKv::new(&short, &v), None, 3).unwrap_err();
        assert!(err.to_string().contains("key of 4"), "{err}");
    }

    #[test]
    fn gaussian_caches_of_sliding_layers_are_billed_for_their_window() {
        // Layer 0 slides over 4 positions, layer 1 reads all 10. One KV head of 32 values is
        // one q8_0 block (34 bytes) per token and side: 4 x 68 + 10 x 68 bytes.
        let shape = ModelShape {
            layers: 2,
            query_heads: 2,
            kv_heads: 1,
            head_dim: 32,
            causal: true,
            max_tokens: 64,
            sliding: Some((4, 2)),
        };
        let scheme = "llamacpp-q8_0".parse().unwrap();
        let spec = crate::scheme::SchemeSpec::new(scheme, crate::Schedule::Prefill).unwrap();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let layer =
            |c: &Cache, at: (usize, usize), w: Option<usize>, kv: &LayerKv<'_>| c.layer(at, w, kv);
        let runs = gaussian_runs(
            (3, Draw::Iid),
            &shape,
            10,
            &[Cache::Scheme(spec)],
            &[],
            &layer,
            2,
            &pool,
        )
        .unwrap();
        assert_eq!(runs[0].bytes, 14 * 68);
        for [err, reference] in &runs[0].layers {
            assert!(*err > 0.0 && err < reference);
        }
    }

    #[test]
    fn channel_stats_are_each_channels_mean_and_spread_over_positions() {
        // Head 0: channel 0 takes 1 and 3 (mean 2, spread 1), channel 1 is constant at -4.
        // Head 1: channel 0 takes 0 and 10, channel 1 takes 2 and 2.
        let x = Array3::from_shape_vec((2, 2, 2), vec![1., -4., 3., -4., 0., 2., 10., 2.]).unwrap();
        let stats = channel_stats(&x);
        assert_eq!(
            stats,
            vec![vec![[2.0, 1.0], [-4.0, 0.0]], vec![[5.0, 5.0], [2.0, 0.0]]]
        );
    }

    #[test]
    fn a_matched_draw_moves_the_iid_draw_to_each_channels_mean_and_spread() {
        let (heads, kv_heads, dim) = (4, 2, 8);
        let iid = gaussian(9, 2, (heads, kv_heads, dim), 6);
        let unit = |h: usize| vec![vec![[0.0, 1.0]; dim]; h];
        let same = LayerStats {
            q: unit(heads),
            k: unit(kv_heads),
            v: unit(kv_heads),
        };
        let drawn = matched_draw(9, (heads, kv_heads, dim), 6, &[same.clone(), same]).unwrap();
        assert_eq!(drawn, iid);
        // Channel 3 of KV head 1's keys centred on 100 with spread 0.5; the rest as drawn.
        let mut moved = LayerStats {
            q: unit(heads),
            k: unit(kv_heads),
            v: unit(kv_heads),
        };
        moved.k[1][3] = [100.0, 0.5];
        let drawn = matched_draw(9, (heads, kv_heads, dim), 6, &[moved.clone(), moved]).unwrap();
        for t in 0..6 {
            let z = f64::from(iid[0].1[[1, t, 3]]);
            assert_eq!(drawn[0].1[[1, t, 3]], (100.0 + 0.5 * z) as f32);
            assert_eq!(drawn[0].1[[0, t, 3]], iid[0].1[[0, t, 3]]);
        }
    }

    #[test]
    fn matched_statistics_of_another_shape_are_refused() {
        let shape = ModelShape {
            layers: 2,
            query_heads: 2,
            kv_heads: 1,
            head_dim: 4,
            causal: true,
            max_tokens: 8,
            sliding: None,
        };
        let layer = LayerStats {
            q: vec![vec![[0.0, 1.0]; 4]; 2],
            k: vec![vec![[0.0, 1.0]; 4]; 1],
            v: vec![vec![[0.0, 1.0]; 3]; 1],
        };
        let one = std::slice::from_ref(&layer);
        let err = Draw::Matched(one).of(1, &shape, 8).unwrap_err();
        assert!(err.to_string().contains("statistics of 1 layers"), "{err}");
        let two = [layer.clone(), layer];
        let err = Draw::Matched(&two).of(1, &shape, 8).unwrap_err();
        assert!(err.to_string().contains("4 channels"), "{err}");
    }

    #[test]
    fn relative_l2_pools_layers_before_the_ratio() {
        let x = relative_l2(&[[1.0, 4.0], [3.0, 12.0]]);
        assert_eq!(x, 0.5);
    }
}
