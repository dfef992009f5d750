//! The `weights` crate's integration tests, in one test binary (each test executable links the
//! whole dependency tree, so they are gathered here):
//!
//! - `bpw`: effective bits per element: the worked example, each part of the cost apart, and the
//!   containers' padding;
//! - `formats`: every weight format against the three probes at every width it stores, read back
//!   by oracles written from each format's spec;
//! - `fast_packers`: the fast GPTQ and AWQ packers bit for bit against their reference packers;
//! - `gguf_kernels`: the fast GGUF kernels bit for bit against the per-block reference (proptest;
//!   its regression seeds are in `tests/proptest-regressions/gguf_kernels.txt`, where proptest
//!   looks for a source file under a directory holding a `main.rs`);
//! - `properties`: the integer layouts over arbitrary logical matrices: packing, padding,
//!   act-order and transcoding are exact;
//! - `gguf_files`: every tensor of the real SmolLM2-135M and Gemma 3 270M GGUF files dequantizes
//!   bit for bit as gguf-py does;
//! - `stored_blocks`: the read-only block types (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): fast against
//!   reference, both against gguf-py on committed blocks, and bad bytes refused.

mod bpw;
mod fast_packers;
mod formats;
mod gguf_files;
mod gguf_kernels;
mod properties;
mod stored_blocks;
