"""dist.all_reduce and dist.broadcast through PyTorch on backend="tensorcomm"
against backend="gloo", in the same run, with the ratios.

    torchrun --standalone --nproc-per-node 4 bench/python_backend.py
    tensorcomm run --nproc-per-node 4 -- python3 bench/python_backend.py

Each rank holds a default group of backend "tensorcomm" and a Gloo group of
the same ranks. For each op and size (float32, 8 B to 64 MiB, x4 steps)
both groups run the same calls, alternating which goes first per size:
warm-up calls, then timed calls, each a synchronous torch.distributed call
on a zero tensor (repeated sums stay finite); the time is the slowest
rank's mean per call, and with --rounds R each column is measured R times
(the rounds of the columns interleaved) and its best round is kept, for
noisy machines. A third column times the same collective on the same
tensorcomm group called natively, as a synchronous torch.distributed call
runs it (one blocking native call on a prepared descriptor: no
torch.distributed, no Python ProcessGroup, no Work): the difference to the
first column is the cost of Python dispatch.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import tensorcomm.torch  # noqa: F401  registers "tensorcomm"
from tensorcomm.torch import _desc


def sizes(lo, hi, factor):
    s = lo
    while s <= hi:
        yield s
        s *= factor


def human(n):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div}{unit}"
    return f"{n}B"


def time_calls(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def slowest(seconds, gloo):
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-b", "--min-bytes", type=int, default=8)
    ap.add_argument("-e", "--max-bytes", type=int, default=64 << 20)
    ap.add_argument("-f", "--factor", type=int, default=4)
    ap.add_argument("--ops", default="all_reduce,broadcast")
    ap.add_argument("--rounds", type=int, default=1, help="measure each column this many times, keep the best")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per measurement (default: by size, at most 300)")
    args = ap.parse_args()

    dist.init_process_group("tensorcomm")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    native = dist.distributed_c10d._get_default_group()._group
    if rank == 0:
        print(f"# python_backend: {args.ops} (all_reduce: reduce op SUM), {world} ranks, "
              f"torch {torch.__version__}, float32, {os.cpu_count()} cpus; times in us: the "
              "slowest rank's mean per synchronous call (dist.<op>(t, group=...), host clock "
              "around the timed loop; native = the extension's call and wait())")
        print(f"{'op':<11}{'size':>8}{'tensorcomm':>12}{'gloo':>12}{'ratio':>8}{'native':>10}{'dispatch':>10}")
    for op in args.ops.split(","):
        for i, nbytes in enumerate(sizes(args.min_bytes, args.max_bytes, args.factor)):
            numel = max(1, nbytes // 4)
            t = torch.zeros(numel)
            iters = args.iters or max(5, min(300, (256 << 20) // max(nbytes, 1) // max(world, 1)))
            warmup = max(2, iters // 10)
            if op == "all_reduce":
                def call(group):
                    return lambda: dist.all_reduce(t, group=group)
                desc = _desc(t, "bench")
                native_call = lambda: native.all_reduce(desc, 0, 1.0, None, t, True).wait()  # noqa: E731
            elif op == "broadcast":
                def call(group):
                    return lambda: dist.broadcast(t, src=0, group=group)
                desc = _desc(t, "bench")
                native_call = lambda: native.broadcast(desc, 0, None, t, True).wait()  # noqa: E731
            else:
                raise SystemExit(f"unknown op {op!r} (all_reduce, broadcast)")
            order = [("tensorcomm", call(None)), ("gloo", call(gloo))]
            if i % 2:
                order.reverse()
            order.append(("native", native_call))
            measured = {}
            for _ in range(max(1, args.rounds)):
                for name, fn in order:
                    dist.barrier(group=gloo)
                    took = slowest(time_calls(fn, iters, warmup), gloo)
                    measured[name] = min(measured.get(name, took), took)
            if rank == 0:
                tc, gl, nat = (measured[k] * 1e6 for k in ("tensorcomm", "gloo", "native"))
                print(f"{op:<11}{human(nbytes):>8}{tc:>12.1f}{gl:>12.1f}{tc / gl:>8.2f}{nat:>10.1f}{tc - nat:>10.1f}",
                      flush=True)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
