#!/usr/bin/env python3
"""PyTorch DDP over Gloo on CPU tensors: the step time of the model
`tensorcomm bench --op ddp --model mlp` simulates (six 2048x2048 linear
layers and a 2048x10 head, 25.2M parameters), batch 32, SGD, real forward
and backward. Prints one JSON object: {"ranks", "step_ms" (median of the
slowest rank), "steps", "gradient_as_bucket_view"}.

--gradient-as-bucket-view builds DDP with gradient_as_bucket_view=True
(param.grad is a view of DDP's bucket: no copy into the bucket or back).

World size 1 (no process group, plain training):
    python3 bench/ddp_torch.py
N ranks:
    python3 -m torch.distributed.run --nproc-per-node N bench/ddp_torch.py
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def model():
    layers = []
    for _ in range(6):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    layers.append(nn.Linear(2048, 10))
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--gradient-as-bucket-view", action="store_true")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads (default: the host's CPUs / world size)")
    a = p.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(a.threads or max(1, (os.cpu_count() or 1) // world))
    torch.manual_seed(0)
    net = model()
    if world > 1:
        dist.init_process_group("gloo")
        net = nn.parallel.DistributedDataParallel(
            net, gradient_as_bucket_view=a.gradient_as_bucket_view)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(a.batch, 2048)
    y = torch.randn(a.batch, 10)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = ((net(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    step = statistics.median(times)
    if world > 1:
        t = torch.tensor([step])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step = t.item()
        rank = dist.get_rank()
        dist.destroy_process_group()
    else:
        rank = 0
    if rank == 0:
        print(json.dumps({"ranks": world, "step_ms": step, "steps": a.steps,
                          "gradient_as_bucket_view": a.gradient_as_bucket_view and world > 1}),
              flush=True)


if __name__ == "__main__":
    main()
