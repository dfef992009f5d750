//! (3b) `repack dequantize FILE OUT.npy` on a whole file, no flags: the GGUF reader, and the NF4
//! safetensors reader through the quant state's JSON and shape to the dequantized matrix
//! (`repack::quantfile::dequantize_case`).
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::quantfile::dequantize_case(data);
});
