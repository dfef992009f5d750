//! KVQuant (Hooper et al., 2024; github SqueezeAILab/KVQuant at 57a2383, the simulated
//! quantization in `quant/` that gives the paper's perplexities): keys quantized before RoPE
//! per channel against ranges calibrated offline, values per token, both with a non-uniform
//! level table fitted per layer, and the largest values of each vector kept apart in fp16
//! (dense-and-sparse). Reading notes: docs/schemes-sources.md §4.
//!
//! Spec (`quant/kvquant/simquant_module_quantizer.py` unless said; "row" is one token's whole K
//! or V, all KV heads side by side, W = kv_heads * head_dim values, element `h * head_dim + j`
//! for head h, channel j, as `QuantLinearSim.forward` reshapes the projection's output, l.701):
//! - **Where**: the k and v projections' outputs, keys before RoPE (`make_quant_sim` l.499-530
//!   wraps `k_proj` and `v_proj`); attention rotates the keys it reads back. Every token is
//!   quantized on arrival, none kept in a recent window, so prefill and decoding store the
//!   same bytes.
//! - **Calibration** (`SimQuant.quantize` l.400-555), per layer, on a text that is not
//!   evaluated:
//!   - key thresholds: per channel c, the 99.5th and 0.5th percentiles of c over the
//!     calibration tokens (l.465-466; `t = 1 - (1 - 0.99) / 2`, l.413), by linear interpolation
//!     as written here: s the values sorted by total order, n of them, position p = q (n - 1),
//!     `s[i] + (s[i + 1] - s[i]) * (p - i)` at i = floor(p), in f64 (NumPy's `_lerp`, and
//!     `torch.quantile` in f32, evaluate `b - (b - a)(1 - g)` where g >= 1/2, which can differ in
//!     the last bit); rounded once from f64 to fp16 (l.612-613), `upper_c` and `lower_c`;
//!   - key normalization: `offset_c = fp16(fp16(upper_c + lower_c) / 2)` and `range_c =
//!     fp16(fp16(upper_c - lower_c) / 2)` (fp16 operations, as eval computes them from the fp16
//!     thresholds, l.318-319), `x' = (x - offset_c) / range_c` in f32;
//!   - value normalization: per calibration token, the same percentiles over its row (l.228-234,
//!     `qchannel = -1`), rounded once to f32, `offset = (upper + lower) / 2`, `range = (upper -
//!     lower) / 2`, `x' = (x - offset) / range`, all f32;
//!   - the fit (l.487-528): the normalized values with -1 <= x' <= 1 (outliers excluded) of
//!     tokens from F on (F = the first-token option's count, l.490-495), of channels or tokens
//!     whose range is positive, over all channels and tokens together: one table of 2^b levels
//!     for K and one for V per layer, by k-means (below).
//! - **k-means** (1-D, 2^b clusters): the values as f64, sorted ascending by total order (-0
//!   before +0); it needs at least 2^b distinct values (compared with `==`). Start: level i is
//!   the value at index floor((i + 1/2) n / 2^b) (so levels may repeat). Then Lloyd's steps: each
//!   value goes to its nearest level (|x - level| in f64; on a tie, the level of lowest index, as
//!   the source's argmin over its table); each level becomes the mean of its values (their f64
//!   sum in ascending order, divided by their count; a level with none keeps its value); stop
//!   when no value changes level, or after 50 steps (`max_iter=50`). The levels are rounded to
//!   f32 and sorted ascending, so at eval a tie goes to the lower level. Like the source's, this
//!   finds a local optimum: two starting levels inside one dense cluster can stay there.
//! - **Keys** (eval, l.30-78 and l.265-361), token t >= F, channel c: an outlier when x <
//!   lower_c or x > upper_c (strict, against the calibrated thresholds); it reads back as fp16.
//!   Otherwise the code is the nearest level to x' (distances in f64, a tie to the lower level)
//!   and reads back `level * range_c + offset_c` in f32 (code 0, reading back offset_c, when
//!   range_c is 0).
//! - **Values** (l.80-113 and l.302-315), token t >= F: the row's 99.5th and 0.5th percentiles
//!   by the interpolation above, kept in f64 (not rounded to f32 as in calibration); an outlier
//!   when x >= upper or x <= lower, x compared as f64 (inclusive, so a row's largest and
//!   smallest values always are); the outliers replaced by the row's lower median (element
//!   floor((W - 1) / 2) in total order, as `torch.median`); maxval and minval the largest and
//!   smallest of the result by total order (+0 above -0); `offset = (maxval + minval) / 2`,
//!   `range = (maxval - minval) / 2` in f32; codes and read-back as for keys.
//! - Values whose thresholds, offsets or ranges overflow fp16 or f32 are kept by the fit; a
//!   cache that would read back a value that is not finite is refused (`SchemeError::
//!   Unrepresentable`).
//! - **First tokens** (`--first_few_fp16 F`, l.358-359, l.387-390): rows t < F are kept whole in
//!   fp16 (keys before RoPE).
//! - **Bytes**, per token and side: b bits per code of the row, packed (`ceil(W b / 8)` bytes);
//!   per outlier, 2 bytes of fp16 value and 2 of index in the row (the released kernels use
//!   32-bit indices, `deployment/kvquant/quant_cuda_kernel.cu` l.77-108; 16 bits hold any row
//!   here); 2 bytes of outlier count; for values, maxval and minval in f32 (the source keeps
//!   them f32); a first token's row, 2 bytes a value. Per layer, once: the key thresholds (2 fp16
//!   per channel) and both level tables (f32 each).
//! - **Departures**:
//!   - no sensitivity weights: the source weights the fit by the squared gradient of the LM loss
//!     with respect to each projection output (`gradients/run-fisher.py` l.266-295), which needs
//!     backpropagation; the fit here is the source's own unweighted branch (l.520-528);
//!   - k-means starts from quantiles and runs once, where the source runs scikit-learn's
//!     `KMeans(random_state=0, n_init="auto")` (k-means++ seeding), so the levels are fitted to
//!     the same objective but are not the same numbers;
//!   - one calibration text of the protocol's choosing, where the source draws 16 windows of
//!     2,048 tokens from wikitext-2's training split;
//!   - the model runs in f32; the source projects in fp16 and returns every value, code or not,
//!     rounded to fp16 (l.789); here codes read back in f32 and only outliers and first tokens
//!     are rounded to fp16, as stored;
//!   - calibration normalizes keys with the fp16 thresholds eval uses, where the source's
//!     calibration uses the unrounded percentiles (l.477-484).

use half::f16;
use ndarray::{Array3, ArrayView3};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The percentile above which (and its mirror below which) a value is an outlier: `t = 1 - (1 -
/// 0.99) / 2` for the 1 % setting the paper reports ("nuq4-1%").
pub const UPPER_QUANTILE: f64 = 0.995;
/// The lower percentile, `1 - t`.
pub const LOWER_QUANTILE: f64 = 0.005;
/// Lloyd's steps at most (`max_iter=50`).
pub const MAX_STEPS: usize = 50;

/// Most first tokens the first-token option keeps (the source's examples keep 1 to 5).
pub const MAX_FIRST: usize = 64;

/// A KVQuant scheme: its code width and its first-token option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct KvQuantScheme {
    /// Code width, 2 to 5 (the source's `--abits`).
    pub bits: u32,
    /// Tokens kept whole in fp16 at the start (`--first_few_fp16`; 0 when off).
    pub first: usize,
}

impl KvQuantScheme {
    /// Parses `kvquant<B>[-first<N>]`, B in 2..=5 and N in 1..=[`MAX_FIRST`].
    pub fn parse(name: &str) -> Option<KvQuantScheme> {
        let rest = name.strip_prefix("kvquant")?;
        let (bits, first) = match rest.split_once("-first") {
            Some((bits, first)) => (bits, Some(first)),
            None => (rest, None),
        };
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && !s.starts_with('0'))
                .then(|| s.parse::<usize>().ok())
                .flatten()
        };
        let bits = number(bits).filter(|b| (2..=5).contains(b))? as u32;
        let first = match first {
            Some(first) => number(first).filter(|n| *n <= MAX_FIRST)?,
            None => 0,
        };
        Some(KvQuantScheme { bits, first })
    }
}

impl std::fmt::Display for KvQuantScheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kvquant{}", self.bits)?;
        if self.first > 0 {
            write!(f, "-first{}", self.first)?;
        }
        Ok(())
    }
}

/// Why a calibration could not be fitted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CalibrationError {
    /// Too little calibration data for the level table.
    #[error(
        "layer {layer}: {side} has {distinct} distinct normalized values to fit {levels} levels; \
         the calibration text is too short or too uniform"
    )]
    TooFewValues {
        /// The layer.
        layer: usize,
        /// "K" or "V".
        side: &'static str,
        /// Distinct values found.
        distinct: usize,
        /// Levels to fit.
        levels: usize,
    },
    /// Layers of different shapes, no layer, or no token past the first-token option's.
    #[error("calibration: {0}")]
    Shape(String),
    /// A value that is not finite.
    #[error("calibration: layer {layer} holds a value that is not finite")]
    NotFinite {
        /// The layer.
        layer: usize,
    },
}

/// One layer's calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCalibration {
    /// Per key channel (W of them), its upper threshold.
    pub key_upper: Vec<f16>,
    /// Per key channel, its lower threshold.
    pub key_lower: Vec<f16>,
    /// The keys' levels, ascending, 2^b of them.
    pub key_levels: Vec<f32>,
    /// The values' levels, ascending.
    pub value_levels: Vec<f32>,
}

/// A model's calibration: per layer, the key thresholds and both level tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Code width.
    pub bits: u32,
    /// Tokens kept in fp16 at the start (the first-token option), excluded from the fit.
    pub first: usize,
    /// Per layer.
    pub layers: Vec<LayerCalibration>,
}

impl Calibration {
    /// Fits a calibration from each layer's keys (before RoPE) and values on the calibration
    /// text, [kv_heads, tokens, head_dim] each.
    pub fn fit(
        bits: u32,
        first: usize,
        layers: &[(Array3<f32>, Array3<f32>)],
    ) -> Result<Calibration, CalibrationError> {
        let Some((k0, _)) = layers.first() else {
            return Err(CalibrationError::Shape("no layer".into()));
        };
        let shape = k0.dim();
        if shape.1 <= first {
            return Err(CalibrationError::Shape(format!(
                "{} calibration tokens, none past the first {first}",
                shape.1
            )));
        }
        let fitted = layers
            .iter()
            .enumerate()
            .map(|(layer, (k, v))| {
                if k.dim() != shape || v.dim() != shape {
                    return Err(CalibrationError::Shape(format!(
                        "layer {layer}: K {:?} and V {:?}, where layer 0's are {shape:?}",
                        k.dim(),
                        v.dim()
                    )));
                }
                if k.iter().chain(v.iter()).any(|x| !x.is_finite()) {
                    return Err(CalibrationError::NotFinite { layer });
                }
                fit_layer(bits, first, layer, &rows(k.view()), &rows(v.view()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Calibration {
            bits,
            first,
            layers: fitted,
        })
    }

    /// Bytes of one layer's calibration: two fp16 thresholds per key channel, both tables f32.
    pub fn layer_bytes(&self, width: usize) -> usize {
        width * 2 * 2 + 2 * (1usize << self.bits) * 4
    }
}

/// Rows of a [kv_heads, tokens, head_dim] array: per token, its heads side by side.
pub fn rows(x: ArrayView3<f32>) -> Vec<Vec<f32>> {
    let (heads, tokens, head_dim) = x.dim();
    (0..tokens)
        .map(|t| {
            (0..heads * head_dim)
                .map(|i| x[[i / head_dim, t, i % head_dim]])
                .collect()
        })
        .collect()
}

fn fit_layer(
    bits: u32,
    first: usize,
    layer: usize,
    k: &[Vec<f32>],
    v: &[Vec<f32>],
) -> Result<LayerCalibration, CalibrationError> {
    let width = k[0].len();
    let (mut key_upper, mut key_lower) = (Vec::with_capacity(width), Vec::with_capacity(width));
    for c in 0..width {
        let mut column: Vec<f32> = k.iter().map(|row| row[c]).collect();
        column.sort_by(f32::total_cmp);
        key_upper.push(f16::from_f64(percentile(&column, UPPER_QUANTILE)));
        key_lower.push(f16::from_f64(percentile(&column, LOWER_QUANTILE)));
    }
    let mut key_data = Vec::new();
    for row in &k[first..] {
        for (c, &x) in row.iter().enumerate() {
            let (offset, range) = key_range(key_upper[c], key_lower[c]);
            if range > 0.0 {
                let scaled = (x - offset) / range;
                if (-1.0..=1.0).contains(&scaled) {
                    key_data.push(f64::from(scaled));
                }
            }
        }
    }
    let mut value_data = Vec::new();
    for row in &v[first..] {
        let mut sorted = row.clone();
        sorted.sort_by(f32::total_cmp);
        let upper = percentile(&sorted, UPPER_QUANTILE) as f32;
        let lower = percentile(&sorted, LOWER_QUANTILE) as f32;
        let (offset, range) = ((upper + lower) / 2.0, (upper - lower) / 2.0);
        if range > 0.0 {
            for &x in row {
                let scaled = (x - offset) / range;
                if (-1.0..=1.0).contains(&scaled) {
                    value_data.push(f64::from(scaled));
                }
            }
        }
    }
    let levels = 1usize << bits;
    let fit = |data: Vec<f64>, side| {
        kmeans(data, levels).map_err(|distinct| CalibrationError::TooFewValues {
            layer,
            side,
            distinct,
            levels,
        })
    };
    Ok(LayerCalibration {
        key_upper,
        key_lower,
        key_levels: fit(key_data, "K")?,
        value_levels: fit(value_data, "V")?,
    })
}

/// NumPy's linear percentile of ascending `sorted` (not empty) at quantile `q`, in f64.
pub fn percentile(sorted: &[f32], q: f64) -> f64 {
    let p = q * (sorted.len() - 1) as f64;
    let i = (p.floor() as usize).min(sorted.len() - 1);
    let lo = f64::from(sorted[i]);
    let hi = f64::from(sorted[(i + 1).min(sorted.len() - 1)]);
    lo + (hi - lo) * (p - i as f64)
}

/// A key channel's offset and range from its fp16 thresholds, in fp16 operations.
pub fn key_range(upper: f16, lower: f16) -> (f32, f32) {
    let h = |x: f32| f16::from_f32(x).to_f32();
    let (u, l) = (upper.to_f32(), lower.to_f32());
    (h(h(u + l) / 2.0), h(h(u - l) / 2.0))
}

/// 1-D k-means (module docs): `levels` centroids of `data`, as f32, ascending; or the count of
/// distinct values when there are fewer than `levels`.
pub fn kmeans(mut data: Vec<f64>, levels: usize) -> Result<Vec<f32>, usize> {
    data.sort_by(f64::total_cmp);
    let distinct = data.windows(2).filter(|w| w[0] != w[1]).count() + usize::from(!data.is_empty());
    if distinct < levels {
        return Err(distinct);
    }
    let n = data.len();
    let mut centroids: Vec<f64> = (0..levels)
        .map(|i| data[((2 * i + 1) * n) / (2 * levels)])
        .collect();
    let mut assignment = vec![usize::MAX; n];
    for _ in 0..MAX_STEPS {
        let mut changed = false;
        // The levels by value (then index), one per value: the lowest index holds a repeated
        // value, so that on a tie the lowest index wins. A level left empty keeps its value and
        // may fall out of order, hence the sort at every step.
        let mut order: Vec<usize> = (0..levels).collect();
        order.sort_by(|&a, &b| centroids[a].total_cmp(&centroids[b]).then(a.cmp(&b)));
        order.dedup_by(|later, kept| centroids[*later] == centroids[*kept]);
        let mut at = 0;
        for (x, assigned) in data.iter().zip(assignment.iter_mut()) {
            let distance = |i: usize| (x - centroids[order[i]]).abs();
            // The nearest value rises with x (both ascending).
            while at + 1 < order.len() && distance(at + 1) < distance(at) {
                at += 1;
            }
            let level = if at + 1 < order.len() && distance(at + 1) == distance(at) {
                order[at].min(order[at + 1])
            } else {
                order[at]
            };
            if *assigned != level {
                *assigned = level;
                changed = true;
            }
        }
        if !changed {
            break;
        }
        let mut sums = vec![0f64; levels];
        let mut counts = vec![0usize; levels];
        for (x, &at) in data.iter().zip(&assignment) {
            sums[at] += x;
            counts[at] += 1;
        }
        for ((c, s), &count) in centroids.iter_mut().zip(&sums).zip(&counts) {
            if count > 0 {
                *c = s / count as f64;
            }
        }
    }
    let mut out: Vec<f32> = centroids.iter().map(|&c| c as f32).collect();
    out.sort_by(f32::total_cmp);
    Ok(out)
}

/// The index of the level nearest `scaled` (distances in f64, a tie to the lower level).
pub fn nearest(levels: &[f32], scaled: f32) -> usize {
    let x = f64::from(scaled);
    let mut best = 0;
    for (i, &level) in levels.iter().enumerate().skip(1) {
        if (x - f64::from(level)).abs() < (x - f64::from(levels[best])).abs() {
            best = i;
        }
    }
    best
}

/// One token's quantized row (module docs): its codes, its outliers' positions and fp16 values,
/// and the row it reads back.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedRow {
    /// One code per element (outliers' codes are 0 and unused).
    pub codes: Vec<u8>,
    /// Outliers: (index in the row, fp16 value), ascending by index.
    pub outliers: Vec<(u16, f16)>,
    /// For values, (maxval, minval); None for keys.
    pub range: Option<(f32, f32)>,
    /// What the row reads back.
    pub decoded: Vec<f32>,
}

impl QuantizedRow {
    /// Bytes stored for the row at `bits`: codes, outliers, their count, and a value row's
    /// f32 maxval and minval.
    pub fn bytes(&self, bits: u32) -> (usize, usize, usize) {
        let codes = (self.codes.len() * bits as usize).div_ceil(8);
        let outliers = self.outliers.len() * 4 + 2;
        let metadata = if self.range.is_some() { 8 } else { 0 };
        (codes, metadata, outliers)
    }
}

fn code_of(levels: &[f32], x: f32, offset: f32, range: f32) -> (u8, f32) {
    if range == 0.0 {
        return (0, offset);
    }
    let code = nearest(levels, (x - offset) / range);
    (code as u8, levels[code] * range + offset)
}

/// A key row (before RoPE) against its layer's thresholds and levels.
pub fn quantize_key_row(calibration: &LayerCalibration, row: &[f32]) -> QuantizedRow {
    let mut out = QuantizedRow {
        codes: vec![0; row.len()],
        outliers: Vec::new(),
        range: None,
        decoded: vec![0.0; row.len()],
    };
    for (c, &x) in row.iter().enumerate() {
        let (upper, lower) = (calibration.key_upper[c], calibration.key_lower[c]);
        if x < lower.to_f32() || x > upper.to_f32() {
            let kept = f16::from_f32(x);
            out.outliers.push((c as u16, kept));
            out.decoded[c] = kept.to_f32();
        } else {
            let (offset, range) = key_range(upper, lower);
            let (code, value) = code_of(&calibration.key_levels, x, offset, range);
            out.codes[c] = code;
            out.decoded[c] = value;
        }
    }
    out
}

/// A value row against its layer's levels, with its own outliers and range.
pub fn quantize_value_row(calibration: &LayerCalibration, row: &[f32]) -> QuantizedRow {
    let mut sorted = row.to_vec();
    sorted.sort_by(f32::total_cmp);
    let upper = percentile(&sorted, UPPER_QUANTILE);
    let lower = percentile(&sorted, LOWER_QUANTILE);
    let median = sorted[(sorted.len() - 1) / 2];
    let outlier = |x: f32| f64::from(x) >= upper || f64::from(x) <= lower;
    let kept = row.iter().map(|&x| if outlier(x) { median } else { x });
    let (max, min) = kept.fold((f32::NEG_INFINITY, f32::INFINITY), |(hi, lo), x| {
        let hi = if x.total_cmp(&hi).is_gt() { x } else { hi };
        let lo = if x.total_cmp(&lo).is_lt() { x } else { lo };
        (hi, lo)
    });
    let (offset, range) = ((max + min) / 2.0, (max - min) / 2.0);
    let mut out = QuantizedRow {
        codes: vec![0; row.len()],
        outliers: Vec::new(),
        range: Some((max, min)),
        decoded: vec![0.0; row.len()],
    };
    for (c, &x) in row.iter().enumerate() {
        if outlier(x) {
            let kept = f16::from_f32(x);
            out.outliers.push((c as u16, kept));
            out.decoded[c] = kept.to_f32();
        } else {
            let (code, value) = code_of(&calibration.value_levels, x, offset, range);
            out.codes[c] = code;
            out.decoded[c] = value;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for name in [
            "kvquant4",
            "kvquant2",
            "kvquant3-first1",
            "kvquant5-first64",
        ] {
            assert_eq!(KvQuantScheme::parse(name).unwrap().to_string(), name);
        }
        for bad in [
            "kvquant",
            "kvquant1",
            "kvquant6",
            "kvquant4-first0",
            "kvquant4-first65",
            "kvquant04",
            "kvquant4-first",
        ] {
            assert_eq!(KvQuantScheme::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn percentiles_interpolate_linearly_as_numpy_does() {
        let s: Vec<f32> = (0..192).map(|i| i as f32).collect();
        // p = 0.995 * 191 = 190.045: 190 + 0.045.
        assert!((percentile(&s, UPPER_QUANTILE) - 190.045).abs() < 1e-9);
        assert!((percentile(&s, LOWER_QUANTILE) - 0.955).abs() < 1e-9);
        assert_eq!(percentile(&[3.0], 0.995), 3.0);
    }

    #[test]
    fn kmeans_finds_separated_clusters_and_refuses_too_few_values() {
        let mut data = Vec::new();
        // Clusters of equal size: the quantile start puts one level in each.
        for (centre, n) in [(-0.8, 50), (-0.1, 50), (0.3, 50), (0.9, 50)] {
            for i in 0..n {
                data.push(centre + (i as f64 - n as f64 / 2.0) * 1e-4);
            }
        }
        let levels = kmeans(data, 4).unwrap();
        for (got, want) in levels.iter().zip([-0.8, -0.1, 0.3, 0.9]) {
            assert!((f64::from(*got) - want).abs() < 1e-3, "{levels:?}");
        }
        assert_eq!(kmeans(vec![0.5; 100], 4), Err(1));
        // Starting levels that repeat: the quantile start gives [0, 0, 0.2, 1]; every value
        // still goes to its nearest level (the repeated one, once, by lowest index).
        let data = vec![-1.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.9, 1.0];
        assert_eq!(kmeans(data, 4), Ok(vec![-1.0, 0.0, 0.2, 0.95]));
        assert_eq!(kmeans(vec![0.1, 0.2, 0.2], 4), Err(2));
    }

    #[test]
    fn a_tie_goes_to_the_lower_level() {
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], 0.5), 1);
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], -0.5), 0);
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], 7.0), 2);
    }

    fn calibration() -> LayerCalibration {
        LayerCalibration {
            key_upper: vec![f16::from_f32(2.0); 4],
            key_lower: vec![
                f16::from_f32(-2.0),
                f16::from_f32(0.0),
                f16::from_f32(-2.0),
                f16::from_f32(1.0),
            ],
            key_levels: vec![-1.0, -0.5, 0.5, 1.0],
            value_levels: vec![-1.0, -0.25, 0.25, 1.0],
        }
    }

    #[test]
    fn keys_beyond_their_channels_thresholds_are_outliers_kept_in_fp16() {
        let cal = calibration();
        let row = quantize_key_row(&cal, &[0.9, 2.5, -2.1, 1.0]);
        assert_eq!(
            row.outliers,
            vec![(1, f16::from_f32(2.5)), (2, f16::from_f32(-2.1))]
        );
        assert_eq!(row.decoded[2], f16::from_f32(-2.1).to_f32());
        // Channel 0: offset 0, range 2: 0.9 / 2 = 0.45 is nearest 0.5, reads back 1.0.
        assert_eq!((row.codes[0], row.decoded[0]), (2, 1.0));
        // Channel 3: thresholds 2 and 1, offset 1.5, range 0.5; 1.0 scales to -1.
        assert_eq!((row.codes[3], row.decoded[3]), (0, 1.0));
        assert_eq!(row.bytes(2), (1, 0, 2 * 4 + 2));
    }

    #[test]
    fn a_value_rows_extremes_are_its_outliers_and_the_rest_sets_its_range() {
        let cal = calibration();
        let row: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let q = quantize_value_row(&cal, &row);
        assert_eq!(
            q.outliers.iter().map(|o| o.0).collect::<Vec<_>>(),
            vec![0, 9]
        );
        assert_eq!(q.range, Some((8.0, 1.0)));
        // offset 4.5, range 3.5: 1 scales to -1 and 8 to 1, the ends of the table.
        assert_eq!(q.decoded[1], 1.0);
        assert_eq!(q.decoded[8], 8.0);
        assert_eq!(q.bytes(4), (5, 8, 2 * 4 + 2));
        // A constant row: every value equals both percentiles, so by the inclusive rule every
        // value is an outlier, kept in fp16.
        let flat = quantize_value_row(&cal, &[3.0; 6]);
        assert_eq!(flat.decoded, vec![3.0; 6]);
        assert_eq!(flat.outliers.len(), 6);
    }

    #[test]
    fn calibration_fits_tables_of_two_to_the_bits_levels_per_layer() {
        let k = Array3::from_shape_fn((2, 300, 8), |(h, t, d)| {
            (((h * 7919 + t * 104_729 + d * 1_299_709) % 1000) as f32 / 500.0 - 1.0)
                * (1.0 + d as f32)
        });
        let v = k.mapv(|x| x * 0.5 + 0.1);
        let cal = Calibration::fit(3, 1, &[(k.clone(), v.clone()), (v, k)]).unwrap();
        assert_eq!(cal.layers.len(), 2);
        for layer in &cal.layers {
            assert_eq!(layer.key_upper.len(), 16);
            assert_eq!(layer.key_levels.len(), 8);
            assert!(layer.key_levels.windows(2).all(|w| w[0] <= w[1]));
            assert!(layer.value_levels.iter().all(|l| (-1.0..=1.0).contains(l)));
        }
        assert_eq!(cal.layer_bytes(16), 16 * 4 + 2 * 8 * 4);
        let short = Array3::zeros((1, 2, 4));
        assert!(matches!(
            Calibration::fit(4, 2, &[(short.clone(), short)]),
            Err(CalibrationError::Shape(_))
        ));
    }
}
