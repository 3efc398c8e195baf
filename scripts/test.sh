#!/usr/bin/env bash
# The project's test command (the README's, and what .ci/run runs): the Rust
# tests of the workspace, short libFuzzer runs of the fuzz targets
# (scripts/fuzz-smoke.sh), then the Python package built and its
# NumPy-level tests (scripts/test-python.sh). At the end (pass or fail) it prints how
# many Rust tests skipped and why (scripts/skip-tally.sh): cargo counts a
# skipped test as passed. Its exit status is the tests'.
set -euo pipefail
cd "$(dirname "$0")/.."

# Cargo's stderr (its progress, and the line each skipping test writes)
# goes through tee into a log for the tally; stdout is untouched.
log="$(mktemp)"
trap 'bash scripts/skip-tally.sh "$log"; rm -f "$log"' EXIT
colour=()
if [ -t 2 ]; then
  colour=(--color always)
fi
status=0
{ cargo test ${colour[@]+"${colour[@]}"} --workspace --locked 2>&1 1>&3 3>&- | tee "$log" >&2; } 3>&1 || status=$?
if [ "$status" != 0 ]; then
  exit "$status"
fi
# Short libFuzzer runs of every fuzz target (its skip line, if any, goes
# into the tally too).
{ bash scripts/fuzz-smoke.sh 2>&1 1>&3 3>&- | tee -a "$log" >&2; } 3>&1 || status=$?
if [ "$status" != 0 ]; then
  exit "$status"
fi
bash scripts/test-python.sh
