//! Decoding one token at a time: [`Llama::step`] with a caller-held cache, and greedy
//! generation with an f32 cache.

use ndarray::{Array2, Array3, s};

use super::Llama;
use super::attention::{attention, rope_table};
use super::error::{HookError, ModelError};
use super::forward::KvCache;
use crate::ops;

impl Llama {
    /// One decoding step with a cache the caller holds: runs token `id` at `position` (the
    /// number of positions before it). `cache(layer, k, v)` receives the new token's key (after
    /// RoPE) and value, [kv_heads, 1, head_dim], and returns the whole cache attention reads
    /// for this step, keys and values [kv_heads, position + 1, head_dim] (this token last).
    /// Returns the stream after the last block [1, hidden]. With a cache that keeps every row as
    /// given, the steps give the bits of one [`Llama::forward`] pass.
    pub fn step<F>(&self, id: u32, position: usize, mut cache: F) -> Result<Array2<f32>, ModelError>
    where
        F: FnMut(
            usize,
            &Array3<f32>,
            &Array3<f32>,
        ) -> Result<(Array3<f32>, Array3<f32>), HookError>,
    {
        let c = &self.config;
        if position >= c.context {
            return Err(ModelError::TooManyTokens {
                tokens: position + 1,
                context: c.context,
            });
        }
        if id as usize >= c.vocab {
            return Err(ModelError::UnknownToken {
                id,
                position,
                vocabulary: c.vocab,
            });
        }
        let mut x = self.embed(&[id]);
        let (cos, sin) = rope_table(position, 1, c.head_dim, c.rope_base);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let captured = self.layer_qkv(w, &x, &cos, &sin);
            let (k, v) = cache(l, &captured.k, &captured.v).map_err(|e| ModelError::Hook {
                layer: l,
                problem: e.to_string(),
            })?;
            let expected = (c.kv_heads, position + 1, c.head_dim);
            if k.dim() != expected || v.dim() != expected {
                return Err(ModelError::Hook {
                    layer: l,
                    problem: format!(
                        "returned k {:?} and v {:?}, expected {expected:?}",
                        k.dim(),
                        v.dim()
                    ),
                });
            }
            let (k, v) = (
                k.as_standard_layout().into_owned(),
                v.as_standard_layout().into_owned(),
            );
            let attended = attention(&captured.q, &k, &v, position);
            self.layer_rest(w, &mut x, &attended);
        }
        Ok(x)
    }

    /// `n` tokens continuing `ids`, each the argmax (lowest id on a tie) of the last position's
    /// logits. One pass over `ids`, then one position at a time with an f32 K/V cache; the
    /// logits are bit-identical to a batched pass over the whole sequence (see the tests).
    pub fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        self.check_ids(ids)?;
        // Checked: `n` comes from a flag (`runner quality --generate`).
        super::forward::check_continuation(ids, n, self.config.context)?;
        let mut cache = KvCache::new(self.config.layers);
        let mut out = Vec::with_capacity(n);
        let mut next = ids;
        let mut last;
        for _ in 0..n {
            let (hidden, _) = self.run(next, &mut cache, &mut |_, _, _| Ok(()))?;
            let normed = self.final_norm(&hidden.slice(s![hidden.nrows() - 1.., ..]).to_owned());
            let logits = ops::linear(normed.view(), self.weights.token_embd.view(), None);
            last = [argmax(logits.row(0).as_slice().expect("standard layout"))];
            out.push(last[0]);
            next = &last;
        }
        Ok(out)
    }
}

/// The index of the largest value, the first one on a tie.
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best as u32
}
