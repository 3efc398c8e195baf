#!/usr/bin/env bash
# Stop 40 call 10: the overlap flag in PeerArgs (gate only when launched
# programmatically); tests and A/B against 7bc9cd8 (old) and overlap off.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 TENSORCOMM_CACHE_DIR=/tmp/k
d=.gpu-x2
for t in intranode group_nccl group_cpu_cuda ddp_cuda; do
  timeout 200 $d/test-$t --test-threads 1 >> $OUT/call10-tests.txt 2>&1
  echo "$t rc=$? $(grep -E '^test result' $OUT/call10-tests.txt | tail -1)"
done
grep -E "overlap_their|FAILED|panicked|skipped: " $OUT/call10-tests.txt | head -8
for r in 1 2 3; do
  for v in new old off; do
    case $v in
      new) bin=$d/tensorcomm; env=;;
      old) bin=$d/tensorcomm-old; env=;;
      off) bin=$d/tensorcomm; env=TENSORCOMM_INTRANODE_OVERLAP=0;;
    esac
    echo "== $v r$r" >> $OUT/call10-ab.txt
    env $env timeout 60 $bin bench --backend intranode -n 2 --dtype bf16 --sizes 8,1K,16K,64K,256K,1M --iters 50 --warmup 10 >> $OUT/call10-ab.txt 2>&1 || echo "$v r$r failed"
  done
done
awk '/^==/{printf "\n%s ", $0} /^ +[0-9]/{printf "%s:%s/%s ", $1, $5, $9}' $OUT/call10-ab.txt; echo
