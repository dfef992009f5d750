//! What a forward pass hands back for one text: the token ids, and per layer the queries, keys
//! and values that entered attention, as a KV cache would hold them.

use ndarray::{Array2, Array3};

/// One layer's attention inputs, each [heads, tokens, head_dim] in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerCapture {
    /// Queries, one per query head (after RoPE for a rotary model).
    pub q: Array3<f32>,
    /// Keys, one per KV head (after RoPE for a rotary model): what the cache stores.
    pub k: Array3<f32>,
    /// Values, one per KV head.
    pub v: Array3<f32>,
}

/// Everything one forward pass over a text computed that the studies and `runner kv` use.
#[derive(Debug, Clone, PartialEq)]
pub struct Capture {
    /// The token ids the text was encoded to (special tokens included, as the model saw them).
    pub ids: Vec<u32>,
    /// One entry per layer, in order.
    pub layers: Vec<LayerCapture>,
    /// The last residual stream [tokens, hidden]: MiniLM's `last_hidden` (after the last
    /// LayerNorm), SmolLM2's stream after its last block (before `output_norm`).
    pub hidden: Array2<f32>,
    /// Next-token logits [tokens, vocabulary], for a language model.
    pub logits: Option<Array2<f32>>,
}
