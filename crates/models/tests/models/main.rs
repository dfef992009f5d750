//! The `models` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here). They run on the real model files, fetched by
//! `scripts/fetch-models` on first use:
//!
//! - `minilm`: all-MiniLM-L6-v2: the WordPiece tokenizer against the `tokenizers` library, the
//!   forward pass against two f64 NumPy references, thread counts and the 512-token limit;
//! - `smollm2`: SmolLM2-135M-Instruct (Q4_1 GGUF): the BPE tokenizer, every layer against the
//!   shared f64 NumPy reference, greedy generation and a second, independent NumPy pass;
//! - `gemma3_tokenizer`: Gemma 3 270M's SentencePiece tokenizer (llama.cpp's SPM) against ids
//!   from Google's `sentencepiece` on 228 texts, decoding, and its speed on 8,192 tokens.

mod gemma3;
mod gemma3_tokenizer;
mod minilm;
mod smollm2;
