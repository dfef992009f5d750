//! (2) repack's safetensors checkpoint reader: any bytes, as the file `repack convert` and
//! `repack inspect` read.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::checkpoint::Checkpoint::from_bytes(data);
});
