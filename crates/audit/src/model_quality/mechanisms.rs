//! The mechanisms (a protocol's `mechanisms: true`), written again from the format's spec: what
//! each text's float32 keys and attention look like, per layer and KV head.
//!
//! For KV head h of a layer's float32 pass over T positions, four measures in this order:
//! 1. and 2. the keys' outlier ratio before RoPE (the layer's `k_pre_rope`) and after it (the
//!    stored keys): with `s_c` the f64 sum over positions in order of the channel's squares and
//!    `rms_c = sqrt(s_c / T)`, the largest `rms_c` over their median (NumPy's: the mean of the
//!    two middle values for an even count);
//! 3. the key energy in channel means (stored keys): the sum over channels in order of
//!    `(m_c / T)^2`, `m_c` the f64 sum over positions in order, over the sum over channels in
//!    order of `s_c / T`;
//! 4. the first-token attention: for each query head reading h (g per KV head, in order) and
//!    each query position i = 1 .. T - 1 in order, query i's softmax weight on position 0 (scores
//!    the f64 dot product over features in order times `1 / sqrt(head_dim)`, weights
//!    `libm::exp(score - max)` over their sum in position order), none where a sliding window
//!    no longer reaches position 0; each head's weights summed in position order, the heads'
//!    sums in head order, over `g (T - 1)`.
//!
//! The arithmetic is the spec's, so a re-run text's `t{i}_mechanisms` (float64
//! `[layers, kv_heads, 4]`) is required bit for bit. Every archived value must be finite, each
//! ratio at least 1 and each share within [0, 1]; summary.json's `mechanisms` is their mean
//! over the texts (in text order) per layer and head, and summary.md's mechanisms table one row
//! per layer, each cell the mean over the layer's heads in head order (ratios with 2 decimals,
//! shares in percent with 1).

use models::llama::LayerKv;
use ndarray::Array3;
use rayon::prelude::*;
use serde::Deserialize;

use super::protocol::QualityProtocol;
use crate::common::npz::Archive;
use crate::common::report::{Problem, Report};
use crate::common::tolerance::close;

/// One KV head's four measures, in the module docs' order.
pub type Measures = [f64; 4];
/// One text's measures: per layer, per KV head.
pub type TextMeasures = Vec<Vec<Measures>>;

/// The measures' names in summary.json, in order.
pub const NAMES: [&str; 4] = [
    "key_outlier_before_rope",
    "key_outlier_after_rope",
    "key_mean_energy",
    "first_token_attention",
];

/// Text `t`'s archive member.
pub fn member(t: usize) -> String {
    format!("t{t}_mechanisms")
}

/// summary.json's `mechanisms`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MechanismSummary {
    /// The measures' names.
    pub measures: Vec<String>,
    /// Per layer, per KV head, the four means.
    pub layers: Vec<Vec<Measures>>,
}

/// Per channel of head `h`: (sum, sum of squares) over positions in order, in f64.
fn sums(keys: &Array3<f32>, h: usize) -> Vec<(f64, f64)> {
    let head = keys.index_axis(ndarray::Axis(0), h);
    let mut out = vec![(0f64, 0f64); head.ncols()];
    for row in head.rows() {
        for (acc, &x) in out.iter_mut().zip(row) {
            let x = f64::from(x);
            acc.0 += x;
            acc.1 += x * x;
        }
    }
    out
}

/// Largest channel RMS over the median channel RMS.
fn outlier(keys: &Array3<f32>, h: usize) -> f64 {
    let t = keys.dim().1 as f64;
    let mut rms: Vec<f64> = sums(keys, h).iter().map(|&(_, s)| (s / t).sqrt()).collect();
    rms.sort_by(f64::total_cmp);
    let n = rms.len();
    let Some(&largest) = rms.last() else {
        return f64::NAN;
    };
    let median = if n % 2 == 1 {
        rms[n / 2]
    } else {
        (rms[n / 2 - 1] + rms[n / 2]) / 2.0
    };
    largest / median
}

/// The share of the mean square in the channel means.
fn mean_share(keys: &Array3<f32>, h: usize) -> f64 {
    let t = keys.dim().1 as f64;
    let (mut means, mut total) = (0f64, 0f64);
    for (m, _) in sums(keys, h) {
        means += (m / t) * (m / t);
    }
    for (_, s) in sums(keys, h) {
        total += s / t;
    }
    means / total
}

/// Keys [`sink`] scores side by side.
const KEYS_AT_ONCE: usize = 32;

/// Query head `qh`'s weights on position 0 over query positions 1 .. T, summed in order.
/// Each score is its own sum over the features in order; keys are scored [`KEYS_AT_ONCE`] at a
/// time from an f64 copy of the keys laid out feature by feature, one running sum per key in
/// its own vector lane (independent sums side by side, so the same bits as one at a time,
/// [`sink_one_key_at_a_time`] in the tests).
fn sink(kv: &LayerKv<'_>, qh: usize, h: usize, window: Option<usize>) -> f64 {
    let (_, t, d) = kv.q.dim();
    let scale = 1.0 / (d as f64).sqrt();
    let queries: Vec<f64> =
        kv.q.slice(ndarray::s![qh, .., ..])
            .iter()
            .map(|&x| x.into())
            .collect();
    // by_feature[c * t + j] is channel c of key j.
    let mut by_feature = vec![0f64; d * t];
    for ((j, c), &x) in kv.k.slice(ndarray::s![h, .., ..]).indexed_iter() {
        by_feature[c * t + j] = x.into();
    }
    let mut sum = 0f64;
    let mut scores: Vec<f64> = Vec::with_capacity(t);
    for i in 1..t {
        if let Some(w) = window
            && i >= w
        {
            continue;
        }
        let q = &queries[i * d..(i + 1) * d];
        scores.clear();
        scores.resize(i + 1, 0.0);
        dots(q, &by_feature, t, &mut scores);
        for s in &mut scores {
            *s *= scale;
        }
        sum += first_share(&scores);
    }
    sum
}

/// dots\[j\] = q · key j for the first `dots.len()` keys of `by_feature`, each summed over the
/// features in order; compiled for AVX-512F or AVX2 where the CPU has them (wider registers, the
/// same operations), else plain.
fn dots(q: &[f64], by_feature: &[f64], t: usize, out: &mut [f64]) {
    #[inline(always)]
    fn plain(q: &[f64], by_feature: &[f64], t: usize, out: &mut [f64]) {
        let mut j = 0;
        while j + KEYS_AT_ONCE <= out.len() {
            let mut acc = [0f64; KEYS_AT_ONCE];
            for (c, &x) in q.iter().enumerate() {
                let row = &by_feature[c * t + j..c * t + j + KEYS_AT_ONCE];
                for (a, &k) in acc.iter_mut().zip(row) {
                    *a += x * k;
                }
            }
            out[j..j + KEYS_AT_ONCE].copy_from_slice(&acc);
            j += KEYS_AT_ONCE;
        }
        for (j, o) in out.iter_mut().enumerate().skip(j) {
            *o = q
                .iter()
                .enumerate()
                .fold(0f64, |a, (c, &x)| a + x * by_feature[c * t + j]);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn wide(q: &[f64], by_feature: &[f64], t: usize, out: &mut [f64]) {
            plain(q, by_feature, t, out);
        }
        #[target_feature(enable = "avx2")]
        fn narrow(q: &[f64], by_feature: &[f64], t: usize, out: &mut [f64]) {
            plain(q, by_feature, t, out);
        }
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { wide(q, by_feature, t, out) };
        }
        if is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { narrow(q, by_feature, t, out) };
        }
    }
    plain(q, by_feature, t, out);
}

/// The softmax weight of the first of `scores`: `exp(s - max)` over their sum in order.
fn first_share(scores: &[f64]) -> f64 {
    let top = scores.iter().fold(f64::NEG_INFINITY, |a, &s| a.max(s));
    let mut z = 0f64;
    for s in scores {
        z += libm::exp(s - top);
    }
    libm::exp(scores[0] - top) / z
}

/// One layer's measures per KV head, from its float32 pass (module docs).
pub fn layer(kv: &LayerKv<'_>, window: Option<usize>) -> Vec<Measures> {
    let kv_heads = kv.k.dim().0;
    let (heads, t, _) = kv.q.dim();
    let g = (heads / kv_heads.max(1)).max(1);
    let per_query: Vec<f64> = (0..heads)
        .into_par_iter()
        .map(|qh| sink(kv, qh, qh / g, window))
        .collect();
    (0..kv_heads)
        .map(|h| {
            let mut first = 0f64;
            for w in &per_query[h * g..(h + 1) * g] {
                first += w;
            }
            [
                outlier(kv.k_pre_rope, h),
                outlier(kv.k, h),
                mean_share(kv.k, h),
                first / (g * (t - 1)) as f64,
            ]
        })
        .collect()
}

/// Each text's archived measures, range-checked (module docs); `None` without the block or
/// when a member cannot be read (its shape is reported with the other arrays).
pub fn read(
    p: &QualityProtocol,
    archive: &Archive,
    report: &mut Report,
) -> Option<Vec<TextMeasures>> {
    if !p.mechanisms {
        return None;
    }
    let g = p.geometry();
    let mut texts = Vec::with_capacity(p.texts.len());
    for t in 0..p.texts.len() {
        let name = member(t);
        let values = archive
            .values::<f64>(&name, &[g.layers, g.kv_heads, 4])
            .ok()?;
        if let Some((i, x)) = values.iter().enumerate().find(|&(i, &x)| {
            let ratio = i % 4 < 2;
            !(x.is_finite()
                && if ratio {
                    x >= 1.0
                } else {
                    (0.0..=1.0).contains(&x)
                })
        }) {
            report.fail(Problem::Value {
                array: name,
                index: i,
                found: format!("{x:?}"),
                expected: if i % 4 < 2 {
                    "a finite ratio >= 1".into()
                } else {
                    "a share within [0, 1]".into()
                },
            });
        }
        texts.push(
            values
                .chunks(4 * g.kv_heads)
                .map(|layer| layer.chunks(4).map(|m| [m[0], m[1], m[2], m[3]]).collect())
                .collect(),
        );
    }
    Some(texts)
}

/// The mean over the texts, per layer and head, summed in text order.
pub fn expected(texts: &[TextMeasures]) -> Vec<Vec<Measures>> {
    let Some(first) = texts.first() else {
        return Vec::new();
    };
    let n = texts.len() as f64;
    (0..first.len())
        .map(|l| {
            (0..first[l].len())
                .map(|h| {
                    let mut sum = [0f64; 4];
                    for text in texts {
                        for k in 0..4 {
                            sum[k] += text[l][h][k];
                        }
                    }
                    sum.map(|s| s / n)
                })
                .collect()
        })
        .collect()
}

/// summary.json's `mechanisms` against the block and the expected means.
pub fn check_summary(
    p: &QualityProtocol,
    expected: Option<&[Vec<Measures>]>,
    found: Option<&MechanismSummary>,
    report: &mut Report,
) {
    let fail = |report: &mut Report, place: String, found: String, expected: String| {
        report.fail(Problem::Summary {
            place,
            found,
            expected,
        })
    };
    let Some(found) = super::optional::block_present("mechanisms", p.mechanisms, found, report)
    else {
        return;
    };
    if found.measures != NAMES {
        fail(
            report,
            "mechanisms measures".into(),
            format!("{:?}", found.measures),
            format!("{NAMES:?}"),
        );
    }
    let Some(expected) = expected else {
        return;
    };
    let shape = |l: &[Vec<Measures>]| l.iter().map(Vec::len).collect::<Vec<_>>();
    if shape(&found.layers) != shape(expected) {
        return fail(
            report,
            "mechanisms layers".into(),
            format!("heads per layer {:?}", shape(&found.layers)),
            format!("{:?}", shape(expected)),
        );
    }
    for (l, (got, want)) in found.layers.iter().zip(expected).enumerate() {
        for (h, (g, w)) in got.iter().zip(want).enumerate() {
            for k in 0..4 {
                if !close(g[k], w[k]) {
                    fail(
                        report,
                        format!("mechanisms layer {l} head {h} {}", NAMES[k]),
                        g[k].to_string(),
                        w[k].to_string(),
                    );
                }
            }
        }
    }
}

/// summary.md's mechanisms table from the expected means (module docs).
pub fn table(expected: &[Vec<Measures>]) -> Vec<Vec<String>> {
    let mut out = vec![
        [
            "layer",
            "key outlier ratio before RoPE",
            "after RoPE",
            "key energy in channel means",
            "attention on the first token",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect::<Vec<_>>(),
    ];
    for (l, heads) in expected.iter().enumerate() {
        let n = heads.len() as f64;
        let mut mean = [0f64; 4];
        for head in heads {
            for k in 0..4 {
                mean[k] += head[k];
            }
        }
        let mean = mean.map(|m| m / n);
        out.push(vec![
            l.to_string(),
            format!("{:.2}", mean[0]),
            format!("{:.2}", mean[1]),
            format!("{:.1}%", 100.0 * mean[2]),
            format!("{:.1}%", 100.0 * mean[3]),
        ]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measure one key at a time, as the module docs state it.
    fn sink_one_key_at_a_time(kv: &LayerKv<'_>, qh: usize, h: usize, window: Option<usize>) -> f64 {
        let (_, t, d) = kv.q.dim();
        let scale = 1.0 / (d as f64).sqrt();
        let mut sum = 0f64;
        for i in 1..t {
            if let Some(w) = window
                && i >= w
            {
                continue;
            }
            let q = kv.q.slice(ndarray::s![qh, i, ..]);
            let scores: Vec<f64> = (0..=i)
                .map(|j| {
                    let k = kv.k.slice(ndarray::s![h, j, ..]);
                    let dot = q
                        .iter()
                        .zip(k.iter())
                        .fold(0f64, |a, (&x, &y)| a + f64::from(x) * f64::from(y));
                    dot * scale
                })
                .collect();
            sum += first_share(&scores);
        }
        sum
    }

    #[test]
    fn keys_side_by_side_give_one_at_a_times_bits() {
        // Random, three-level (tie-heavy), all-maximum and patterned rows; token counts on both
        // sides of a whole block of keys; a window; queries in column-major order.
        let mut rng = nprand::NumpyRng::default_rng(611u128);
        for t in [2, 3, 4, 5, 6, 7, 8, 29, 32, 33, 64, 70] {
            for kind in 0..4 {
                let mut value = |(a, b, c): (usize, usize, usize)| match kind {
                    0 => (rng.standard_normal() * 2.5) as f32,
                    1 => rng.integers(3) as f32 - 1.0,
                    2 => 1.0e17f32,
                    _ => ((a * 5 + b * 11 + c) % 7) as f32 - 3.0,
                };
                let k = Array3::from_shape_fn((2, t, 10), &mut value);
                let q = Array3::from_shape_fn((4, t, 10), &mut value);
                let mut q_columns = Array3::<f32>::zeros(ndarray::ShapeBuilder::f((4, t, 10)));
                q_columns.assign(&q);
                for queries in [&q, &q_columns] {
                    let kv = LayerKv::unrotated(queries, &k, &k);
                    for qh in 0..4 {
                        for window in [None, Some(4)] {
                            assert_eq!(
                                sink(&kv, qh, qh / 2, window).to_bits(),
                                sink_one_key_at_a_time(&kv, qh, qh / 2, window).to_bits(),
                                "kind {kind}, {t} tokens, head {qh}, {window:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_measures_follow_the_spec_on_small_keys() {
        // Channels of RMS 1, 1, 2 and 10: ratio 10 / 1.5; the keys never move, so all their
        // energy is in the channel means; zero queries spread weight evenly (1 / (i + 1)).
        let k = Array3::from_shape_fn((1, 3, 4), |(_, _, c)| [1.0f32, -1.0, 2.0, 10.0][c]);
        let q = Array3::<f32>::zeros((2, 3, 4));
        let kv = LayerKv::unrotated(&q, &k, &k);
        let m = layer(&kv, None);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0][0], 10.0 / 1.5);
        assert_eq!(m[0][1], 10.0 / 1.5);
        assert_eq!(m[0][2], 1.0);
        assert!((m[0][3] - (0.5 + 1.0 / 3.0) / 2.0).abs() < 1e-15);
        // A window of two: query 2 no longer reads position 0.
        let windowed = layer(&kv, Some(2));
        assert!((windowed[0][3] - 0.5 / 2.0).abs() < 1e-15);
    }

    #[test]
    fn the_table_averages_heads_and_renders_shares_in_percent() {
        let layers = vec![vec![[4.0, 3.0, 0.25, 0.5], [6.0, 5.0, 0.75, 0.0]]];
        let t = table(&expected(&[layers.clone(), layers]));
        assert_eq!(t[1], ["0", "5.00", "4.00", "50.0%", "25.0%"]);
    }
}
