//! KVQuant (`kvquant<B>[-first<N>]`) as the audit reads it: keys quantized before RoPE per
//! channel against thresholds calibrated on another text, values per token, both against a
//! non-uniform table of 2^B levels fitted per layer by k-means, the values beyond the thresholds
//! kept apart in fp16 (dense-and-sparse), and optionally the first N tokens kept whole in fp16.
//!
//! Spec, from kvschemes' `kvquant.rs` top comment (itself from github SqueezeAILab/KVQuant at
//! 57a2383, `quant/kvquant/simquant_module_quantizer.py`; reading notes in
//! docs/schemes-sources.md §4). A "row" is one token's whole K or V, every KV head side by side:
//! W = kv_heads * head_dim values, element `h * head_dim + j` for head h and channel j
//! (`QuantLinearSim.forward` l.701 reshapes the projection's output so).
//! - **Name**: `kvquant` B, then optionally `-first` N; B in 2..=5 (`--abits`), N in 1..=64
//!   (`--first_few_fp16`), both decimal without a leading zero. F = N, or 0 without `-first`.
//! - **Percentile** (NumPy's linear method, `np.percentile` l.465-466, `torch.quantile` l.228 and
//!   l.80-113): of n values sorted ascending s, at quantile q, the position p = q (n - 1) and
//!   i = floor(p); `s[i] + (s[i + 1] - s[i]) * (p - i)`, every operation in f64 (`s[n]` read as
//!   `s[n - 1]`). The quantiles are t = 1 - (1 - 0.99) / 2 = 0.995 and 1 - t = 0.005 (l.413).
//! - **Calibration**, per layer (`SimQuant.quantize` l.400-555), on K before RoPE and V of a text
//!   that is not evaluated, every layer of one shape and more than F tokens:
//!   - key thresholds: per channel c, the 0.995 and 0.005 percentiles of c over every calibration
//!     token, rounded from f64 to fp16 (l.612-613): `upper_c`, `lower_c`;
//!   - key offset and range in fp16 operations (each one the f32 operation rounded to fp16, as
//!     eval computes them from the fp16 thresholds, l.318-319): `offset_c = fp16(fp16(upper_c +
//!     lower_c) / 2)`, `range_c = fp16(fp16(upper_c - lower_c) / 2)`; a key normalizes to
//!     `x' = (x - offset_c) / range_c` in f32;
//!   - a calibration value row (l.228-234, `qchannel = -1`) normalizes with its own 0.995 and
//!     0.005 percentiles, each rounded once to f32: `offset = (upper + lower) / 2`, `range =
//!     (upper - lower) / 2`, `x' = (x - offset) / range`, all f32;
//!   - the fit data (l.487-528): the normalized values with -1 <= x' <= 1 of tokens F and later,
//!     of key channels and value rows whose range is positive; keys and values apart, every
//!     channel and token together: one table of 2^B levels for K and one for V, by k-means.
//! - **k-means**, 1-D, L = 2^B levels: the data as f64, sorted ascending; refused with fewer than
//!   L distinct values (compared as numbers). Start: level i is the value at index floor((i +
//!   1/2) n / L). A step: each value goes to its nearest level (|x - level| in f64; a tie to the
//!   lower level); each level becomes the mean of its values (their f64 sum in ascending order,
//!   divided by their count; a level with none keeps its value). Stop when no value changes
//!   level, or after 50 steps (`max_iter=50`). The levels are rounded to f32 and sorted.
//! - **Keys** at eval (l.30-78, l.265-361), token t >= F, channel c: an outlier when x < lower_c
//!   or x > upper_c (strict, compared as f32), read back in fp16; otherwise the code is the
//!   nearest level to x' (distances in f64, a tie to the lower level), read back as `level *
//!   range_c + offset_c` in f32; when range_c is 0, code 0, read back as offset_c.
//! - **Values** at eval (l.80-113, l.302-315), token t >= F: the row's 0.995 and 0.005
//!   percentiles (f64, as above, not rounded); an outlier when x >= upper or x <= lower
//!   (inclusive); the outliers replaced by the row's lower median; maxval and minval the
//!   largest and smallest of the result; `offset = (maxval + minval) / 2`, `range = (maxval -
//!   minval) / 2` in f32; codes and read-back as for keys, against the value levels.
//! - **First tokens** (l.358-359, l.387-390): rows t < F are kept whole, in fp16 (keys before
//!   RoPE).
//! - **Reading**: the keys read back are the dequantized pre-RoPE keys, rotated by the model's
//!   RoPE; every token is quantized on arrival, so prefill and token-by-token decoding read the
//!   same cache.
//! - **Bytes**, per layer: per quantized row and side, ceil(W B / 8) bytes of packed codes,
//!   4 bytes per outlier (fp16 value and 16-bit index) and 2 of outlier count; per quantized
//!   value row, 8 bytes (f32 maxval and minval); per first-token row and side, 2 bytes a value;
//!   once per layer, the calibration: 2 fp16 thresholds per key channel and both tables in f32,
//!   W * 2 * 2 + 2 * 2^B * 4.
//!
//! Refused: a calibration that is not the scheme's (bits, first tokens), not the model's (layer
//! count, row width, table sizes); K and V of different shapes; a value that is not finite; a
//! read-back value that is not finite (thresholds or a range fp16 or f32 cannot hold).
//!
//! Written again from the spec: the percentile, the fp16 operations and the k-means are this
//! module's own. The k-means assigns each value by the nearest level over the whole table (the
//! spec's rule, whatever the levels' order), found by a merge of the sorted data with the
//! sorted distinct levels; the tests hold it to kvschemes' also where starting levels repeat
//! (which kvschemes got wrong until this module's tests found it).

use std::fmt;

use half::f16;
use models::llama::{KvSource, row_of};
use ndarray::{Array3, ArrayView1, Axis, s};
use rayon::prelude::*;

/// The upper quantile, t = 1 - (1 - 0.99) / 2.
pub const UPPER_QUANTILE: f64 = 0.995;
/// The lower quantile, 1 - t.
pub const LOWER_QUANTILE: f64 = 0.005;
/// Lloyd's steps at most.
pub const MAX_STEPS: usize = 50;
/// The largest first-token count a name may ask for.
pub const MAX_FIRST: usize = 64;
/// The code widths a name may ask for.
pub const BITS: std::ops::RangeInclusive<u32> = 2..=5;

/// A decimal number without a leading zero.
fn number(s: &str) -> Option<usize> {
    if s.is_empty() || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The (bits, first tokens) a `kvquant<B>[-first<N>]` name spells, if any (module docs).
pub fn parse(name: &str) -> Option<(u32, usize)> {
    let rest = name.strip_prefix("kvquant")?;
    let (bits, first) = match rest.find('-') {
        None => (rest, 0),
        Some(at) => {
            let first = number(rest[at..].strip_prefix("-first")?)?;
            (&rest[..at], first)
        }
    };
    let bits = u32::try_from(number(bits)?).ok()?;
    (BITS.contains(&bits) && first <= MAX_FIRST).then_some((bits, first))
}

/// The name of (bits, first tokens).
pub fn name(bits: u32, first: usize) -> String {
    if first == 0 {
        format!("kvquant{bits}")
    } else {
        format!("kvquant{bits}-first{first}")
    }
}

/// One fp16 operation: its f32 result rounded to fp16 (ties to even).
fn fp16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// NumPy's linear percentile of `sorted` (ascending, not empty) at quantile `q`, in f64.
pub fn percentile(sorted: &[f32], q: f64) -> f64 {
    let last = sorted.len() - 1;
    let position = q * last as f64;
    let below = position.floor();
    let i = (below as usize).min(last);
    let (a, b) = (f64::from(sorted[i]), f64::from(sorted[(i + 1).min(last)]));
    a + (b - a) * (position - below)
}

/// A key channel's offset and range from its fp16 thresholds, in fp16 operations.
pub fn key_offset_range(upper: f16, lower: f16) -> (f32, f32) {
    let (u, l) = (upper.to_f32(), lower.to_f32());
    (fp16(fp16(u + l) / 2.0), fp16(fp16(u - l) / 2.0))
}

/// The level table's distinct values, ascending, each with the lowest index that holds it.
fn distinct_levels(levels: &[f64]) -> Vec<(f64, usize)> {
    let mut order: Vec<usize> = (0..levels.len()).collect();
    // Levels are finite (means of finite data): compared as numbers, -0 equals +0.
    order.sort_by(|&a, &b| {
        levels[a]
            .partial_cmp(&levels[b])
            .expect("finite levels")
            .then(a.cmp(&b))
    });
    let mut out: Vec<(f64, usize)> = Vec::with_capacity(levels.len());
    for i in order {
        match out.last() {
            Some(&(value, _)) if value == levels[i] => {}
            _ => out.push((levels[i], i)),
        }
    }
    out
}

/// For each value of ascending `sorted`, the index of its nearest level in `levels` (any
/// order): the least |x - level| in f64, a tie to the lowest index. |x - c| rounded is
/// monotone in c on each side of x, so the nearest values are a run of the sorted distinct
/// levels next to x: the run is found from x's two neighbours.
fn assign(sorted: &[f64], levels: &[f64], out: &mut [usize]) -> bool {
    let table = distinct_levels(levels);
    let distance = |x: f64, k: usize| (x - table[k].0).abs();
    let mut above = 0; // the first distinct level greater than x
    let mut changed = false;
    for (&x, assigned) in sorted.iter().zip(out.iter_mut()) {
        while above < table.len() && table[above].0 <= x {
            above += 1;
        }
        let candidates = [above.checked_sub(1), (above < table.len()).then_some(above)];
        let best = candidates
            .iter()
            .flatten()
            .map(|&k| distance(x, k))
            .fold(f64::INFINITY, f64::min);
        let mut index = usize::MAX;
        if let Some(mut k) = candidates[0].filter(|&k| distance(x, k) == best) {
            index = index.min(table[k].1);
            while k > 0 && distance(x, k - 1) == best {
                k -= 1;
                index = index.min(table[k].1);
            }
        }
        if let Some(mut k) = candidates[1].filter(|&k| distance(x, k) == best) {
            index = index.min(table[k].1);
            while k + 1 < table.len() && distance(x, k + 1) == best {
                k += 1;
                index = index.min(table[k].1);
            }
        }
        if *assigned != index {
            *assigned = index;
            changed = true;
        }
    }
    changed
}

/// 1-D k-means (module docs): `count` levels fitted to `data`, as f32, ascending; or, with
/// fewer distinct values than `count`, how many there are.
pub fn kmeans(data: &[f64], count: usize) -> Result<Vec<f32>, usize> {
    let mut sorted = data.to_vec();
    sorted.sort_by(f64::total_cmp);
    let distinct = sorted
        .iter()
        .enumerate()
        .filter(|&(i, x)| i == 0 || *x != sorted[i - 1])
        .count();
    if distinct < count {
        return Err(distinct);
    }
    let n = sorted.len();
    let mut levels: Vec<f64> = (0..count)
        .map(|i| sorted[(2 * i + 1) * n / (2 * count)])
        .collect();
    let mut assigned = vec![usize::MAX; n];
    for _ in 0..MAX_STEPS {
        if !assign(&sorted, &levels, &mut assigned) {
            break;
        }
        let mut sums = vec![0f64; count];
        let mut members = vec![0usize; count];
        for (&x, &level) in sorted.iter().zip(&assigned) {
            sums[level] += x;
            members[level] += 1;
        }
        for (level, (sum, n)) in levels.iter_mut().zip(sums.into_iter().zip(members)) {
            if n > 0 {
                *level = sum / n as f64;
            }
        }
    }
    let mut out: Vec<f32> = levels.into_iter().map(|l| l as f32).collect();
    out.sort_by(f32::total_cmp);
    Ok(out)
}

/// The index of the level of ascending `levels` nearest `scaled`: distances in f64, a tie to
/// the lower level.
pub fn nearest(levels: &[f32], scaled: f32) -> usize {
    let x = f64::from(scaled);
    let distance = |level: f32| (x - f64::from(level)).abs();
    (0..levels.len())
        .min_by(|&a, &b| {
            distance(levels[a])
                .total_cmp(&distance(levels[b]))
                .then(a.cmp(&b))
        })
        .expect("a table of levels")
}

/// One layer's calibration (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerCalibration {
    /// Per key channel (W), its upper threshold.
    pub key_upper: Vec<f16>,
    /// Per key channel, its lower threshold.
    pub key_lower: Vec<f16>,
    /// The keys' 2^B levels, ascending.
    pub key_levels: Vec<f32>,
    /// The values' 2^B levels, ascending.
    pub value_levels: Vec<f32>,
}

/// A model's KVQuant calibration: the scheme's bits and first tokens, and each layer's.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The code width B.
    pub bits: u32,
    /// The first-token count F (0 without `-first`).
    pub first: usize,
    /// Per layer.
    pub layers: Vec<LayerCalibration>,
}

/// The rows of a [kv_heads, tokens, head_dim] array: per token, element h * head_dim + j.
fn token_rows(x: &Array3<f32>) -> Vec<Vec<f32>> {
    x.axis_iter(Axis(1))
        .map(|token| token.iter().copied().collect())
        .collect()
}

fn sorted_copy(x: impl IntoIterator<Item = f32>) -> Vec<f32> {
    let mut out: Vec<f32> = x.into_iter().collect();
    out.sort_by(f32::total_cmp);
    out
}

fn unit(x: f32) -> bool {
    (-1.0..=1.0).contains(&x)
}

impl Calibration {
    /// Fits a calibration at `bits` with `first` first tokens from each layer's keys before
    /// RoPE and values on the calibration text, [kv_heads, tokens, head_dim] each, every layer
    /// of one shape (module docs).
    pub fn fit(
        bits: u32,
        first: usize,
        layers: &[(Array3<f32>, Array3<f32>)],
    ) -> Result<Calibration, String> {
        if !BITS.contains(&bits) || first > MAX_FIRST {
            return Err(format!(
                "kvquant calibration: {bits} bits and {first} first tokens; the scheme takes 2 to \
                 5 bits and at most {MAX_FIRST} first tokens"
            ));
        }
        let Some((k0, _)) = layers.first() else {
            return Err("kvquant calibration: no layer to calibrate".into());
        };
        let shape = k0.dim();
        if shape.0 * shape.2 == 0 {
            return Err(format!(
                "kvquant calibration: rows of {} heads of {} values are empty",
                shape.0, shape.2
            ));
        }
        if shape.1 <= first {
            return Err(format!(
                "kvquant calibration: {} calibration tokens, none after the first {first} kept \
                 in fp16; the calibration text is too short",
                shape.1
            ));
        }
        for (layer, (k, v)) in layers.iter().enumerate() {
            if k.dim() != shape || v.dim() != shape {
                return Err(format!(
                    "kvquant calibration: layer {layer}'s K is {:?} and V {:?} (kv_heads, \
                     tokens, head_dim), where layer 0's K is {shape:?}",
                    k.dim(),
                    v.dim()
                ));
            }
            for (side, x) in [("K", k), ("V", v)] {
                if let Some(((h, t, j), value)) = x.indexed_iter().find(|(_, x)| !x.is_finite()) {
                    return Err(format!(
                        "kvquant calibration: layer {layer}'s {side} of head {h}, token {t}, \
                         channel {j} is {value}; the calibration fits finite values"
                    ));
                }
            }
        }
        let fitted: Vec<Result<LayerCalibration, String>> = layers
            .par_iter()
            .enumerate()
            .map(|(layer, (k, v))| {
                fit_layer(bits, first, k, v).map_err(|e| format!("layer {layer}: {e}"))
            })
            .collect();
        Ok(Calibration {
            bits,
            first,
            layers: fitted.into_iter().collect::<Result<_, _>>()?,
        })
    }

    /// Bytes of one layer's calibration for rows of `width` values: two fp16 thresholds per key
    /// channel and both tables of 2^B f32 levels; None on overflow.
    pub fn layer_bytes(&self, width: usize) -> Option<usize> {
        width
            .checked_mul(4)?
            .checked_add(2 * (1usize << self.bits) * 4)
    }

    /// Refuses a calibration that is not `bits` and `first`'s, or not for `layers` layers of
    /// rows of `width` values.
    pub fn check(
        &self,
        (bits, first): (u32, usize),
        layers: usize,
        width: usize,
    ) -> Result<(), String> {
        let scheme = name(bits, first);
        if (self.bits, self.first) != (bits, first) {
            return Err(format!(
                "{scheme}: the calibration is {}'s",
                name(self.bits, self.first)
            ));
        }
        if self.layers.len() != layers {
            return Err(format!(
                "{scheme}: the calibration has {} layers, the model {layers}",
                self.layers.len()
            ));
        }
        let levels = 1usize << bits;
        for (i, layer) in self.layers.iter().enumerate() {
            if layer.key_upper.len() != width || layer.key_lower.len() != width {
                return Err(format!(
                    "{scheme}: layer {i}'s calibration has {} upper and {} lower key thresholds, \
                     where the layer's rows hold {width} values",
                    layer.key_upper.len(),
                    layer.key_lower.len()
                ));
            }
            if layer.key_levels.len() != levels || layer.value_levels.len() != levels {
                return Err(format!(
                    "{scheme}: layer {i}'s calibration has {} key and {} value levels, where \
                     {bits} bits code {levels}",
                    layer.key_levels.len(),
                    layer.value_levels.len()
                ));
            }
            let ascending =
                |t: &[f32]| t.iter().all(|l| l.is_finite()) && t.windows(2).all(|w| w[0] <= w[1]);
            if !ascending(&layer.key_levels) || !ascending(&layer.value_levels) {
                return Err(format!(
                    "{scheme}: layer {i}'s levels are not finite and ascending"
                ));
            }
        }
        Ok(())
    }
}

/// One layer's calibration (module docs); shapes and finiteness checked by the caller.
fn fit_layer(
    bits: u32,
    first: usize,
    k: &Array3<f32>,
    v: &Array3<f32>,
) -> Result<LayerCalibration, String> {
    let (heads, tokens, head_dim) = k.dim();
    let width = heads * head_dim;
    let mut key_upper = Vec::with_capacity(width);
    let mut key_lower = Vec::with_capacity(width);
    let mut key_data = Vec::new();
    // Channel by channel: element h * head_dim + j is K[h, .., j].
    for h in 0..heads {
        for j in 0..head_dim {
            let channel: ArrayView1<f32> = k.slice(s![h, .., j]);
            let column = sorted_copy(channel.iter().copied());
            let upper = f16::from_f64(percentile(&column, UPPER_QUANTILE));
            let lower = f16::from_f64(percentile(&column, LOWER_QUANTILE));
            key_upper.push(upper);
            key_lower.push(lower);
            let (offset, range) = key_offset_range(upper, lower);
            if range > 0.0 {
                key_data.extend(
                    channel
                        .iter()
                        .skip(first)
                        .map(|&x| (x - offset) / range)
                        .filter(|&x| unit(x))
                        .map(f64::from),
                );
            }
        }
    }
    let mut value_data = Vec::new();
    for row in token_rows(v).into_iter().skip(first) {
        let ascending = sorted_copy(row.iter().copied());
        let upper = percentile(&ascending, UPPER_QUANTILE) as f32;
        let lower = percentile(&ascending, LOWER_QUANTILE) as f32;
        let (offset, range) = ((upper + lower) / 2.0, (upper - lower) / 2.0);
        if range > 0.0 {
            value_data.extend(
                row.iter()
                    .map(|&x| (x - offset) / range)
                    .filter(|&x| unit(x))
                    .map(f64::from),
            );
        }
    }
    let levels = 1usize << bits;
    let table = |data: &[f64], side: &str| {
        kmeans(data, levels).map_err(|distinct| {
            format!(
                "{side} has {distinct} distinct normalized values (of {} tokens after the first \
                 {first}) to fit {levels} levels; the calibration text is too short or too \
                 uniform",
                tokens - first
            )
        })
    };
    Ok(LayerCalibration {
        key_levels: table(&key_data, "K")?,
        value_levels: table(&value_data, "V")?,
        key_upper,
        key_lower,
    })
}

/// Bytes one layer's KVQuant cache stores, by part (module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvQuantBytes {
    /// Packed codes.
    pub codes: usize,
    /// Value rows' maxval and minval, and the layer's calibration.
    pub metadata: usize,
    /// The first tokens' rows, fp16.
    pub full_precision: usize,
    /// Outliers' values and indices, and each quantized row's outlier count.
    pub outliers: usize,
}

impl KvQuantBytes {
    /// Everything.
    pub fn total(&self) -> usize {
        self.codes + self.metadata + self.full_precision + self.outliers
    }
}

/// One quantized row: what it reads back, and its outlier count.
struct Quantized {
    read: Vec<f32>,
    outliers: usize,
}

/// A code's read-back: the nearest level of `levels` to x', `level * range + offset` in f32;
/// offset when the range is 0.
fn dequantized(levels: &[f32], x: f32, offset: f32, range: f32) -> f32 {
    if range == 0.0 {
        return offset;
    }
    levels[nearest(levels, (x - offset) / range)] * range + offset
}

/// A key row (before RoPE) against its layer's thresholds and key levels.
fn key_row(calibration: &LayerCalibration, row: &[f32]) -> Quantized {
    let mut outliers = 0;
    let read = row
        .iter()
        .zip(calibration.key_upper.iter().zip(&calibration.key_lower))
        .map(|(&x, (&upper, &lower))| {
            if x > upper.to_f32() || x < lower.to_f32() {
                outliers += 1;
                fp16(x)
            } else {
                let (offset, range) = key_offset_range(upper, lower);
                dequantized(&calibration.key_levels, x, offset, range)
            }
        })
        .collect();
    Quantized { read, outliers }
}

/// A value row against its layer's value levels, with its own outliers and range.
fn value_row(calibration: &LayerCalibration, row: &[f32]) -> Quantized {
    let ascending = sorted_copy(row.iter().copied());
    let upper = percentile(&ascending, UPPER_QUANTILE);
    let lower = percentile(&ascending, LOWER_QUANTILE);
    let outlier = |x: f32| f64::from(x) <= lower || f64::from(x) >= upper;
    let median = ascending[(ascending.len() - 1) / 2];
    let outliers = row.iter().filter(|&&x| outlier(x)).count();
    let kept = row.iter().copied().filter(|&x| !outlier(x));
    let kept: Vec<f32> = kept.chain((outliers > 0).then_some(median)).collect();
    let max = kept
        .iter()
        .copied()
        .max_by(f32::total_cmp)
        .expect("a value");
    let min = kept
        .iter()
        .copied()
        .min_by(f32::total_cmp)
        .expect("a value");
    let (offset, range) = ((max + min) / 2.0, (max - min) / 2.0);
    let read = row
        .iter()
        .map(|&x| {
            if outlier(x) {
                fp16(x)
            } else {
                dequantized(&calibration.value_levels, x, offset, range)
            }
        })
        .collect();
    Quantized { read, outliers }
}

/// One layer's KVQuant cache: the keys (dequantized before RoPE, then rotated) and values every
/// query reads, and the bytes stored.
#[derive(Debug, Clone)]
pub struct KvQuantLayer {
    k: Array3<f32>,
    v: Array3<f32>,
    bytes: KvQuantBytes,
    outliers: usize,
}

impl KvQuantLayer {
    /// The bytes the layer stores (the same after prefill and after decoding).
    pub fn stored(&self) -> KvQuantBytes {
        self.bytes
    }

    /// The outlier values the layer stores, K and V together (arrays.npz's `<id>_outliers`).
    pub fn outliers(&self) -> usize {
        self.outliers
    }
}

impl KvSource for KvQuantLayer {
    fn key(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.k, head, position)
    }
    fn value(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.v, head, position)
    }
}

/// Layer `layer` of `layers` under `kvquant<bits>[-first<first>]` (`scheme`, as
/// [`parse`] reads it) against `calibration`, from the layer's keys before RoPE and values,
/// [kv_heads, tokens, head_dim]; `rope` rotates the keys read back as the model rotates its
/// own (position p by position p's angles; in a pass, `models::llama::LayerKv::rope`). Both
/// schedules read this one cache.
pub fn layer<E: fmt::Display>(
    (bits, first): (u32, usize),
    calibration: &Calibration,
    (layer, layers): (usize, usize),
    k_pre_rope: &Array3<f32>,
    v: &Array3<f32>,
    rope: impl FnOnce(&mut Array3<f32>) -> Result<(), E>,
) -> Result<KvQuantLayer, String> {
    let scheme = name(bits, first);
    if k_pre_rope.dim() != v.dim() {
        return Err(format!(
            "{scheme}: K is {:?} and V is {:?} (kv_heads, tokens, head_dim); they must agree",
            k_pre_rope.dim(),
            v.dim()
        ));
    }
    if layer >= layers {
        return Err(format!(
            "{scheme}: layer {layer} of {layers} does not exist"
        ));
    }
    let (heads, tokens, head_dim) = k_pre_rope.dim();
    let width = heads * head_dim;
    calibration.check((bits, first), layers, width)?;
    let fitted = &calibration.layers[layer];
    for (side, x) in [("K", k_pre_rope), ("V", v)] {
        if let Some(((h, t, j), value)) = x.indexed_iter().find(|(_, x)| !x.is_finite()) {
            return Err(format!(
                "{scheme}: {side} of head {h}, token {t}, channel {j} is {value}; the schemes \
                 quantize finite values"
            ));
        }
    }
    let overflow = || format!("{scheme}: the bytes of layer {layer} overflow usize");
    let mut bytes = KvQuantBytes {
        metadata: calibration.layer_bytes(width).ok_or_else(overflow)?,
        ..KvQuantBytes::default()
    };
    let code_bytes = width
        .checked_mul(bits as usize)
        .ok_or_else(overflow)?
        .div_ceil(8);
    let mut outliers = 0usize;
    let mut side = |x: &Array3<f32>, keys: bool| -> Result<Array3<f32>, String> {
        let mut read = Array3::<f32>::zeros((heads, tokens, head_dim));
        for (t, row) in token_rows(x).into_iter().enumerate() {
            let (values, add) = if t < first {
                let fp16_row: Vec<f32> = row.iter().map(|&x| fp16(x)).collect();
                let add = KvQuantBytes {
                    full_precision: width * 2,
                    ..KvQuantBytes::default()
                };
                (fp16_row, add)
            } else {
                let q = if keys {
                    key_row(fitted, &row)
                } else {
                    value_row(fitted, &row)
                };
                outliers += q.outliers;
                let add = KvQuantBytes {
                    codes: code_bytes,
                    metadata: if keys { 0 } else { 8 },
                    full_precision: 0,
                    outliers: q.outliers * 4 + 2,
                };
                (q.read, add)
            };
            bytes.codes = bytes.codes.checked_add(add.codes).ok_or_else(overflow)?;
            bytes.metadata = bytes
                .metadata
                .checked_add(add.metadata)
                .ok_or_else(overflow)?;
            bytes.full_precision = bytes
                .full_precision
                .checked_add(add.full_precision)
                .ok_or_else(overflow)?;
            bytes.outliers = bytes
                .outliers
                .checked_add(add.outliers)
                .ok_or_else(overflow)?;
            for (slot, value) in read.slice_mut(s![.., t, ..]).iter_mut().zip(values) {
                *slot = value;
            }
        }
        Ok(read)
    };
    let mut k = side(k_pre_rope, true)?;
    let v = side(v, false)?;
    rope(&mut k).map_err(|e| format!("{scheme}: rotating the keys read back: {e}"))?;
    for (side, x) in [("K", &k), ("V", &v)] {
        if let Some(((h, t, _), value)) = x.indexed_iter().find(|(_, x)| !x.is_finite()) {
            return Err(format!(
                "{scheme}: {side} of head {h}, token {t} reads back as {value}; its thresholds, \
                 range or fp16 value cannot hold that row"
            ));
        }
    }
    Ok(KvQuantLayer {
        k,
        v,
        bytes,
        outliers,
    })
}

#[cfg(test)]
mod tests {
    use kvschemes::kvquant as theirs;
    use kvschemes::{LayerCache, Schedule};
    use models::llama::{LayerWeights, Llama, LlamaConfig, LlamaWeights, OwnKv};
    use ndarray::Array2;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;
    use rand_distr::{Distribution as _, StandardNormal};

    use super::*;

    const HEADS: usize = 2;
    const HEAD_DIM: usize = 16;

    /// The inputs the differential tests read.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Input {
        /// Values from a modular pattern, each channel its own scale.
        Patterned,
        /// Standard normal values.
        Random,
        /// Multiples of 0.25 in [-3, 3]: ties in every rule, repeated k-means data.
        Grid,
        /// Normal values, channels 3 and 11 of each head 50 times larger, token 0 20 times.
        OutlierChannels,
        /// Normal values, channel 5 of head 1 always 0.75 and channel 2 of head 0 always 0.
        ConstantChannel,
        /// Normal values, each token's row scaled by 2^e for e from -30 to 9 (eval only).
        Magnitudes,
    }

    fn array(input: Input, tokens: usize, seed: u64) -> Array3<f32> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        Array3::from_shape_fn((HEADS, tokens, HEAD_DIM), |(h, t, j)| {
            let z: f64 = StandardNormal.sample(&mut rng);
            let z = z as f32;
            match input {
                Input::Patterned => {
                    let at = h * 7919 + t * 104_729 + j * 1_299_709 + seed as usize;
                    ((at % 1000) as f32 / 500.0 - 1.0) * (1.0 + j as f32)
                }
                Input::Random => z,
                Input::Grid => ((z * 4.0).round() / 4.0).clamp(-3.0, 3.0),
                Input::OutlierChannels => {
                    let channel = if j == 3 || j == 11 { 50.0 } else { 1.0 };
                    let sink = if t == 0 { 20.0 } else { 1.0 };
                    z * channel * sink
                }
                Input::ConstantChannel => match (h, j) {
                    (1, 5) => 0.75,
                    (0, 2) => 0.0,
                    _ => z,
                },
                Input::Magnitudes => z * 2f32.powi((t * 37 % 40) as i32 - 30),
            }
        })
    }

    /// A stand-in RoPE for the differential tests (both sides rotate with it): position t's
    /// pairs (j, j + d/2) turned by t / 10^(2j/d) radians, in f32.
    fn rope(x: &mut Array3<f32>) -> Result<(), String> {
        let (heads, tokens, d) = x.dim();
        for h in 0..heads {
            for t in 0..tokens {
                for j in 0..d / 2 {
                    let angle = t as f32 / 10f32.powf(2.0 * j as f32 / d as f32);
                    let (sin, cos) = angle.sin_cos();
                    let (a, b) = (x[[h, t, j]], x[[h, t, j + d / 2]]);
                    x[[h, t, j]] = a * cos - b * sin;
                    x[[h, t, j + d / 2]] = a * sin + b * cos;
                }
            }
        }
        Ok(())
    }

    fn bits16(x: &[f16]) -> Vec<u16> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn bits32(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Two calibrations hold the same bits.
    fn same_calibration(at: &str, ours: &Calibration, expected: &theirs::Calibration) {
        assert_eq!(
            (ours.bits, ours.first),
            (expected.bits, expected.first),
            "{at}"
        );
        assert_eq!(ours.layers.len(), expected.layers.len(), "{at}");
        for (i, (a, b)) in ours.layers.iter().zip(&expected.layers).enumerate() {
            let at = format!("{at}, layer {i}");
            assert_eq!(bits16(&a.key_upper), bits16(&b.key_upper), "{at}: upper");
            assert_eq!(bits16(&a.key_lower), bits16(&b.key_lower), "{at}: lower");
            assert_eq!(
                bits32(&a.key_levels),
                bits32(&b.key_levels),
                "{at}: key levels\naudit {:?}\nkvschemes {:?}",
                a.key_levels,
                b.key_levels
            );
            assert_eq!(
                bits32(&a.value_levels),
                bits32(&b.value_levels),
                "{at}: value levels\naudit {:?}\nkvschemes {:?}",
                a.value_levels,
                b.value_levels
            );
        }
    }

    /// kvschemes' calibration, fitted from the same layers.
    fn their_fit(
        bits: u32,
        first: usize,
        layers: &[(Array3<f32>, Array3<f32>)],
    ) -> theirs::Calibration {
        theirs::Calibration::fit(bits, first, layers).expect("kvschemes fits it")
    }

    /// The audit's layer and kvschemes' read the same bits at every (head, position), under
    /// both of kvschemes' schedules, and count the same bytes, part by part.
    fn compare_layer(
        at: &str,
        (bits, first): (u32, usize),
        (ours, expected): (&Calibration, &theirs::Calibration),
        layers: (usize, usize),
        (k, v): (&Array3<f32>, &Array3<f32>),
    ) {
        let cache = layer((bits, first), ours, layers, k, v, rope).expect("the audit holds it");
        let tokens = k.dim().1;
        for schedule in [Schedule::Prefill, Schedule::Streaming] {
            let scheme = theirs::KvQuantScheme { bits, first };
            let expected = LayerCache::kvquant(scheme, expected, schedule, layers, (k, v), rope)
                .expect("kvschemes holds it");
            let (stored, mine) = (expected.stored(), cache.stored());
            assert_eq!(
                (
                    mine.codes,
                    mine.metadata,
                    mine.full_precision,
                    mine.outliers
                ),
                (
                    stored.codes,
                    stored.metadata,
                    stored.full_precision,
                    stored.outliers
                ),
                "{at} {schedule:?}: bytes"
            );
            assert_eq!(mine.total(), stored.total(), "{at}");
            assert_eq!(cache.outliers(), expected.outliers(), "{at}: outliers");
            for query in [0, tokens / 2, tokens.saturating_sub(1)] {
                for head in 0..HEADS {
                    for position in 0..tokens {
                        for (side, a, b) in [
                            (
                                "key",
                                cache.key(head, query, position),
                                expected.key(head, query, position),
                            ),
                            (
                                "value",
                                cache.value(head, query, position),
                                expected.value(head, query, position),
                            ),
                        ] {
                            assert_eq!(
                                bits32(a),
                                bits32(b),
                                "{at} {schedule:?}: {side} of head {head}, position {position}:\n\
                                 audit {a:?}\nkvschemes {b:?}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Calibrates on two layers of `input`, compares both calibrations, then reads `eval`
    /// inputs of several lengths through both at both layers.
    fn compare_input(input: Input, evals: &[Input], seed: u64) {
        let layers = vec![
            (array(input, 150, seed), array(input, 150, seed + 1)),
            (array(input, 150, seed + 2), array(input, 150, seed + 3)),
        ];
        for bits in 2..=5 {
            for first in [0, 1] {
                let at = format!("{input:?} kvquant{bits} first {first}");
                let ours = Calibration::fit(bits, first, &layers).expect("the audit fits it");
                let expected = their_fit(bits, first, &layers);
                same_calibration(&at, &ours, &expected);
                for (i, &eval) in evals.iter().enumerate() {
                    for tokens in [1, 2, 45] {
                        let s = seed + 100 + 10 * i as u64 + tokens as u64;
                        let (k, v) = (array(eval, tokens, s), array(eval, tokens, s + 1));
                        for l in 0..2 {
                            let at = format!("{at}, {eval:?} T={tokens} layer {l}");
                            compare_layer(&at, (bits, first), (&ours, &expected), (l, 2), (&k, &v));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn patterned_and_random_calibrations_and_reads_equal_kvschemes_bit_for_bit() {
        compare_input(Input::Patterned, &[Input::Patterned, Input::Random], 1);
        compare_input(Input::Random, &[Input::Random, Input::Magnitudes], 2);
    }

    #[test]
    fn outlier_and_constant_channel_calibrations_and_reads_equal_kvschemes_bit_for_bit() {
        compare_input(
            Input::OutlierChannels,
            &[Input::OutlierChannels, Input::ConstantChannel],
            3,
        );
        compare_input(
            Input::ConstantChannel,
            &[Input::ConstantChannel, Input::Grid],
            4,
        );
    }

    #[test]
    fn tie_heavy_calibrations_and_reads_equal_kvschemes_bit_for_bit() {
        compare_input(Input::Grid, &[Input::Grid, Input::Random], 5);
    }

    #[test]
    fn names_parse_and_print_back_as_kvschemes_reads_them() {
        for name in [
            "kvquant2",
            "kvquant5",
            "kvquant3-first1",
            "kvquant4-first64",
        ] {
            let (bits, first) = parse(name).unwrap();
            assert_eq!(self::name(bits, first), name);
        }
        let mut names: Vec<String> = [
            "kvquant",
            "kvquant1",
            "kvquant6",
            "kvquant04",
            "kvquant4-",
            "kvquant4-first",
            "kvquant4-first0",
            "kvquant4-first01",
            "kvquant4-first65",
            "kvquant4-first1-first2",
            "kvquant4-first1x",
            "kvquant4-sink1",
            "kvquant-first1",
            "kvquant+4",
            "kvquant4 ",
            "KVQUANT4",
            "kvquant99999999999999999999",
            "kvquant4-first99999999999999999999",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for bits in ["0", "1", "2", "3", "4", "5", "6", "10", "02", ""] {
            for first in [
                "", "-first0", "-first1", "-first5", "-first64", "-first65", "-first",
            ] {
                names.push(format!("kvquant{bits}{first}"));
            }
        }
        for name in &names {
            let expected = theirs::KvQuantScheme::parse(name).map(|s| (s.bits, s.first));
            assert_eq!(parse(name), expected, "{name:?}");
        }
    }

    #[test]
    fn percentiles_interpolate_linearly_in_f64() {
        let s: Vec<f32> = (0..192).map(|i| i as f32).collect();
        // p = 0.995 * 191 = 190.045: 190 + 1 * 0.045 (to f64 rounding).
        assert!((percentile(&s, UPPER_QUANTILE) - 190.045).abs() < 1e-9);
        assert!((percentile(&s, LOWER_QUANTILE) - 0.955).abs() < 1e-9);
        assert_eq!(percentile(&[3.0], UPPER_QUANTILE), 3.0);
        assert_eq!(percentile(&[1.0, 2.0], 0.5), 1.5);
        for n in [1, 2, 3, 7, 100, 201, 4096] {
            let s: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let s = sorted_copy(s);
            for q in [UPPER_QUANTILE, LOWER_QUANTILE, 0.5, 0.0] {
                let (a, b) = (percentile(&s, q), theirs::percentile(&s, q));
                assert_eq!(a.to_bits(), b.to_bits(), "n {n} q {q}");
            }
        }
    }

    #[test]
    fn key_offsets_and_ranges_are_fp16_operations() {
        let h = f16::from_f32;
        assert_eq!(key_offset_range(h(2.0), h(-2.0)), (0.0, 2.0));
        // 1 + 2^-10 and 1 - 2^-11 (one fp16 ulp below 1): the sum 2 + 2^-11 rounds to 2 in
        // fp16 (ties to even), so the offset is 1, not 1 + 2^-12.
        let (u, l) = (h(1.0 + 2f32.powi(-10)), h(1.0 - 2f32.powi(-11)));
        assert_eq!(key_offset_range(u, l).0, 1.0);
        // The fp16 sum of the largest thresholds overflows: an infinite offset (the layer
        // then reads back infinities and is refused).
        assert_eq!(key_offset_range(h(65504.0), h(65504.0)).0, f32::INFINITY);
        for (u, l) in [
            (3.3, -1.7),
            (0.001, -0.002),
            (65504.0, -65504.0),
            (7.0, 7.0),
        ] {
            let (u, l) = (h(u), h(l));
            let (a, b) = (key_offset_range(u, l), theirs::key_range(u, l));
            assert_eq!(
                (a.0.to_bits(), a.1.to_bits()),
                (b.0.to_bits(), b.1.to_bits())
            );
        }
    }

    #[test]
    fn kmeans_finds_separated_clusters_and_refuses_too_few_values() {
        let mut data = Vec::new();
        for centre in [-0.8, -0.1, 0.3, 0.9] {
            for i in 0..50 {
                data.push(centre + (i as f64 - 25.0) * 1e-4);
            }
        }
        let levels = kmeans(&data, 4).unwrap();
        for (got, want) in levels.iter().zip([-0.8, -0.1, 0.3, 0.9]) {
            assert!((f64::from(*got) - want).abs() < 1e-3, "{levels:?}");
        }
        assert_eq!(kmeans(&[0.5; 100], 4), Err(1));
        assert_eq!(kmeans(&[0.1, 0.2, 0.2], 4), Err(2));
        assert_eq!(kmeans(&[0.0, -0.0, 1.0, 2.0], 4), Err(3));
        assert_eq!(kmeans(&[], 4), Err(0));
        // Exactly as many distinct values as levels: each its own level.
        assert_eq!(
            kmeans(&[0.25, -1.0, 1.0, 0.5, 0.5], 4),
            Ok(vec![-1.0, 0.25, 0.5, 1.0])
        );
    }

    /// Data whose quantile start repeats a level: 8 values, 4 levels start at indices 1, 3, 5
    /// and 7, that is at 0, 0, 0.2 and 1.
    const REPEATED_START: [f64; 8] = [-1.0, 0.0, 0.0, 0.0, 0.0, 0.2, 0.9, 1.0];

    #[test]
    fn kmeans_assigns_each_value_its_nearest_level_when_starting_levels_repeat() {
        // Step 1: -1 and the zeros go to level 0 (a tie with level 1, the lower wins), 0.2 to
        // level 2, 0.9 and 1 to level 3; level 1 has none and keeps 0. Levels: mean(-1, 0, 0,
        // 0, 0) = -0.2, 0, 0.2, 0.95. Step 2: the zeros move to level 1 (distance 0): levels -1,
        // 0, 0.2, 0.95. Step 3 changes nothing.
        assert_eq!(kmeans(&REPEATED_START, 4), Ok(vec![-1.0, 0.0, 0.2, 0.95]));
        // Unsorted levels: the nearest over the whole table, a tie to the lowest index.
        let mut assigned = vec![usize::MAX; 4];
        assert!(assign(
            &[-1.0, 0.0, 0.5, 2.0],
            &[1.0, 0.0, 1.0, -1.0],
            &mut assigned
        ));
        assert_eq!(assigned, vec![3, 1, 0, 0]);
    }

    /// A repeated starting level: every value still goes to its nearest level (-1, 0, 0.2,
    /// 0.95 here; walking a pointer up the levels while the next is strictly nearer stops at
    /// the repeat and gives -0.2, 0.1375, 0.2, 0.95, the bug this test found in kvschemes).
    #[test]
    fn kmeans_equals_kvschemes_when_starting_levels_repeat() {
        assert_eq!(
            kmeans(&REPEATED_START, 4),
            theirs::kmeans(REPEATED_START.to_vec(), 4)
        );
    }

    #[test]
    fn kmeans_equals_kvschemes_on_many_data_sets() {
        let mut rng = ChaCha20Rng::seed_from_u64(77);
        let mut repeated = Vec::new();
        for case in 0..60 {
            let n = [40, 300, 2000][case % 3];
            let levels = 1 << (2 + case % 4);
            let data: Vec<f64> = (0..n)
                .map(|_| {
                    let z: f64 = StandardNormal.sample(&mut rng);
                    match case % 5 {
                        // Normal, squashed into [-1, 1] by tanh.
                        0 => z.tanh(),
                        // Skewed: a heavy cluster at -1 and a tail.
                        1 => (z.abs() * 0.5 - 1.0).min(1.0),
                        // On a grid of 64 steps: repeated values.
                        2 => (z.tanh() * 32.0).round() / 32.0,
                        // f32 values as the calibration passes them.
                        3 => f64::from(z.tanh() as f32),
                        // Two far clusters.
                        _ => {
                            if z > 0.0 {
                                0.9 + z * 0.01
                            } else {
                                -0.5 + z * 0.001
                            }
                        }
                    }
                })
                .collect();
            let ours = kmeans(&data, levels);
            let expected = theirs::kmeans(data.clone(), levels);
            let bits = |r: &Result<Vec<f32>, usize>| r.clone().map(|l| bits32(&l));
            if repeated_start(&data, levels) {
                // kvschemes' walk misassigns these (the ignored test above).
                repeated.push(case);
                continue;
            }
            assert_eq!(
                bits(&ours),
                bits(&expected),
                "case {case}: n {n}, {levels} levels"
            );
        }
        // Only short, coarse-grid data sets start with a repeated level.
        assert!(repeated.iter().all(|case| case % 5 == 2), "{repeated:?}");
        assert!(repeated.len() < 8, "{repeated:?}");
    }

    /// Whether k-means' quantile start repeats a level on `data`.
    fn repeated_start(data: &[f64], levels: usize) -> bool {
        let mut sorted = data.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let start: Vec<f64> = (0..levels)
            .map(|i| sorted[(2 * i + 1) * n / (2 * levels)])
            .collect();
        start.windows(2).any(|w| w[0] == w[1])
    }

    #[test]
    fn the_nearest_level_takes_the_lower_on_a_tie() {
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], 0.5), 1);
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], -0.5), 0);
        assert_eq!(nearest(&[-1.0, 0.0, 1.0], 7.0), 2);
        assert_eq!(nearest(&[-1.0, 0.0, 0.0, 1.0], 0.25), 1);
        for x in [-2.0, -0.75, 0.1, 0.5, 0.99, f32::NAN] {
            let levels = [-1.0, -0.5, 0.5, 1.0];
            assert_eq!(nearest(&levels, x), theirs::nearest(&levels, x), "{x}");
        }
    }

    #[test]
    fn a_layer_reads_first_tokens_in_fp16_and_bills_codes_outliers_ranges_and_calibration() {
        let layers = [(array(Input::Random, 60, 9), array(Input::Random, 60, 10))];
        let cal = Calibration::fit(3, 2, &layers).unwrap();
        let (k, v) = (array(Input::Random, 10, 11), array(Input::Random, 10, 12));
        let cache = layer((3, 2), &cal, (0, 1), &k, &v, |_: &mut Array3<f32>| {
            Ok::<(), String>(())
        })
        .unwrap();
        // Token 1 is kept in fp16 (no RoPE here).
        let fp16_row: Vec<f32> = (0..HEAD_DIM).map(|j| fp16(v[[1, 1, j]])).collect();
        assert_eq!(cache.value(1, 9, 1), fp16_row.as_slice());
        let fp16_row: Vec<f32> = (0..HEAD_DIM).map(|j| fp16(k[[0, 1, j]])).collect();
        assert_eq!(cache.key(0, 0, 1), fp16_row.as_slice());
        // Bytes: 8 quantized rows of 32 values per side at 3 bits (12 bytes each), 8 bytes of
        // range per value row, 2 first rows of 32 fp16 values per side, the calibration (32 x 4
        // + 2 x 8 x 4 = 192), and 4 bytes per outlier plus 2 per quantized row and side. Every
        // value row has at least its largest and smallest value as outliers.
        let stored = cache.stored();
        assert_eq!(stored.codes, 2 * 8 * 12);
        assert_eq!(stored.metadata, 8 * 8 + 192);
        assert_eq!(stored.full_precision, 2 * 2 * 32 * 2);
        assert!(stored.outliers >= 2 * 8 * 2 + 8 * 2 * 4, "{stored:?}");
        assert_eq!((stored.outliers - 2 * 8 * 2) % 4, 0);
        assert_eq!(cal.layer_bytes(32), Some(192));
    }

    #[test]
    fn calibrations_and_layers_that_do_not_fit_are_refused_as_kvschemes_refuses_them() {
        let good = (array(Input::Random, 40, 1), array(Input::Random, 40, 2));
        let fits = |bits, first, layers: &[(Array3<f32>, Array3<f32>)]| {
            let ours = Calibration::fit(bits, first, layers);
            let expected = theirs::Calibration::fit(bits, first, layers);
            assert_eq!(ours.is_ok(), expected.is_ok(), "{ours:?}\n{expected:?}");
            ours.err()
        };
        assert_eq!(fits(3, 1, std::slice::from_ref(&good)), None);
        // Too short: no token after the first; too few distinct values.
        let short = (array(Input::Random, 1, 1), array(Input::Random, 1, 2));
        let err = fits(2, 1, &[short]).unwrap();
        assert!(
            err.contains("1 calibration tokens, none after the first 1"),
            "{err}"
        );
        let flat = (
            Array3::from_elem((HEADS, 40, HEAD_DIM), 0.5),
            good.1.clone(),
        );
        let err = fits(2, 0, &[flat]).unwrap();
        assert!(
            err.contains("layer 0: K has 0 distinct normalized values"),
            "{err}"
        );
        // Rows of 2 values over 4 tokens: at most 8 normalized values for 32 levels.
        let few = Array3::from_shape_fn((1, 4, 2), |(_, t, j)| (t * 2 + j) as f32 * 0.3);
        let err = fits(5, 0, &[(few.clone(), few)]).unwrap();
        assert!(err.contains("to fit 32 levels"), "{err}");
        // Mismatched widths or lengths between layers, or between K and V.
        let narrow = (Array3::zeros((HEADS, 40, 8)), Array3::zeros((HEADS, 40, 8)));
        let err = fits(2, 0, &[good.clone(), narrow]).unwrap();
        assert!(err.contains("layer 1's K is (2, 40, 8)"), "{err}");
        let err = fits(2, 0, &[(good.0.clone(), array(Input::Random, 39, 3))]).unwrap();
        assert!(
            err.contains("layer 0's K is (2, 40, 16) and V (2, 39, 16)"),
            "{err}"
        );
        assert!(fits(2, 0, &[]).unwrap().contains("no layer"));
        // Values that are not finite.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut v = good.1.clone();
            v[[1, 7, 3]] = bad;
            let err = fits(2, 0, &[good.clone(), (good.0.clone(), v)]).unwrap();
            assert!(
                err.contains("layer 1's V of head 1, token 7, channel 3 is"),
                "{err}"
            );
        }
        // The layer: a calibration of other bits, first tokens, layer count or width; shapes
        // that disagree; a value that is not finite; a RoPE that refuses.
        let cal = Calibration::fit(3, 1, std::slice::from_ref(&good)).unwrap();
        let expected = their_fit(3, 1, std::slice::from_ref(&good));
        let (k, v) = (array(Input::Random, 5, 3), array(Input::Random, 5, 4));
        let refused = |(bits, first): (u32, usize),
                       layers: (usize, usize),
                       (k, v): (&Array3<f32>, &Array3<f32>)| {
            let ours = layer((bits, first), &cal, layers, k, v, rope);
            let scheme = theirs::KvQuantScheme { bits, first };
            let theirs =
                LayerCache::kvquant(scheme, &expected, Schedule::Prefill, layers, (k, v), rope);
            assert_eq!(ours.is_ok(), theirs.is_ok(), "{:?}", ours.as_ref().err());
            ours.err()
        };
        assert_eq!(refused((3, 1), (0, 1), (&k, &v)), None);
        let err = refused((4, 1), (0, 1), (&k, &v)).unwrap();
        assert!(
            err.contains("kvquant4-first1: the calibration is kvquant3-first1's"),
            "{err}"
        );
        let err = refused((3, 0), (0, 1), (&k, &v)).unwrap();
        assert!(err.contains("calibration is kvquant3-first1's"), "{err}");
        let err = refused((3, 1), (0, 2), (&k, &v)).unwrap();
        assert!(
            err.contains("the calibration has 1 layers, the model 2"),
            "{err}"
        );
        let err = refused((3, 1), (1, 1), (&k, &v)).unwrap();
        assert!(err.contains("layer 1 of 1 does not exist"), "{err}");
        let wide = Array3::zeros((HEADS + 1, 5, HEAD_DIM));
        let err = refused((3, 1), (0, 1), (&wide, &wide)).unwrap();
        assert!(err.contains("the layer's rows hold 48 values"), "{err}");
        let err = refused((3, 1), (0, 1), (&k, &array(Input::Random, 6, 4))).unwrap();
        assert!(err.contains("they must agree"), "{err}");
        let mut bad = v.clone();
        bad[[0, 4, 15]] = f32::NAN;
        let err = refused((3, 1), (0, 1), (&k, &bad)).unwrap();
        assert!(
            err.contains("V of head 0, token 4, channel 15 is NaN"),
            "{err}"
        );
        // Finite values whose fp16 first-token row overflows read back as infinities.
        let mut huge = k.clone();
        huge[[1, 0, 2]] = 1e6;
        let err = refused((3, 1), (0, 1), (&huge, &v)).unwrap();
        assert!(
            err.contains("K of head 1, token 0 reads back as inf"),
            "{err}"
        );
        let err = layer((3, 1), &cal, (0, 1), &k, &v, |_: &mut Array3<f32>| {
            Err("no rope")
        })
        .unwrap_err();
        assert!(
            err.contains("rotating the keys read back: no rope"),
            "{err}"
        );
        // A table of the wrong size, or not ascending.
        let mut odd = cal.clone();
        odd.layers[0].value_levels.pop();
        assert!(
            odd.check((3, 1), 1, 32)
                .unwrap_err()
                .contains("7 value levels")
        );
        let mut odd = cal.clone();
        odd.layers[0].key_levels.swap(0, 7);
        assert!(
            odd.check((3, 1), 1, 32)
                .unwrap_err()
                .contains("not finite and ascending")
        );
        assert!(Calibration::fit(6, 0, std::slice::from_ref(&good)).is_err());
    }

    /// kvschemes' layer as a source.
    struct Theirs(LayerCache);

    impl KvSource for Theirs {
        fn key(&self, head: usize, query: usize, position: usize) -> &[f32] {
            self.0.key(head, query, position)
        }
        fn value(&self, head: usize, query: usize, position: usize) -> &[f32] {
            self.0.value(head, query, position)
        }
    }

    /// A small Llama with pseudo-random weights: 2 layers, hidden 64, 4 query heads and 2 KV
    /// heads of 16 (rows of 32 values), FFN 48, vocabulary 50.
    fn small_llama() -> Llama {
        let config = LlamaConfig {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: HEADS,
            head_dim: HEAD_DIM,
            ffn: 48,
            vocab: 50,
            context: 256,
            rope_base: 10000.0,
            rms_eps: 1e-5,
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut matrix = |rows: usize, cols: usize| {
            Array2::from_shape_fn((rows, cols), |_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
        };
        let layers = (0..2)
            .map(|_| LayerWeights {
                attn_norm: vec![1.0; 64],
                q: matrix(64, 64),
                k: matrix(32, 64),
                v: matrix(32, 64),
                o: matrix(64, 64),
                ffn_norm: vec![1.0; 64],
                gate: matrix(48, 64),
                up: matrix(48, 64),
                down: matrix(64, 48),
            })
            .collect();
        let weights = LlamaWeights {
            token_embd: matrix(50, 64),
            layers,
            output_norm: vec![1.0; 64],
        };
        Llama::from_weights(config, weights).unwrap()
    }

    /// Through a model: calibrated on one text's pre-RoPE keys and values, the audit's layers
    /// and kvschemes' give the same logits, bit for bit, on another text (RoPE the model's own).
    #[test]
    fn a_model_pass_reads_what_kvschemes_reads_bit_for_bit() {
        let model = small_llama();
        let calibration_ids: Vec<u32> = (0..160).map(|i| (i * 37 + 11) % 50).collect();
        let ids: Vec<u32> = (0..70).map(|i| (i * i + 3 * i + 1) % 50).collect();
        let mut kv = Vec::new();
        model
            .forward_with_layer_source(&calibration_ids, |_, layer| {
                kv.push((layer.k_pre_rope.clone(), layer.v.clone()));
                Ok(Box::new(OwnKv::new(layer.k, layer.v)))
            })
            .unwrap();
        for (bits, first) in [(2, 0), (4, 1), (5, 0)] {
            let ours = Calibration::fit(bits, first, &kv).unwrap();
            let expected = their_fit(bits, first, &kv);
            same_calibration(&format!("model kvquant{bits}"), &ours, &expected);
            let audit = model
                .forward_with_layer_source(&ids, |l, layer_kv| {
                    let cache = layer(
                        (bits, first),
                        &ours,
                        (l, 2),
                        layer_kv.k_pre_rope,
                        layer_kv.v,
                        |k| layer_kv.rope(k),
                    )?;
                    Ok(Box::new(cache))
                })
                .unwrap();
            let scheme = theirs::KvQuantScheme { bits, first };
            let study = model
                .forward_with_layer_source(&ids, |l, layer_kv| {
                    let cache = LayerCache::kvquant(
                        scheme,
                        &expected,
                        Schedule::Prefill,
                        (l, 2),
                        (layer_kv.k_pre_rope, layer_kv.v),
                        |k| layer_kv.rope(k),
                    )?;
                    Ok(Box::new(Theirs(cache)))
                })
                .unwrap();
            let logits =
                |c: &models::Capture| bits32(c.logits.as_ref().unwrap().as_slice().unwrap());
            assert_eq!(
                logits(&audit),
                logits(&study),
                "kvquant{bits} first {first}"
            );
            // Quantized, the pass differs from the plain one.
            let plain = model.forward(&ids).unwrap();
            assert_ne!(logits(&audit), logits(&plain));
        }
    }
}
