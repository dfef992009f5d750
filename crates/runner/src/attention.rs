//! Reference attention in f64 and the error metrics the study reports.
//!
//! scores = q k^T / sqrt(D); softmax per query row with the row maximum subtracted;
//! out = weights v. Every sum runs in a fixed sequential order and `exp` comes from the pure-Rust
//! `libm` crate, so outputs are the same bits on every machine (a BLAS or the platform libm could
//! differ in the last place).

use ndarray::{Array2, ArrayView2, Zip};

/// Attention output for queries `q` (Q x D) over keys `k` and values `v` (N x D).
pub fn attention(q: ArrayView2<f64>, k: ArrayView2<f64>, v: ArrayView2<f64>) -> Array2<f64> {
    let (queries, features) = q.dim();
    let tokens = k.nrows();
    let inv_sqrt_d = 1.0 / (features as f64).sqrt();
    let mut out = Array2::<f64>::zeros((queries, v.ncols()));
    let mut weights = vec![0f64; tokens];
    for i in 0..queries {
        let qi = q.row(i);
        for (j, w) in weights.iter_mut().enumerate() {
            let dot: f64 = qi.iter().zip(k.row(j)).map(|(a, b)| a * b).sum();
            *w = dot * inv_sqrt_d;
        }
        let max = weights.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for w in weights.iter_mut() {
            *w = libm::exp(*w - max);
        }
        let total: f64 = weights.iter().sum();
        let mut row = out.row_mut(i);
        for (j, w) in weights.iter().enumerate() {
            let p = w / total;
            for (o, x) in row.iter_mut().zip(v.row(j)) {
                *o += p * x;
            }
        }
    }
    out
}

/// ||out - reference||_F / ||reference||_F over the whole output.
pub fn relative_l2(out: &Array2<f64>, reference: &Array2<f64>) -> f64 {
    let mut diff = 0.0;
    let mut norm = 0.0;
    Zip::from(out).and(reference).for_each(|o, r| {
        diff += (o - r) * (o - r);
        norm += r * r;
    });
    (diff / norm).sqrt()
}

/// max |out - reference|.
pub fn max_abs(out: &Array2<f64>, reference: &Array2<f64>) -> f64 {
    let mut max = 0f64;
    Zip::from(out)
        .and(reference)
        .for_each(|o, r| max = max.max((o - r).abs()));
    max
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn equal_scores_average_the_values() {
        let q = array![[0.0, 0.0]];
        let k = array![[1.0, 2.0], [3.0, 4.0]];
        let v = array![[1.0, 10.0], [3.0, 20.0]];
        assert_eq!(attention(q.view(), k.view(), v.view()), array![[2.0, 15.0]]);
    }

    #[test]
    fn a_dominant_key_selects_its_value() {
        let q = array![[100.0, 0.0]];
        let k = array![[10.0, 0.0], [-10.0, 0.0]];
        let v = array![[1.0, 2.0], [5.0, 7.0]];
        let out = attention(q.view(), k.view(), v.view());
        assert!((out[[0, 0]] - 1.0).abs() < 1e-12 && (out[[0, 1]] - 2.0).abs() < 1e-12);
    }

    #[test]
    fn softmax_is_shift_invariant_and_does_not_overflow() {
        let q = array![[1.0, 1.0]];
        let k = array![[800.0, 800.0], [799.0, 799.0]];
        let v = array![[1.0, 0.0], [0.0, 1.0]];
        let out = attention(q.view(), k.view(), v.view());
        assert!(out.iter().all(|x| x.is_finite()));
        assert!((out.sum() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn metrics() {
        let reference = array![[3.0, 4.0]];
        let out = array![[3.0, 4.5]];
        assert_eq!(relative_l2(&out, &reference), 0.1);
        assert_eq!(max_abs(&out, &reference), 0.5);
    }
}
