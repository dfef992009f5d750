//! (6) the audit's reading of a manifest's protocol: any UTF-8 text, parsed and held to the
//! runner's bounds.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(protocol) = serde_json::from_slice::<audit::packed_kv::protocol::Protocol>(data) {
        let _ = protocol.validate();
    }
});
