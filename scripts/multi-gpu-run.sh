#!/usr/bin/env bash
# Issue 15's run on a machine with several GPUs, from a bundle made by
# gpu-bundle.sh: the GPU test binaries, then each comparison against PyTorch
# in the same call. STAGES picks and orders the parts (default: all of
# tests,cuda-comm,nccl-launch,nccl,intranode,cpu-cuda,gloo-cuda,ddp,faults); RANKS the world sizes
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
    echo "$name rc=$rc skipped=$(grep -c 'test [^ ]* skipped: ' "$out/$name.log") $(grep -E '^test result:' "$out/$name.log" | tail -1)"
    [ $rc -ne 0 ] && grep -E "panicked|FAILED|Error" "$out/$name.log" | head -20
  done
}

stage_cuda_comm() {
  # Every GPU count of RANKS (GPUs of this one process); from 3 GPUs also
  # with the chain off (every copy from the root), the fan-out baseline.
  for n in $RANKS; do
    echo "## $n GPUs: PyTorch, then tensorcomm"
    lim python3 "$dir/cuda_comm_torch.py" --gpus "$n" --sizes "${CC_SIZES:-1024,1048576,4194304,16777216,67108864,268435456,1073741824}" \
      --json "$out/torch-cuda-comm-$n.json" > "$out/torch-cuda-comm-$n.log" 2>&1 \
      || { echo "torch bench failed"; tail -5 "$out/torch-cuda-comm-$n.log"; }
    lim "$tc" bench --backend cuda-comm -n "$n" --sizes "${CC_SIZES:-1K,1M,4M,16M,64M,256M,1G}" --torch "$out/torch-cuda-comm-$n.json"
    if [ "$n" -ge 3 ]; then
      echo "## $n GPUs, TENSORCOMM_CUDA_CHAIN_MIN=off"
      TENSORCOMM_CUDA_CHAIN_MIN=off lim "$tc" bench --backend cuda-comm -n "$n" --op broadcast,reduce_add,broadcast_coalesced \
        --sizes "${CC_SIZES:-1K,1M,4M,16M,64M,256M,1G}" --torch "$out/torch-cuda-comm-$n.json"
      for chunk in ${CHAIN_CHUNKS:-2M 8M 32M}; do
        echo "## $n GPUs, TENSORCOMM_CUDA_CHAIN_MIN=1M TENSORCOMM_CUDA_CHAIN_CHUNK=$chunk"
        TENSORCOMM_CUDA_CHAIN_MIN=1M TENSORCOMM_CUDA_CHAIN_CHUNK=$chunk lim "$tc" bench --backend cuda-comm -n "$n" \
          --op broadcast,reduce_add --sizes 4M,16M,64M,256M,1G --torch "$out/torch-cuda-comm-$n.json" | grep -v '^#'
      done
    fi
  done
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
    for algo in ${ALGOS:-push one_shot two_shot}; do
      echo "## forced $algo, $n ranks"
      TENSORCOMM_INTRANODE_ALGO=$algo lim "$tc" bench --backend intranode -n "$n" \
        --sizes "${FORCED_SIZES:-8,16K,64K,256K,1M,4M,16M,64M}" --iters "${ITERS:-30}" --warmup 5
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

stage_ddp() {
  # The data-parallel example (the losses and checksums must match the
  # host run's), then the ddp bench over NCCL with the all-reduce and
  # no-op hooks (exposed communication is the difference of their tails).
  for n in $RANKS; do
    for a in "" "--device cuda --backend nccl" "--device cuda --backend nccl --hook fp16"; do
      echo "## ddp_mlp, $n ranks: $a"
      lim "$tc" run --nproc-per-node "$n" -- "$dir/ddp_mlp" --steps 20 $a 2>&1 | grep -E "step +(0|19) |checksum" | sort -u
    done
    for hook in allreduce noop; do
      lim "$tc" bench --op ddp -n "$n" --device cuda --backend nccl --hook "$hook" --iters 20 --warmup 3
    done
  done
}

stage_faults() {
  # The fault-injection suite on NCCL at the GPU count (one rank a GPU).
  TENSORCOMM_BIN="$tc" TENSORCOMM_FAULT_SCENARIOS="${FAULT_SCENARIOS:-8}" LIMIT="${FAULT_LIMIT:-200}" \
    lim "$dir/fault_injection" --exact fault_injection_on_nccl --nocapture 2>&1 | grep -E "^fault|test result|panicked"
}

for s in $(echo "${STAGES:-tests,cuda-comm,nccl-launch,nccl,intranode,cpu-cuda,gloo-cuda,ddp,faults}" | tr , ' '); do
  echo "=== $s ($(date +%T))"
  "stage_${s//-/_}" 2>&1 | tee "$out/$s.txt"
done
echo "=== done ($(date +%T))"
