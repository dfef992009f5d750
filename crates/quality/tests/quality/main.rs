//! The `quality` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here):
//!
//! - `tiny`: the packed-cache decoder on a tiny random Llama (no download): float32 gives the
//!   plain pass's bits, streaming equals a token-by-token loop, budgets count what they hold;
//! - `schemes`: named schemes of the literature (KIVI, llama.cpp's types) as the cache, on a
//!   tiny random Llama with SmolLM2's head size;
//! - `smollm2`: SmolLM2-135M-Instruct with its cache held by the KV codec, against the public
//!   perplexity reference and an independent NumPy computation (the model is fetched by
//!   `scripts/fetch-models` on first use).

mod schemes;
mod smollm2;
mod tiny;
