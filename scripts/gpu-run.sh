#!/usr/bin/env bash
# Runs a bundle made by gpu-bundle.sh on a GPU machine: every test binary
# (the CUDA tests run for real there), then the PyTorch comparison and
# `tensorcomm bench-cuda` with both copy strategies, then a summary.
# Usage: bash .gpu/gpu-run.sh [bundle dir, default: this script's folder]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dir="${1:-$(cd "$(dirname "$0")" && pwd)}"
export TENSORCOMM_CACHE_DIR="${TENSORCOMM_CACHE_DIR:-/tmp/tensorcomm-kernels}"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader || true
summary=()
for t in "$dir"/test-*; do
  name="$(basename "$t")"
  log="$out/$name.log"
  "$t" --test-threads=1 --nocapture > "$log" 2>&1
  rc=$?
  res="$(grep -E '^test result:' "$log" | tail -1)"
  skips="$(grep -c '^skipped' "$log")"
  summary+=("$name rc=$rc skipped=$skips $res")
  if [ $rc -ne 0 ]; then grep -E "panicked|FAILED|assert" "$log" | head -20; fi
done
PYTHONUNBUFFERED=1 python3 "$dir/cuda_comm_torch.py" --json "$out/torch.json" > "$out/torch.log" 2>&1 \
  || { echo "torch bench failed"; tail -5 "$out/torch.log"; }
TENSORCOMM_CUDA_COPY=kernel "$dir/tensorcomm" bench-cuda --torch "$out/torch.json" --label "copy=kernel" | tee "$out/bench-kernel.txt"
TENSORCOMM_CUDA_COPY=ce "$dir/tensorcomm" bench-cuda --torch "$out/torch.json" --label "copy=ce" | tee "$out/bench-ce.txt"
echo "== summary =="
printf '%s\n' "${summary[@]}"
