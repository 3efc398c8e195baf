#!/usr/bin/env python3
"""tensorcomm vs PyTorch Gloo, side by side, from one command.

For each op and rank count, runs `tensorcomm bench --json` once per
transport (shared memory on: --transport shm; off: --transport tcp; sym:
shared memory with the tensors in the group's symmetric memory,
--transport shm --symmetric) and
bench/gloo_bench.py once, over the same sizes and dtype, then prints one
table per (op, ranks) with the time of each and the ratio tensorcomm/gloo
per size (below 1.0: tensorcomm is faster). Rows pair by size in bytes per
rank; the barriers (barrier, monitored_barrier) print one row of size 0 in
both tools, which pairs like any other. Ops that cannot use symmetric
memory (gather, scatter, all_reduce_sparse) fail the sym transport with
tensorcomm's reason.

    python3 bench/compare_gloo.py --tensorcomm target/release/tensorcomm \\
        --ops all_reduce --ranks 2,4,8 -b 8 -e 64M -f 2

--device cuda times CUDA tensors instead: tensorcomm bench --device cuda
(the CPU backend staging them through pinned memory) against PyTorch's
Gloo on CUDA tensors (bench/gloo_cuda_torch.py: all_reduce only, each
call timed with work.wait() then torch.cuda.synchronize(), median call).
tensorcomm's column is its bench's median call (--median; also to the end
of the copies back), the statistic Gloo's column reports; the ratio is
tensorcomm/gloo as before.

    python3 bench/compare_gloo.py --device cuda --tensorcomm target/release/tensorcomm \
        --ranks 2 --transports shm -b 8 -e 256M -f 4

--peer-memory (with --device cuda) creates tensorcomm's group with peer
memory asked for: the device path where the ranks qualify, and large
all_reduces staged in pipelined chunks.

--no-gloo runs the tensorcomm half only (where PyTorch is missing);
--json-out FILE also writes every measurement as JSON lines (each with its
tool, ranks and device, tensorcomm's with their transport;
bench/ratio_table.py reads them). Output lines
that are not JSON objects (headers, launcher prefixes such as
`[rank0]: `, warnings) are skipped, so either tool may print extra text.
Exits non-zero if any run failed or a row's correctness check failed, after
printing what it has.
"""
import argparse
import json
import os
import re
import subprocess
import sys

PREFIX = re.compile(r"^\[rank\d+\]:\s?")


def parse_size(text):
    """8, 64K, 64M, 1G (binary multiples), as tensorcomm bench takes them."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def parse_rows(text):
    """JSON objects found one per line in `text`, launcher prefixes removed;
    everything else is ignored. Each row gets `size` (bytes per rank) and
    `time_us` as numbers, whichever tool printed it."""
    rows = []
    for line in text.splitlines():
        line = PREFIX.sub("", line.strip())
        if not line.startswith("{"):
            continue
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        size = row.get("size", row.get("size_bytes"))
        time_us = row.get("time_us")
        if not isinstance(size, (int, float)) or not isinstance(time_us, (int, float)):
            continue
        row["size"] = int(size)
        row["time_us"] = float(time_us)
        rows.append(row)
    return rows


def run(cmd, env=None, timeout=None):
    """Runs `cmd`; returns (rows, error message or None)."""
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"{cmd[0]}: {e}"
    rows = parse_rows(done.stdout)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return rows, f"exit status {done.returncode}: " + " | ".join(tail)
    if not rows:
        return rows, "no JSON rows in its output"
    return rows, None


def tensorcomm_cmd(args, op, ranks, transport):
    flags = ["--transport", "shm", "--symmetric"] if transport == "sym" else ["--transport", transport]
    return [args.tensorcomm, "bench", "--op", op, "--backend", "cpu", "-n", str(ranks),
            "-b", args.begin, "-e", args.end, "-f", str(args.factor), "--dtype", args.dtype,
            "--iters", str(args.iters), "--warmup", str(args.warmup), "--json",
            "--device", args.device] + flags + (["--peer-memory"] if args.peer_memory else []) \
        + (["--median"] if args.device == "cuda" else [])


def gloo_cmd(args, op, ranks):
    script = args.gloo_script
    if script is None:
        name = "gloo_cuda_torch.py" if args.device == "cuda" else "gloo_bench.py"
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return [args.python, script, "--op", op, "-n", str(ranks), "-b", args.begin,
            "-e", args.end, "-f", str(args.factor), "--dtype", args.dtype,
            "--warmup", str(args.warmup)]


def ratio(mine, theirs):
    if mine is None or theirs is None or theirs <= 0:
        return None
    return mine / theirs


def fmt(value, digits=1):
    return "-" if value is None else f"{value:.{digits}f}"


# Ops that reduce, with SUM in both tools (tensorcomm bench and gloo_bench.py).
REDUCING = ("all_reduce", "reduce", "all_reduce_coalesced", "reduce_scatter",
            "reduce_scatter_tensor", "all_reduce_sparse")


def reduce_op(op):
    """The reduce op both tools time `op` with, as a header says it."""
    return "reduce op SUM" if op in REDUCING else "no reduce op"


def timing(device):
    """How each column of a comparison on `device` (cpu or cuda) was timed."""
    if device == "cuda":
        return ("time: tensorcomm = median call, slowest rank (tensorcomm bench --median); "
                "gloo = median call, wait() then torch.cuda.synchronize() (gloo_cuda_torch.py)")
    return ("time: mean call after warm-up, slowest rank, in both "
            "(tensorcomm bench, gloo_bench.py)")


def title(op, ranks, dtype, device):
    """The table's first line: op, ranks, dtype, reduce op and how each
    column was timed."""
    return f"# {op}, {ranks} ranks, {dtype}, {reduce_op(op)}; {timing(device)}"


def table(op, ranks, transports, results, gloo, dtype="f32", device="cpu"):
    """The side-by-side text table for one (op, ranks)."""
    by_size = {}
    for t in transports:
        for row in results.get(t, []):
            by_size.setdefault(row["size"], {})[t] = row
    gloo_by_size = {row["size"]: row for row in gloo}
    sizes = sorted(set(by_size) | set(gloo_by_size))
    head = [f"{'size(B)':>12}"]
    for t in transports:
        head.append(f"{'tc-' + t + '(us)':>13}")
    head.append(f"{'gloo(us)':>12}")
    for t in transports:
        head.append(f"{t + '/gloo':>10}")
    head.append(f"{'check':>6}")
    lines = [title(op, ranks, dtype, device), " ".join(head)]
    for size in sizes:
        mine = by_size.get(size, {})
        theirs = gloo_by_size.get(size, {}).get("time_us")
        cells = [f"{size:>12}"]
        for t in transports:
            cells.append(f"{fmt(mine.get(t, {}).get('time_us')):>13}")
        cells.append(f"{fmt(theirs):>12}")
        for t in transports:
            cells.append(f"{fmt(ratio(mine.get(t, {}).get('time_us'), theirs), 3):>10}")
        checks = [r.get("correct") for r in mine.values() if "correct" in r]
        check = "-" if not checks else ("OK" if all(checks) else "WRONG")
        cells.append(f"{check:>6}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensorcomm", default="tensorcomm",
                   help="path of the tensorcomm binary (default: tensorcomm on PATH)")
    p.add_argument("--python", default=sys.executable, help="python with torch, for Gloo")
    p.add_argument("--gloo-script", default=None,
                   help="the PyTorch side (default: gloo_bench.py, or gloo_cuda_torch.py "
                        f"with --device cuda, in {here})")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the tensors are (cuda: see above)")
    p.add_argument("--peer-memory", action="store_true",
                   help="with --device cuda: tensorcomm's group asks for peer memory (the device "
                        "path where eligible; large all_reduces staged in pipelined chunks)")
    p.add_argument("--ops", default="all_reduce", help="comma-separated ops")
    p.add_argument("--ranks", default="2,4,8", help="comma-separated rank counts")
    p.add_argument("-b", "--begin", default="8")
    p.add_argument("-e", "--end", default="64M")
    p.add_argument("-f", "--factor", type=int, default=2)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--iters", type=int, default=20, help="tensorcomm timed iterations")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--transports", default="shm,tcp",
                   help="tensorcomm transports to run: shm (shared memory on), tcp (off), auto, "
                        "sym (shared memory, tensors in symmetric memory)")
    p.add_argument("--no-gloo", action="store_true", help="run the tensorcomm half only")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--json-out", help="also write every measurement here as JSON lines")
    args = p.parse_args(argv)
    try:
        parse_size(args.begin), parse_size(args.end)
        ranks_list = [int(r) for r in args.ranks.split(",") if r.strip()]
    except ValueError as e:
        p.error(f"expected sizes like 8, 64K, 64M and ranks like 2,4,8: {e}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if args.device == "cuda" and not args.no_gloo and args.gloo_script is None and ops != ["all_reduce"]:
        p.error("--device cuda compares all_reduce only (bench/gloo_cuda_torch.py times nothing else)")
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in ("shm", "tcp", "auto", "sym")]
    if bad or not transports:
        p.error(f"expected --transports from shm, tcp, auto, sym; found {args.transports!r}")

    failures = []
    everything = []
    for op in ops:
        for ranks in ranks_list:
            results = {}
            for t in transports:
                rows, err = run(tensorcomm_cmd(args, op, ranks, t), timeout=args.timeout)
                if err:
                    failures.append(f"tensorcomm {op} {ranks} ranks {t}: {err}")
                if any(r.get("correct") is False for r in rows):
                    failures.append(f"tensorcomm {op} {ranks} ranks {t}: a result was WRONG")
                results[t] = rows
                everything += [dict(r, tool="tensorcomm", transport=t, ranks=ranks,
                                    device=args.device) for r in rows]
            gloo = []
            if not args.no_gloo:
                gloo, err = run(gloo_cmd(args, op, ranks), timeout=args.timeout)
                if err:
                    failures.append(f"gloo {op} {ranks} ranks: {err}")
                everything += [dict(r, tool="gloo", ranks=ranks, device=args.device)
                               for r in gloo]
            print(table(op, ranks, transports, results, gloo, args.dtype, args.device), flush=True)
            print(flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            for row in everything:
                f.write(json.dumps(row) + "\n")
    for failure in failures:
        print("compare_gloo: " + failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
