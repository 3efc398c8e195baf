"""What the PyTorch-level suites (torch_suite.py, cuda_suite.py) share: run
a suite's checks on every rank of a "tensorcomm" group started with
torch.multiprocessing, gather each rank's outcomes, print one line per
check and count them.

A check is a function ``fn(rank, world_size)`` that raises on failure and
may return a note; ``skip(fn)`` gives a reason to skip it, or None.
"""

import argparse
import datetime
import json
import os
import socket
import tempfile
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def run_rank(rank, n, port, out_dir, checks, skip=lambda fn: None):
    """Rank ``rank`` of ``n``: joins the group, runs every check, writes
    its outcomes for ``collect`` and leaves the group."""
    import tensorcomm.torch  # noqa: F401  registers the backend

    dist.init_process_group("tensorcomm", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=120))
    results = []
    for fn in checks:
        why = skip(fn)
        if why is not None:
            results.append((fn.__name__, "SKIP", why))
            continue
        try:
            note = fn(rank, n)
            results.append((fn.__name__, "PASS", note or ""))
        except BaseException as e:  # noqa: BLE001
            results.append((fn.__name__, "FAIL", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks_from_args(description):
    """The ``--ranks`` the command line asks for (default 2)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--ranks", type=int, default=2)
    return ap.parse_args().ranks


def collect(worker, n):
    """Starts ``worker(rank, n, port, out_dir)`` on ``n`` processes and
    returns every rank's outcomes, a list of (name, PASS|SKIP|FAIL, text)
    per rank."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(n, free_port(), out_dir), nprocs=n, join=True)
        per_rank = []
        for rank in range(n):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                per_rank.append(json.load(f))
    return per_rank


def report(per_rank, n):
    """Prints a line per check (a failure with every failing rank's
    reason) and returns (passed, failed, skipped)."""
    failed = skipped = 0
    for i, (name, _, _) in enumerate(per_rank[0]):
        outcomes = [res[i] for res in per_rank]
        bad = [(rank, o[2]) for rank, o in enumerate(outcomes) if o[1] == "FAIL"]
        if bad:
            failed += 1
            print(f"FAIL {name} ({n} ranks)")
            for rank, why in bad:
                print(f"  rank {rank}: {why.strip()}")
        elif outcomes[0][1] == "SKIP":
            skipped += 1
            print(f"SKIP {name}: {outcomes[0][2]}")
        else:
            note = outcomes[0][2]
            print(f"PASS {name} ({n} ranks){': ' + note if note else ''}")
    return len(per_rank[0]) - failed - skipped, failed, skipped
