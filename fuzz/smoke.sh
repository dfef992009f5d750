#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 20) from a fixed seed, starting
# from the repository's own files (read, never written): fuzz/seeds/<target>/, the kept
# regressions crates/*/tests/data/fuzz-regressions/<target>/, and the fixtures listed below.
# Fails on the first crash, hang (-timeout) or runaway memory (-rss_limit_mb, and the
# allocation limit in fuzz/src/lib.rs); libFuzzer then prints the input and saves it under
# fuzz/artifacts/<target>/.
# Usage (from anywhere): fuzz/smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"

# Fixtures that make good starting points, beyond the seeds and regressions found by name.
fixtures() {
  case "$1" in
    repack_npy) echo crates/repack/tests/data/formats/inputs ;;
    repack_checkpoint) echo crates/repack/tests/data/formats/library ;;
    repack_inspect | repack_dequantize) echo crates/repack/tests/data/formats ;; # all of it: libFuzzer reads directories recursively
    runner_protocol | audit_protocol) echo experiments/packed-kv experiments/widths-and-modes ;;
    quality_protocol) echo experiments/model-quality ;;
    audit_npz) echo crates/audit/tests/data/npz ;;
    audit_quality_protocol) echo experiments/model-quality ;;
  esac
}

# Without sanitizers, so that the stable toolchain builds it (-Zsanitizer is nightly-only).
# At opt-level 1 rather than cargo-fuzz's release default of 3: on 2 cores the twelve targets
# built in 164 s rather than 218 s, and a target still ran about 110,000 inputs a second
# (audit_npz), plenty for a smoke run. Exported, so that `cargo fuzz run` below finds this build
# rather than making another; `cargo fuzz run` by hand keeps opt-level 3 for long runs.
export CARGO_PROFILE_RELEASE_OPT_LEVEL=1
cargo fuzz build -s none
for target in $(cargo fuzz list); do
  seeds=()
  for dir in "fuzz/seeds/$target" crates/*/tests/data/fuzz-regressions/"$target" $(fixtures "$target"); do
    if [ -d "$dir" ]; then seeds+=("$dir"); fi
  done
  # The first directory is the one libFuzzer adds new inputs to (ignored by git).
  mkdir -p "fuzz/corpus/$target"
  echo "fuzz: $target for ${seconds}s from ${seeds[*]:-nothing}"
  cargo fuzz run -s none "$target" "fuzz/corpus/$target" "${seeds[@]}" -- \
    -max_total_time="$seconds" -seed=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
