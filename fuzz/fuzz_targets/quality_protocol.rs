//! (4b) the model-quality protocol parser (`runner quality --protocol`): any UTF-8 text, parsed
//! and validated, and for a protocol it accepts, every run's cache configuration (setting label,
//! policy, schedule), the sizes that used to abort or wrap (`g4294967296_b4`, a window of
//! 2^64 - 1) included.
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(protocol) = quality::study::QualityProtocol::from_json(text)
    {
        let _ = protocol.specs();
    }
});
