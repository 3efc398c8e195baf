#!/usr/bin/env bash
# Builds the CUDA test binaries and the tensorcomm binary (release, stripped)
# into one folder (default .gpu, relative to the current directory), with
# gpu-run.sh and the PyTorch comparison script, ready to carry to a GPU
# machine:  scripts/gpu-bundle.sh /work/main/.gpu
# Test names after the folder keep only those test binaries (a smaller
# bundle); EXAMPLES="ddp_mlp" adds example binaries:
#   EXAMPLES=ddp_mlp scripts/gpu-bundle.sh .gpu-mg group_nccl group_nccl_ranks
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-.gpu}"
shift || true
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
cd "$root"
cargo build --release -p tensorcomm-cli
# The test executables cargo builds, one per test target, by name.
targets=(--tests)
if [ "$#" -gt 0 ]; then
  targets=()
  for t in "$@"; do targets+=(--test "$t"); done
fi
cargo test --release --no-run -p tensorcomm "${targets[@]}" --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' > "$dest/tests.txt"
rm -f "$dest"/test-*
while read -r name exe; do
  cp "$exe" "$dest/test-$name"
  strip "$dest/test-$name"
done < "$dest/tests.txt"
cp target/release/tensorcomm "$dest/tensorcomm"
strip "$dest/tensorcomm"
for e in ${EXAMPLES:-}; do
  cargo build --release -p tensorcomm --example "$e"
  cp "target/release/examples/$e" "$dest/$e"
  strip "$dest/$e"
done
git rev-parse --short HEAD > "$dest/REVISION"
cp scripts/gpu-run.sh scripts/gloo-ab.sh scripts/multi-gpu-run.sh bench/*.py bench/cpu_sweeps.sh "$dest/"
du -sh "$dest"
