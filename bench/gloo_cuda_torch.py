#!/usr/bin/env python3
"""PyTorch's Gloo backend on CUDA tensors, timed per call.

Starts N local ranks (torch.multiprocessing); rank r's tensors are on
cuda:(r % GPUs) (ranks may share a GPU). For each size it times
all_reduce of f32 CUDA tensors one call at a time: `work.wait()` then
`torch.cuda.synchronize()` (so each call includes Gloo's copies to the
host and back), and prints one JSON object per size on stdout:
{"backend": "gloo", "device": "cuda", "op", "ranks", "dtype", "size",
"size_bytes", "count", "time_us"}, time_us being the median call of the
slowest rank (the maximum over ranks of each rank's median). This is the
PyTorch side of `tensorcomm bench --backend cpu --device cuda`;
bench/compare_gloo.py --device cuda runs both and prints the ratios:

    python3 bench/gloo_cuda_torch.py -n 2 -b 8 -e 256M -f 2
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {"f32": torch.float32, "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().rstrip("b")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def sizes(begin, end, factor):
    size = begin
    while size <= end:
        yield size
        size *= factor


def iterations(size):
    # Enough calls for a stable median, few enough to finish quickly.
    return max(5, min(100, (256 << 20) // max(size, 1)))


def rank_main(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    for size in sizes(parse_size(args.begin), parse_size(args.end), args.factor):
        count = max(size // elem, 1)
        tensor = (torch.arange(count, device=device) % 7).to(dtype)

        def once():
            start = time.perf_counter()
            dist.all_reduce(tensor, async_op=True).wait()
            torch.cuda.synchronize()
            return time.perf_counter() - start

        for _ in range(args.warmup):
            once()
        dist.barrier()
        median = statistics.median(once() for _ in range(iterations(size)))
        slowest = torch.tensor([median], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            queue.put({
                "backend": "gloo", "device": "cuda", "op": "all_reduce", "ranks": world,
                "dtype": args.dtype, "size": count * elem, "size_bytes": count * elem,
                "count": count, "time_us": slowest.item() * 1e6,
            })
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="all_reduce", choices=["all_reduce"])
    p.add_argument("-n", "--nproc", type=int, default=2)
    p.add_argument("-b", "--begin", default="8")
    p.add_argument("-e", "--end", default="256M")
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("no CUDA device: this script times Gloo on CUDA tensors")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.nproc, port, args, queue))
             for r in range(args.nproc)]
    for proc in procs:
        proc.start()
    expected = len(list(sizes(parse_size(args.begin), parse_size(args.end), args.factor)))
    rows = 0
    while rows < expected:
        if not any(proc.is_alive() for proc in procs) and queue.empty():
            break
        try:
            row = queue.get(timeout=1)
        except Exception:  # queue.Empty: check the ranks again
            continue
        print(json.dumps(row), flush=True)
        rows += 1
    for proc in procs:
        proc.join()
    failed = [r for r, proc in enumerate(procs) if proc.exitcode != 0]
    if failed or rows < expected:
        print(f"gloo_cuda_torch: ranks {failed} failed, {rows} of {expected} rows",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
