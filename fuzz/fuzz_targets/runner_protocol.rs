//! (4) the runner's protocol parser: any UTF-8 text, as the protocol file `runner` reads
//! (`from_json` takes a &str; the runner reads the file with `read_to_string`, which refuses
//! invalid UTF-8 before parsing).
#![no_main]

use fuzz as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kvstudy::protocol::Protocol::from_json(text);
    }
});
