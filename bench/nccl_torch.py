#!/usr/bin/env python3
"""PyTorch's NCCL backend timed the way `tensorcomm bench --backend nccl`
times tensorcomm's: per call, a fresh input and a poisoned output, then
the host time of the call and its wait() and the device time from an event
on the current stream before the call to one after wait(); medians, the
slowest rank's. Prints one JSON object per size:
{"op", "size", "count", "host_us", "time_us", "correct"}.

One process per GPU under torchrun (or alone: world size 1):

    python3 bench/nccl_torch.py --op all_reduce -b 8 -e 256M -f 4
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "f64": torch.float64, "i32": torch.int32, "i64": torch.int64}


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    return int(t[:-1]) * units[t[-1]] if t[-1] in units else int(t)


def sizes(args):
    out, s = [], parse_size(args.minbytes)
    while s <= parse_size(args.maxbytes):
        out.append(s)
        s *= args.stepfactor
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", default="all_reduce")
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="1M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}.items():
        os.environ.setdefault(k, v)
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    rank, n = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    esize = torch.tensor([], dtype=dtype).element_size()
    op = args.op
    for size in ([0] if op == "barrier" else sizes(args)):
        count = max(size // esize, 1)
        if op in ("reduce_scatter_tensor", "all_to_all_single"):
            count = -(-count // n) * n
        fresh = torch.full((count,), rank + 1, dtype=dtype, device=dev)
        inp = torch.empty_like(fresh)
        if op == "all_gather_into_tensor":
            out = torch.empty(count * n, dtype=dtype, device=dev)
        elif op == "reduce_scatter_tensor":
            out = torch.empty(count // n, dtype=dtype, device=dev)
        elif op == "all_to_all_single":
            out = torch.empty(count, dtype=dtype, device=dev)
        else:
            out = inp

        def call():
            if op == "all_reduce":
                return dist.all_reduce(inp, async_op=True)
            if op == "broadcast":
                return dist.broadcast(inp, 0, async_op=True)
            if op == "reduce":
                return dist.reduce(inp, 0, async_op=True)
            if op == "all_gather_into_tensor":
                return dist.all_gather_into_tensor(out, inp, async_op=True)
            if op == "reduce_scatter_tensor":
                return dist.reduce_scatter_tensor(out, inp, async_op=True)
            if op == "all_to_all_single":
                return dist.all_to_all_single(out, inp, async_op=True)
            return dist.barrier(async_op=True)

        def reset():
            if out is not inp:
                out.fill_(-7)
            inp.copy_(fresh)
            torch.cuda.synchronize()

        reset()
        call().wait()
        torch.cuda.synchronize()
        got = out.double().cpu()
        total = n * (n + 1) / 2
        if op in ("all_reduce", "reduce_scatter_tensor"):
            ok = bool((got == total).all())
        elif op == "reduce":
            ok = bool((got == (total if rank == 0 else rank + 1)).all())
        elif op == "broadcast":
            ok = bool((got == 1).all())
        elif op in ("all_gather_into_tensor", "all_to_all_single"):
            per = got.numel() // n
            want = torch.arange(n, dtype=torch.float64).repeat_interleave(per) + 1
            ok = bool((got == want).all())
        else:
            ok = True
        host, devt = [], []
        stream = torch.cuda.current_stream()
        for i in range(args.warmup + args.iters):
            reset()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            t0 = time.perf_counter()
            call().wait()
            h = (time.perf_counter() - t0) * 1e6
            end.record(stream)
            end.synchronize()
            if i >= args.warmup:
                host.append(h)
                devt.append(start.elapsed_time(end) * 1e3)
        agreed = torch.tensor([statistics.median(host), statistics.median(devt),
                               0.0 if ok else 1.0], dtype=torch.float64, device=dev)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        h, t, bad = agreed.tolist()
        if rank == 0:
            import json
            print(json.dumps({"op": op, "size": 0 if op == "barrier" else count * esize,
                              "count": 0 if op == "barrier" else count, "host_us": h,
                              "time_us": t, "correct": bad == 0.0}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
