//! A Llama decoder (SmolLM2-135M) in plain f32: weights from a GGUF file, dequantized once at
//! load, and a batched causal forward pass that hands back every layer's q, k, v.
//!
//! The block (pre-norm, no biases), with y = x W^T and W stored [out, in]:
//!
//! ```text
//! x = token_embd[id]
//! per layer:  h = RMSNorm(x) * attn_norm
//!             q, k, v = h Wq^T, h Wk^T, h Wv^T; RoPE on q and k
//!             x += Attention(q, k, v) Wo^T
//!             h = RMSNorm(x) * ffn_norm
//!             x += (silu(h Wgate^T) * (h Wup^T)) Wdown^T
//! logits = (RMSNorm(x) * output_norm) token_embd^T      (tied embeddings: no output.weight)
//! ```
//!
//! Conventions (llama.cpp's, checked against the reference in
//! `shared/reference/real-models/smollm2/README.md`):
//! - RoPE rotates adjacent channel pairs (2i, 2i + 1) of each head by the angle
//!   pos * base^(-2i / head_dim), positions from 0: llama.cpp's converter stores `attn_q` and
//!   `attn_k` rows permuted so that its normal (non-NeoX) rotation applies. The angle is computed
//!   in f64 with `libm` (`pow`, `cos`, `sin`) and cos/sin are rounded to f32 once: the same bits
//!   on every machine, unlike the platform's `f32::cos`.
//! - Grouped-query attention: query head h reads KV head h / (heads / kv_heads).
//! - Attention: softmax(q k^T / sqrt(head_dim)) over positions 0..=i (causal), each score one
//!   [`ops::dot`](crate::ops::dot), the weighted sum of values taken over positions in order.
//! - RMSNorm's eps is `llama.attention.layer_norm_rms_epsilon`; no BOS is added (the tokenizer's
//!   `add_bos_token` is false for SmolLM2).
//!
//! [`Llama::forward_with`] lets a caller transform each layer's K and V (after RoPE, as a cache
//! holds them) before attention reads them, e.g. to store the cache through a quantization codec.
//! Two more general entry points let a cache change as tokens arrive: [`Llama::forward_with_source`]
//! (one teacher-forced pass in which attention at query position i reads, at each position
//! j <= i, the rows a [`KvSource`] hands back for (i, j)) and [`Llama::step`] (one token at a
//! time, the caller holding the whole cache). Both compute every score, softmax and weighted sum
//! as [`Llama::forward`] does, so an unchanged cache gives its bits (see the tests).

mod attention;
mod config;
mod error;
mod forward;
mod load;
mod source;
mod step;
#[cfg(test)]
mod tests;

pub(crate) use attention::{attention_from, rope_neox, rope_table};
pub use config::LlamaConfig;
pub use error::{HookError, ModelError};
pub use forward::LayerKv;
pub(crate) use forward::{check_continuation, check_ids};
pub(crate) use load::read_matrix;
pub use load::{LayerWeights, LlamaWeights, load_with_tokenizer};
pub use source::{KvSource, OwnKv, row_of};
pub use step::argmax;

/// A Llama model ready to run. SmolLM2-135M is [`SmolLm2`].
#[derive(Debug, Clone)]
pub struct Llama {
    config: LlamaConfig,
    weights: LlamaWeights,
}

/// SmolLM2-135M-Instruct: a [`Llama`] loaded with [`Llama::load`].
pub type SmolLm2 = Llama;
