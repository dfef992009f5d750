//! The `repack` crate's integration tests, in one test binary.

/// Fixture paths, an independent safetensors reader and weight hashes.
mod support;

/// Every layout against the bytes and dequantized weights of the libraries that define it.
mod conformance;

/// The real binary: conversions, inspection, quantization and every refusal, by message.
mod cli;
