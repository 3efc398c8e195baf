cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_DEVICE_MAX_CONNECTIONS=32 TENSORCOMM_CACHE_DIR=/tmp/k
O=$OUT/costs.txt; B=$OUT/bench.txt; T=$OUT/tests.txt
nvidia-smi -L > $O; nproc >> $O; cat REVISION >> $O
for i in 1 2 3; do for b in device_path_costs device_path_costs-old; do
  echo "== $b $i" >> $O; timeout 120 ./tensorcomm run --nproc-per-node 2 -- ./$b >> $O 2>&1
done; done
for i in 1 2 3; do for b in tensorcomm tensorcomm-old; do
  echo "== $b $i" >> $B; timeout 120 ./$b bench --op all_reduce --backend cpu --device cuda --peer-memory -n 2 -b 8 -e 16M -f 4 --median --iters 200 --warmup 20 >> $B 2>&1
done; done
for i in 1 2; do echo "== intranode $i" >> $B; timeout 120 ./tensorcomm bench --backend intranode -n 2 -b 8 -e 16M -f 4 --iters 200 --warmup 20 >> $B 2>&1; done
for t in test-group_cpu_cuda test-ddp_cuda; do echo "== $t" >> $T; timeout 300 ./$t --test-threads 1 >> $T 2>&1; done
echo "== lib ballot vote_tests" >> $T; timeout 120 ./lib-tests --test-threads 2 ballot vote_tests >> $T 2>&1
echo finished
