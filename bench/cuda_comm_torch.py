#!/usr/bin/env python3
"""Times PyTorch's torch.cuda.comm on the shapes `tensorcomm bench --backend cuda-comm -n N` uses
(GPUs 0 to N-1, --gpus N, default 2; f32) and writes JSON lines {"op", "bytes", "time_us"} (median wall
time per call, both GPUs synchronised), for its `--torch FILE`."""
import argparse, json, time
import torch
import torch.cuda.comm as comm


def median_us(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t) * 1e6)
    ts.sort()
    return ts[len(ts) // 2]


GPUS = 2


def sync():
    for d in range(GPUS):
        torch.cuda.synchronize(d)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sizes", default="1024,1048576,268435456,1073741824")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    global GPUS
    GPUS = a.gpus
    devs = list(range(GPUS))
    rows = []
    d1 = torch.device("cuda:1")
    for nbytes in [int(s) for s in a.sizes.split(",")]:
        n = max(nbytes // 4, GPUS)
        nbytes = n * 4  # as tensorcomm's rows name it
        iters = min(a.iters, 10) if nbytes >= 1 << 28 else a.iters
        ys = [torch.randint(0, 255, (n,), device=f"cuda:{d}").float() for d in devs]
        x = ys[0]
        each = -(-n // GPUS)
        parts = [ys[k][k * each : min((k + 1) * each, n)] for k in devs]
        dst = torch.empty(n, device=d1)
        cases = {
            "peer_copy": lambda: dst.copy_(x, non_blocking=True),
            "broadcast": lambda: comm.broadcast(x, devs),
            "scatter": lambda: comm.scatter(x, devs, dim=0),
            "gather": lambda: comm.gather(parts, 0, destination=0),
            "reduce_add": lambda: comm.reduce_add(ys, destination=0),
        }
        for op, fn in cases.items():
            t = median_us(fn, a.warmup, iters)
            rows.append({"op": op, "bytes": nbytes, "time_us": t, "gpus": GPUS})
            print(f"torch {op:>26} {nbytes:>12} B {t:>11.1f} us", flush=True)
        del x, ys, parts, dst
        torch.cuda.empty_cache()
    shapes = [(64, 3, 7, 7)] + [(256, 256, 3, 3)] * 40 + [(256,)] * 100 + [(1000, 2048)] * 4
    params = [torch.randn(s, device="cuda:0") for s in shapes]
    total = sum(p.numel() * 4 for p in params)
    for mib in (25, 1):
        t = median_us(lambda: comm.broadcast_coalesced(params, devs, buffer_size=mib << 20), a.warmup, a.iters)
        op = f"broadcast_coalesced/{mib}MiB"
        rows.append({"op": op, "bytes": total, "time_us": t, "gpus": GPUS})
        print(f"torch {op:>26} {total:>12} B {t:>11.1f} us", flush=True)
    with open(a.json, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
