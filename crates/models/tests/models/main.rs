//! The `models` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here). Both run on the real model files, fetched by
//! `scripts/fetch-models` on first use:
//!
//! - `minilm`: all-MiniLM-L6-v2: the WordPiece tokenizer against the `tokenizers` library, the
//!   forward pass against two f64 NumPy references, thread counts and the 512-token limit;
//! - `smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF): the BPE tokenizer, every layer against the
//!   shared f64 NumPy reference, greedy generation and a second, independent NumPy pass.

mod minilm;
mod smollm2;
