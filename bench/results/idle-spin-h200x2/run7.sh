cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TENSORCOMM_CACHE_DIR=/tmp/k
B=$OUT/bench.txt; G=$OUT/gloo.txt
nvidia-smi -L > $B; nproc >> $B; cat REVISION >> $B
for i in 1 2 3 4 5; do for b in tensorcomm tensorcomm-ed9; do for n in 2 4; do
  echo "== $b staged n$n $i" >> $B; timeout 60 ./$b bench --op all_reduce --backend cpu --device cuda -n $n -b 1M -e 16M -f 2 --median --iters 30 --warmup 5 2>&1 | grep -v "^\[\|WARN" >> $B
done; done; done
timeout 240 python3 compare_gloo.py --device cuda --tensorcomm ./tensorcomm --ops all_reduce --ranks 2,4 -b 8 -e 16M -f 4 --iters 30 --warmup 5 --transports shm > $G 2>&1
echo finished
