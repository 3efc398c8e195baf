#!/usr/bin/env python3
"""tensorcomm's NCCL group vs PyTorch's, side by side, from one command.

For each op, runs `tensorcomm bench --backend nccl --json -n RANKS` and
bench/nccl_torch.py (alone for one rank, under torchrun for more) over the
same sizes, then prints per size the host time per call and the device
time per call of each, and the ratios tensorcomm / PyTorch (below 1.0:
tensorcomm is faster).

    python3 bench/compare_nccl.py --tensorcomm target/release/tensorcomm \\
        --ops all_reduce,broadcast --ranks 1 -b 8 -e 256M -f 8
"""
import argparse
import json
import os
import re
import subprocess
import sys

PREFIX = re.compile(r"^\[rank\d+\]:\s?")


def rows(text):
    out = {}
    for line in text.splitlines():
        line = PREFIX.sub("", line.strip())
        if line.startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            out[int(r["size"])] = r
    return out


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}\n")
    return rows(p.stdout), p.returncode == 0


def title(op, ranks, dtype, iters, warmup):
    """One op's table's first line: op, ranks, dtype, reduce op and timing."""
    reduce = "reduce op SUM" if op in ("all_reduce", "reduce", "reduce_scatter_tensor") else "no reduce op"
    return (f"# {op}, {ranks} rank(s), {dtype}, {reduce}; per call, the slowest rank's median "
            f"of {iters} calls after {warmup} warm-up, in both: host = the caller's time of the "
            f"call and its wait(), time = from an event on the current stream before the call "
            f"to one after wait() (ratio = tensorcomm / PyTorch)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensorcomm", default="target/release/tensorcomm")
    p.add_argument("--ops", default="all_reduce")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="1M")
    p.add_argument("-f", default="2")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--iters", default="50")
    p.add_argument("--warmup", default="10")
    p.add_argument("--json-out")
    a = p.parse_args()
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1")
    common = ["-b", a.b, "-e", a.e, "-f", a.f, "--dtype", a.dtype, "--iters", a.iters,
              "--warmup", a.warmup]
    ok_all = True
    out = open(a.json_out, "w") if a.json_out else None
    here = os.path.dirname(os.path.abspath(__file__))
    for i, op in enumerate(a.ops.split(",")):
        tc, ok1 = run([a.tensorcomm, "bench", "--backend", "nccl", "--op", op, "-n",
                       str(a.ranks), "--json"] + common, env)
        torch_cmd = [sys.executable]
        if a.ranks > 1:
            torch_cmd += ["-m", "torch.distributed.run", f"--nproc-per-node={a.ranks}"]
        torch_cmd += [os.path.join(here, "nccl_torch.py"), "--op", op] + common
        pt, ok2 = run(torch_cmd, env)
        ok_all &= ok1 and ok2
        if i:
            print()
        print(title(op, a.ranks, a.dtype, a.iters, a.warmup))
        print(f"{'size(B)':>12} {'tc host':>9} {'pt host':>9} {'host ratio':>10} "
              f"{'tc time':>9} {'pt time':>9} {'time ratio':>10} {'check':>6}")
        for size in sorted(set(tc) | set(pt)):
            t, q = tc.get(size), pt.get(size)
            def f(r, k):
                return f"{r[k]:.2f}" if r else "-"
            hr = f"{t['host_us'] / q['host_us']:.2f}x" if t and q else "-"
            tr = f"{t['time_us'] / q['time_us']:.2f}x" if t and q else "-"
            good = (t or {}).get("correct", False) and (q or {}).get("correct", False)
            ok_all &= bool(good)
            print(f"{size:>12} {f(t, 'host_us'):>9} {f(q, 'host_us'):>9} {hr:>10} "
                  f"{f(t, 'time_us'):>9} {f(q, 'time_us'):>9} {tr:>10} {'OK' if good else 'WRONG':>6}")
            if out:
                for tool, r in (("tensorcomm", t), ("torch", q)):
                    if r:
                        out.write(json.dumps(dict(r, tool=tool, op=op, ranks=a.ranks)) + "\n")
    sys.exit(0 if ok_all else 1)


if __name__ == "__main__":
    main()
