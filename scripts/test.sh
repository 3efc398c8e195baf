#!/usr/bin/env bash
# The project's test command (the README's, and what .ci/run runs): the Rust
# tests of the workspace, then the Python package built and its NumPy-level
# tests (scripts/test-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
bash scripts/test-python.sh
