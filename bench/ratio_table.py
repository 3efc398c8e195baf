#!/usr/bin/env python3
"""The README's ratio table from compare_gloo.py --json-out files.

For each (ranks, transport) prints tensorcomm time / Gloo time at the
given sizes (and the range of ratios up to --small bytes), as the range
over the runs given (one file per run), under a `#` line naming the op,
its reduce op, the dtype and how both sides were timed (from the rows):

    python3 bench/ratio_table.py --op all_reduce run1.jsonl run2.jsonl
"""
import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_gloo import reduce_op, timing  # noqa: E402


def rows_of(path):
    """The JSON rows of one run's file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load(rows, op):
    """{(ranks, transport, size): ratio} for `op` in one run's rows."""
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


def header(op, rows):
    """The `#` line over the table: the op, its reduce op, the dtype and the
    timing of `rows` (every run's rows of `op`, both tools), as the rows
    record them."""
    rows = [r for r in rows if r.get("op") == op]
    dtypes = sorted({str(r["dtype"]) for r in rows if "dtype" in r})
    if not dtypes:
        dtype = "dtype not recorded"
    elif len(dtypes) == 1:
        dtype = dtypes[0]
    else:
        dtype = "mixed dtypes " + "/".join(dtypes)
    devices = {r.get("device") for r in rows}
    if devices == {"cuda"}:
        how = "CUDA tensors; " + timing("cuda")
    elif devices == {"cpu"}:
        how = "CPU tensors; " + timing("cpu")
    else:
        how = ("device not recorded in every row (with compare_gloo.py's default --device cpu, "
               + timing("cpu") + "; with --device cuda, " + timing("cuda") + ")")
    return (f"# {op}, {dtype}, {reduce_op(op)}; ratio = tensorcomm time / Gloo time per size, "
            f"range over the runs; {how}")


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
    all_rows = [rows_of(path) for path in args.runs]
    runs = [load(rows, args.op) for rows in all_rows]
    keys = sorted({(k[0], k[1]) for run in runs for k in run},
                  key=lambda k: (k[0], ["shm", "sym", "tcp"].index(k[1]) if k[1] in ("shm", "sym", "tcp") else 9))
    names = ["up to %d KiB" % (args.small >> 10)] + [f"{s >> 20} MiB" for s in sizes]
    print(header(args.op, [r for rows in all_rows for r in rows]))
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
