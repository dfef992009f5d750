//! Three real transformers, run in plain f32 on the CPU so that the studies can read the K/V
//! cache a trained model actually computes: all-MiniLM-L6-v2 (a BERT encoder), SmolLM2-135M
//! (a Llama decoder with grouped-query attention and RoPE) and Gemma 3 270M (one KV head of 256,
//! QK-norm, sliding-window and global layers).
//!
//! Where things live:
//! - [`files`]: where the fetched model files are (`scripts/fetch-models`), their pinned SHA-256,
//!   and the error that names the command to run when they are missing;
//! - [`ops`]: the numerical building blocks both models share (linear layers, norms, softmax,
//!   activations), each with a fixed order of f32 operations;
//! - [`capture`]: what a forward pass hands back: token ids and per-layer q, k, v;
//! - [`transformer`]: one interface over the three models ([`load`] by name), and their sizes;
//! - [`decoder`]: one interface over the two decoders ([`CausalLm`]) for a caller that runs
//!   its own cache inside attention;
//! - [`tokenizer`]: WordPiece (MiniLM), byte-level BPE (SmolLM2) and SentencePiece (Gemma 3);
//! - [`gemma3`]: Gemma 3 from its GGUF (k-quant weights), with the same K/V hook as [`llama`];
//! - [`bert`], [`llama`]: the other two forward passes ([`llama`]: SmolLM2 from its GGUF, with a hook
//!   on each layer's K/V before attention reads them, a [`llama::KvSource`] that decides per
//!   query position what attention reads, and [`llama::Llama::step`] for a caller-held cache).
//!
//! Why by hand: the point is the per-layer K/V, exactly as a cache holds it, bit-reproducible on
//! any machine and thread count. A general inference library hides the cache, picks its kernels
//! (FMA or not, summation order) at run time, and costs minutes of build. Here every dot product
//! sums in one fixed order ([`ops::dot`]), transcendental functions come from `libm`, and
//! threads only split independent outputs, so the same text gives the same bytes everywhere.

#![warn(missing_docs)]

pub mod bert;
pub mod capture;
pub mod decoder;
pub mod files;
pub mod gemma3;
pub mod llama;
pub mod ops;
pub mod tokenizer;
pub mod transformer;

pub use capture::{Capture, LayerCapture};
pub use decoder::CausalLm;
pub use files::{ModelFiles, ModelName, ModelRecord};
pub use transformer::{ModelError, ModelShape, Transformer, load};
