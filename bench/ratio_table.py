#!/usr/bin/env python3
"""The README's ratio table from compare_gloo.py --json-out files.

For each (ranks, transport) prints tensorcomm time / Gloo time at the
given sizes (and the range of ratios up to --small bytes), as the range
over the runs given (one file per run):

    python3 bench/ratio_table.py --op all_reduce run1.jsonl run2.jsonl
"""
import argparse
import json
from collections import defaultdict


def load(path, op):
    """{(ranks, transport, size): ratio} for `op` in one run."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    gloo = {(r["ranks"], r["size"]): r["time_us"] for r in rows
            if r.get("tool") == "gloo" and r.get("op") == op}
    out = {}
    for r in rows:
        if r.get("tool") != "tensorcomm" or r.get("op") != op:
            continue
        base = gloo.get((r["ranks"], r["size"]))
        if base:
            out[(r["ranks"], r["transport"], r["size"])] = r["time_us"] / base
    return out


def span(values):
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+")
    p.add_argument("--op", default="all_reduce")
    p.add_argument("--small", type=int, default=32 << 10, help="bytes: the first column's limit")
    p.add_argument("--sizes", default="2097152,8388608,33554432")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    runs = [load(path, args.op) for path in args.runs]
    keys = sorted({(k[0], k[1]) for run in runs for k in run},
                  key=lambda k: (k[0], ["shm", "sym", "tcp"].index(k[1]) if k[1] in ("shm", "sym", "tcp") else 9))
    names = ["up to %d KiB" % (args.small >> 10)] + [f"{s >> 20} MiB" for s in sizes]
    print("| ranks | transport | " + " | ".join(names) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " |")
    for ranks, transport in keys:
        cells = []
        small = [v for run in runs for (r, t, s), v in run.items()
                 if (r, t) == (ranks, transport) and s <= args.small]
        cells.append(span(small) if small else "-")
        for size in sizes:
            vals = [run[(ranks, transport, size)] for run in runs if (ranks, transport, size) in run]
            cells.append(span(vals) if vals else "-")
        print(f"| {ranks} | {transport} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
