#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 20) from a fixed seed, starting
# from the repository's own files (read, never written): the format fixtures and the kept
# regression inputs. Fails on the first crash, hang (-timeout) or runaway memory (-rss_limit_mb);
# libFuzzer then prints the input and saves it under fuzz/artifacts/<target>/.
# Usage (from anywhere): fuzz/smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
data=crates/repack/tests/data

# Each target, then the directories of inputs it starts from.
targets=(
  "repack_npy $data/formats/inputs $data/fuzz-regressions/repack_npy"
  "repack_checkpoint $data/formats/library $data/fuzz-regressions/repack_checkpoint"
  "repack_blockfile fuzz/seeds/repack_blockfile $data/fuzz-regressions/repack_blockfile"
  "runner_protocol experiments/packed-kv experiments/widths-and-modes"
)

# Without sanitizers, so that the stable toolchain builds it (-Zsanitizer is nightly-only).
cargo fuzz build -s none
for entry in "${targets[@]}"; do
  read -r target seeds <<<"$entry"
  # The first directory is the one libFuzzer adds new inputs to (ignored by git).
  mkdir -p "fuzz/corpus/$target"
  echo "fuzz: $target for ${seconds}s"
  # shellcheck disable=SC2086 # $seeds is a list of directories
  cargo fuzz run -s none "$target" "fuzz/corpus/$target" $seeds -- \
    -max_total_time="$seconds" -seed=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
