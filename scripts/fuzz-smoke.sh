#!/usr/bin/env bash
# Short libFuzzer runs of every fuzz target in fuzz/ (part of the README's
# test command, so CI runs them): builds the fuzz crate with libFuzzer's
# coverage instrumentation on the stable toolchain (what `cargo fuzz build
# -s none` does, without needing nightly or cargo-fuzz), then runs each
# target for FUZZ_SMOKE_SECS seconds (default 10) from its seed corpus.
# New inputs go to a temporary folder, so the repository is not written;
# a crash, a leak or an input over the memory limits fails the run, with
# the input saved under fuzz/artifacts/ and the target's output printed.
#
# Needs a C++ compiler (`c++`) to build libFuzzer itself: without one it
# says so with a skip line (counted by scripts/skip-tally.sh) and exits 0;
# the fuzz targets' bodies still run through the stable mutation harness
# of `cargo test` (crates/tensorcomm/tests/fuzz_smoke.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${FUZZ_SMOKE_SECS:-10}"
if ! command -v c++ > /dev/null; then
  echo "test fuzz_smoke_libfuzzer skipped: no C++ compiler (c++) to build libFuzzer" >&2
  exit 0
fi
host="$(rustc -vV | sed -n 's/^host: //p')"
# As cargo-fuzz instruments (sanitizer none); --target keeps the flags off
# build scripts and proc macros.
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
flags+=" -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares"
flags+=" -Cdebug-assertions -Coverflow-checks"
echo "fuzz smoke: building the fuzz targets (libFuzzer, $host)" >&2
RUSTFLAGS="$flags" cargo build --manifest-path fuzz/Cargo.toml --release --locked \
  --target "$host" --bins --quiet
bin_dir="fuzz/target/$host/release"
targets="$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^tensorcomm-fuzz$')"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p fuzz/artifacts
failed=0
for target in $targets; do
  mkdir -p "$work/$target"
  log="$work/$target.log"
  if "$bin_dir/$target" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=256 \
      -artifact_prefix="fuzz/artifacts/$target-" -print_final_stats=1 \
      "$work/$target" "fuzz/corpus/$target" > "$log" 2>&1; then
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
    echo "fuzz smoke: $target: ${runs:-?} executions in ${secs} s, nothing found" >&2
  else
    failed=1
    echo "fuzz smoke: $target FAILED; its output ends:" >&2
    tail -n 40 "$log" >&2
  fi
done
exit "$failed"
