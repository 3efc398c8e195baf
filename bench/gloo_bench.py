#!/usr/bin/env python3
"""PyTorch Gloo collectives timed the way `tensorcomm bench` times its own.

Starts N local ranks (torch.multiprocessing), runs one collective over a
range of message sizes, and prints one JSON object per size on stdout:
{"backend": "gloo", "op", "ranks", "dtype", "size_bytes", "count", "time_us"}.
time_us is the mean time of one call, the slowest rank's mean (as
nccl-tests reports). Reducing ops use SUM; the in-place ones (all_reduce,
reduce, reduce_scatter) time zero inputs, which repeated sums keep finite. Used by bench/compare_gloo.py; runnable on its own:

    python3 bench/gloo_bench.py --op all_reduce -n 2 -b 8 -e 64M -f 2

The ops beyond the collectives match `tensorcomm bench`'s:
send_recv is nccl-tests' sendrecv ring (rank r isends its buffer to
(r + 1) % n and irecvs one from (r - 1 + n) % n, both posted before
waiting; 2 ranks or more), send_recv_any the same with irecv from any
source; barrier and monitored_barrier print one row of size 0 and count
0, whatever the sizes; all_reduce_sparse sums a 1-D sparse COO tensor of
`count` entries per rank, the first count // 2 at indices 0.. that every
rank holds, the rest at indices of its own (see sparse_input), and size
is the bytes of its values (not on f16, which Gloo cannot sum sparsely).
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


SIZELESS = ("barrier", "monitored_barrier")
# Ops whose SUM (the default reduce op) writes into the input it reads
# (reduce_scatter here writes into the input's first piece).
IN_PLACE_SUMS = ("all_reduce", "reduce", "reduce_scatter")
RING = ("send_recv", "send_recv_any")
# Dtypes Gloo's sparse all-reduce cannot sum, and why (seen with torch 2.11).
SPARSE_UNSUPPORTED = {
    "f16": "PyTorch's CPU sparse addition has no f16 kernel "
           "(NotImplementedError: \"cadd_sparse\" not implemented for 'Half')",
}


def sizes_of(op, begin, end, factor):
    """The sizes a run of `op` goes through: one of 0 for the barriers."""
    return [0] if op in SIZELESS else list(sizes(begin, end, factor))


def sparse_input(rank, world, count, dtype):
    """Rank `rank`'s sparse all-reduce input, as tensorcomm bench builds it
    (crates/tensorcomm-cli/src/bench/sparse.rs): `count` entries, sorted and
    unique; the first shared = count // 2 at indices 0..shared (every rank
    holds them), the other own = count - shared at shared + rank * own + k;
    entry j has value (rank + j) % 5; the tensor's size is
    shared + world * own. Returns (indices [1, count], values, size)."""
    shared = count // 2
    own = count - shared
    indices = torch.cat([torch.arange(shared), shared + rank * own + torch.arange(own)])
    values = ((rank + torch.arange(count)) % 5).to(dtype)
    return indices.unsqueeze(0), values, (shared + world * own,)


def iterations(size):
    # Enough calls to average out timer noise, few enough to finish quickly.
    return max(5, min(200, (64 << 20) // max(size, 1)))


def one_call(op, world, rank, tensor, outputs, sparse=None):
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
    elif op in RING:
        # Both posted before either is waited on; no src: any source.
        src = (rank - 1 + world) % world if op == "send_recv" else None
        pending = [dist.isend(tensor, (rank + 1) % world), dist.irecv(outputs[0], src)]
        for work in pending:
            work.wait()
    elif op == "barrier":
        dist.barrier()
    elif op == "monitored_barrier":
        dist.monitored_barrier()
    elif op == "all_reduce_sparse":
        # Gloo writes the coalesced sum into the tensor it is given, so each
        # call wraps the same (coalesced) indices and values afresh, as
        # tensorcomm's input stays the same from call to call.
        indices, values, size = sparse
        t = torch.sparse_coo_tensor(indices, values, size, check_invariants=False)
        t._coalesced_(True)
        dist.all_reduce(t)
    else:
        raise SystemExit(f"unknown op {op}")


def rank_main(rank, world, port, args, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    if args.op == "all_reduce_sparse":
        # The inputs are valid by construction: opt out of the checks
        # explicitly (torch warns on every tensor when left implicit).
        torch.sparse.check_sparse_tensor_invariants.disable()
    for size in sizes_of(args.op, parse_size(args.begin), parse_size(args.end), args.factor):
        count = 0 if args.op in SIZELESS else max(size // elem, 1)
        if args.op in ("reduce_scatter", "all_to_all"):
            count = max(count // world, 1) * world
        tensor = (torch.arange(count) % 7).to(dtype)
        if args.op in IN_PLACE_SUMS:
            # Summed into itself call after call, it would overflow (f16
            # within a few calls); zeros stay finite, as tensorcomm bench's.
            tensor.zero_()
        outputs = [torch.empty_like(tensor) for _ in range(world)]
        sparse = sparse_input(rank, world, count, dtype) if args.op == "all_reduce_sparse" else None
        for _ in range(args.warmup):
            one_call(args.op, world, rank, tensor, outputs, sparse)
        n = iterations(size)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            one_call(args.op, world, rank, tensor, outputs, sparse)
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
    if args.op == "all_reduce_sparse" and args.dtype in SPARSE_UNSUPPORTED:
        p.error(f"all_reduce_sparse cannot run on dtype {args.dtype}: "
                f"{SPARSE_UNSUPPORTED[args.dtype]}")
    if args.op in RING and args.nproc < 2:
        p.error(f"{args.op} needs at least 2 ranks (rank r sends to (r + 1) % n and receives "
                f"from (r - 1 + n) % n, both itself on one rank), found {args.nproc}")
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.nproc, port, args, queue))
             for r in range(args.nproc)]
    for proc in procs:
        proc.start()
    rows = []
    expected = len(sizes_of(args.op, parse_size(args.begin), parse_size(args.end), args.factor))
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
