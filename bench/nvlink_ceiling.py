#!/usr/bin/env python3
"""What the link between two GPUs carries, measured with copy engines: the
ceiling any two-GPU all-reduce works under.

A two-rank all-reduce of S bytes must bring every rank S bytes it does not
have (the peer's half of the inputs, then the peer's half of the results),
so with both directions busy it takes at least S / (bytes a second one
direction carries while the other is busy too). This probe times, with
CUDA events and medians:

- `one way`: GPU 0's buffer copied into GPU 1's (cudaMemcpyPeerAsync,
  through PyTorch's `copy_`), nothing coming back;
- `both ways`: that copy and GPU 1's into GPU 0's at the same time, each on
  a stream of its source GPU, both released by one gate so they start
  together; the time is the slower direction's.

It prints GB/s per direction (1e9 bytes) and the floor of a two-rank
all-reduce implied by `both ways` (S / that rate), per size.

    python3 bench/nvlink_ceiling.py --sizes 16M,64M,256M,1G --iters 20
"""
import argparse
import statistics

import torch


def parse_size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def timed_copies(pairs, iters, warmup):
    """Median ms of the slowest of `pairs` (dst, src, stream) copied at once,
    each timed by events on its own stream, behind a short sleeping kernel
    on every stream so that the copies are queued before they run."""
    times = []
    for i in range(warmup + iters):
        events = []
        for dst, src, stream in pairs:
            with torch.cuda.device(stream.device), torch.cuda.stream(stream):
                torch.cuda._sleep(2_000_000)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                dst.copy_(src, non_blocking=True)
                end.record(stream)
                events.append((start, end))
        for _, _, stream in pairs:
            stream.synchronize()
        if i >= warmup:
            times.append(max(s.elapsed_time(e) for s, e in events))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="16M,64M,256M,1G")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"needs two GPUs, found {torch.cuda.device_count()}")
    for src, dst in ((0, 1), (1, 0)):
        if not torch.cuda.can_device_access_peer(src, dst):
            raise SystemExit(f"cuda:{src} cannot reach cuda:{dst} as a peer")
    s0 = torch.cuda.Stream(0)
    s1 = torch.cuda.Stream(1)
    print("# GB/s per direction (1e9 bytes/s), copy engines, medians; floor = S / both-ways rate")
    print(f"{'bytes':>12} {'one way':>9} {'both ways':>10} {'floor us':>9}")
    for size in map(parse_size, a.sizes.split(",")):
        n = size // 4
        x0 = torch.randn(n, device="cuda:0")
        x1 = torch.randn(n, device="cuda:1")
        y0 = torch.full((n,), float("nan"), device="cuda:0")
        y1 = torch.full((n,), float("nan"), device="cuda:1")
        one = timed_copies([(y1, x0, s0)], a.iters, a.warmup)
        both = timed_copies([(y1, x0, s0), (y0, x1, s1)], a.iters, a.warmup)
        if not (torch.equal(y1.cpu(), x0.cpu()) and torch.equal(y0.cpu(), x1.cpu())):
            raise SystemExit(f"{size} bytes: a copy did not arrive whole")
        gbs = lambda ms: size / (ms * 1e-3) / 1e9
        print(f"{size:>12} {gbs(one):>9.1f} {gbs(both):>10.1f} {both * 1e3:>9.1f}", flush=True)
        del x0, x1, y0, y1
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
