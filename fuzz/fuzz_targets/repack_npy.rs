//! (1) repack's `.npy` reader: any bytes, as the file `repack quantize` reads.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::npy::parse_npy_matrix(data);
});
