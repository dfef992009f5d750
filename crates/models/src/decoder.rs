//! One interface over the two decoders, SmolLM2 ([`Llama`]) and Gemma 3 ([`Gemma3`]), for a
//! caller that runs its own cache inside the model's attention: the quality study.
//!
//! Every pass hands back the *stream the LM head reads* ([`CausalLm::logits`] turns rows of it
//! into logits): SmolLM2's stream after the last block (its head applies `output_norm`, then the
//! tied embedding), Gemma 3's stream after `output_norm` (its head is the tied embedding alone).
//! Logits of a row depend on that row alone, so a caller may compute them a few rows at a time:
//! at 8,192 tokens Gemma 3's 262,144-token vocabulary makes the full matrix 8.6 GB.

use ndarray::{Array2, Array3, ArrayView2};

use crate::capture::LayerCapture;
use crate::files::ModelName;
use crate::gemma3::Gemma3;
use crate::llama::{HookError, KvSource, LayerKv, Llama, ModelError};

/// What a K/V hook does to one layer's keys and values ([`CausalLm::hidden_with`]).
pub type KvHook<'a> =
    dyn FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError> + 'a;

/// What a layer's attention reads instead of its own K/V ([`CausalLm::hidden_with_layer_source`]).
pub type LayerSource<'a> =
    dyn FnMut(usize, &LayerKv<'_>) -> Result<Box<dyn KvSource>, HookError> + 'a;

/// A decoder whose attention can read a caller's cache.
pub trait CausalLm: Sync {
    /// Which model.
    fn name(&self) -> ModelName;
    /// Blocks.
    fn layers(&self) -> usize;
    /// KV heads per layer.
    fn kv_heads(&self) -> usize;
    /// Channels per head.
    fn head_dim(&self) -> usize;
    /// The longest input.
    fn context(&self) -> usize;
    /// Rows of the LM head.
    fn vocab(&self) -> usize;
    /// Positions layer `layer`'s query reads, itself included, when the layer slides (Gemma
    /// 3's sliding-window layers: 512); `None` when it reads every earlier position.
    fn window(&self, layer: usize) -> Option<usize>;
    /// The plain pass with `hook` on each layer's K/V before attention reads them: the stream
    /// the LM head reads (module docs) and what each layer computed.
    fn hidden_with(
        &self,
        ids: &[u32],
        hook: &mut KvHook<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>;
    /// The pass whose attention reads, at each layer, what `source` hands back for the layer's
    /// K/V (query i reading the positions [`CausalLm::window`] lets it see); a source that
    /// returns the layer's own rows gives [`CausalLm::hidden_with`]'s bits.
    fn hidden_with_layer_source(
        &self,
        ids: &[u32],
        source: &mut LayerSource<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError>;
    /// The logits of rows of a pass's stream, [rows, vocab].
    fn logits(&self, hidden: ArrayView2<'_, f32>) -> Array2<f32>;
    /// `n` greedy tokens continuing `ids` with the float32 cache (lowest id on a tie).
    fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError>;
}

impl CausalLm for Llama {
    fn name(&self) -> ModelName {
        ModelName::SmolLm2
    }
    fn layers(&self) -> usize {
        self.config().layers
    }
    fn kv_heads(&self) -> usize {
        self.config().kv_heads
    }
    fn head_dim(&self) -> usize {
        self.config().head_dim
    }
    fn context(&self) -> usize {
        self.config().context
    }
    fn vocab(&self) -> usize {
        self.config().vocab
    }
    fn window(&self, _layer: usize) -> Option<usize> {
        None
    }
    fn hidden_with(
        &self,
        ids: &[u32],
        hook: &mut KvHook<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError> {
        Llama::hidden_with(self, ids, hook)
    }
    fn hidden_with_layer_source(
        &self,
        ids: &[u32],
        source: &mut LayerSource<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError> {
        Llama::hidden_with_layer_source(self, ids, source)
    }
    fn logits(&self, hidden: ArrayView2<'_, f32>) -> Array2<f32> {
        let normed = self.final_norm(&hidden.to_owned());
        crate::ops::linear(normed.view(), self.weights().token_embd.view(), None)
    }
    fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        Llama::generate_greedy(self, ids, n)
    }
}

impl CausalLm for Gemma3 {
    fn name(&self) -> ModelName {
        ModelName::Gemma3
    }
    fn layers(&self) -> usize {
        self.config().layers
    }
    fn kv_heads(&self) -> usize {
        self.config().kv_heads
    }
    fn head_dim(&self) -> usize {
        self.config().head_dim
    }
    fn context(&self) -> usize {
        self.config().context
    }
    fn vocab(&self) -> usize {
        self.config().vocab
    }
    fn window(&self, layer: usize) -> Option<usize> {
        let c = self.config();
        (!c.is_global(layer)).then_some(c.sliding_window)
    }
    fn hidden_with(
        &self,
        ids: &[u32],
        hook: &mut KvHook<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError> {
        Gemma3::hidden_with(self, ids, hook)
    }
    fn hidden_with_layer_source(
        &self,
        ids: &[u32],
        source: &mut LayerSource<'_>,
    ) -> Result<(Array2<f32>, Vec<LayerCapture>), ModelError> {
        Gemma3::hidden_with_layer_source(self, ids, source)
    }
    fn logits(&self, hidden: ArrayView2<'_, f32>) -> Array2<f32> {
        Gemma3::logits(self, hidden)
    }
    fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        Gemma3::generate_greedy(self, ids, n)
    }
}
