#!/usr/bin/env python3
"""How fast the copy engines write into another process's GPU memory mapped
through PyTorch's symmetric memory (cuMem VMM allocations shared as POSIX
file descriptors): 256 MiB copied by rank 0 into rank 1's buffer, then by
both at once, CUDA events, medians of 10. Compare with ipc_copy_probe.py
(legacy CUDA IPC). Needs two GPUs:

    torchrun --nproc-per-node 2 bench/vmm_copy_probe.py
"""
import os, statistics
import torch, torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem

def timed(fn, iters=10):
    s = torch.cuda.current_stream()
    ts = []
    for i in range(iters + 2):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(s); fn(); b.record(s); s.synchronize()
        if i >= 2: ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)

rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
n = 256 << 20
t = symm_mem.empty(n, dtype=torch.uint8, device=f"cuda:{rank}")
h = symm_mem.rendezvous(t, dist.group.WORLD)
src = torch.ones(n, dtype=torch.uint8, device=f"cuda:{rank}")
peer = h.get_buffer(1 - rank, (n,), torch.uint8)
dist.barrier(); torch.cuda.synchronize()
for both in (False, True):
    dist.barrier(); torch.cuda.synchronize()
    if rank == 0 or both:
        us = timed(lambda: peer.copy_(src, non_blocking=True))
        print(f"rank {rank} {'both ways' if both else 'one way'}: peer.device={peer.device} {us:.1f} us {n / us / 1e3:.1f} GB/s", flush=True)
    dist.barrier(); torch.cuda.synchronize()
h.barrier()
dist.destroy_process_group()
