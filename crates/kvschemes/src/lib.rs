//! The literature's KV-cache quantization schemes, each as its source defines it, and the bytes
//! each stores. A scheme is a named whole: which tensor it quantizes, the code, the group axis
//! and size, the metadata and its precision, what stays in full precision and how it ages.
//!
//! | name | source | K | V | full precision | bits per value |
//! |---|---|---|---|---|---|
//! | `kivi2`, `kivi4` | [`kivi`]: jy-yuan/KIVI | asymmetric per channel, groups of 32 tokens, fp16 scale and min | asymmetric per token, groups of 32 channels | last R = 128 tokens (keys leave R at a time, values one at a time) | 3.0, 5.0 + residual |
//! | `hf-quanto2`, `hf-quanto4` | [`quanto`]: transformers' `QuantizedCache`, quanto backend | asymmetric per token, groups of 64 along head_dim, f32 scale and shift | the same | none after prefill; while decoding, up to R - 1 = 127 tokens, then everything re-quantized | 3.0, 5.0 + residual |
//! | `llamacpp-TYPE` | [`llamacpp`]: llama.cpp `-ctk/-ctv TYPE` (rotation disabled, `LLAMA_ATTN_ROT_DISABLE=1`) | blocks of 32 along head_dim, per token | the same | none | q4_0 4.5, q4_1 5.0, q5_0 5.5, q8_0 8.5, iq4_nl 4.5 |
//! | `llamacpp-TYPE+rot` | [`hadamard`]: llama.cpp's default since PR #21038 | H k, then TYPE | H v, then TYPE | none | as TYPE |
//! | `kvpack-k<KB>v<VB>[-asym][-sink<S>][-edge8][-layer<L>]` | [`codec`]: this project's codec | groups of 32 tokens per channel, KB bits, f32 scale (and b-bit zero point); KB 32: float32 | groups of 32 channels per token, VB bits; VB 32: float32 | the first S tokens; the K group still filling while decoding; every layer but L | KB + 1, VB + 1 (asym: + 1/32 more) |
//! | `kvquant<B>[-first<N>]` | [`kvquant`]: SqueezeAILab/KVQuant | before RoPE, per channel against calibrated fp16 thresholds, B-bit codes into a per-layer level table fitted by k-means; values beyond the thresholds kept apart in fp16 | per token against the row's own range, the row's 0.5 % largest and smallest values kept apart | the first N tokens (fp16) | B, plus 32 bits per outlier and 16 per row for their count; a value row's f32 range, 64 bits |
//!
//! Keys are quantized after RoPE in all of these but KVQuant (their sources do so). Where a scheme departs
//! from its source, its module says so (the model here runs in f32, so the residual is f32).
//!
//! Where things live: [`scheme`] (the names, parsed once), [`cache`] (one layer's cache under a
//! scheme: what attention reads for each query and position, and the bytes stored), and one
//! module per source. The block quantizers of llama.cpp's types are `weights::gguf`'s.

#![warn(missing_docs)]

pub mod cache;
pub mod codec;
pub mod hadamard;
pub mod kivi;
pub mod kvquant;
pub mod llamacpp;
pub mod quanto;
pub mod scheme;

pub use cache::{LayerCache, Schedule, Stored};
pub use scheme::{Scheme, SchemeError, UnknownScheme, Width};
