cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 TENSORCOMM_CACHE_DIR=/tmp/k
B=$OUT/bench.txt; T=$OUT/tests.txt
nvidia-smi -L > $B; nproc >> $B; cat REVISION >> $B
for i in 1 2 3; do for b in tensorcomm tensorcomm-ed9; do
  for n in 2 8; do echo "== $b host n$n $i" >> $B; timeout 60 ./$b bench --op all_reduce --backend cpu -n $n -b 8 -e 1M -f 8 --median --iters 500 --warmup 50 2>&1 | grep -v "^\[" >> $B; done
  echo "== $b device-path n2 $i" >> $B; timeout 60 ./$b bench --op all_reduce --backend cpu --device cuda --peer-memory -n 2 -b 8 -e 16M -f 4 --median --iters 200 --warmup 20 2>&1 | grep -v "^\[\|WARN" >> $B
done; done
for i in 1 2; do echo "== intranode $i" >> $B; timeout 60 ./tensorcomm bench --backend intranode -n 2 -b 8 -e 16M -f 4 --iters 200 --warmup 20 2>&1 | grep -v "^\[" >> $B; done
echo "== lib-tests" >> $T; timeout 120 ./lib-tests --test-threads 8 2>&1 | grep -E "test result|FAILED|panicked" >> $T
for t in test-group_cpu_cuda test-ddp_cuda; do echo "== $t" >> $T; timeout 150 ./$t --test-threads 1 2>&1 | grep -E "test result|FAILED|panicked" >> $T; done
echo finished
