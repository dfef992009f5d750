//! The oracle the attention kernels are held to: the cache decoded exactly to f64
//! ([`crate::reference::decode_exact`]), then `softmax(qs K^T) V` in f64, one query at a time,
//! with the row maximum subtracted. Slow, and meant for nothing else.

use ndarray::{Array2, ArrayView2};

use super::{PackedHead, Queries, Result};
use crate::packed::PackedTensor;
use crate::reference::decode_exact;

/// Attention of `queries` over one KV head's packed cache, in f64 (the same checks as
/// [`super::attend`]).
pub fn attend_reference(
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: &PackedTensor,
    v: &PackedTensor,
    scale: f32,
) -> Result<Array2<f64>> {
    let head = PackedHead::new(k, v)?;
    Queries::new(queries, visible, head.tokens, head.features, scale)?;
    let (k, v) = (decode_exact(k), decode_exact(v));
    Ok(attend_f64(queries, visible, &k, &v, f64::from(scale)))
}

/// Attention in f64 over a decoded cache.
pub(crate) fn attend_f64(
    queries: ArrayView2<f32>,
    visible: &[usize],
    k: &Array2<f64>,
    v: &Array2<f64>,
    scale: f64,
) -> Array2<f64> {
    let features = k.ncols();
    let mut out = Array2::<f64>::zeros((queries.nrows(), features));
    for (i, q) in queries.rows().into_iter().enumerate() {
        let seen = visible[i];
        let scores: Vec<f64> = (0..seen)
            .map(|t| {
                q.iter()
                    .zip(k.row(t))
                    .map(|(&x, &y)| f64::from(x) * scale * y)
                    .sum()
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (t, w) in weights.iter().enumerate() {
            for (o, &x) in out.row_mut(i).iter_mut().zip(v.row(t)) {
                *o += w / total * x;
            }
        }
    }
    out
}
