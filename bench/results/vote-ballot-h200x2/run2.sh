cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 TENSORCOMM_CACHE_DIR=/tmp/k
T=$OUT/tests.txt
nvidia-smi -L > $T; cat REVISION >> $T
for t in test-intranode test-group_nccl test-group_cpu_cuda test-ddp_cuda test-cuda_comm test-group_nccl_ranks; do
  echo "== $t" >> $T; timeout 240 ./$t --test-threads 1 >> $T 2>&1; echo "rc=$?" >> $T
done
B=$OUT/bench.txt
timeout 100 ./tensorcomm bench --backend intranode -n 2 --dtype bf16 -b 8 -e 64M -f 8 --iters 50 --warmup 10 > $B 2>&1
echo finished
