#!/usr/bin/env python3
"""tensorcomm's peer-memory all-reduce against PyTorch's symmetric-memory
one-shot and two-shot and NCCL, in one call on the same GPUs.

Runs `tensorcomm bench --backend intranode --json` and
bench/intranode_torch.py (under `tensorcomm run`) over the same sizes,
then prints per size each one's median device time per call (eager and in
a CUDA graph) and the ratio tensorcomm / best PyTorch (below 1.0:
tensorcomm is faster).

    python3 bench/compare_intranode.py --tensorcomm target/release/tensorcomm \\
        --ranks 2 --sizes 8,16K,256K,1M,4M,16M,64M
"""
import argparse
import json
import os
import re
import subprocess
import sys

PREFIX = re.compile(r"^\[rank\d+\]:\s?")


def json_lines(text):
    for line in text.splitlines():
        line = PREFIX.sub("", line.strip())
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                pass


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}\n")
    return list(json_lines(p.stdout)), p.stdout, p.returncode == 0


def title(ranks, dtype, iters, warmup):
    """The table's first line: op, reduce op, ranks, dtype and timing."""
    return (f"# all_reduce, reduce op SUM, {ranks} ranks, {dtype}; us per call, the slowest "
            f"rank's medians, in both: device time of one eager call (CUDA events around it; "
            f"{iters} calls after {warmup} warm-up, queued back to back), _g = a replay of a CUDA "
            f"graph of 20 calls / 20; _rg = ours in a graph captured with registered tensors "
            f"(capture_registered: no copy through the buffers); ratio = tensorcomm / best "
            f"PyTorch (one_shot, two_shot, nccl; _g and _rg: one_shot, two_shot graphs)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensorcomm", default="target/release/tensorcomm")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--sizes", default="8,1K,16K,64K,256K,1M,4M,16M,64M")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--iters", default="50")
    p.add_argument("--warmup", default="10")
    p.add_argument("--torch-script", default=os.path.join(os.path.dirname(__file__), "intranode_torch.py"))
    a = p.parse_args()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    ours, _, ok_ours = run([a.tensorcomm, "bench", "--backend", "intranode", "--op", "all_reduce",
                            "-n", str(a.ranks), "--sizes", a.sizes, "--dtype", a.dtype,
                            "--iters", a.iters, "--warmup", a.warmup, "--json"], env)
    theirs, raw, ok_theirs = run([a.tensorcomm, "run", "--nproc-per-node", str(a.ranks), "--",
                                  sys.executable, a.torch_script, "--sizes", a.sizes, "--dtype",
                                  a.dtype, "--iters", a.iters, "--warmup", a.warmup], env)
    print(title(a.ranks, a.dtype, a.iters, a.warmup))
    for line in raw.splitlines():
        if "# " in line:
            print(line)
    by = {}
    for r in theirs:
        if "error" in r:
            print(f"# PyTorch {r['impl']} at {r['size']} B: {r['error']}")
            continue
        by.setdefault(int(r["size"]), {})[r["impl"]] = r
    print(f"{'bytes':>11} {'algo':>9} {'ours':>8} {'one_shot':>9} {'two_shot':>9} {'nccl':>8} {'ratio':>6}"
          f" {'ours_g':>8} {'1shot_g':>8} {'2shot_g':>8} {'ratio_g':>7} {'ours_rg':>8} {'ratio_rg':>8} ok")
    for r in ours:
        size = int(r["size"])
        t = by.get(size, {})
        get = lambda k, f: t[k][f] if k in t and t[k].get("correct") else float("nan")
        best = min([v for v in (get("one_shot", "time_us"), get("two_shot", "time_us"),
                                get("nccl", "time_us")) if v == v] or [float("nan")])
        best_g = min([v for v in (get("one_shot", "graph_us"), get("two_shot", "graph_us"))
                      if v == v] or [float("nan")])
        reg = r.get("registered_graph_us", float("nan"))
        print(f"{size:>11} {r.get('algo', '?'):>9} {r['time_us']:>8.2f} {get('one_shot', 'time_us'):>9.2f}"
              f" {get('two_shot', 'time_us'):>9.2f} {get('nccl', 'time_us'):>8.2f}"
              f" {r['time_us'] / best:>6.2f} {r['graph_us']:>8.2f} {get('one_shot', 'graph_us'):>8.2f}"
              f" {get('two_shot', 'graph_us'):>8.2f} {r['graph_us'] / best_g:>7.2f}"
              f" {reg:>8.2f} {reg / best_g:>8.2f}"
              f" {'yes' if r.get('correct', True) else 'NO'}")
    sys.exit(0 if ok_ours and ok_theirs else 1)


if __name__ == "__main__":
    main()
