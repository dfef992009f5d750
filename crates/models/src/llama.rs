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
//!   [`ops::dot`], the weighted sum of values taken over positions in order.
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

use ndarray::{Array2, Array3, Axis, s};
use rayon::prelude::*;
use thiserror::Error;

use crate::capture::{Capture, LayerCapture};
use crate::files::{FilesError, ModelFiles, ModelName};
use crate::ops;
use crate::tokenizer::bpe::{Bpe, BpeError};

/// Why a model cannot be loaded or run.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The model's files are missing or not the pinned ones.
    #[error(transparent)]
    Files(#[from] FilesError),
    /// The GGUF container cannot be read, or lacks a key or tensor.
    #[error("GGUF: {0}")]
    Gguf(#[from] gguf_file::Error),
    /// The tokenizer in the file cannot be built.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] BpeError),
    /// `files` is not a Llama model.
    #[error("{0} is not a Llama model")]
    NotLlama(ModelName),
    /// A hyperparameter is missing a required relation or is out of range.
    #[error("hyperparameter {key}: {problem}")]
    Hyperparameter {
        /// The metadata key (or config field).
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A tensor's dimensions are not what the hyperparameters imply.
    #[error(
        "tensor {tensor} has shape {found:?}, expected {expected:?} (rows x columns, [out, in])"
    )]
    TensorShape {
        /// The tensor.
        tensor: String,
        /// The expected shape.
        expected: Vec<usize>,
        /// Its shape (ggml order reversed: rows first).
        found: Vec<u64>,
    },
    /// A tensor is stored in a type this loader does not dequantize.
    #[error("tensor {tensor} is {ty}; this loader reads F32, F16, Q4_0, Q4_1 and Q8_0")]
    TensorType {
        /// The tensor.
        tensor: String,
        /// Its ggml type.
        ty: String,
    },
    /// A tensor's blocks cannot be dequantized (e.g. a scale that is not finite).
    #[error("tensor {tensor}: {problem}")]
    TensorData {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// A forward pass over no tokens.
    #[error("no tokens to run")]
    EmptyInput,
    /// A token id outside the vocabulary.
    #[error("token {id} at position {position} is not below the vocabulary size {vocabulary}")]
    UnknownToken {
        /// The id.
        id: u32,
        /// Its position in the input.
        position: usize,
        /// The vocabulary size.
        vocabulary: usize,
    },
    /// More tokens than the model's context length.
    #[error("{tokens} tokens exceed the context length {context}")]
    TooManyTokens {
        /// The number of tokens.
        tokens: usize,
        /// The context length.
        context: usize,
    },
    /// A K/V hook failed or changed the shape of what it was given.
    #[error("the K/V hook at layer {layer}: {problem}")]
    Hook {
        /// The layer.
        layer: usize,
        /// What went wrong.
        problem: String,
    },
}

/// The hyperparameters of a Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Number of blocks (`llama.block_count`).
    pub layers: usize,
    /// Width of the residual stream (`llama.embedding_length`).
    pub hidden: usize,
    /// Query heads (`llama.attention.head_count`).
    pub heads: usize,
    /// Key/value heads (`llama.attention.head_count_kv`), dividing `heads`.
    pub kv_heads: usize,
    /// Channels per head: hidden / heads, even (RoPE rotates pairs).
    pub head_dim: usize,
    /// Width of the SwiGLU layer (`llama.feed_forward_length`).
    pub ffn: usize,
    /// Number of tokens (rows of `token_embd`).
    pub vocab: usize,
    /// The longest input (`llama.context_length`).
    pub context: usize,
    /// RoPE base (`llama.rope.freq_base`).
    pub rope_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl LlamaConfig {
    fn check(&self) -> Result<(), ModelError> {
        let bad =
            |key: &'static str, problem: String| Err(ModelError::Hyperparameter { key, problem });
        for (key, value) in [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("context", self.context),
        ] {
            if value == 0 {
                return bad(key, "is 0".into());
            }
        }
        if self.heads * self.head_dim != self.hidden {
            return bad(
                "head_dim",
                format!(
                    "{} heads of {} do not make hidden {}",
                    self.heads, self.head_dim, self.hidden
                ),
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(
                "head_dim",
                format!("{} is not a positive even number", self.head_dim),
            );
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(
                "kv_heads",
                format!("{} does not divide {} heads", self.kv_heads, self.heads),
            );
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad("rope_base", format!("{} is not positive", self.rope_base));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps >= 0.0) {
            return bad("rms_eps", format!("{} is not a finite eps", self.rms_eps));
        }
        Ok(())
    }
}

/// One block's weights in f32, matrices [out, in].
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// RMSNorm gain before attention `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection [heads * head_dim, hidden], rows in GGUF (permuted) order.
    pub q: Array2<f32>,
    /// Key projection [kv_heads * head_dim, hidden], rows in GGUF (permuted) order.
    pub k: Array2<f32>,
    /// Value projection [kv_heads * head_dim, hidden].
    pub v: Array2<f32>,
    /// Attention output projection [hidden, heads * head_dim].
    pub o: Array2<f32>,
    /// RMSNorm gain before the feed-forward layer `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate [ffn, hidden].
    pub gate: Array2<f32>,
    /// SwiGLU up [ffn, hidden].
    pub up: Array2<f32>,
    /// SwiGLU down [hidden, ffn].
    pub down: Array2<f32>,
}

/// All weights of a Llama model in f32.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaWeights {
    /// Token embeddings [vocab, hidden], also the LM head (tied).
    pub token_embd: Array2<f32>,
    /// The blocks, in order.
    pub layers: Vec<LayerWeights>,
    /// Final RMSNorm gain `[hidden]`.
    pub output_norm: Vec<f32>,
}

/// A Llama model ready to run. SmolLM2-135M is [`SmolLm2`].
#[derive(Debug, Clone)]
pub struct Llama {
    config: LlamaConfig,
    weights: LlamaWeights,
}

/// SmolLM2-135M-Instruct: a [`Llama`] loaded with [`Llama::load`].
pub type SmolLm2 = Llama;

/// What a K/V hook may fail with.
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// What attention reads at one layer in [`Llama::forward_with_source`]: for query position
/// `query` and key position `position <= query`, the key and value rows (`head_dim` values each)
/// of KV head `head`. Attention asks for every (head, query, position) in order.
pub trait KvSource: Sync {
    /// The key row query `query` reads at `position`.
    fn key(&self, head: usize, query: usize, position: usize) -> &[f32];
    /// The value row query `query` reads at `position`.
    fn value(&self, head: usize, query: usize, position: usize) -> &[f32];
}

/// The layer's own keys and values, [kv_heads, tokens, head_dim] (standard layout): the source
/// that makes [`Llama::forward_with_source`] [`Llama::forward`].
#[derive(Debug, Clone)]
pub struct OwnKv {
    k: Array3<f32>,
    v: Array3<f32>,
}

impl OwnKv {
    /// Keys and values as attention reads them in a plain pass.
    pub fn new(k: &Array3<f32>, v: &Array3<f32>) -> OwnKv {
        OwnKv {
            k: k.as_standard_layout().into_owned(),
            v: v.as_standard_layout().into_owned(),
        }
    }
}

impl KvSource for OwnKv {
    fn key(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.k, head, position)
    }
    fn value(&self, head: usize, _query: usize, position: usize) -> &[f32] {
        row_of(&self.v, head, position)
    }
}

/// Row `position` of head `head` of a standard-layout [heads, positions, d] array; empty when
/// out of range (attention then reports the length mismatch).
pub fn row_of(x: &Array3<f32>, head: usize, position: usize) -> &[f32] {
    let (heads, positions, d) = x.dim();
    match x.as_slice() {
        Some(all) if head < heads && position < positions => {
            let start = (head * positions + position) * d;
            &all[start..start + d]
        }
        _ => &[],
    }
}

impl Llama {
    /// Loads a fetched, hash-checked Llama model (SmolLM2) from its GGUF file.
    pub fn load(files: &ModelFiles) -> Result<Llama, ModelError> {
        Ok(load_with_tokenizer(files)?.0)
    }

    /// A model from a parsed GGUF file: hyperparameters from the `llama.*` metadata, every
    /// tensor's type and shape checked (errors name the tensor), weights dequantized to f32.
    pub fn from_gguf(gguf: &gguf_file::GgufFile<'_>) -> Result<Llama, ModelError> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Hyperparameter {
                key: "general.architecture",
                problem: format!("is {arch:?}, not \"llama\""),
            });
        }
        let count = |key: &str| -> Result<usize, ModelError> {
            Ok(usize::try_from(gguf.get_u32(key)?).unwrap_or(usize::MAX))
        };
        let hidden = count("llama.embedding_length")?;
        let heads = count("llama.attention.head_count")?;
        let embd = gguf.tensor("token_embd.weight")?;
        let config = LlamaConfig {
            layers: count("llama.block_count")?,
            hidden,
            heads,
            kv_heads: count("llama.attention.head_count_kv")?,
            head_dim: hidden.checked_div(heads).unwrap_or(0),
            ffn: count("llama.feed_forward_length")?,
            vocab: embd
                .dims
                .get(1)
                .map_or(0, |&d| usize::try_from(d).unwrap_or(usize::MAX)),
            context: count("llama.context_length")?,
            rope_base: gguf.get_f32("llama.rope.freq_base")?,
            rms_eps: gguf.get_f32("llama.attention.layer_norm_rms_epsilon")?,
        };
        config.check()?;
        // RoPE here rotates every channel of a head; a partial rotation would be another model.
        if gguf.get("llama.rope.dimension_count").is_some() {
            let rotated = count("llama.rope.dimension_count")?;
            if rotated != config.head_dim {
                return Err(ModelError::Hyperparameter {
                    key: "llama.rope.dimension_count",
                    problem: format!("{rotated}, but head_dim is {}", config.head_dim),
                });
            }
        }
        if gguf.get("llama.vocab_size").is_some() {
            let vocab = count("llama.vocab_size")?;
            if vocab != config.vocab {
                return Err(ModelError::Hyperparameter {
                    key: "llama.vocab_size",
                    problem: format!("{vocab}, but token_embd has {} rows", config.vocab),
                });
            }
        }
        // Frequency factors (Llama 3's long-context RoPE) would change every angle.
        if gguf.tensor("rope_freqs.weight").is_ok() {
            return Err(ModelError::Hyperparameter {
                key: "rope_freqs.weight",
                problem: "RoPE frequency factors; this loader implements plain RoPE only".into(),
            });
        }
        if gguf.tensor("output.weight").is_ok() {
            return Err(ModelError::Hyperparameter {
                key: "output.weight",
                problem: "an untied LM head; this loader reads tied embeddings only".into(),
            });
        }
        let (h, f, q_out, kv_out) = (
            config.hidden,
            config.ffn,
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
        );
        let matrix = |name: &str, rows: usize, cols: usize| read_matrix(gguf, name, rows, cols);
        let vector = |name: &str| -> Result<Vec<f32>, ModelError> {
            Ok(read_matrix(gguf, name, 1, h)?.into_raw_vec_and_offset().0)
        };
        let layers = (0..config.layers)
            .map(|l| {
                let name = |part: &str| format!("blk.{l}.{part}.weight");
                Ok(LayerWeights {
                    attn_norm: vector(&name("attn_norm"))?,
                    q: matrix(&name("attn_q"), q_out, h)?,
                    k: matrix(&name("attn_k"), kv_out, h)?,
                    v: matrix(&name("attn_v"), kv_out, h)?,
                    o: matrix(&name("attn_output"), h, q_out)?,
                    ffn_norm: vector(&name("ffn_norm"))?,
                    gate: matrix(&name("ffn_gate"), f, h)?,
                    up: matrix(&name("ffn_up"), f, h)?,
                    down: matrix(&name("ffn_down"), h, f)?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let weights = LlamaWeights {
            token_embd: matrix("token_embd.weight", config.vocab, h)?,
            layers,
            output_norm: vector("output_norm.weight")?,
        };
        Llama::from_weights(config, weights)
    }

    /// A model from f32 weights (e.g. a tiny model built in a test), checking every shape
    /// against `config`.
    pub fn from_weights(config: LlamaConfig, weights: LlamaWeights) -> Result<Llama, ModelError> {
        config.check()?;
        let (h, f, q_out, kv_out) = (
            config.hidden,
            config.ffn,
            config.heads * config.head_dim,
            config.kv_heads * config.head_dim,
        );
        let shape = |name: String, found: &[usize], expected: &[usize]| {
            if found == expected {
                Ok(())
            } else {
                Err(ModelError::TensorShape {
                    tensor: name,
                    expected: expected.to_vec(),
                    found: found.iter().map(|&d| d as u64).collect(),
                })
            }
        };
        if weights.layers.len() != config.layers {
            return Err(ModelError::Hyperparameter {
                key: "layers",
                problem: format!(
                    "{} layers of weights for {} layers",
                    weights.layers.len(),
                    config.layers
                ),
            });
        }
        shape(
            "token_embd.weight".into(),
            weights.token_embd.shape(),
            &[config.vocab, h],
        )?;
        shape(
            "output_norm.weight".into(),
            &[weights.output_norm.len()],
            &[h],
        )?;
        for (l, w) in weights.layers.iter().enumerate() {
            let name = |part: &str| format!("blk.{l}.{part}.weight");
            shape(name("attn_norm"), &[w.attn_norm.len()], &[h])?;
            shape(name("ffn_norm"), &[w.ffn_norm.len()], &[h])?;
            shape(name("attn_q"), w.q.shape(), &[q_out, h])?;
            shape(name("attn_k"), w.k.shape(), &[kv_out, h])?;
            shape(name("attn_v"), w.v.shape(), &[kv_out, h])?;
            shape(name("attn_output"), w.o.shape(), &[h, q_out])?;
            shape(name("ffn_gate"), w.gate.shape(), &[f, h])?;
            shape(name("ffn_up"), w.up.shape(), &[f, h])?;
            shape(name("ffn_down"), w.down.shape(), &[h, f])?;
        }
        Ok(Llama { config, weights })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// The causal pass over `ids`: every layer's q, k (after RoPE) and v, the stream after the
    /// last block, and the logits at every position.
    pub fn forward(&self, ids: &[u32]) -> Result<Capture, ModelError> {
        self.forward_with(ids, |_, _, _| Ok(()))
    }

    /// [`Llama::forward`], calling `hook(layer, k, v)` on each layer's keys (after RoPE) and
    /// values, both [kv_heads, tokens, head_dim], before attention reads them. The hook may
    /// change the values (not the shapes); later layers then see the effect. The capture keeps
    /// what each layer computed, before the hook.
    pub fn forward_with<F>(&self, ids: &[u32], mut hook: F) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &mut Array3<f32>, &mut Array3<f32>) -> Result<(), HookError>,
    {
        self.check_ids(ids)?;
        let mut cache = KvCache::new(self.config.layers);
        let (hidden, layers) = self.run(ids, &mut cache, &mut hook)?;
        let normed = self.final_norm(&hidden);
        let logits = ops::linear(normed.view(), self.weights.token_embd.view(), None);
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: Some(logits),
        })
    }

    /// Runs `ids` at the positions after those in `cache`, whose K/V attention reads first;
    /// appends the new (hooked) K/V to it. Returns the stream after the last block and what each
    /// layer computed. Every output row is computed exactly as in a batched pass over all
    /// positions (each element one [`ops::dot`] of its own row, attention over positions in
    /// order, the same RoPE table entry for a position), so decoding token by token gives the
    /// same bits as one pass.
    fn run<F>(
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
    pub fn forward_with_source<F>(&self, ids: &[u32], source: F) -> Result<Capture, ModelError>
    where
        F: FnMut(usize, &Array3<f32>, &Array3<f32>) -> Result<Box<dyn KvSource>, HookError>,
    {
        let (hidden, layers) = self.hidden_with_source(ids, source)?;
        let normed = self.final_norm(&hidden);
        let logits = ops::linear(normed.view(), self.weights.token_embd.view(), None);
        Ok(Capture {
            ids: ids.to_vec(),
            layers,
            hidden,
            logits: Some(logits),
        })
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
        self.check_ids(ids)?;
        let c = &self.config;
        let mut x = self.embed(ids);
        let (cos, sin) = rope_table(0, ids.len(), c.head_dim, c.rope_base);
        let mut layers = Vec::with_capacity(c.layers);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let captured = self.layer_qkv(w, &x, &cos, &sin);
            let hook = |e: HookError| ModelError::Hook {
                layer: l,
                problem: e.to_string(),
            };
            let read = source(l, &captured.k, &captured.v).map_err(hook)?;
            let attended = attention_from(&captured.q, read.as_ref(), c.kv_heads)
                .map_err(|problem| ModelError::Hook { layer: l, problem })?;
            self.layer_rest(w, &mut x, &attended);
            layers.push(captured);
        }
        Ok((x, layers))
    }

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

    /// The token embeddings of `ids` (checked), [tokens, hidden].
    fn embed(&self, ids: &[u32]) -> Array2<f32> {
        let mut x = Array2::<f32>::zeros((ids.len(), self.config.hidden));
        for (mut row, &id) in x.axis_iter_mut(Axis(0)).zip(ids) {
            row.assign(&self.weights.token_embd.row(id as usize));
        }
        x
    }

    /// A block's q, k (both after RoPE) and v for the stream `x`.
    fn layer_qkv(
        &self,
        w: &LayerWeights,
        x: &Array2<f32>,
        cos: &Array2<f32>,
        sin: &Array2<f32>,
    ) -> LayerCapture {
        let c = &self.config;
        let mut h = x.clone();
        ops::rms_norm(&mut h, &w.attn_norm, c.rms_eps);
        let mut q = split_heads(ops::linear(h.view(), w.q.view(), None), c.heads);
        let mut k = split_heads(ops::linear(h.view(), w.k.view(), None), c.kv_heads);
        let v = split_heads(ops::linear(h.view(), w.v.view(), None), c.kv_heads);
        rope(&mut q, cos, sin);
        rope(&mut k, cos, sin);
        LayerCapture { q, k, v }
    }

    /// The rest of a block after attention: the output projection and the feed-forward layer,
    /// both added to the stream `x`.
    fn layer_rest(&self, w: &LayerWeights, x: &mut Array2<f32>, attended: &Array2<f32>) {
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

    /// `n` tokens continuing `ids`, each the argmax (lowest id on a tie) of the last position's
    /// logits. One pass over `ids`, then one position at a time with an f32 K/V cache; the
    /// logits are bit-identical to a batched pass over the whole sequence (see the tests).
    pub fn generate_greedy(&self, ids: &[u32], n: usize) -> Result<Vec<u32>, ModelError> {
        self.check_ids(ids)?;
        if ids.len() + n > self.config.context {
            return Err(ModelError::TooManyTokens {
                tokens: ids.len() + n,
                context: self.config.context,
            });
        }
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

    fn check_ids(&self, ids: &[u32]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::EmptyInput);
        }
        if ids.len() > self.config.context {
            return Err(ModelError::TooManyTokens {
                tokens: ids.len(),
                context: self.config.context,
            });
        }
        if let Some((position, &id)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= self.config.vocab)
        {
            return Err(ModelError::UnknownToken {
                id,
                position,
                vocabulary: self.config.vocab,
            });
        }
        Ok(())
    }
}

/// SmolLM2 and its tokenizer from one read of the GGUF file.
pub fn load_with_tokenizer(files: &ModelFiles) -> Result<(Llama, Bpe), ModelError> {
    if files.model != ModelName::SmolLm2 {
        return Err(ModelError::NotLlama(files.model));
    }
    let bytes = gguf_file::read_file(files.weights())?;
    let gguf = gguf_file::GgufFile::parse(&bytes)?;
    let tokenizer = Bpe::from_gguf(&gguf)?;
    Ok((Llama::from_gguf(&gguf)?, tokenizer))
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

/// Each layer's keys and values of the positions run so far, [kv_heads, positions, head_dim].
struct KvCache {
    layers: Vec<(Array3<f32>, Array3<f32>)>,
    len: usize,
}

impl KvCache {
    fn new(layers: usize) -> KvCache {
        let empty = || Array3::zeros((0, 0, 0));
        KvCache {
            layers: (0..layers).map(|_| (empty(), empty())).collect(),
            len: 0,
        }
    }
}

/// `past` followed by `new` along the positions (standard layout); `past` may be empty.
fn append_positions(past: &Array3<f32>, new: &Array3<f32>) -> Array3<f32> {
    if past.is_empty() {
        return new.as_standard_layout().into_owned();
    }
    let (heads, p, d) = past.dim();
    let mut out = Array3::zeros((heads, p + new.dim().1, d));
    out.slice_mut(s![.., ..p, ..]).assign(past);
    out.slice_mut(s![.., p.., ..]).assign(new);
    out
}

/// [tokens, heads * head_dim] -> [heads, tokens, head_dim].
fn split_heads(y: Array2<f32>, heads: usize) -> Array3<f32> {
    let (t, width) = y.dim();
    let d = width / heads;
    Array3::from_shape_fn((heads, t, d), |(h, i, j)| y[[i, h * d + j]])
}

/// cos and sin of pos * base^(-2i / head_dim) for pos = start..start + t, [t, head_dim / 2],
/// computed in f64 with `libm` and rounded once to f32.
fn rope_table(start: usize, t: usize, head_dim: usize, base: f32) -> (Array2<f32>, Array2<f32>) {
    let half = head_dim / 2;
    let freq: Vec<f64> = (0..half)
        .map(|i| libm::pow(f64::from(base), -((2 * i) as f64) / head_dim as f64))
        .collect();
    let angle = |row: usize, i: usize| (start + row) as f64 * freq[i];
    (
        Array2::from_shape_fn((t, half), |(p, i)| libm::cos(angle(p, i)) as f32),
        Array2::from_shape_fn((t, half), |(p, i)| libm::sin(angle(p, i)) as f32),
    )
}

/// Rotates channel pairs (2i, 2i + 1) of every head and position in place.
fn rope(x: &mut Array3<f32>, cos: &Array2<f32>, sin: &Array2<f32>) {
    for mut head in x.axis_iter_mut(Axis(0)) {
        for (pos, mut row) in head.axis_iter_mut(Axis(0)).enumerate() {
            for i in 0..cos.ncols() {
                let (c, s) = (cos[[pos, i]], sin[[pos, i]]);
                let (a, b) = (row[2 * i], row[2 * i + 1]);
                row[2 * i] = a * c - b * s;
                row[2 * i + 1] = a * s + b * c;
            }
        }
    }
}

/// Causal grouped-query attention: q [heads, T, d] for positions start..start + T, k and v
/// [kv_heads, start + T, d] (standard layout) -> [T, heads * d]. Heads run in parallel; each
/// output is computed in one fixed order.
fn attention(q: &Array3<f32>, k: &Array3<f32>, v: &Array3<f32>, start: usize) -> Array2<f32> {
    let (heads, t, d) = q.dim();
    let group = heads / k.dim().0;
    let scale = 1.0 / (d as f32).sqrt();
    let per_head: Vec<Array2<f32>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let q = q.index_axis(Axis(0), h);
            let k = k.index_axis(Axis(0), h / group);
            let v = v.index_axis(Axis(0), h / group);
            let k = k.to_slice().expect("standard layout");
            let v = v.to_slice().expect("standard layout");
            let mut out = Array2::<f32>::zeros((t, d));
            let mut scores = vec![0f32; start + t];
            for i in 0..t {
                let qi = q.row(i);
                let qi = qi.as_slice().expect("standard layout");
                let seen = start + i + 1;
                for (j, score) in scores[..seen].iter_mut().enumerate() {
                    *score = ops::dot(qi, &k[j * d..(j + 1) * d]) * scale;
                }
                ops::softmax_in_place(&mut scores[..seen]);
                let mut row = out.row_mut(i);
                for (j, &p) in scores[..seen].iter().enumerate() {
                    for (o, &x) in row.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                        *o += p * x;
                    }
                }
            }
            out
        })
        .collect();
    let mut out = Array2::<f32>::zeros((t, heads * d));
    for (h, part) in per_head.iter().enumerate() {
        out.slice_mut(s![.., h * d..(h + 1) * d]).assign(part);
    }
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

/// [`attention`] over positions 0..T with rows from `source`: the same scores, softmax and
/// weighted sums in the same order. A row that is not `head_dim` long is refused.
fn attention_from(
    q: &Array3<f32>,
    source: &dyn KvSource,
    kv_heads: usize,
) -> Result<Array2<f32>, String> {
    let (heads, t, d) = q.dim();
    let group = heads / kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let per_head: Vec<Result<Array2<f32>, String>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let q = q.index_axis(Axis(0), h);
            let kv = h / group;
            let mut out = Array2::<f32>::zeros((t, d));
            let mut scores = vec![0f32; t];
            for i in 0..t {
                let qi = q.row(i);
                let qi = qi.as_slice().expect("standard layout");
                let seen = i + 1;
                for (j, score) in scores[..seen].iter_mut().enumerate() {
                    let k = source.key(kv, i, j);
                    if k.len() != d {
                        return Err(format!(
                            "the key of head {kv} at position {j} for query {i} has {} values, \
                             not {d}",
                            k.len()
                        ));
                    }
                    *score = ops::dot(qi, k) * scale;
                }
                ops::softmax_in_place(&mut scores[..seen]);
                let mut row = out.row_mut(i);
                for (j, &p) in scores[..seen].iter().enumerate() {
                    let v = source.value(kv, i, j);
                    if v.len() != d {
                        return Err(format!(
                            "the value of head {kv} at position {j} for query {i} has {} \
                             values, not {d}",
                            v.len()
                        ));
                    }
                    for (o, &x) in row.iter_mut().zip(v) {
                        *o += p * x;
                    }
                }
            }
            Ok(out)
        })
        .collect();
    let mut out = Array2::<f32>::zeros((t, heads * d));
    for (h, part) in per_head.into_iter().enumerate() {
        out.slice_mut(s![.., h * d..(h + 1) * d]).assign(&part?);
    }
    Ok(out)
}

/// A GGUF tensor as an f32 matrix [rows, cols] (a 1-D tensor as [1, cols]), after checking its
/// shape (ggml's ne0 is the row length) and type.
fn read_matrix(
    gguf: &gguf_file::GgufFile<'_>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Array2<f32>, ModelError> {
    let info = gguf.tensor(name)?;
    let expected: Vec<u64> = if rows == 1 && info.dims.len() == 1 {
        vec![cols as u64]
    } else {
        vec![cols as u64, rows as u64]
    };
    if info.dims != expected {
        return Err(ModelError::TensorShape {
            tensor: name.to_string(),
            expected: if info.dims.len() == 1 {
                vec![cols]
            } else {
                vec![rows, cols]
            },
            found: info.dims.iter().rev().copied().collect(),
        });
    }
    let bytes = gguf.tensor_bytes(info)?;
    let data = |problem: String| ModelError::TensorData {
        tensor: name.to_string(),
        problem,
    };
    // The shape was checked against the hyperparameters and gguf-file checked that the bytes
    // are in the file, so this allocation is bounded by the file's size.
    let mut out = vec![0f32; rows * cols];
    use gguf_file::TensorType as T;
    use weights::gguf::{BlockQ4_0, BlockQ8_0};
    match info.ty {
        T::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        T::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        T::Q8_0 => {
            let blocks =
                weights::gguf::from_bytes::<BlockQ8_0>(bytes).map_err(|e| data(e.to_string()))?;
            weights::gguf::dequantize_into(&blocks, &mut out).map_err(|e| data(e.to_string()))?;
        }
        T::Q4_0 => {
            let blocks =
                weights::gguf::from_bytes::<BlockQ4_0>(bytes).map_err(|e| data(e.to_string()))?;
            weights::gguf::dequantize_into(&blocks, &mut out).map_err(|e| data(e.to_string()))?;
        }
        T::Q4_1 => {
            let blocks = weights::gguf::q4_1::from_bytes(bytes).map_err(|e| data(e.to_string()))?;
            weights::gguf::q4_1::dequantize_into(&blocks, &mut out)
                .map_err(|e| data(e.to_string()))?;
        }
        other => {
            return Err(ModelError::TensorType {
                tensor: name.to_string(),
                ty: other.to_string(),
            });
        }
    }
    Ok(Array2::from_shape_vec((rows, cols), out).expect("rows * cols values"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny model: 2 layers, hidden 16, 4 query heads and 2 KV heads of 4, FFN 24, vocab 30,
    /// with deterministic pseudo-random weights.
    fn tiny() -> Llama {
        let config = LlamaConfig {
            layers: 2,
            hidden: 16,
            heads: 4,
            kv_heads: 2,
            head_dim: 4,
            ffn: 24,
            vocab: 30,
            context: 64,
            rope_base: 10000.0,
            rms_eps: 1e-5,
        };
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut matrix = |rows: usize, cols: usize| {
            Array2::from_shape_fn((rows, cols), |_| {
                // xorshift: a fixed stream of values in [-0.5, 0.5).
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
        };
        let layers = (0..2)
            .map(|_| LayerWeights {
                attn_norm: vec![1.0; 16],
                q: matrix(16, 16),
                k: matrix(8, 16),
                v: matrix(8, 16),
                o: matrix(16, 16),
                ffn_norm: vec![1.0; 16],
                gate: matrix(24, 16),
                up: matrix(24, 16),
                down: matrix(16, 24),
            })
            .collect();
        let weights = LlamaWeights {
            token_embd: matrix(30, 16),
            layers,
            output_norm: vec![1.0; 16],
        };
        Llama::from_weights(config, weights).unwrap()
    }

    #[test]
    fn a_later_token_does_not_change_earlier_positions() {
        let model = tiny();
        let a = model.forward(&[1, 2, 3, 4]).unwrap();
        let b = model.forward(&[1, 2, 3, 29]).unwrap();
        for (la, lb) in a.layers.iter().zip(&b.layers) {
            assert_eq!(la.q.slice(s![.., ..3, ..]), lb.q.slice(s![.., ..3, ..]));
            assert_eq!(la.k.slice(s![.., ..3, ..]), lb.k.slice(s![.., ..3, ..]));
            assert_eq!(la.v.slice(s![.., ..3, ..]), lb.v.slice(s![.., ..3, ..]));
        }
        let (la, lb) = (a.logits.unwrap(), b.logits.unwrap());
        assert_eq!(la.slice(s![..3, ..]), lb.slice(s![..3, ..]));
        assert_ne!(la.row(3), lb.row(3));
        // A prefix gives the same numbers as the first positions of a longer input.
        let prefix = model.forward(&[1, 2, 3]).unwrap();
        assert_eq!(prefix.hidden, a.hidden.slice(s![..3, ..]));
    }

    #[test]
    fn rope_at_position_0_is_the_identity_and_rotations_keep_norms() {
        let model = tiny();
        let c = model.forward(&[5, 5, 5]).unwrap();
        let w = &model.weights().layers[0];
        // Recompute layer 0's k before RoPE by hand.
        let mut h = model.weights().token_embd.slice(s![5..6, ..]).to_owned();
        ops::rms_norm(&mut h, &w.attn_norm, 1e-5);
        let k = ops::linear(h.view(), w.k.view(), None);
        let k0 = &c.layers[0].k;
        for head in 0..2 {
            assert_eq!(
                k0.slice(s![head, 0, ..]),
                k.slice(s![0, head * 4..head * 4 + 4])
            );
            // The same token at later positions: rotated, with the same norm of every pair.
            for pos in 1..3 {
                assert_ne!(k0.slice(s![head, pos, ..]), k0.slice(s![head, 0, ..]));
                for pair in 0..2 {
                    let norm = |p: usize| {
                        let (a, b) = (k0[[head, p, 2 * pair]], k0[[head, p, 2 * pair + 1]]);
                        (a * a + b * b).sqrt()
                    };
                    assert!((norm(pos) - norm(0)).abs() < 1e-5);
                }
            }
        }
    }

    #[test]
    fn query_heads_share_kv_heads_in_groups() {
        // With 4 query heads and 2 KV heads, heads 0-1 read KV head 0 and heads 2-3 KV head 1:
        // zeroing KV head 1's values changes only the attention output of heads 2 and 3.
        let model = tiny();
        let c = model.forward(&[3, 7, 11]).unwrap();
        let l = &c.layers[0];
        let full = attention(&l.q, &l.k, &l.v, 0);
        let mut v = l.v.clone();
        v.slice_mut(s![1, .., ..]).fill(0.0);
        let cut = attention(&l.q, &l.k, &v, 0);
        assert_eq!(full.slice(s![.., ..8]), cut.slice(s![.., ..8]));
        assert!(cut.slice(s![.., 8..]).iter().all(|&x| x == 0.0));
        assert!(full.slice(s![.., 8..]).iter().any(|&x| x != 0.0));
    }

    #[test]
    fn the_same_bits_on_one_and_on_two_threads() {
        let model = tiny();
        let ids = [0, 29, 4, 4, 17, 8];
        let on = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| model.forward(&ids).unwrap())
        };
        assert_eq!(on(1), on(2));
    }

    #[test]
    fn the_hook_sees_each_layers_kv_and_its_changes_reach_later_layers() {
        let model = tiny();
        let ids = [1, 2, 3];
        let plain = model.forward(&ids).unwrap();
        let mut seen = Vec::new();
        let hooked = model
            .forward_with(&ids, |layer, k, v| {
                seen.push((layer, k.dim(), v.dim()));
                v.mapv_inplace(|x| x * 0.5);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, [(0, (2, 3, 4), (2, 3, 4)), (1, (2, 3, 4), (2, 3, 4))]);
        // Layer 0's capture is what it computed; layer 1 already sees the halved values.
        assert_eq!(hooked.layers[0], plain.layers[0]);
        assert_ne!(hooked.layers[1].k, plain.layers[1].k);
        let err = model
            .forward_with(&ids, |_, k, _| {
                *k = Array3::zeros((1, 1, 1));
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(err, ModelError::Hook { layer: 0, .. }), "{err}");
        let err = model
            .forward_with(&ids, |_, _, _| Err("codec refused".into()))
            .unwrap_err();
        assert!(err.to_string().contains("codec refused"), "{err}");
    }

    #[test]
    fn decoding_token_by_token_gives_the_bits_of_one_batched_pass() {
        let model = tiny();
        let ids = [3, 1, 4, 1, 5, 9, 2, 6];
        let batched = model.forward(&ids).unwrap();
        let mut cache = KvCache::new(2);
        let (first, _) = model
            .run(&ids[..3], &mut cache, &mut |_, _, _| Ok(()))
            .unwrap();
        assert_eq!(first, batched.hidden.slice(s![..3, ..]));
        for (pos, id) in ids.iter().enumerate().skip(3) {
            let (row, layers) = model
                .run(&[*id], &mut cache, &mut |_, _, _| Ok(()))
                .unwrap();
            assert_eq!(row, batched.hidden.slice(s![pos..pos + 1, ..]));
            for (mine, all) in layers.iter().zip(&batched.layers) {
                assert_eq!(mine.k, all.k.slice(s![.., pos..pos + 1, ..]));
            }
        }
    }

    #[test]
    fn a_source_of_the_layers_own_rows_and_a_step_loop_give_the_bits_of_forward() {
        let model = tiny();
        let ids = [3, 1, 4, 1, 5, 9, 2, 6];
        let plain = model.forward(&ids).unwrap();
        let sourced = model
            .forward_with_source(&ids, |_, k, v| Ok(Box::new(OwnKv::new(k, v))))
            .unwrap();
        assert_eq!(sourced, plain);
        // A caller-held cache that keeps every row as given.
        let mut cache: Vec<(Array3<f32>, Array3<f32>)> =
            vec![(Array3::zeros((2, 0, 4)), Array3::zeros((2, 0, 4))); 2];
        for (pos, &id) in ids.iter().enumerate() {
            let row = model
                .step(id, pos, |l, k, v| {
                    let (past_k, past_v) = &mut cache[l];
                    *past_k = append_positions(past_k, k);
                    *past_v = append_positions(past_v, v);
                    Ok((past_k.clone(), past_v.clone()))
                })
                .unwrap();
            assert_eq!(row, plain.hidden.slice(s![pos..pos + 1, ..]));
        }
    }

    #[test]
    fn a_source_or_step_cache_of_the_wrong_shape_is_refused() {
        let model = tiny();
        let short = Array3::<f32>::zeros((2, 1, 3));
        let err = model
            .forward_with_source(&[1, 2], |_, _, _| Ok(Box::new(OwnKv::new(&short, &short))))
            .unwrap_err();
        assert!(matches!(err, ModelError::Hook { layer: 0, .. }), "{err}");
        let err = model
            .step(1, 0, |_, _, _| Ok((short.clone(), short.clone())))
            .unwrap_err();
        assert!(err.to_string().contains("expected (2, 1, 4)"), "{err}");
        assert!(matches!(
            model.step(1, 64, |_, k, v| Ok((k.clone(), v.clone()))),
            Err(ModelError::TooManyTokens { .. })
        ));
    }

    #[test]
    fn greedy_generation_extends_with_the_argmax_of_a_full_pass() {
        let model = tiny();
        let out = model.generate_greedy(&[1, 2], 3).unwrap();
        assert_eq!(out.len(), 3);
        let mut all = vec![1, 2];
        all.extend_from_slice(&out[..2]);
        let logits = model.forward(&all).unwrap().logits.unwrap();
        assert_eq!(argmax(logits.row(3).as_slice().unwrap()), out[2]);
    }

    #[test]
    fn bad_inputs_are_refused_by_name() {
        let model = tiny();
        assert!(matches!(model.forward(&[]), Err(ModelError::EmptyInput)));
        assert!(matches!(
            model.forward(&[1, 30]),
            Err(ModelError::UnknownToken {
                id: 30,
                position: 1,
                vocabulary: 30
            })
        ));
        assert!(matches!(
            model.forward(&[1; 65]),
            Err(ModelError::TooManyTokens {
                tokens: 65,
                context: 64
            })
        ));
        assert!(matches!(
            model.generate_greedy(&[1; 60], 5),
            Err(ModelError::TooManyTokens { tokens: 65, .. })
        ));
        let mut weights = model.weights().clone();
        weights.layers[1].k = Array2::zeros((4, 16));
        let err = Llama::from_weights(model.config().clone(), weights).unwrap_err();
        assert!(err.to_string().contains("blk.1.attn_k.weight"), "{err}");
        let mut config = model.config().clone();
        config.kv_heads = 3;
        let err = Llama::from_weights(config, model.weights().clone()).unwrap_err();
        assert!(matches!(
            err,
            ModelError::Hyperparameter {
                key: "kv_heads",
                ..
            }
        ));
    }

    /// A GGUF file (v3) holding `model` as F32 tensors, written by hand from the format's layout
    /// (see the `gguf-file` crate's docs); `edit` may change the metadata and tensors first.
    fn gguf_of(
        model: &Llama,
        edit: impl FnOnce(&mut Vec<(String, u32)>, &mut Vec<Tensor>),
    ) -> Vec<u8> {
        let c = model.config();
        let w = model.weights();
        let mut counts: Vec<(String, u32)> = [
            ("llama.block_count", c.layers),
            ("llama.embedding_length", c.hidden),
            ("llama.attention.head_count", c.heads),
            ("llama.attention.head_count_kv", c.kv_heads),
            ("llama.feed_forward_length", c.ffn),
            ("llama.context_length", c.context),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v as u32))
        .collect();
        let matrix = |name: String, m: &Array2<f32>| Tensor {
            name,
            dims: vec![m.ncols() as u64, m.nrows() as u64],
            ty: 0,
            data: m.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let vector = |name: String, v: &[f32]| Tensor {
            name,
            dims: vec![v.len() as u64],
            ty: 0,
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let mut tensors = vec![
            matrix("token_embd.weight".into(), &w.token_embd),
            vector("output_norm.weight".into(), &w.output_norm),
        ];
        for (l, lw) in w.layers.iter().enumerate() {
            let n = |part: &str| format!("blk.{l}.{part}.weight");
            tensors.push(vector(n("attn_norm"), &lw.attn_norm));
            tensors.push(vector(n("ffn_norm"), &lw.ffn_norm));
            for (part, m) in [
                ("attn_q", &lw.q),
                ("attn_k", &lw.k),
                ("attn_v", &lw.v),
                ("attn_output", &lw.o),
                ("ffn_gate", &lw.gate),
                ("ffn_up", &lw.up),
                ("ffn_down", &lw.down),
            ] {
                tensors.push(matrix(n(part), m));
            }
        }
        edit(&mut counts, &mut tensors);

        let mut out = Vec::new();
        let string = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((counts.len() as u64 + 3).to_le_bytes());
        string(&mut out, "general.architecture");
        out.extend(8u32.to_le_bytes());
        string(&mut out, "llama");
        for (key, value) in [
            ("llama.rope.freq_base", c.rope_base),
            ("llama.attention.layer_norm_rms_epsilon", c.rms_eps),
        ] {
            string(&mut out, key);
            out.extend(6u32.to_le_bytes());
            out.extend(value.to_le_bytes());
        }
        for (key, value) in &counts {
            string(&mut out, key);
            out.extend(4u32.to_le_bytes());
            out.extend(value.to_le_bytes());
        }
        let mut offset = 0u64;
        for t in &tensors {
            string(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (t.data.len() as u64).div_ceil(32) * 32;
        }
        for t in &tensors {
            out.resize(out.len().div_ceil(32) * 32, 0);
            out.extend(&t.data);
        }
        out
    }

    /// Changes to the metadata counts and tensors of [`gguf_of`].
    type Edit = dyn Fn(&mut Vec<(String, u32)>, &mut Vec<Tensor>);

    struct Tensor {
        name: String,
        dims: Vec<u64>,
        ty: u32,
        data: Vec<u8>,
    }

    #[test]
    fn a_gguf_file_loads_to_the_same_model_and_bad_ones_are_refused_by_tensor_name() {
        let model = tiny();
        let bytes = gguf_of(&model, |_, _| {});
        let gguf = gguf_file::GgufFile::parse(&bytes).unwrap();
        let loaded = Llama::from_gguf(&gguf).unwrap();
        assert_eq!(loaded.config(), model.config());
        assert_eq!(loaded.weights(), model.weights());

        let refuse = |edit: &Edit| {
            let bytes = gguf_of(&model, edit);
            let gguf = gguf_file::GgufFile::parse(&bytes).unwrap();
            Llama::from_gguf(&gguf).unwrap_err().to_string()
        };
        // A projection of the wrong shape.
        let err = refuse(&|_, tensors| {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == "blk.1.attn_k.weight")
                .unwrap();
            t.dims = vec![16, 4];
            t.data.truncate(16 * 4 * 4);
        });
        assert!(err.contains("blk.1.attn_k.weight"), "{err}");
        // A type this loader does not read (I32, ggml type 26).
        let err = refuse(&|_, tensors| {
            let t = tensors
                .iter_mut()
                .find(|t| t.name == "blk.0.ffn_up.weight")
                .unwrap();
            t.ty = 26;
        });
        assert!(
            err.contains("blk.0.ffn_up.weight") && err.contains("I32"),
            "{err}"
        );
        // A missing tensor, a missing key, heads that do not divide the width.
        let err = refuse(&|_, tensors| tensors.retain(|t| t.name != "blk.1.ffn_down.weight"));
        assert!(err.contains("blk.1.ffn_down.weight"), "{err}");
        let err = refuse(&|counts, _| counts.retain(|(k, _)| k != "llama.context_length"));
        assert!(err.contains("llama.context_length"), "{err}");
        let err = refuse(&|counts, _| counts[2].1 = 5);
        assert!(err.contains("head_dim"), "{err}");
    }

    /// FNV-1a over the bits of everything a capture holds.
    fn digest(c: &Capture) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut eat = |x: f32| {
            for b in x.to_bits().to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        };
        for l in &c.layers {
            l.q.iter().chain(&l.k).chain(&l.v).for_each(|&x| eat(x));
        }
        c.hidden.iter().for_each(|&x| eat(x));
        c.logits.iter().flatten().for_each(|&x| eat(x));
        h
    }

    #[test]
    fn forward_and_forward_with_keep_the_bits_they_had_before_the_source_api() {
        let model = tiny();
        let ids = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3];
        let plain = digest(&model.forward(&ids).unwrap());
        let halved = digest(
            &model
                .forward_with(&ids, |_, _, v| {
                    v.mapv_inplace(|x| x * 0.5);
                    Ok(())
                })
                .unwrap(),
        );
        // Printed by this test run on the code before `forward_with_source` and `step` were
        // added (commit 3f209b0): the refactor into `layer_qkv` / `layer_rest` changed no bit.
        assert_eq!(plain, 0xbbc9_f82b_fc91_6e29);
        assert_eq!(halved, 0xd91f_465b_8df9_3d2e);
        let sourced = model
            .forward_with_source(&ids, |_, k, v| Ok(Box::new(OwnKv::new(k, v))))
            .unwrap();
        assert_eq!(digest(&sourced), plain);
    }
}
