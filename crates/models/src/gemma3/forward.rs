//! Gemma 3's causal pass: embedding, the blocks with their sliding or global attention, the
//! final norm and the tied LM head; and greedy decoding.

use ndarray::{Array2, Array3, ArrayView2, Axis, s};

use super::Gemma3;
use super::load::Gemma3LayerWeights;
use crate::capture::{Capture, LayerCapture};
use crate::llama::{
    HookError, KvSource, LayerKv, ModelError, OwnKv, argmax, attention_from, check_continuation,
    check_ids, rope_neox, rope_table,
};
use crate::ops;

impl Gemma3 {
    /// The causal pass over `ids`: every layer's q (after QK-norm and RoPE, before the 1/16
    /// scale), k (after QK-norm and RoPE) and v; the stream after `output_norm`
    /// ([`Capture::hidden`], the reference's `hidden_final`); and the logits at every position.
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.forward_with(ids, |_, _, _| Ok(()))
    }

    /// [`Gemma3::forward`], calling `hook(layer, k, v)` on each layer's keys and values, both
    /// [kv_heads, tokens, head_dim], before attention reads them. The hook may change the
    /// values (not the shapes); later layers then see the effect. The capture keeps what each
    /// layer computed, before the hook.
    pub fn forward_with<F>(&self, ids: &[u32], hook: F) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        let (hidden, layers) = self.hidden_with(ids, hook)?;
        let logits = ops::linear(hidden.view(), self.weights.token_embd.view(), None);
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: Some(logits),
        })
    }

    /// [`Gemma3::forward_with`] without the LM head: the stream after `output_norm`
    /// [tokens, hidden] and what each layer computed.
    pub fn hidden_with<F>(
        &self,
        ids: &[u32],
        mut hook: F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        // The hooked K/V as a source: one attention for both passes, so a cache that hands back
        // the layer's own rows gives these bits by construction.
        self.hidden_with_layer_source(ids, |l, kv| {
            let (mut k, mut v) = (kv.k.clone(), kv.v.clone());
            hook(l, &mut k, &mut v)?;
            if k.dim() != kv.k.dim() || v.dim() != kv.v.dim() {
                return Err(format!(
                    "changed the shapes of k and v from {:?} to {:?} and {:?}",
                    kv.k.dim(),
                    k.dim(),
                    v.dim()
                )
                .into());
            }
            Ok(Box::new(OwnKv::new(&k, &v)))
        })
    }

    /// The causal pass over `ids` where attention reads what `source(layer, kv)` hands back
    /// instead of the layer's own K/V, as [`crate::llama::Llama::forward_with_layer_source`]
    /// does: `kv` holds the layer's keys after QK-norm and RoPE, its values, and its keys after
    /// QK-norm before RoPE (with the layer's NeoX RoPE, [`LayerKv::rope`]). A sliding-window
    /// layer's query i reads only positions i - 511..=i of the source. Scores, softmax and
    /// weighted sums are [`Gemma3::forward`]'s in the same order, so a source that returns the
    /// layer's own rows gives its bits. Returns the stream after `output_norm` and what each
    /// layer computed.
    pub fn hidden_with_layer_source<F>(
        &self,
        ids: &[u32],
        mut source: F,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>
    where
        F: FnMut(usize, &LayerKv<'_>) -> Result<Box<dyn KvSource>, HookError>,
    {
        check_ids(ids, self.config.context, self.config.vocab)?;
        let c = &self.config;
        let mut x = self.embed(ids);
        let tables = [c.rope_base_sliding, c.rope_base_global]
            .map(|base| rope_table(0, ids.len(), c.head_dim, base));
        let mut layers = Vec::with_capacity(c.layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let (cos, sin) = &tables[usize::from(c.is_global(l))];
            let (captured, k_pre_rope) = self.layer_qkv(w, &x, cos, sin);
            let hook = |problem: String| ModelError::Hook { layer: l, problem };
            let kv = LayerKv::new(
                &captured.q,
                (&captured.k, &captured.v, &k_pre_rope),
                (cos, sin),
                true,
            );
            let read = source(l, &kv).map_err(|e| hook(e.to_string()))?;
            let attended = attention_from(&captured.q, read.as_ref(), c.kv_heads, &|i| {
                c.first_visible(l, i)
            })
            .map_err(hook)?;
            self.layer_rest(w, &mut x, &attended);
            layers.push(captured);
        }
        ops::rms_norm(&mut x, &self.weights.output_norm, c.rms_eps);
        Ok((x, layers))
    }

    /// The logits of rows of the stream after `output_norm` (the tied LM head), [rows, vocab].
    pub fn logits(&self, hidden: ArrayView2<'_, f32>) -> Array2<f32> {
        ops::linear(hidden, self.weights.token_embd.view(), None)
    }

    /// `n` tokens continuing `ids`, each the argmax (lowest id on a tie) of the last position's
    /// logits. Each step runs the whole sequence again (no cache), computing the LM head for
    /// the last position only.
    pub fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        check_ids(ids, self.config.context, self.config.vocab)?;
        check_continuation(ids, n, self.config.context)?;
        let mut sequence = ids.to_vec();
        for _ in 0..n {
            let (hidden, _) = self.hidden_with(&sequence, |_, _, _| Ok(()))?;
            let last = hidden.slice(s![hidden.nrows() - 1.., ..]);
            let logits = ops::linear(last, self.weights.token_embd.view(), None);
            sequence.push(argmax(logits.row(0).as_slice().expect("standard layout")));
        }
        Ok(sequence.split_off(ids.len()))
    }

    /// The scaled token embeddings of `ids` (checked), [tokens, hidden].
    fn embed(&self, ids: &[u32]) -> Array2<f32> {
        let scale = (self.config.hidden as f32).sqrt();
        let mut x = Array2::<f32>::zeros((ids.len(), self.config.hidden));
        for (mut row, &id) in x.axis_iter_mut(Axis(0)).zip(ids) {
            for (o, &e) in row.iter_mut().zip(self.weights.token_embd.row(id as usize)) {
                *o = e * scale;
            }
        }
        x
    }

    /// A block's q and k (after QK-norm and RoPE) and v for the stream `x`, and k after QK-norm
    /// before RoPE.
    fn layer_qkv(
        &self,
        w: &Gemma3LayerWeights,
        x: &Array2<f32>,
        cos: &Array2<f32>,
        sin: &Array2<f32>,
    ) -> (LayerCapture, Array3<f32>) {
        let c = &self.config;
        let mut h = x.clone();
        ops::rms_norm(&mut h, &w.attn_norm, c.rms_eps);
        let project = |weight: &Array2<f32>, heads: usize, norm: Option<&[f32]>| {
            let y = ops::linear(h.view(), weight.view(), None);
            let t = y.nrows();
            // [tokens, heads * d] -> rows of one head each, normed over head_dim.
            let mut rows = y
                .into_shape_with_order((t * heads, c.head_dim))
                .expect("heads * head_dim columns");
            if let Some(gain) = norm {
                ops::rms_norm(&mut rows, gain, c.rms_eps);
            }
            let y = rows
                .into_shape_with_order((t, heads, c.head_dim))
                .expect("same size");
            y.permuted_axes([1, 0, 2]).as_standard_layout().into_owned()
        };
        let mut q = project(&w.q, c.heads, Some(&w.q_norm));
        let mut k = project(&w.k, c.kv_heads, Some(&w.k_norm));
        let v = project(&w.v, c.kv_heads, None);
        let k_pre_rope = k.clone();
        rope_neox(&mut q, cos, sin);
        rope_neox(&mut k, cos, sin);
        (LayerCapture { q, k, v }, k_pre_rope)
    }

    /// The rest of a block after attention: output projection and its norm, then the gated FFN
    /// and its norm, each added to the stream `x`.
    fn layer_rest(&self, w: &Gemma3LayerWeights, x: &mut Array2<f32>, attended: &Array2<f32>) {
        let eps = self.config.rms_eps;
        let mut branch = ops::linear(attended.view(), w.o.view(), None);
        ops::rms_norm(&mut branch, &w.post_attention_norm, eps);
        *x += &branch;
        let mut h = x.clone();
        ops::rms_norm(&mut h, &w.ffn_norm, eps);
        let mut gate = ops::linear(h.view(), w.gate.view(), None);
        let up = ops::linear(h.view(), w.up.view(), None);
        gate.zip_mut_with(&up, |g, &u| *g = ops::gelu_tanh(*g) * u);
        let mut branch = ops::linear(gate.view(), w.down.view(), None);
        ops::rms_norm(&mut branch, &w.post_ffw_norm, eps);
        *x += &branch;
    }
}
