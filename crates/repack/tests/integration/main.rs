//! The `repack` crate's integration tests, in one test binary.

/// Fixture paths, an independent safetensors reader and weight hashes.
mod support;

/// Every layout against the bytes and dequantized weights of the libraries that define it.
mod conformance;

/// The real binary: conversions, inspection, quantization and every refusal, by message.
mod cli;

/// `quantize` and `dequantize`: GGUF and NF4 safetensors files (against gguf-py's reading of
/// them), bare block files only with `--raw`, and every refused flag, size and input by message.
mod quantfile;

/// Inputs that used to abort or panic the binary, each now refused.
mod untrusted;

/// Every reader on arbitrary bytes and on mutated valid files: Ok or Err, never a panic.
mod properties;

/// The inputs the fuzz targets crashed on (and hand-made seeds), replayed through the same
/// library functions.
mod fuzz_regressions;

/// `repack::read`: a file's quantized layers as their parts (what `kvpack.weights.read` returns).
mod read;

/// `repack bpw`: the worked example and one layout part by part.
mod bpw;

/// `repack layer-error`: MiniLM's real layers under each format (fetches the model on first
/// use).
mod layer_error;
