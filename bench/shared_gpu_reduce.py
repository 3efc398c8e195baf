#!/usr/bin/env python3
"""What an all-reduce among processes sharing one GPU costs when it stays
on the GPU and the processes meet on the host instead of in a kernel.

Each of N processes (all on cuda:0) owns a device buffer that the others
open through CUDA IPC. One step: copy the input into this process's buffer
(a device copy), wait for it on the host (an event), meet the others at a
host barrier (spinning on shared memory), sum every buffer in rank order
into the output, wait, and meet again before the buffers are reused. No
kernel ever waits for another process, so the GPU never has to switch to a
context whose kernel spins. Prints the median and 10th percentile step
time in microseconds, timed with time.perf_counter, the slowest process's.

    python3 bench/shared_gpu_reduce.py --procs 2,4 --sizes 8,64K,1M,16M,64M
"""
import argparse
import statistics
import time

from shared_gpu_common import DEVICE, copy_rows, parse_size, print_row, run_all


def meet(flags, rank, n, generation):
    """A barrier on shared memory: every process posts its generation and
    spins until all have posted it."""
    flags[rank] = generation
    while True:
        if all(flags[s] >= generation for s in range(n)):
            return


def rows_d2d(dst, src, nbytes, stream):
    """Copies `nbytes` from device address `src` to `dst` as one
    cuMemcpy2DAsync of several equal rows (a copy engine's job, not the
    command stream's)."""
    rows = 2
    while nbytes % rows:
        rows += 1
    if rows == nbytes and nbytes > 2:
        rows = 1
    copy_rows(dst, DEVICE, src, DEVICE, nbytes, rows, stream)


def worker(rank, n, sizes, iters, queues, flags, out, mode):
    import torch
    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    biggest = max(max(sizes) // 4, 1)
    # one block per rank, and a result area in rank 0's
    mine = torch.zeros(2 * biggest, dtype=torch.float32, device="cuda")
    for s in range(n):
        if s != rank:
            queues[s].put((rank, mine))
    slots = [None] * n
    slots[rank] = mine
    for _ in range(n - 1):
        r, t = queues[rank].get()
        slots[r] = t
    results_area = slots[0][biggest:]
    generation = 0
    res = {}
    ev = torch.cuda.Event()
    with torch.cuda.stream(stream):
        for size in sizes:
            m = max(1, size // 4)
            inp = torch.full((m,), float(rank + 1), device="cuda")
            outp = torch.empty(m, device="cuda")
            views = [t[:m] for t in slots]
            result = results_area[:m]
            times = []
            for i in range(iters + 10):
                generation += 1
                meet(flags, rank, n, generation)
                t0 = time.perf_counter()
                if mode == "all":
                    views[rank].copy_(inp, non_blocking=True)
                else:
                    rows_d2d(views[rank].data_ptr(), inp.data_ptr(), m * 4, stream)
                ev.record(stream)
                ev.synchronize()
                generation += 1
                meet(flags, rank, n, generation)
                if mode == "all":
                    torch.add(views[0], views[1], out=outp)
                    for v in views[2:]:
                        outp.add_(v)
                elif rank == 0:
                    torch.add(views[0], views[1], out=result)
                    for v in views[2:]:
                        result.add_(v)
                    outp.copy_(result, non_blocking=True)
                if mode == "leader":
                    ev.record(stream)
                    ev.synchronize()
                    generation += 1
                    meet(flags, rank, n, generation)
                    if rank != 0:
                        rows_d2d(outp.data_ptr(), result.data_ptr(), m * 4, stream)
                ev.record(stream)
                ev.synchronize()
                generation += 1
                meet(flags, rank, n, generation)
                if i >= 10:
                    times.append((time.perf_counter() - t0) * 1e6)
            expect = n * (n + 1) / 2
            got = outp[:4].tolist()
            if any(g != expect for g in got):
                raise SystemExit(f"rank {rank}: expected {expect}, found {got}")
            times.sort()
            res[size] = (statistics.median(times), times[len(times) // 10])
    out.put((rank, res))
    # the buffer stays mapped in the peers until every process is done
    generation += 1
    meet(flags, rank, n, generation)


def main():
    import torch.multiprocessing as mp
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="2,4")
    ap.add_argument("--sizes", default="8,64K,1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--mode", default="all", choices=["all", "leader"],
                    help="all: every process sums every buffer into its output (kernels in "
                         "every process); leader: process 0 sums into its result area and the "
                         "others copy it out, every other copy as rows (copy engines only)")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    ctx = mp.get_context("spawn")
    print(f"# {a.mode}: processes sharing cuda:0: device copy in, host barrier, sum in rank order, "
          "host barrier; median / p10 us per step (slowest process's)")
    print(f"{'procs':>5} " + " ".join(f"{s:>16}" for s in sizes))
    for n in [int(p) for p in a.procs.split(",")]:
        queues = [ctx.Queue() for _ in range(n)]
        flags = ctx.Array("q", n, lock=False)
        out = ctx.Queue()
        ps = [ctx.Process(target=worker, args=(r, n, sizes, a.iters, queues, flags, out, a.mode))
              for r in range(n)]
        print_row(n, sizes, run_all(ps, out))


if __name__ == "__main__":
    main()
