#!/usr/bin/env python3
"""PyTorch's intra-node all-reduce, timed as `tensorcomm bench --backend
intranode` times tensorcomm's: symmetric memory's one-shot
(`torch.ops.symm_mem.one_shot_all_reduce_out`) and two-shot
(`two_shot_all_reduce_`), and NCCL's all_reduce when every rank has its own
GPU. Run one process per rank with the torchrun environment, e.g.

    tensorcomm run --nproc-per-node 2 -- python3 bench/intranode_torch.py --sizes 8,1M

For each size: one call checked (rank r's input all r + 1), then --iters
calls after --warmup, each after a device copy of a fresh input into the
symmetric buffer, timed with CUDA events around the call alone; and a CUDA
graph of 20 calls replayed (its time over 20). Calls are queued behind a
sleeping kernel (`torch.cuda._sleep`) in batches of 25, so the device runs
them back to back, as tensorcomm's bench gates its stream. Rank 0 prints one JSON line
per (impl, size) with the slowest rank's medians: {"impl", "size",
"time_us", "graph_us", "correct"} or {"impl", "size", "error"}.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist

GRAPH_CALLS = 20
BATCH = 25
# About 25 ms of a spinning kernel: time for every rank to queue a batch.
GATE_CYCLES = 50_000_000


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8,1K,16K,256K,1M,4M,16M,64M")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--impls", default="one_shot,two_shot,nccl")
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    distinct = world <= torch.cuda.device_count()
    dist.init_process_group("nccl" if distinct else "gloo", device_id=device if distinct else None)
    cpu_group = dist.new_group(backend="gloo")
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    stream = torch.cuda.Stream(device)
    torch.cuda.set_stream(stream)
    want = world * (world + 1) / 2

    def emit(row):
        if rank == 0:
            print(json.dumps(row), flush=True)

    import torch.distributed._symmetric_memory as symm_mem
    group_name = dist.group.WORLD.group_name

    for impl in a.impls.split(","):
        if impl == "nccl" and not distinct:
            emit({"impl": impl, "size": 0, "error": "NCCL needs one GPU per rank"})
            continue
        for size in map(parse_size, a.sizes.split(",")):
            n = max(size // torch.tensor([], dtype=dtype).element_size(), 1)
            try:
                fresh = torch.full((n,), float(rank + 1), dtype=dtype, device=device)
                if impl == "nccl":
                    buf = torch.empty(n, dtype=dtype, device=device)
                    out = buf

                    def call():
                        dist.all_reduce(buf)
                else:
                    buf = symm_mem.empty(n, dtype=dtype, device=device)
                    symm_mem.rendezvous(buf, group_name)
                    out = torch.empty_like(buf) if impl == "one_shot" else buf

                    if impl == "one_shot":
                        def call():
                            torch.ops.symm_mem.one_shot_all_reduce_out(buf, "sum", group_name, out)
                    else:
                        def call():
                            torch.ops.symm_mem.two_shot_all_reduce_(buf, "sum", group_name)
                out.fill_(-7.0)
                buf.copy_(fresh)
                call()
                torch.cuda.synchronize()
                correct = bool((out.float() == want).all().item())
                # Queued behind a sleeping kernel in batches, as tensorcomm's
                # bench gates its stream, so the device runs the calls back
                # to back rather than at Python's pace.
                times = []
                done = 0
                while done < a.warmup + a.iters:
                    batch = min(BATCH, a.warmup + a.iters - done)
                    dist.barrier(group=cpu_group)
                    torch.cuda._sleep(GATE_CYCLES)
                    for _ in range(batch):
                        buf.copy_(fresh)
                        if out is not buf:
                            out.fill_(-7.0)
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        call()
                        e.record()
                        times.append((s, e))
                    torch.cuda.synchronize()
                    done += batch
                correct &= bool((out.float() == want).all().item())
                eager = statistics.median(s.elapsed_time(e) * 1e3 for s, e in times[a.warmup:])
                graph_us = float("nan")
                try:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, stream=stream):
                        for _ in range(GRAPH_CALLS):
                            call()
                    reps = []
                    dist.barrier(group=cpu_group)
                    torch.cuda._sleep(GATE_CYCLES)
                    for i in range(a.warmup + max(a.iters // GRAPH_CALLS, 5)):
                        buf.copy_(fresh)
                        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        s.record()
                        g.replay()
                        e.record()
                        reps.append((s, e))
                    torch.cuda.synchronize()
                    reps = [s.elapsed_time(e) * 1e3 / GRAPH_CALLS for s, e in reps[a.warmup:]]
                    graph_us = statistics.median(reps)
                except Exception as err:  # graphs are a second measurement
                    if rank == 0:
                        print(f"# {impl} {size}: graph capture failed: {err}", flush=True)
                agreed = torch.tensor([eager, graph_us, 0.0 if correct else 1.0], dtype=torch.float64)
                dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=cpu_group)
                v = agreed.tolist()
                emit({"impl": impl, "size": n * fresh.element_size(), "time_us": v[0],
                      "graph_us": v[1], "correct": v[2] == 0.0})
            except Exception as err:
                emit({"impl": impl, "size": size, "error": f"{type(err).__name__}: {err}"[:300]})
    torch.cuda.synchronize()
    dist.barrier(group=cpu_group)
    # Tearing down a group that holds symmetric memory hung at exit on a
    # 2-GPU host (PyTorch 2.11): every result is out, so leave at once.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
