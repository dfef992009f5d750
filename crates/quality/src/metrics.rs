//! Teacher-forcing metrics of a packed cache against the float32 cache, over a text of T tokens.
//!
//! Position i (0 <= i < T - 1) predicts token i + 1; every number is over these T - 1 positions.
//! - log-softmax in f64: m = max of the row, log p(v) = (x_v - m) - log(sum_u exp(x_u - m)), the
//!   sum taken over the vocabulary in id order with `libm::exp`, then `libm::log`;
//! - NLL = mean of -log p(t_(i+1)) (natural log, nats), perplexity = exp(NLL);
//! - KL(p_f32 || p_packed) at a position = sum over the vocabulary, in id order, of
//!   p_f32(v) * (log p_f32(v) - log p_packed(v)); reported as its mean and max;
//! - top-1 agreement = the share of positions whose argmax (lowest id on a tie) equals the f32
//!   cache's.
//!
//! Sums are f64 in a fixed order, so the numbers are the same bits on any machine.
//!
//! Over a run, KL is also reported as a distribution, pooled over every scored position of every
//! text, by llama.cpp's perplexity tool's rule (`tools/perplexity/perplexity.cpp`,
//! `kl_divergence`, the statistics after `====== KL divergence statistics ======`; read at
//! commit 050fc7f): the values sorted, the median the middle one or the mean of the two middle
//! ones, and percentile f = (1 - w) v\[k\] + w v\[min(k + 1, n - 1)\] with k = floor(f (n - 1)) and
//! w the fraction left over. llama.cpp does this in f32 over f32 KL values; here it is f64,
//! like every other number of the study. And as a mean within bands of positions
//! ([`POSITION_BANDS`]), so that a window or a sink is judged where it no longer covers the text.

use models::llama::argmax;
use std::ops::Range;

use ndarray::{Array2, s};
use serde::Serialize;

use crate::error::QualityError;

/// The natural-log softmax of one row of logits, in f64 (module docs).
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
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

/// The bands of positions (the index of the token a prediction is made from) whose mean KL a
/// run reports: 0-127, 128-1,023, and 1,024 on (`None`: no end).
pub const POSITION_BANDS: [(usize, Option<usize>); 3] =
    [(0, Some(127)), (128, Some(1023)), (1024, None)];

/// The median of sorted values (module docs); NaN for none.
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n.is_multiple_of(2) => 0.5 * (sorted[n / 2] + sorted[n / 2 - 1]),
        _ => sorted[n / 2],
    }
}

/// The `fraction` percentile of sorted values, interpolated linearly between neighbours
/// (module docs); NaN for none.
pub fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if fraction <= 0.0 {
        return sorted[0];
    }
    if fraction >= 1.0 {
        return sorted[n - 1];
    }
    let p = fraction * (n - 1) as f64;
    let k = p as usize;
    let w = p - k as f64;
    (1.0 - w) * sorted[k] + w * sorted[(k + 1).min(n - 1)]
}

/// Per band of [`POSITION_BANDS`], the mean of `kl` over the positions in it, pooled over the
/// texts (`kl[t][i]`: text t's KL at position i; summed in text, then position order); `None`
/// for a band no text reaches.
pub fn band_means(kl: &[&[f64]]) -> Vec<Option<f64>> {
    POSITION_BANDS
        .iter()
        .map(|&(first, last)| {
            let (mut sum, mut count) = (0f64, 0usize);
            for text in kl {
                let end = last.map_or(text.len(), |l| (l + 1).min(text.len()));
                for &x in text.get(first..end).unwrap_or(&[]) {
                    sum += x;
                    count += 1;
                }
            }
            (count > 0).then(|| sum / count as f64)
        })
        .collect()
}

/// KL(p || q) from two log-softmax rows (module docs).
pub fn kl(log_p: &[f64], log_q: &[f64]) -> f64 {
    let mut sum = 0f64;
    for (&a, &b) in log_p.iter().zip(log_q) {
        sum += libm::exp(a) * (a - b);
    }
    sum
}

/// Per position and summary numbers of one comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// log p(t_(i+1)) with the float32 cache, per position.
    pub logp_f32: Vec<f64>,
    /// log p(t_(i+1)) with the packed cache, per position.
    pub logp: Vec<f64>,
    /// KL(p_f32 || p_packed), per position.
    pub kl: Vec<f64>,
    /// Whether the argmaxes agree, per position.
    pub top1_same: Vec<bool>,
    /// Mean -log p with the float32 cache.
    pub nll_f32: f64,
    /// Mean -log p with the packed cache.
    pub nll: f64,
    /// Mean KL.
    pub kl_mean: f64,
    /// Largest KL.
    pub kl_max: f64,
    /// Share of positions whose argmaxes agree.
    pub top1_agreement: f64,
}

/// Compares the logits [T, vocab] of the float32 cache and of a packed cache on `ids`.
pub fn compare(
    ids: &[u32],
    f32_logits: &Array2<f32>,
    logits: &Array2<f32>,
) -> Result<Comparison, QualityError> {
    if f32_logits.dim() != logits.dim() {
        return Err(QualityError::Shapes(f32_logits.dim(), logits.dim()));
    }
    if f32_logits.nrows() < ids.len() {
        return Err(QualityError::TooFewTokens(ids.len()));
    }
    compare_in_blocks(ids, ids.len(), |rows| {
        Ok((
            f32_logits.slice(s![rows.clone(), ..]).to_owned(),
            logits.slice(s![rows, ..]).to_owned(),
        ))
    })
}

/// [`compare`] with the logits handed over `block` positions at a time: `logits(rows)` gives
/// both caches' logits of positions `rows`, so that the whole [T, vocab] matrices (8.6 GB at
/// 8,192 tokens of Gemma 3's vocabulary) never exist at once. The numbers are [`compare`]'s.
pub fn compare_in_blocks(
    ids: &[u32],
    block: usize,
    mut logits: impl FnMut(Range<usize>) -> Result<(Array2<f32>, Array2<f32>), QualityError>,
) -> Result<Comparison, QualityError> {
    let positions = ids.len().saturating_sub(1);
    if positions == 0 {
        return Err(QualityError::TooFewTokens(ids.len()));
    }
    let mut out = Comparison {
        logp_f32: Vec::with_capacity(positions),
        logp: Vec::with_capacity(positions),
        kl: Vec::with_capacity(positions),
        top1_same: Vec::with_capacity(positions),
        nll_f32: 0.0,
        nll: 0.0,
        kl_mean: 0.0,
        kl_max: 0.0,
        top1_agreement: 0.0,
    };
    let block = block.max(1);
    for start in (0..positions).step_by(block) {
        let rows = start..(start + block).min(positions);
        let (f32_logits, logits) = logits(rows.clone())?;
        if f32_logits.dim() != logits.dim() || f32_logits.nrows() != rows.len() {
            return Err(QualityError::Shapes(f32_logits.dim(), logits.dim()));
        }
        for (r, i) in rows.enumerate() {
            let a = f32_logits.row(r);
            let b = logits.row(r);
            let a = a.as_slice().ok_or(QualityError::TooFewTokens(ids.len()))?;
            let b = b.as_slice().ok_or(QualityError::TooFewTokens(ids.len()))?;
            let (la, lb) = (log_softmax(a), log_softmax(b));
            let next = ids[i + 1] as usize;
            out.logp_f32.push(la.get(next).copied().unwrap_or(f64::NAN));
            out.logp.push(lb.get(next).copied().unwrap_or(f64::NAN));
            out.kl.push(kl(&la, &lb));
            out.top1_same.push(argmax(a) == argmax(b));
        }
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / positions as f64;
    out.nll_f32 = -mean(&out.logp_f32);
    out.nll = -mean(&out.logp);
    out.kl_mean = mean(&out.kl);
    out.kl_max = out.kl.iter().fold(0f64, |m, &x| m.max(x));
    out.top1_agreement =
        out.top1_same.iter().filter(|&&same| same).count() as f64 / positions as f64;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn percentiles_interpolate_between_sorted_neighbours_as_llama_cpp_does() {
        let v = [0.0, 1.0, 2.0, 10.0];
        assert_eq!(median(&v), 1.5);
        assert_eq!(median(&v[..3]), 1.0);
        // f (n - 1) = 0.99 * 3 = 2.97: 0.03 of v[2] and 0.97 of v[3].
        assert!((percentile(&v, 0.99) - (0.03 * 2.0 + 0.97 * 10.0)).abs() < 1e-12);
        assert_eq!(percentile(&v, 1.0), 10.0);
        assert_eq!(percentile(&v, 0.0), 0.0);
        assert_eq!(percentile(&[7.0], 0.999), 7.0);
        assert!(median(&[]).is_nan() && percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn band_means_pool_texts_and_leave_unreached_bands_empty() {
        let a: Vec<f64> = (0..200).map(|i| if i < 128 { 1.0 } else { 3.0 }).collect();
        let b = vec![2.0; 130];
        let means = band_means(&[&a, &b]);
        assert_eq!(means[0], Some((128.0 + 2.0 * 128.0) / 256.0));
        assert_eq!(means[1], Some((72.0 * 3.0 + 2.0 * 2.0) / 74.0));
        assert_eq!(means[2], None);
    }

    #[test]
    fn log_softmax_of_equal_logits_is_minus_log_n_and_survives_large_values() {
        let row = log_softmax(&[1000.0, 1000.0, 1000.0, 1000.0]);
        for x in row {
            assert!((x + 4f64.ln()).abs() < 1e-15);
        }
        let row = log_softmax(&[0.0, 2f32.ln()]);
        assert!((row[1] - (2.0f64 / 3.0).ln()).abs() < 1e-7);
    }

    #[test]
    fn identical_logits_have_zero_kl_and_full_agreement() {
        let ids = [0, 1, 2];
        let logits = array![[1.0f32, 2.0, 0.5], [0.0, 0.0, 3.0], [1.0, 1.0, 1.0]];
        let c = compare(&ids, &logits, &logits).unwrap();
        assert_eq!(c.kl, [0.0, 0.0]);
        assert_eq!((c.top1_agreement, c.nll, c.kl_max), (1.0, c.nll_f32, 0.0));
        // Position 0 predicts id 1: log p = 2 - log(e^1 + e^2 + e^0.5).
        let expected = 2.0 - (1f64.exp() + 2f64.exp() + 0.5f64.exp()).ln();
        assert!((c.logp_f32[0] - expected).abs() < 1e-6);
    }

    #[test]
    fn a_changed_argmax_counts_against_agreement_and_kl_is_positive() {
        let ids = [0, 0, 0];
        let a = array![[2.0f32, 1.0], [2.0, 1.0], [0.0, 0.0]];
        let b = array![[1.0f32, 2.0], [2.0, 1.0], [0.0, 0.0]];
        let c = compare(&ids, &a, &b).unwrap();
        assert_eq!(c.top1_same, [false, true]);
        assert_eq!(c.top1_agreement, 0.5);
        assert!(c.kl[0] > 0.0 && c.kl[1] == 0.0 && c.kl_max == c.kl[0]);
        assert!(matches!(
            compare(&[0], &a, &b),
            Err(QualityError::TooFewTokens(1))
        ));
    }

    #[test]
    fn blocks_of_any_size_give_the_whole_comparison() {
        let ids = [3u32, 1, 4, 1, 5, 9, 2];
        let logits = |seed: f32| {
            Array2::from_shape_fn((7, 10), |(i, v)| ((i * 7 + v * 3) as f32 * seed).sin())
        };
        let (a, b) = (logits(0.37), logits(0.41));
        let whole = compare(&ids, &a, &b).unwrap();
        for block in [1, 2, 4, 6, 100] {
            let blocks = compare_in_blocks(&ids, block, |rows| {
                Ok((
                    a.slice(s![rows.clone(), ..]).to_owned(),
                    b.slice(s![rows, ..]).to_owned(),
                ))
            })
            .unwrap();
            assert_eq!(blocks, whole, "block {block}");
        }
        let short = compare_in_blocks(&ids, 3, |_| Ok((a.clone(), b.clone()))).unwrap_err();
        assert!(matches!(short, QualityError::Shapes(..)), "{short:?}");
    }
}
