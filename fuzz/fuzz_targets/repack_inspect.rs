//! (2b) repack's checkpoint reader followed by everything `repack inspect` does with what it
//! read: finding layers, reading their metadata, unpacking them through the codec.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = repack::inspect::inspect_bytes("fuzz input", data);
});
