//! (5) the audit's strict .npz reader: any bytes, as `arrays.npz` (the zip container, then every
//! member's .npy header and data size).
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = audit::common::npz::parse(data);
});
