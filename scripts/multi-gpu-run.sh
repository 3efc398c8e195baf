#!/usr/bin/env bash
# Issue 15's run on a machine with several GPUs, from a bundle made by
# gpu-bundle.sh: the GPU test binaries, then each comparison against PyTorch
# in the same call. STAGES picks and orders the parts (default: all of
# tests,cuda-comm,nccl-launch,nccl,intranode,cpu-cuda,gloo-cuda); RANKS the world sizes
# (default: 2 up to the GPU count, doubling). Each part's output goes to
# $OUT/<part>.txt (OUT defaults to /tmp).
#   STAGES=tests,nccl bash .gpu/multi-gpu-run.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-32}" PYTHONUNBUFFERED=1
# Every command gets at most LIMIT seconds (default 150), so one hang costs
# one part, not the run.
lim() { timeout -k 5 "${LIMIT:-150}" "$@" || echo "!! rc=$? from: $*"; }
dir="$(cd "$(dirname "$0")" && pwd)"
export TENSORCOMM_CACHE_DIR="${TENSORCOMM_CACHE_DIR:-/tmp/tensorcomm-kernels}"
out="${OUT:-/tmp}"
tc="$dir/tensorcomm"
gpus="$(nvidia-smi -L | wc -l)"
if [ -z "${RANKS:-}" ]; then
  RANKS=""
  n=2
  while [ "$n" -le "$gpus" ]; do RANKS="$RANKS $n"; n=$((n * 2)); done
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
nvidia-smi topo -m | head -"$((gpus + 1))"
git_rev="$(cat "$dir/REVISION" 2>/dev/null || echo unknown)"
echo "# build $git_rev, ranks:$RANKS"

stage_tests() {
  for t in "$dir"/test-*; do
    name="$(basename "$t")"
    timeout -k 5 "${LIMIT:-150}" "$t" --test-threads=1 --nocapture > "$out/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc skipped=$(grep -c '^skipped' "$out/$name.log") $(grep -E '^test result:' "$out/$name.log" | tail -1)"
    [ $rc -ne 0 ] && grep -E "panicked|FAILED|Error" "$out/$name.log" | head -20
  done
}

stage_cuda_comm() {
  lim python3 "$dir/cuda_comm_torch.py" --json "$out/torch-cuda-comm.json" > "$out/torch-cuda-comm.log" 2>&1 \
    || { echo "torch bench failed"; tail -5 "$out/torch-cuda-comm.log"; }
  lim "$tc" bench --backend cuda-comm --sizes 1K,1M,256M,1G --torch "$out/torch-cuda-comm.json"
}

stage_nccl() {
  for n in $RANKS; do
    (cd "$dir" && lim python3 compare_nccl.py --tensorcomm "$tc" --ranks "$n" \
      --ops all_reduce,broadcast,reduce,all_gather_into_tensor,reduce_scatter_tensor,all_to_all_single \
      -b 8 -e "${NCCL_END:-1G}" -f 8 --iters "${ITERS:-30}" --warmup 5 --json-out "$out/nccl-$n.jsonl")
  done
}

stage_nccl_launch() {
  # NCCL's own path (peer memory off): calls queued blocking, then each on
  # NCCL's own thread (the non-blocking communicator).
  for n in $RANKS; do
    for op in all_reduce broadcast all_gather_into_tensor; do
      for mode in blocking nonblocking; do
        echo "## $n ranks, $op, TENSORCOMM_NCCL_LAUNCH=$mode"
        TENSORCOMM_INTRANODE=off TENSORCOMM_NCCL_LAUNCH=$mode lim "$tc" bench --backend nccl \
          -n "$n" --op $op --sizes 8,4K,32K,1M --iters 20 --warmup 5 | grep -v '^#'
      done
    done
  done
}

stage_intranode() {
  for n in $RANKS; do
    echo "## quick: ours, then PyTorch's, $n ranks"
    LIMIT=60 lim "$tc" bench --backend intranode -n "$n" --sizes 8,1M --iters 10 --warmup 2
    LIMIT=90 lim "$tc" run --nproc-per-node "$n" -- python3 "$dir/intranode_torch.py" --sizes 8,1M --iters 10 --warmup 2
    (cd "$dir" && lim python3 compare_intranode.py --tensorcomm "$tc" --ranks "$n" \
      --sizes "${SIZES:-8,1K,16K,64K,256K,1M,4M,16M,64M,256M,1G}" --iters "${ITERS:-30}" --warmup 5)
    for algo in one_shot two_shot; do
      echo "## forced $algo, $n ranks"
      TENSORCOMM_INTRANODE_ALGO=$algo lim "$tc" bench --backend intranode -n "$n" \
        --sizes 8,16K,64K,256K,1M,4M,16M,64M --iters "${ITERS:-30}" --warmup 5
    done
    for v in "$dir"/tensorcomm-b*; do
      [ -x "$v" ] || continue
      for algo in one_shot two_shot; do
        echo "## variant $(basename "$v"), forced $algo, $n ranks"
        TENSORCOMM_INTRANODE_ALGO=$algo lim "$v" bench --backend intranode -n "$n" \
          --sizes 64K,1M,4M,16M,64M --iters "${ITERS:-30}" --warmup 5
      done
    done
  done
}

stage_cpu_cuda() {
  for n in $RANKS; do
    echo "## $n ranks: staged through host memory"
    lim "$tc" bench --op all_reduce --backend cpu --device cuda -n "$n" --sizes 8,64K,1M,16M,64M --iters 20 --warmup 5
    echo "## $n ranks: device path (--peer-memory)"
    lim "$tc" bench --op all_reduce --backend cpu --device cuda -n "$n" --sizes 8,64K,1M,16M,64M --iters 20 --warmup 5 --peer-memory
  done
}

stage_gloo_cuda() {
  (cd "$dir" && lim python3 compare_gloo.py --device cuda --tensorcomm "$tc" \
    --ranks "$(echo $RANKS | tr ' ' ,)" --transports shm -b 8 -e 256M -f 8 --iters 20 --warmup 5 \
    --json-out "$out/gloo-cuda.jsonl")
}

for s in $(echo "${STAGES:-tests,cuda-comm,nccl-launch,nccl,intranode,cpu-cuda,gloo-cuda}" | tr , ' '); do
  echo "=== $s ($(date +%T))"
  "stage_${s//-/_}" 2>&1 | tee "$out/$s.txt"
done
echo "=== done ($(date +%T))"
