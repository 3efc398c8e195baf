#!/usr/bin/env bash
# Stop 40 call 8: overlap (programmatic dependent launches) tests and A/B.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 TENSORCOMM_CACHE_DIR=/tmp/k
d=.gpu-x2
for t in intranode group_nccl group_cpu_cuda ddp_cuda; do
  timeout 200 $d/test-$t --test-threads 1 > $OUT/test-$t.txt 2>&1
  echo "$t rc=$? $(grep -E '^test result' $OUT/test-$t.txt | tail -1) skipped=$(grep -c 'skipped: ' $OUT/test-$t.txt)"
done
grep -E "overlap_their|FAILED|panicked" $OUT/test-intranode.txt | head -5
sizes=8,1K,16K,64K,256K,1M,4M,16M
for r in 1 2 3; do
  for v in new old off; do
    case $v in
      new) bin=$d/tensorcomm; env=;;
      old) bin=$d/tensorcomm-old; env=;;
      off) bin=$d/tensorcomm; env=TENSORCOMM_INTRANODE_OVERLAP=0;;
    esac
    env $env timeout 60 $bin bench --backend intranode -n 2 --dtype bf16 --sizes $sizes --iters 50 --warmup 10 > $OUT/ab-$v-r$r.txt 2>&1 || echo "$v r$r failed"
  done
done
for v in new old off; do echo "== $v"; for r in 1 2 3; do grep -E "^ +[0-9]" $OUT/ab-$v-r$r.txt | awk '{printf "%s:%s/%s ", $1, $5, $9}'; echo; done; done
timeout 150 python3 bench/compare_intranode.py --tensorcomm $d/tensorcomm --ranks 2 --sizes 8,1K,16K,64K,256K,1M,4M,16M,64M,256M,1G --iters 30 --warmup 5 > $OUT/compare-intranode-n2.txt 2>&1; echo compare rc=$?
