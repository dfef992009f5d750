//! Replays `tests/data/fuzz-regressions/<target>/*`: inputs the fuzz targets in `fuzz/` crashed
//! on (plus hand-made seeds for the aborts fixed before fuzzing), each fed to the library
//! function its target calls. Every one must come back Ok or Err; a panic fails the test, and an
//! abort takes the test binary down with it.

use std::path::PathBuf;

use repack::blockfile::decode_case;
use repack::checkpoint::Checkpoint;
use repack::convert::convert_case;
use repack::inspect::inspect_bytes;
use repack::npy::parse_npy_matrix;
use repack::quantfile::dequantize_case;

/// Runs one reader on one input, ignoring what it returns.
type Replay = fn(&[u8]);

/// Each fuzz target of this crate, and the function it runs on its input.
const TARGETS: [(&str, Replay); 6] = [
    ("repack_npy", |bytes| {
        let _ = parse_npy_matrix(bytes);
    }),
    ("repack_checkpoint", |bytes| {
        let _ = Checkpoint::from_bytes(bytes);
    }),
    ("repack_inspect", |bytes| {
        let _ = inspect_bytes("regression", bytes);
    }),
    ("repack_convert", |bytes| {
        let _ = convert_case(bytes);
    }),
    ("repack_blockfile", |bytes| {
        let _ = decode_case(bytes);
    }),
    ("repack_dequantize", |bytes| {
        let _ = dequantize_case(bytes);
    }),
];

fn regressions() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz-regressions")
}

#[test]
fn every_kept_fuzz_input_is_refused_or_read_without_a_panic() {
    for (target, run) in TARGETS {
        let dir = regressions().join(target);
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        inputs.sort();
        // An empty directory would make this test pass without running anything.
        assert!(!inputs.is_empty(), "{}: no inputs", dir.display());
        for input in inputs {
            let bytes = std::fs::read(&input).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&bytes));
            assert!(outcome.is_ok(), "{} panicked", input.display());
        }
    }
}

#[test]
fn every_regression_directory_belongs_to_a_target() {
    // A directory named for a target that is not in TARGETS would never be replayed.
    for entry in std::fs::read_dir(regressions()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            let name = entry.file_name().into_string().unwrap();
            assert!(
                TARGETS.iter().any(|(target, _)| *target == name),
                "tests/data/fuzz-regressions/{name} is not replayed by any target"
            );
        }
    }
}

/// The files in `fuzz/seeds/<target>`, which must be there.
fn seeds(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    assert!(!seeds.is_empty(), "{}: no seeds", dir.display());
    seeds
}

#[test]
fn every_seed_of_the_structured_fuzz_targets_is_a_valid_call() {
    // fuzz/seeds holds valid decode_case and convert_case inputs, so that the fuzzer starts past
    // the argument checks; a change to either layout must not quietly invalidate them.
    for seed in seeds("repack_blockfile") {
        if let Err(err) = decode_case(&std::fs::read(&seed).unwrap()) {
            panic!("{}: {err}", seed.display());
        }
    }
    for seed in seeds("repack_convert") {
        if let Err(err) = convert_case(&std::fs::read(&seed).unwrap()) {
            panic!("{}: {err}", seed.display());
        }
    }
}

#[test]
fn the_kept_nf4_shape_wrap_reaches_the_shape_check() {
    // The regression is only worth keeping if it gets past the container and the quant-state
    // JSON to the product that wraps.
    let path = regressions()
        .join("repack_dequantize/nf4-quant-state-shape-wraps-to-the-codes-count.safetensors");
    let err = dequantize_case(&std::fs::read(path).unwrap()).unwrap_err();
    let message = repack::error::with_causes(&err);
    assert!(message.contains("rows x cols overflows"), "{message}");
}
