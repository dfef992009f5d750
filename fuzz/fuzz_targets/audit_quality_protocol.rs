//! (9) the audit's reading of a model-quality manifest's protocol: any UTF-8 text, parsed and held
//! to the format's bounds (what the audit's re-run then trusts).
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(protocol) =
        serde_json::from_slice::<audit::model_quality::protocol::QualityProtocol>(data)
    {
        let _ = protocol.validate();
    }
});
