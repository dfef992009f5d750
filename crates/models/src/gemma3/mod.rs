//! Gemma 3 (270M) in plain f32, as llama.cpp runs `gemma-3-270m-q4_k_m.gguf`: weights from the
//! GGUF file, dequantized once at load, and a batched causal pass that hands back every layer's
//! q, k and v.
//!
//! The block, with y = x W^T and W stored [out, in] (GGUF names; `norm(x, w)` is RMSNorm
//! `x / sqrt(mean(x^2) + eps) * w`):
//!
//! ```text
//! x = token_embd[id] * sqrt(hidden)                               (f32 sqrt of 640)
//! per layer l:  h = norm(x, attn_norm)
//!               q = norm_per_head(h Wq^T, attn_q_norm), k = norm_per_head(h Wk^T, attn_k_norm)
//!               v = h Wv^T;  NeoX RoPE on q and k, base 1e6 (global) or 1e4 (sliding)
//!               x += norm(Attention(q / 16, k, v) Wo^T, post_attention_norm)
//!               h = norm(x, ffn_norm)
//!               x += norm((gelu_tanh(h Wgate^T) * (h Wup^T)) Wdown^T, post_ffw_norm)
//! hidden_final = norm(x, output_norm);  logits = hidden_final token_embd^T   (tied)
//! ```
//!
//! Conventions, each with its source (LC: llama.cpp `ec98e2002` as vendored in ollama
//! `f63eea3d`, HF: transformers 5.24.0 `models/gemma3/modeling_gemma3.py`, as the shared
//! reference `shared/reference/real-models/gemma3/README.md` cites them, which checked each
//! against llama.cpp's own activations):
//! - Embedding scale `sqrtf(n_embd)` in f32, multiplied after the lookup (LC: `gemma3.cpp:14`).
//! - RMSNorm weights are used as stored: the converter already added 1 to every `*norm.weight`
//!   (LC: `llama-graph.cpp:730,744`; converter `Gemma3Model.norm_shift`). eps is
//!   `gemma3.attention.layer_norm_rms_epsilon`.
//! - QK-norm: RMSNorm over each head's 256 channels of q and of k, before RoPE
//!   (LC: `gemma3.cpp:64-79`).
//! - RoPE is NeoX style: channel i pairs with i + head_dim/2, angle pos * base^(-2i / head_dim),
//!   every channel rotated (LC: `llama-model.cpp:7886-7914` gives GEMMA3 `LLAMA_ROPE_TYPE_NEOX`;
//!   `ops.cpp:5637-5652`). The angle is computed in f64 with `libm` and cos/sin rounded once to
//!   f32, as in [`crate::llama`].
//! - Global layers are those with `l % 6 == 5` (5, 11, 17 of 18: `set_swa_pattern(6)`,
//!   LC: `llama-model.cpp:1273`, `llama-hparams.cpp:8-18`); they use `gemma3.rope.freq_base`
//!   (1e6). Sliding layers use base 10000 (`rope_freq_base_train_swa`, LC:
//!   `llama-model.cpp:1275`; the file has no `rope.freq_base_swa` key, and a file that has one is
//!   refused rather than half-read) and see only the last `gemma3.attention.sliding_window`
//!   (512) positions: query p1 reads key p0 iff p0 <= p1 and p1 - p0 < 512
//!   (LC: `llama-hparams.cpp:207-222`).
//! - Attention scale 1/sqrt(key_length) = 1/16 on q after RoPE (LC: `llama-model.cpp:1296`,
//!   `gemma3.cpp:85`), a power of two, so scaling the score instead is exact. One KV head is
//!   read by all 4 query heads. No attention or final logit softcapping (the file has no
//!   `final_logit_softcapping` key: LC: `llama-model.cpp:1281`).
//! - FFN: GELU with the tanh approximation, gated: `down(gelu_tanh(gate h) * up h)`
//!   (LC: `gemma3.cpp:111-115`, `LLM_FFN_GELU, LLM_FFN_PAR`). llama.cpp's CPU backend reads
//!   GELU from an f16 table; this pass computes the formula in f32 (`libm::tanhf`), as the
//!   reference does.
//! - Sandwich norms: `post_attention_norm` and `post_ffw_norm` act on each branch before its
//!   residual add (LC: `gemma3.cpp:45,95-124`).
//! - Tied output: the file has no `output.weight` (LC: `llama-model.cpp:3946-3951`).
//!
//! Determinism is [`crate::ops`]': every dot product in one fixed order, attention's sums over
//! positions in order, threads splitting only independent outputs.
//!
//! [`Gemma3::forward_with`] lets a caller transform each layer's K and V (after QK-norm and
//! RoPE, as llama.cpp's cache holds them) before attention reads them.

mod forward;
mod load;
#[cfg(test)]
mod tests;

pub use load::{Gemma3LayerWeights, Gemma3Weights, load, load_with_tokenizer};

/// The hyperparameters of a Gemma 3 model.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Config {
    /// Number of blocks (`gemma3.block_count`).
    pub layers: usize,
    /// Width of the residual stream (`gemma3.embedding_length`).
    pub hidden: usize,
    /// Query heads (`gemma3.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`gemma3.attention.head_count_kv`), dividing `heads`.
    pub kv_heads: usize,
    /// Channels per head (`gemma3.attention.key_length`, equal to `value_length`), even.
    pub head_dim: usize,
    /// Width of the gated FFN (`gemma3.feed_forward_length`).
    pub ffn: usize,
    /// Number of tokens (rows of `token_embd`).
    pub vocab: usize,
    /// The longest input (`gemma3.context_length`).
    pub context: usize,
    /// RoPE base of the global layers (`gemma3.rope.freq_base`).
    pub rope_base_global: f32,
    /// RoPE base of the sliding-window layers (llama.cpp's default 10000).
    pub rope_base_sliding: f32,
    /// Positions a sliding-window layer sees, itself included (`gemma3.attention.sliding_window`).
    pub sliding_window: usize,
    /// Every `pattern`-th layer is global, the others slide (llama.cpp's 6 for Gemma 3).
    pub sliding_pattern: usize,
    /// RMSNorm epsilon (`gemma3.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl Gemma3Config {
    /// Whether layer `l` attends to every earlier position (otherwise it slides).
    pub fn is_global(&self, l: usize) -> bool {
        l % self.sliding_pattern == self.sliding_pattern - 1
    }

    /// The RoPE base of layer `l`.
    pub fn rope_base(&self, l: usize) -> f32 {
        if self.is_global(l) {
            self.rope_base_global
        } else {
            self.rope_base_sliding
        }
    }

    /// The first key position query position `i` of layer `l` reads.
    pub fn first_visible(&self, l: usize, i: usize) -> usize {
        if self.is_global(l) {
            0
        } else {
            (i + 1).saturating_sub(self.sliding_window)
        }
    }
}

/// A Gemma 3 model ready to run.
#[derive(Debug, Clone)]
pub struct Gemma3 {
    config: Gemma3Config,
    weights: Gemma3Weights,
}
