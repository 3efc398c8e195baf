#!/usr/bin/env python3
"""How copies between pinned host memory and one GPU slow down when several
processes share that GPU (the situation of CPU-group ranks staging CUDA
tensors on one GPU).

Each of N processes (all on cuda:0) repeats, for each size: copy a pinned
host buffer to the GPU, wait for it (an event), copy it back, wait: the
copy-down / copy-up pair a staged collective makes (--op pair; --op picks
one direction, a device copy, a kernel, or the workarounds for small
copies). The processes start each
size together (a barrier) and run at the same time. Prints the median and
10th percentile of one pair in microseconds, timed on the host with
time.perf_counter, per size and process count.

    python3 bench/shared_gpu_copies.py --procs 1,2,4 --sizes 8,4K,16K,32K,64K,1M
"""
import argparse
import multiprocessing as mp
import statistics
import time

from shared_gpu_common import DEVICE, HOST, copy_rows, parse_size, print_row, run_all


def rows_copy(dev, host, size, stream):
    """Copies the first `size` bytes (even) of pinned `host` to `dev` as one
    cuMemcpy2DAsync of two rows, as tensorcomm's staging does."""
    rows = 2 if size >= 2 else 1
    copy_rows(dev.data_ptr(), DEVICE, host.data_ptr(), HOST, size, rows, stream)


def worker(rank, sizes, iters, barrier, out, sync_mode, op):
    import torch
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    res = {}
    for size in sizes:
        n = max(1, (size + 3) // 4)
        host = torch.zeros(n, dtype=torch.float32).pin_memory()
        dev = torch.empty(n, dtype=torch.float32, device="cuda")
        ev = torch.cuda.Event(blocking=(sync_mode == "blocking"))
        big = max(n, 8192)
        host_big = torch.zeros(big, dtype=torch.float32).pin_memory()
        dev_big = torch.zeros(big, dtype=torch.float32, device="cuda")
        if op == "duplex":
            other = torch.cuda.Stream()
            host2 = torch.zeros(n, dtype=torch.float32).pin_memory()
            dev2 = torch.empty(n, dtype=torch.float32, device="cuda")
            ev2 = torch.cuda.Event(blocking=(sync_mode == "blocking"))

        def step():
            if op in ("pair", "h2d"):
                dev.copy_(host, non_blocking=True)
                ev.record(stream)
                ev.synchronize()
            if op in ("pair", "d2h"):
                host.copy_(dev, non_blocking=True)
                ev.record(stream)
                ev.synchronize()
            if op == "duplex":
                # one copy each way at once, on two streams
                dev.copy_(host, non_blocking=True)
                with torch.cuda.stream(other):
                    host2.copy_(dev2, non_blocking=True)
                ev.record(stream)
                ev2.record(other)
                ev.synchronize()
                ev2.synchronize()
            if op == "d2d":
                dev.copy_(dev_big[:n], non_blocking=True)
                ev.record(stream)
                ev.synchronize()
            if op == "kernel":
                dev.add_(1.0)
                ev.record(stream)
                ev.synchronize()
            if op == "d2h_window":
                # a window of at least 32 KiB around the tensor, copied down
                host_big.copy_(dev_big, non_blocking=True)
                ev.record(stream)
                ev.synchronize()
            if op == "h2d_rows":
                # the bytes as rows of one 2D copy (what tensorcomm's
                # staging does under 32 KiB), through the driver API
                rows_copy(dev, host, size, stream)
                ev.record(stream)
                ev.synchronize()
            if op == "h2d_scratch":
                # 32 KiB up into a scratch, then the tensor's bytes on the device
                dev_big.copy_(host_big, non_blocking=True)
                dev.copy_(dev_big[:n], non_blocking=True)
                ev.record(stream)
                ev.synchronize()

        times = []
        barrier.wait()
        with torch.cuda.stream(stream):
            for i in range(iters + 10):
                t0 = time.perf_counter()
                step()
                if i >= 10:
                    times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        res[size] = (statistics.median(times), times[len(times) // 10])
    out.put((rank, res))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,2,4")
    ap.add_argument("--sizes", default="8,4K,16K,32K,64K,1M")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--sync", default="spin", choices=["spin", "blocking"])
    ap.add_argument("--op", default="pair",
                    choices=["pair", "h2d", "d2h", "duplex", "d2d", "kernel", "d2h_window", "h2d_scratch", "h2d_rows"],
                    help="pair: copy down and up; h2d/d2h: one way; duplex: one copy each way at once; d2d: a device copy; kernel: an "
                         "in-place add; d2h_window: 32 KiB down; h2d_scratch: 32 KiB up then a device copy; "
                         "h2d_rows: up as one copy of several rows")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    print(f"# {a.op}, processes sharing cuda:0, {a.sync} event waits; median / p10 us per "
          f"step (slowest process's)")
    print(f"{'procs':>5} " + " ".join(f"{s:>16}" for s in sizes))
    for n in [int(p) for p in a.procs.split(",")]:
        barrier, out = ctx.Barrier(n), ctx.Queue()
        ps = [ctx.Process(target=worker, args=(r, sizes, a.iters, barrier, out, a.sync, a.op)) for r in range(n)]
        print_row(n, sizes, run_all(ps, out))


if __name__ == "__main__":
    main()
