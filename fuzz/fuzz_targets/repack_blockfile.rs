//! (3) repack's block-file reader, the `dequantize` path: the format, `--cols` and
//! `--block-size` from the input's first 17 bytes and the file from the rest
//! (`repack::blockfile::decode_case` says how).
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::blockfile::decode_case(data);
});
