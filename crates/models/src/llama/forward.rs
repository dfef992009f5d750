//! The batched causal passes: [`Llama::forward`], its K/V hook and its [`KvSource`] variant,
//! and the pieces of a block they share with token-by-token decoding.

use ndarray::{Array2, Array3, ArrayView2, Axis, s};

use super::Llama;
use super::attention::{attention, attention_from, rope, rope_neox, rope_table, split_heads};
use super::error::{HookError, ModelError};
use super::load::LayerWeights;
use super::source::KvSource;
use crate::capture::{Capture, LayerCapture};
use crate::ops;

/// One layer's cache inputs in [`Llama::forward_with_layer_source`]: keys after RoPE (what a
/// cache usually stores), keys before it, and values, each [kv_heads, tokens, head_dim]; the
/// queries that will read them; and the layer's RoPE, so that keys stored before it can be
/// rotated as attention reads them.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv<'a> {
    /// Queries, [heads, tokens, head_dim], after RoPE (Gemma 3: after QK-norm too), every
    /// position of the pass (not only those of [`LayerKv::positions_from`]).
    pub q: &'a Array3<f32>,
    /// Keys after RoPE.
    pub k: &'a Array3<f32>,
    /// Values.
    pub v: &'a Array3<f32>,
    /// Keys before RoPE: the projection's output, split into heads (Gemma 3: after QK-norm).
    pub k_pre_rope: &'a Array3<f32>,
    cos: ArrayView2<'a, f32>,
    sin: ArrayView2<'a, f32>,
    neox: bool,
}

impl<'a> LayerKv<'a> {
    /// A layer's cache inputs with the RoPE table its pass used; `neox` for NeoX pairs
    /// (channel i with i + d/2, Gemma 3) rather than adjacent ones (2i, 2i + 1, SmolLM2).
    pub(crate) fn new(
        q: &'a Array3<f32>,
        (k, v, k_pre_rope): (&'a Array3<f32>, &'a Array3<f32>, &'a Array3<f32>),
        (cos, sin): (&'a Array2<f32>, &'a Array2<f32>),
        neox: bool,
    ) -> LayerKv<'a> {
        LayerKv {
            q,
            k,
            v,
            k_pre_rope,
            cos: cos.view(),
            sin: sin.view(),
            neox,
        }
    }

    /// The same layer at positions `first..` only: `k`, `v` and `k_pre_rope` are those
    /// positions' rows, and [`LayerKv::rope`] rotates row r as position `first + r` (a cache
    /// that holds only a sliding window's last tokens). Refuses rows that are not
    /// [kv_heads, tokens - first, head_dim].
    pub fn positions_from<'b>(
        &self,
        first: usize,
        (k, v, k_pre_rope): (&'b Array3<f32>, &'b Array3<f32>, &'b Array3<f32>),
    ) -> Result<LayerKv<'b>, HookError>
    where
        'a: 'b,
    {
        let (heads, tokens, d) = self.k.dim();
        let expected = (heads, tokens.saturating_sub(first), d);
        if first > tokens
            || [k.dim(), v.dim(), k_pre_rope.dim()]
                .iter()
                .any(|&x| x != expected)
        {
            return Err(format!(
                "rows of shapes {:?}, {:?} and {:?} for positions {first}.. of {tokens}",
                k.dim(),
                v.dim(),
                k_pre_rope.dim()
            )
            .into());
        }
        Ok(LayerKv {
            q: self.q,
            k,
            v,
            k_pre_rope,
            cos: from_row(self.cos, first),
            sin: from_row(self.sin, first),
            neox: self.neox,
        })
    }

    /// Cache inputs whose keys carry no position (generated K/V): keys before RoPE are `k`, and
    /// [`LayerKv::rope`] leaves keys as they are.
    pub fn unrotated(q: &'a Array3<f32>, k: &'a Array3<f32>, v: &'a Array3<f32>) -> LayerKv<'a> {
        let none = ArrayView2::from_shape((0, 0), &[]).expect("an empty table");
        LayerKv {
            q,
            k,
            v,
            k_pre_rope: k,
            cos: none,
            sin: none,
            neox: false,
        }
    }

    /// Rotates `keys` [kv_heads, tokens, head_dim] as the pass rotated its own (position p by
    /// the same table entry), so that `rope(k_pre_rope)` is `k` bit for bit. Refuses another
    /// shape.
    pub fn rope(&self, keys: &mut Array3<f32>) -> Result<(), HookError> {
        if keys.dim() != self.k_pre_rope.dim() {
            return Err(format!(
                "keys of shape {:?} to rotate, where the layer's are {:?}",
                keys.dim(),
                self.k_pre_rope.dim()
            )
            .into());
        }
        if self.cos.is_empty() {
            return Ok(()); // unrotated
        }
        let (cos, sin) = (self.cos.to_owned(), self.sin.to_owned());
        if self.neox {
            rope_neox(keys, &cos, &sin);
        } else {
            rope(keys, &cos, &sin);
        }
        Ok(())
    }
}

/// A RoPE table's rows from `first` on; an unrotated layer's empty table stays empty.
fn from_row(table: ArrayView2<'_, f32>, first: usize) -> ArrayView2<'_, f32> {
    if table.is_empty() {
        table
    } else {
        table.slice_move(s![first.., ..])
    }
}

impl Llama {
    /// The causal pass over `ids`: every layer's q, k (after RoPE) and v, the stream after the
    /// last block, and the logits at every position.
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.forward_with(ids, |_, _, _| Ok(()))
    }

    /// [`Llama::forward`], calling `hook(layer, k, v)` on each layer's keys (after RoPE) and
    /// values, both [kv_heads, tokens, head_dim], before attention reads them. The hook may
    /// change the values (not the shapes); later layers then see the effect. The capture keeps
    /// what each layer computed, before the hook.
    pub fn forward_with<F>(&self, ids: &[u32], hook: F) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        let (hidden, layers) = self.hidden_with(ids, hook)?;
        let normed = self.final_norm(&hidden);
        let logits = ops::linear(normed.view(), self.weights.token_embd.view(), None);
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: Some(logits),
        })
    }

    /// [`Llama::forward_with`] without the LM head: the stream after the last block (before
    /// `output_norm`), [tokens, hidden], and what each layer computed.
    pub fn hidden_with<F>(
        &self,
        ids: &[u32],
        mut hook: F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        self.check_ids(ids)?;
        let mut cache = KvCache::new(self.config.layers);
        self.run(ids, &mut cache, &mut hook)
    }

    /// Runs `ids` at the positions after those in `cache`, whose K/V attention reads first;
    /// appends the new (hooked) K/V to it. Returns the stream after the last block and what each
    /// layer computed. Every output row is computed exactly as in a batched pass over all
    /// positions (each element one [`ops::dot`] of its own row, attention over positions in
    /// order, the same RoPE table entry for a position), so decoding token by token gives the
    /// same bits as one pass.
    pub(super) fn run<F>(
        &self,
        ids: &[u32],
        cache: &mut KvCache,
        hook: &mut F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        let c = &self.config;
        let t = ids.len();
        let start = cache.len;
        let mut x = self.embed(ids);
        let (cos, sin) = rope_table(start, t, c.head_dim, c.rope_base);
        let mut layers = Vec::with_capacity(c.layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let captured = self.layer_qkv(w, &x, &cos, &sin);
            let (mut k, mut v) = (captured.k.clone(), captured.v.clone());
            hook(l, &mut k, &mut v).map_err(|e| ModelError::Hook {
                layer: l,
                problem: e.to_string(),
            })?;
            check_hooked_shapes(l, &captured, &k, &v)?;
            let (past_k, past_v) = &mut cache.layers[l];
            *past_k = append_positions(past_k, &k);
            *past_v = append_positions(past_v, &v);
            let attended = attention(&captured.q, past_k, past_v, start);
            self.layer_rest(w, &mut x, &attended);
            layers.push(captured);
        }
        cache.len += t;
        Ok((x, layers))
    }

    /// The causal pass over `ids` where attention reads what `source(layer, k, v)` hands back
    /// instead of the layer's own K/V: `k` (after RoPE) and `v` are [kv_heads, tokens,
    /// head_dim], and the returned [`KvSource`] says, for each query position i and key position
    /// j <= i, which key and value rows attention reads. A cache that changes as tokens arrive
    /// (e.g. a group quantized once it fills) is a source whose rows depend on i. Attention is
    /// [`Llama::forward`]'s, one [`ops::dot`] per score in the same order, so a source that
    /// returns the layer's own rows gives the bits of [`Llama::forward`]. The capture keeps what
    /// each layer computed.
    pub fn forward_with_source<F>(&self, ids: &[u32], mut source: F) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &Array3<f32>, &Array3<f32>) -> Result<Box<dyn KvSource>, HookError>,
    {
        self.forward_with_layer_source(ids, |l, kv| source(l, kv.k, kv.v))
    }

    /// [`Llama::forward_with_source`] without the LM head: the stream after the last block
    /// [tokens, hidden] and what each layer computed.
    pub fn hidden_with_source<F>(
        &self,
        ids: &[u32],
        mut source: F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &Array3<f32>, &Array3<f32>) -> Result<Box<dyn KvSource>, HookError>,
    {
        self.hidden_with_layer_source(ids, |l, kv| source(l, kv.k, kv.v))
    }

    /// [`Llama::forward_with_source`] whose source also sees each layer's keys before RoPE
    /// ([`LayerKv`]), for a cache that quantizes them there (KVQuant) and rotates what it reads
    /// back with the layer's own RoPE.
    pub fn forward_with_layer_source<F>(
        &self,
        ids: &[u32],
        source: F,
    ) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &LayerKv<'_>) -> Result<Box<dyn KvSource>, HookError>,
    {
        let (hidden, layers) = self.hidden_with_layer_source(ids, source)?;
        let normed = self.final_norm(&hidden);
        let logits = ops::linear(normed.view(), self.weights.token_embd.view(), None);
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: Some(logits),
        })
    }

    /// [`Llama::forward_with_layer_source`] without the LM head.
    pub fn hidden_with_layer_source<F>(
        &self,
        ids: &[u32],
        mut source: F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &LayerKv<'_>) -> Result<Box<dyn KvSource>, HookError>,
    {
        self.check_ids(ids)?;
        let c = &self.config;
        let mut x = self.embed(ids);
        let (cos, sin) = rope_table(0, ids.len(), c.head_dim, c.rope_base);
        let mut layers = Vec::with_capacity(c.layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let (captured, k_pre_rope) = self.layer_qkv_pre_rope(w, &x, &cos, &sin);
            let hook = |e: HookError| ModelError::Hook {
                layer: l,
                problem: e.to_string(),
            };
            let kv = LayerKv::new(
                &captured.q,
                (&captured.k, &captured.v, &k_pre_rope),
                (&cos, &sin),
                false,
            );
            let read = source(l, &kv).map_err(hook)?;
            let attended = attention_from(&captured.q, read.as_ref(), c.kv_heads, &|_| 0)
                .map_err(|problem| ModelError::Hook { layer: l, problem })?;
            self.layer_rest(w, &mut x, &attended);
            layers.push(captured);
        }
        Ok((x, layers))
    }

    /// The token embeddings of `ids` (checked), [tokens, hidden].
    pub(super) fn embed(&self, ids: &[u32]) -> Array2<f32> {
        let mut x = Array2::<f32>::zeros((ids.len(), self.config.hidden));
        for (mut row, &id) in x.axis_iter_mut(Axis(0)).zip(ids) {
            row.assign(&self.weights.token_embd.row(id as usize));
        }
        x
    }

    /// A block's q, k (both after RoPE) and v for the stream `x`.
    pub(super) fn layer_qkv(
        &self,
        w: &LayerWeights,
        x: &Array2<f32>,
        cos: &Array2<f32>,
        sin: &Array2<f32>,
    ) -> LayerCapture {
        self.layer_qkv_pre_rope(w, x, cos, sin).0
    }

    /// [`Llama::layer_qkv`], and k before RoPE.
    fn layer_qkv_pre_rope(
        &self,
        w: &LayerWeights,
        x: &Array2<f32>,
        cos: &Array2<f32>,
        sin: &Array2<f32>,
    ) -> (LayerCapture, Array3<f32>) {
        let c = &self.config;
        let mut h = x.clone();
        ops::rms_norm(&mut h, &w.attn_norm, c.rms_eps);
        let mut q = split_heads(ops::linear(h.view(), w.q.view(), None), c.heads);
        let k_pre_rope = split_heads(ops::linear(h.view(), w.k.view(), None), c.kv_heads);
        let v = split_heads(ops::linear(h.view(), w.v.view(), None), c.kv_heads);
        rope(&mut q, cos, sin);
        let mut k = k_pre_rope.clone();
        rope(&mut k, cos, sin);
        (LayerCapture { q, k, v }, k_pre_rope)
    }

    /// The rest of a block after attention: the output projection and the feed-forward layer,
    /// both added to the stream `x`.
    pub(super) fn layer_rest(&self, w: &LayerWeights, x: &mut Array2<f32>, attended: &Array2<f32>) {
        *x += &ops::linear(attended.view(), w.o.view(), None);
        let mut h = x.clone();
        ops::rms_norm(&mut h, &w.ffn_norm, self.config.rms_eps);
        let mut gate = ops::linear(h.view(), w.gate.view(), None);
        let up = ops::linear(h.view(), w.up.view(), None);
        gate.zip_mut_with(&up, |g, &u| *g = ops::silu(*g) * u);
        *x += &ops::linear(gate.view(), w.down.view(), None);
    }

    /// The LM head's input: `output_norm` (RMSNorm) applied to the stream after the last block
    /// ([`Capture::hidden`]).
    pub fn final_norm(&self, hidden: &Array2<f32>) -> Array2<f32> {
        let mut normed = hidden.clone();
        ops::rms_norm(&mut normed, &self.weights.output_norm, self.config.rms_eps);
        normed
    }

    pub(super) fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        check_ids(ids, self.config.context, self.config.vocab)
    }
}

/// A decoder's input: at least one id, at most `context`, each below `vocab`.
pub(crate) fn check_ids(ids: &[u32], context: usize, vocab: usize) -> Result<(), ModelError> {
    if ids.is_empty() {
        return Err(ModelError::EmptyInput);
    }
    if ids.len() > context {
        return Err(ModelError::TooManyTokens {
            tokens: ids.len(),
            context,
        });
    }
    if let Some((position, &id)) = ids
        .iter()
        .enumerate()
        .find(|&(_, &id)| id as usize >= vocab)
    {
        return Err(ModelError::UnknownToken {
            id,
            position,
            vocabulary: vocab,
        });
    }
    Ok(())
}

/// `n` more tokens after `ids` fit in `context` (checked: `n` may come from a flag).
pub(crate) fn check_continuation(ids: &[u32], n: usize, context: usize) -> Result<(), ModelError> {
    match ids.len().checked_add(n) {
        Some(tokens) if tokens <= context => Ok(()),
        tokens => Err(ModelError::TooManyTokens {
            tokens: tokens.unwrap_or(usize::MAX),
            context,
        }),
    }
}

/// Each layer's keys and values of the positions run so far, [kv_heads, positions, head_dim].
pub(super) struct KvCache {
    layers: Vec<(Array3<f32>, Array3<f32>)>,
    len: usize,
}

impl KvCache {
    pub(super) fn new(layers: usize) -> KvCache {
        let empty = || Array3::zeros((0, 0, 0));
        KvCache {
            layers: (0..layers).map(|_| (empty(), empty())).collect(),
            len: 0,
        }
    }
}

/// `past` followed by `new` along the positions (standard layout); `past` may be empty.
pub(super) fn append_positions(past: &Array3<f32>, new: &Array3<f32>) -> Array3<f32> {
    if past.is_empty() {
        return new.as_standard_layout().into_owned();
    }
    let (heads, p, d) = past.dim();
    let mut out = Array3::zeros((heads, p + new.dim().1, d));
    out.slice_mut(s![.., ..p, ..]).assign(past);
    out.slice_mut(s![.., p.., ..]).assign(new);
    out
}

/// The K/V hook of [`Llama::forward_with`] may change values, not shapes.
fn check_hooked_shapes(
    layer: usize,
    captured: &LayerCapture,
    k: &Array3<f32>,
    v: &Array3<f32>,
) -> Result<(), ModelError> {
    if k.dim() != captured.k.dim() || v.dim() != captured.v.dim() {
        return Err(ModelError::Hook {
            layer,
            problem: format!(
                "changed the shapes of k and v from {:?} to {:?} and {:?}",
                captured.k.dim(),
                k.dim(),
                v.dim()
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unrotated_keys_stay_as_they_are_for_any_window_of_positions() {
        let x = Array3::from_shape_fn((2, 5, 4), |(h, t, c)| (h * 20 + t * 4 + c) as f32 - 7.5);
        let kv = LayerKv::unrotated(&x, &x, &x);
        let mut keys = x.clone();
        kv.rope(&mut keys).unwrap();
        assert_eq!(keys, x);
        let tail = x.slice(s![.., 3.., ..]).to_owned();
        let window = kv.positions_from(3, (&tail, &tail, &tail)).unwrap();
        let mut keys = tail.clone();
        window.rope(&mut keys).unwrap();
        assert_eq!(keys, tail);
    }
}
