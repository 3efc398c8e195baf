#!/usr/bin/env bash
# Runs a bundle made by gpu-bundle.sh on a GPU machine: every test binary
# (the CUDA tests run for real there), then the PyTorch comparison and
# `tensorcomm bench --backend cuda-comm` (default copy choice, then each
# method forced), then a summary.
# Usage: bash .gpu/gpu-run.sh [bundle dir, default: this script's folder]
# TENSORCOMM_SWEEP=1 adds the copy-tuning sweeps (threshold, streams);
# TENSORCOMM_GLOO=1 the CPU backend's comparison against PyTorch's Gloo,
# shaped by GLOO_OPS, GLOO_RANKS, GLOO_END, GLOO_FACTOR, GLOO_ITERS and
# GLOO_TRANSPORTS (defaults: all_reduce,broadcast at 2,4,8 ranks, 8 B to
# 64 MiB by 4, 50 iterations, shm,sym,tcp). TEST_THREADS (default 1) runs
# each test binary's tests that many at a time; TESTS=0 skips the test
# binaries, CUDA_BENCH=0 the cuda::comm benchmarks.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Tests that run up to 8 ranks as threads of one process, each on its own
# stream, need as many hardware queues (CUDA's default is 8).
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}"
dir="${1:-$(cd "$(dirname "$0")" && pwd)}"
export TENSORCOMM_CACHE_DIR="${TENSORCOMM_CACHE_DIR:-/tmp/tensorcomm-kernels}"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader || true
summary=()
for t in $([ "${TESTS:-1}" = 0 ] || echo "$dir"/test-*); do
  name="$(basename "$t")"
  log="$out/$name.log"
  "$t" --test-threads="${TEST_THREADS:-1}" --nocapture > "$log" 2>&1
  rc=$?
  res="$(grep -E '^test result:' "$log" | tail -1)"
  skips="$(grep -c 'test [^ ]* skipped: ' "$log")"
  summary+=("$name rc=$rc skipped=$skips $res")
  if [ $rc -ne 0 ]; then grep -E "panicked|FAILED|assert" "$log" | head -20; fi
done
if [ "${CUDA_BENCH:-1}" = 1 ]; then
  PYTHONUNBUFFERED=1 python3 "$dir/cuda_comm_torch.py" --json "$out/torch.json" > "$out/torch.log" 2>&1 \
    || { echo "torch bench failed"; tail -5 "$out/torch.log"; }
  sizes=1K,1M,256M,1G
  for copy in auto kernel ce; do
    TENSORCOMM_CUDA_COPY=$copy "$dir/tensorcomm" bench --backend cuda-comm --sizes $sizes \
      --torch "$out/torch.json" | tee "$out/bench-$copy.txt"
  done
fi
if [ "${TENSORCOMM_SWEEP:-0}" = 1 ]; then
  # Measurements behind the copy tuning (bench/results/NOTES.md).
  tc() { "$dir/tensorcomm" bench --backend cuda-comm --torch "$out/torch.json" --iters 10 "$@"; }
  {
    for copy in kernel ce; do
      echo "## single ranges, copy=$copy"
      TENSORCOMM_CUDA_COPY=$copy tc --op broadcast,scatter --sizes 1M,4M,16M,64M,256M
    done
    for n in 1 2 4; do
      echo "## copy engines over $n streams"
      TENSORCOMM_CUDA_COPY=ce TENSORCOMM_CUDA_CE_STREAMS=$n tc --op broadcast,scatter,gather --sizes 1G
    done
    for max in 0 4M; do
      echo "## one launch for calls up to $max"
      TENSORCOMM_CUDA_ONE_LAUNCH_MAX=$max tc --op gather,scatter --sizes 1K,64K,1M
    done
    for min in 1M 4M; do
      echo "## broadcast_coalesced with the copy engines from $min"
      TENSORCOMM_CUDA_CE_MIN=$min tc --op broadcast_coalesced
    done
  } 2>&1 | tee "$out/sweep.txt"
fi
if [ "${TENSORCOMM_GLOO:-0}" = 1 ]; then
  # The CPU backend against PyTorch's Gloo (bench/results/gloo-h200x2.txt).
  (cd "$dir" && python3 compare_gloo.py --tensorcomm ./tensorcomm \
    --ops "${GLOO_OPS:-all_reduce,broadcast}" --ranks "${GLOO_RANKS:-2,4,8}" -b 8 \
    -e "${GLOO_END:-64M}" -f "${GLOO_FACTOR:-4}" --iters "${GLOO_ITERS:-50}" --warmup 5 \
    --transports "${GLOO_TRANSPORTS:-shm,sym,tcp}" --json-out "$out/compare.jsonl") 2>&1 | tee "$out/compare.txt"
fi
echo "== summary =="
printf '%s\n' "${summary[@]}"
