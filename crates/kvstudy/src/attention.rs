//! Reference attention in f64 and the error metrics the study reports.
//!
//! scores = q k^T / sqrt(D); softmax per query row with the row maximum subtracted;
//! out = weights v. Every sum runs in a fixed sequential order and `exp` comes from the pure-Rust
//! `libm` crate, so outputs are the same bits on every machine (a BLAS or the platform libm could
//! differ in the last place).
//!
//! K and V are read in chunks of [`CHUNK_TOKENS`] token rows through [`TokenRows`], so a long
//! cache (stored packed, or as f32) is never held whole in f64: the scores (queries x tokens)
//! are the only array that grows with the cache. Chunking changes no result: each score is one
//! dot product over features, and each output element sums over tokens in token order either way.

use ndarray::{Array2, ArrayView2, ArrayViewMut2, Zip, s};

/// Token rows read at a time.
pub const CHUNK_TOKENS: usize = 256;

/// A cache (K or V, N tokens x D features) that can be read as f64 rows, a chunk at a time.
pub trait TokenRows {
    /// N.
    fn tokens(&self) -> usize;
    /// D.
    fn features(&self) -> usize;
    /// Writes token rows `start..start + out.nrows()` into `out` (rows x D), exactly.
    fn read(&self, start: usize, out: ArrayViewMut2<f64>);
}

impl TokenRows for ArrayView2<'_, f32> {
    fn tokens(&self) -> usize {
        self.nrows()
    }

    fn features(&self) -> usize {
        self.ncols()
    }

    fn read(&self, start: usize, mut out: ArrayViewMut2<f64>) {
        let rows = self.slice(s![start..start + out.nrows(), ..]);
        Zip::from(&mut out)
            .and(rows)
            .for_each(|o, &x| *o = f64::from(x));
    }
}

impl TokenRows for ArrayView2<'_, f64> {
    fn tokens(&self) -> usize {
        self.nrows()
    }

    fn features(&self) -> usize {
        self.ncols()
    }

    fn read(&self, start: usize, mut out: ArrayViewMut2<f64>) {
        let rows = out.nrows();
        out.assign(&self.slice(s![start..start + rows, ..]));
    }
}

/// Attention output for queries `q` (Q x D) over keys `k` and values `v` (N x D each).
pub fn attention(q: ArrayView2<f64>, k: &impl TokenRows, v: &impl TokenRows) -> Array2<f64> {
    let (queries, features) = q.dim();
    let tokens = k.tokens();
    debug_assert_eq!((k.features(), v.tokens()), (features, tokens));
    let inv_sqrt_d = 1.0 / (features as f64).sqrt();
    let mut chunk = Array2::<f64>::zeros((CHUNK_TOKENS.min(tokens), features.max(v.features())));

    let q = q.as_standard_layout();
    let q = q.as_slice().expect("standard layout");
    let mut weights = Array2::<f64>::zeros((queries, tokens));
    for start in (0..tokens).step_by(CHUNK_TOKENS) {
        let len = CHUNK_TOKENS.min(tokens - start);
        let mut rows = chunk.slice_mut(s![..len, ..features]);
        k.read(start, rows.view_mut());
        let rows = rows.as_standard_layout();
        let rows = rows.as_slice().expect("standard layout");
        for (j, kj) in rows.chunks_exact(features).enumerate() {
            let column = start + j;
            dots(q, kj, |i, dot| weights[[i, column]] = dot * inv_sqrt_d);
        }
    }
    let mut totals = Vec::with_capacity(queries);
    for mut row in weights.outer_iter_mut() {
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        row.mapv_inplace(|w| libm::exp(w - max));
        totals.push(row.iter().sum::<f64>());
    }

    let v_features = v.features();
    let mut out = vec![0f64; queries * v_features];
    for start in (0..tokens).step_by(CHUNK_TOKENS) {
        let len = CHUNK_TOKENS.min(tokens - start);
        let mut rows = chunk.slice_mut(s![..len, ..v_features]);
        v.read(start, rows.view_mut());
        let rows = rows.as_standard_layout();
        let rows = rows.as_slice().expect("standard layout");
        for (i, out_row) in out.chunks_exact_mut(v_features).enumerate() {
            for (j, vj) in rows.chunks_exact(v_features).enumerate() {
                let p = weights[[i, start + j]] / totals[i];
                for (o, x) in out_row.iter_mut().zip(vj) {
                    *o += p * x;
                }
            }
        }
    }
    Array2::from_shape_vec((queries, v_features), out).expect("queries x features")
}

/// Calls `emit(i, q_i . k)` for every query row `i` of `q` (row-major, `k.len()` columns).
///
/// Each dot product is the sequential sum of `q_i[f] * k[f]` in feature order, starting from
/// the standard library's neutral element of an f64 sum, so it is bit for bit
/// `q_i.iter().zip(k).map(|(a, b)| a * b).sum()`. Four queries run side by side only so that
/// their four independent chains of additions overlap in the CPU.
fn dots(q: &[f64], k: &[f64], mut emit: impl FnMut(usize, f64)) {
    let features = k.len();
    let zero: f64 = std::iter::empty::<f64>().sum();
    let mut blocks = q.chunks_exact(4 * features);
    let mut i = 0;
    for block in blocks.by_ref() {
        let (q0, rest) = block.split_at(features);
        let (q1, rest) = rest.split_at(features);
        let (q2, q3) = rest.split_at(features);
        let mut sums = [zero; 4];
        for f in 0..features {
            let x = k[f];
            sums[0] += q0[f] * x;
            sums[1] += q1[f] * x;
            sums[2] += q2[f] * x;
            sums[3] += q3[f] * x;
        }
        for (offset, sum) in sums.into_iter().enumerate() {
            emit(i + offset, sum);
        }
        i += 4;
    }
    for qi in blocks.remainder().chunks_exact(features) {
        emit(i, qi.iter().zip(k).map(|(a, b)| a * b).sum());
        i += 1;
    }
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
        assert_eq!(
            attention(q.view(), &k.view(), &v.view()),
            array![[2.0, 15.0]]
        );
    }

    #[test]
    fn a_dominant_key_selects_its_value() {
        let q = array![[100.0, 0.0]];
        let k = array![[10.0, 0.0], [-10.0, 0.0]];
        let v = array![[1.0, 2.0], [5.0, 7.0]];
        let out = attention(q.view(), &k.view(), &v.view());
        assert!((out[[0, 0]] - 1.0).abs() < 1e-12 && (out[[0, 1]] - 2.0).abs() < 1e-12);
    }

    #[test]
    fn softmax_is_shift_invariant_and_does_not_overflow() {
        let q = array![[1.0, 1.0]];
        let k = array![[800.0, 800.0], [799.0, 799.0]];
        let v = array![[1.0, 0.0], [0.0, 1.0]];
        let out = attention(q.view(), &k.view(), &v.view());
        assert!(out.iter().all(|x| x.is_finite()));
        assert!((out.sum() - 1.0).abs() < 1e-12);
    }

    /// The unchunked attention this module computed before chunking, one query at a time.
    fn unchunked(q: ArrayView2<f64>, k: ArrayView2<f64>, v: ArrayView2<f64>) -> Array2<f64> {
        let inv_sqrt_d = 1.0 / (q.ncols() as f64).sqrt();
        let mut out = Array2::<f64>::zeros((q.nrows(), v.ncols()));
        for (i, qi) in q.outer_iter().enumerate() {
            let mut w: Vec<f64> = k
                .outer_iter()
                .map(|kj| qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * inv_sqrt_d)
                .collect();
            let max = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            w.iter_mut().for_each(|x| *x = libm::exp(*x - max));
            let total: f64 = w.iter().sum();
            for (j, wj) in w.iter().enumerate() {
                let p = wj / total;
                for (o, x) in out.row_mut(i).iter_mut().zip(v.row(j)) {
                    *o += p * x;
                }
            }
        }
        out
    }

    #[test]
    fn chunks_and_query_blocks_change_no_bit() {
        // 7 queries (a block of 4 and 3 alone), 1000 tokens (3 full chunks and a partial one).
        let wave = |r: usize, c: usize, a: f64| ((r * 31 + c * 7) as f64 * a).sin() * 3.0;
        let q = Array2::from_shape_fn((7, 12), |(r, c)| wave(r, c, 0.13));
        let k = Array2::from_shape_fn((1000, 12), |(r, c)| wave(r, c, 0.071) as f32);
        let v = Array2::from_shape_fn((1000, 12), |(r, c)| wave(r, c, 0.029) as f32);
        let chunked = attention(q.view(), &k.view(), &v.view());
        let whole = unchunked(q.view(), k.mapv(f64::from).view(), v.mapv(f64::from).view());
        assert_eq!(chunked.mapv(f64::to_bits), whole.mapv(f64::to_bits));
    }

    #[test]
    fn metrics() {
        let reference = array![[3.0, 4.0]];
        let out = array![[3.0, 4.5]];
        assert_eq!(relative_l2(&out, &reference), 0.1);
        assert_eq!(max_abs(&out, &reference), 0.5);
    }
}
