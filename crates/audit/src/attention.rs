//! Attention recomputed with a different expression from the runner's: the log-sum-exp form
//! out = sum_j exp((s_j - m) - ln(sum_i exp(s_i - m))) v_j, queries pre-scaled by 1/sqrt(D),
//! std's exp and ln. The row maximum m is subtracted before the log-sum is, so huge scores do
//! not swallow it. Agreement with the archived outputs is checked to about 1e-12 relative, not
//! bit for bit.

use ndarray::{Array2, ArrayView2};

pub fn attention(q: ArrayView2<f64>, k: ArrayView2<f64>, v: ArrayView2<f64>) -> Array2<f64> {
    let scale = (q.ncols() as f64).sqrt().recip();
    let mut out = Array2::<f64>::zeros((q.nrows(), v.ncols()));
    for (qi, mut oi) in q.outer_iter().zip(out.outer_iter_mut()) {
        let scores: Vec<f64> = k
            .outer_iter()
            .map(|kj| kj.iter().zip(qi.iter()).map(|(a, b)| a * (b * scale)).sum())
            .collect();
        let m = scores.iter().copied().fold(f64::MIN, f64::max);
        let log_sum = scores.iter().map(|s| (s - m).exp()).sum::<f64>().ln();
        for (s, vj) in scores.iter().zip(v.outer_iter()) {
            let w = ((s - m) - log_sum).exp();
            oi.zip_mut_with(&vj, |o, x| *o += w * x);
        }
    }
    out
}

/// Largest |a - b| relative to the largest |b| (0 when both are all zeros).
pub fn relative_max_diff(a: &Array2<f64>, b: &Array2<f64>) -> f64 {
    let diff = a
        .iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let norm = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    if diff == 0.0 { 0.0 } else { diff / norm }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn uniform_scores_average_values() {
        let out = attention(
            array![[0.0, 0.0]].view(),
            array![[1.0, 2.0], [3.0, 4.0]].view(),
            array![[1.0, 10.0], [3.0, 20.0]].view(),
        );
        assert!(relative_max_diff(&out, &array![[2.0, 15.0]]) < 1e-15);
    }

    #[test]
    fn huge_tied_scores_still_average() {
        // Scores of 1e38 tie: m + ln(2) would round back to m and double every weight.
        let out = attention(
            array![[1e19, 0.0]].view(),
            array![[1e19, 0.0], [1e19, 1.0]].view(),
            array![[1.0, 10.0], [3.0, 20.0]].view(),
        );
        assert!(
            relative_max_diff(&out, &array![[2.0, 15.0]]) < 1e-15,
            "{out}"
        );
    }
}
