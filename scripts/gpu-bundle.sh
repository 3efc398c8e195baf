#!/usr/bin/env bash
# Builds the CUDA test binaries and the tensorcomm binary (release, stripped)
# into one folder (default .gpu, relative to the current directory), with
# gpu-run.sh and the PyTorch comparison script, ready to carry to a GPU
# machine:  scripts/gpu-bundle.sh /work/main/.gpu
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-.gpu}"
mkdir -p "$dest"
dest="$(cd "$dest" && pwd)"
cd "$root"
cargo build --release -p tensorcomm-cli
# The test executables cargo builds, one per test target, by name.
cargo test --release --no-run -p tensorcomm --tests --message-format=json 2>/dev/null \
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
cp scripts/gpu-run.sh scripts/gloo-ab.sh bench/gloo_cuda_torch.py bench/nccl_torch.py bench/compare_nccl.py bench/cuda_comm_torch.py bench/compare_gloo.py bench/gloo_bench.py \
  bench/cpu_sweeps.sh "$dest/"
du -sh "$dest"
