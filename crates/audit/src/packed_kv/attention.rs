//! Attention recomputed with a different expression from the runner's: the log-sum-exp form
//! out = sum_j exp((s_j - m) - ln(sum_i exp(s_i - m))) v_j, queries pre-scaled by 1/sqrt(D),
//! std's exp and ln. The row maximum m is subtracted before the log-sum is, so huge scores do
//! not swallow it. Agreement with the archived outputs is checked to about 1e-12 relative, not
//! bit for bit.
//!
//! Keys and values are read a block of rows at a time through [`Rows`]: f32 inputs converted to
//! f64 as they are read (exactly: every f32 is an f64), or codes decoded as they are read. So no
//! f64 copy of a whole K or V is ever made; what is held besides them is one block and the
//! scores of a group of queries. Each query's sums still run over the same values in the same
//! order as over whole matrices, so the result is the same to the bit.

use ndarray::{Array2, ArrayView2, s};

/// f64 values per block of rows read from K or V (512 KiB).
const BLOCK_VALUES: usize = 1 << 16;

/// A tokens x features matrix read a block of rows at a time, as f64.
pub trait Rows {
    /// (tokens, features).
    fn dim(&self) -> (usize, usize);
    /// Writes rows `start..start + out.len() / features` into `out`, row-major.
    fn rows(&self, start: usize, out: &mut [f64]);
}

impl<T: Rows + ?Sized> Rows for &T {
    fn dim(&self) -> (usize, usize) {
        (**self).dim()
    }
    fn rows(&self, start: usize, out: &mut [f64]) {
        (**self).rows(start, out)
    }
}

impl Rows for ArrayView2<'_, f64> {
    fn dim(&self) -> (usize, usize) {
        ArrayView2::dim(self)
    }
    fn rows(&self, start: usize, out: &mut [f64]) {
        let width = self.ncols().max(1);
        let block = self.slice(s![start..start + out.len() / width, ..]);
        for (o, &x) in out.iter_mut().zip(block.iter()) {
            *o = x;
        }
    }
}

impl Rows for ArrayView2<'_, f32> {
    fn dim(&self) -> (usize, usize) {
        ArrayView2::dim(self)
    }
    fn rows(&self, start: usize, out: &mut [f64]) {
        let width = self.ncols().max(1);
        let block = self.slice(s![start..start + out.len() / width, ..]);
        for (o, &x) in out.iter_mut().zip(block.iter()) {
            *o = f64::from(x);
        }
    }
}

/// Attention of every query row of `q` over keys `k` and values `v` (as many rows as `k`).
pub fn attention(q: ArrayView2<f64>, k: impl Rows, v: impl Rows) -> Array2<f64> {
    let (tokens, k_width) = k.dim();
    let (_, v_width) = v.dim();
    let scale = (q.ncols() as f64).sqrt().recip();
    let mut out = Array2::<f64>::zeros((q.nrows(), v_width));
    let widest = k_width.max(v_width).max(1);
    let block = (BLOCK_VALUES / widest).max(1);
    let mut buf = vec![0.0f64; block * widest];
    // Queries at a time: their scores (8 bytes per query and token) stay within a quarter of
    // what K and V take as f32 (8 bytes per feature and token).
    let group = (k_width / 4).max(1);
    for first in (0..q.nrows()).step_by(group) {
        let queries = q.slice(s![first..(first + group).min(q.nrows()), ..]);
        let mut scores = Array2::<f64>::zeros((queries.nrows(), tokens));
        for start in (0..tokens).step_by(block) {
            let n = block.min(tokens - start);
            let keys = &mut buf[..n * k_width];
            k.rows(start, keys);
            for (qi, mut si) in queries.outer_iter().zip(scores.outer_iter_mut()) {
                for (j, kj) in keys.chunks_exact(k_width.max(1)).enumerate() {
                    si[start + j] = kj.iter().zip(qi.iter()).map(|(a, b)| a * (b * scale)).sum();
                }
            }
        }
        let stats: Vec<(f64, f64)> = scores
            .outer_iter()
            .map(|si| {
                let m = si.iter().copied().fold(f64::MIN, f64::max);
                let log_sum = si.iter().map(|s| (s - m).exp()).sum::<f64>().ln();
                (m, log_sum)
            })
            .collect();
        let mut rows = out.slice_mut(s![first..first + queries.nrows(), ..]);
        for start in (0..tokens).step_by(block) {
            let n = block.min(tokens - start);
            let values = &mut buf[..n * v_width];
            v.rows(start, values);
            for ((si, &(m, log_sum)), mut oi) in
                scores.outer_iter().zip(&stats).zip(rows.outer_iter_mut())
            {
                for (j, vj) in values.chunks_exact(v_width.max(1)).enumerate() {
                    let w = ((si[start + j] - m) - log_sum).exp();
                    for (o, x) in oi.iter_mut().zip(vj) {
                        *o += w * x;
                    }
                }
            }
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

    /// The expression over whole f64 matrices, one query at a time, as the audit computed it
    /// before it read K and V by blocks.
    fn whole(q: ArrayView2<f64>, k: ArrayView2<f64>, v: ArrayView2<f64>) -> Array2<f64> {
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

    #[test]
    fn blocks_and_query_groups_give_the_same_bits_as_whole_matrices() {
        // Several blocks of rows (features 8: 8192 rows a block) and several groups of queries
        // (two queries a group), from f32 inputs read as f64.
        let (queries, tokens, features) = (5, 20_000, 8);
        let mut state = 1u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
        };
        let q = Array2::from_shape_fn((queries, features), |_| f64::from(next()));
        let k = Array2::from_shape_fn((tokens, features), |_| next());
        let v = Array2::from_shape_fn((tokens, features), |_| next());
        let blocked = attention(q.view(), k.view(), v.view());
        let expected = whole(q.view(), k.mapv(f64::from).view(), v.mapv(f64::from).view());
        let bits = |a: &Array2<f64>| a.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&blocked), bits(&expected));
    }
}
