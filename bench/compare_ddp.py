#!/usr/bin/env python3
"""tensorcomm's DDP Reducer against PyTorch DDP over Gloo, side by side.

PyTorch trains the real model (bench/ddp_torch.py: six 2048x2048 layers
and a 2048x10 head, batch 32, SGD) at world size 1, 2, 4...; at each world
size N it first times one process without DDP using the intra-op threads a
rank of N gets (the host's CPUs / N), whose step (no communication) sets
the compute that `tensorcomm bench --op ddp --model mlp` simulates per
layer (step / 7 layers), so both sides do about the same compute per
rank; then both run at N ranks and the table gives step times and the
ratio tensorcomm / PyTorch (below 1.0: faster). tensorcomm's columns:
comm = time any bucket's all-reduce hook was in flight; exposed = the part
of it after the last gradient was ready (what backward did not hide);
tail = last gradient ready to finish() returning (also the write-back).

    python3 bench/compare_ddp.py --tensorcomm target/release/tensorcomm --ranks 2,4

--grad-as-bucket-view adds, at each world size, a row with both sides
writing gradients straight into their bucket views: PyTorch DDP with
gradient_as_bucket_view=True, tensorcomm with --grad-as-bucket-view (the
default rows copy gradients into the buckets and back on both sides).
--copy-threads T sets tensorcomm's threads per rank for the copies in
the copying rows (ReducerOptions::copy_threads; default the rank's share
of the host's cores, at most 4); 1 is the single-threaded copy PyTorch's
rows also do.
PyTorch comes from the Python running this script.
"""
import argparse
import json
import os
import subprocess
import sys


def last_json(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}\n")
        return None
    return last_json(p.stdout)


def title(cpus, layers, steps):
    """The table's first line: op, reduce op, dtype, where, and timing."""
    return (f"# DDP gradient all-reduce, reduce op SUM of the gradients / world size (the mean: "
            f"PyTorch DDP's default, tensorcomm's allreduce hook), f32 gradients, CPU ranks "
            f"(Gloo; tensorcomm's cpu backend), {cpus} cpus; ms per "
            f"step, the slowest rank's median of {steps} steps after 3 warm-up, in both; compute "
            f"per layer = PyTorch's step without DDP at the threads of one rank / {layers} layers")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensorcomm", default="target/release/tensorcomm")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", default="10")
    p.add_argument("--grad-as-bucket-view", action="store_true",
                   help="also run both sides with gradients as bucket views")
    p.add_argument("--copy-threads", type=int, default=None,
                   help="tensorcomm's copy threads per rank (default: its own choice)")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "ddp_torch.py")
    layers = 7
    cpus = os.cpu_count() or 1
    print(title(cpus, layers, a.steps))
    modes = [False, True] if a.grad_as_bucket_view else [False]
    mode_head = f" {'grads':>5}" if a.grad_as_bucket_view else ""
    print(f"{'ranks':>5}{mode_head} {'compute ms':>10} {'torch ms':>9} {'tensorcomm ms':>14} {'ratio':>6} "
          f"{'comm ms':>8} {'exposed ms':>11} {'tail ms':>8}")
    ok = True
    for n in [1] + [int(r) for r in a.ranks.split(",")]:
        base = run([sys.executable, script, "--steps", a.steps, "--threads", str(max(1, cpus // n))])
        if not base:
            ok = False
            continue
        compute_us = int(base["step_ms"] * 1000 / layers)
        for view in modes:
            if n == 1:
                t = base  # no DDP at world size 1: no bucket, no copies
            else:
                t = run([sys.executable, "-m", "torch.distributed.run",
                         f"--nproc-per-node={n}", script, "--steps", a.steps]
                        + (["--gradient-as-bucket-view"] if view else []))
            c = run([a.tensorcomm, "bench", "--op", "ddp", "-n", str(n), "--model", "mlp",
                     "--hook", "allreduce", "--compute-us", str(compute_us), "--iters", a.steps,
                     "--warmup", "3", "--json"]
                    + (["--grad-as-bucket-view"] if view else [])
                    + ([f"--copy-threads={a.copy_threads}"]
                       if a.copy_threads is not None and not view else []))
            if not t or not c:
                ok = False
                continue
            tc_ms = c["step_us"] / 1000
            mode = f" {'view' if view else 'copy':>5}" if a.grad_as_bucket_view else ""
            print(f"{n:>5}{mode} {base['step_ms']:>10.1f} {t['step_ms']:>9.1f} {tc_ms:>14.1f} "
                  f"{tc_ms / t['step_ms']:>6.2f} {c['comm_us'] / 1000:>8.1f} "
                  f"{c['exposed_us'] / 1000:>11.1f} {c['tail_us'] / 1000:>8.1f}", flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
