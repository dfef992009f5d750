//! (2c) repack's checkpoint reader followed by all of `repack convert`: the request from the
//! input's first 5 bytes and the safetensors file from the rest
//! (`repack::convert::convert_case` says how); the result is laid out but not written.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::convert::convert_case(data);
});
