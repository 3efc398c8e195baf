#!/usr/bin/env python3
"""PyTorch Gloo collectives timed the way `tensorcomm bench` times its own.

Starts N local ranks (torch.multiprocessing), runs one collective over a
range of message sizes, and prints one JSON object per size on stdout:
{"backend": "gloo", "op", "ranks", "dtype", "size_bytes", "count", "time_us"}.
time_us is the mean time of one call, the slowest rank's mean (as
nccl-tests reports). Used by bench/compare_gloo.py; runnable on its own:

    python3 bench/gloo_bench.py --op all_reduce -n 2 -b 8 -e 64M -f 2
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DTYPES = {
    "f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
    "bf16": torch.bfloat16, "i8": torch.int8, "u8": torch.uint8,
    "i32": torch.int32, "i64": torch.int64,
}


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
    # Enough calls to average out timer noise, few enough to finish quickly.
    return max(5, min(200, (64 << 20) // max(size, 1)))


def one_call(op, world, rank, tensor, outputs):
    if op == "all_reduce":
        dist.all_reduce(tensor)
    elif op == "broadcast":
        dist.broadcast(tensor, src=0)
    elif op == "reduce":
        dist.reduce(tensor, dst=0)
    elif op == "all_gather":
        dist.all_gather(outputs, tensor)
    elif op == "gather":
        dist.gather(tensor, gather_list=outputs if rank == 0 else None, dst=0)
    elif op == "scatter":
        dist.scatter(tensor, scatter_list=outputs if rank == 0 else None, src=0)
    elif op == "reduce_scatter":
        # Gloo has no reduce_scatter in PyTorch 2.x for all versions; use the
        # tensor form when present.
        dist.reduce_scatter_tensor(tensor.narrow(0, 0, tensor.numel() // world), tensor)
    elif op == "all_to_all":
        out = torch.empty_like(tensor)
        dist.all_to_all_single(out, tensor)
    elif op == "barrier":
        dist.barrier()
    else:
        raise SystemExit(f"unknown op {op}")


def rank_main(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    for size in sizes(parse_size(args.begin), parse_size(args.end), args.factor):
        count = max(size // elem, 1)
        if args.op in ("reduce_scatter", "all_to_all"):
            count = max(count // world, 1) * world
        tensor = (torch.arange(count) % 7).to(dtype)
        outputs = [torch.empty_like(tensor) for _ in range(world)]
        for _ in range(args.warmup):
            one_call(args.op, world, rank, tensor, outputs)
        n = iterations(size)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            one_call(args.op, world, rank, tensor, outputs)
        mean = (time.perf_counter() - start) / n
        slowest = torch.tensor([mean], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if rank == 0:
            queue.put({
                "backend": "gloo", "op": args.op, "ranks": world,
                "dtype": args.dtype, "size_bytes": count * elem, "count": count,
                "time_us": slowest.item() * 1e6,
            })
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="all_reduce")
    p.add_argument("-n", "--nproc", type=int, default=2)
    p.add_argument("-b", "--begin", default="8")
    p.add_argument("-e", "--end", default="64M")
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.nproc, port, args, queue))
             for r in range(args.nproc)]
    for proc in procs:
        proc.start()
    rows = []
    expected = len(list(sizes(parse_size(args.begin), parse_size(args.end), args.factor)))
    while len(rows) < expected:
        if not any(proc.is_alive() for proc in procs) and queue.empty():
            break
        try:
            rows.append(queue.get(timeout=1))
            print(json.dumps(rows[-1]), flush=True)
        except Exception:
            pass
    for proc in procs:
        proc.join()
    failed = [r for r, proc in enumerate(procs) if proc.exitcode != 0]
    if failed or len(rows) < expected:
        print(f"gloo_bench: ranks {failed} failed; {len(rows)}/{expected} sizes done", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
