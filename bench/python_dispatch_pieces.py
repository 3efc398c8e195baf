"""Where a synchronous 8-byte dist.broadcast / dist.all_reduce on backend
"tensorcomm" spends its time, piece by piece: PyTorch's own dispatch to a
Python group (the "floor" groups, whose collectives do nothing), each step
of tensorcomm.torch, the native blocking call alone, and the whole call.

    torchrun --standalone --nproc-per-node 1 bench/python_dispatch_pieces.py

At one rank nothing waits on a peer, so the numbers are the calling
thread's own costs; each line gives its CPU time (time.thread_time_ns,
steady on a loaded machine) and wall time per call, best and median of 9
rounds of 20,000 calls. More ranks work too (the collectives then wait on
each other, and only wall time means much). TAG (environment) prefixes
each line, to compare wheels.
"""

import os
import time

import torch
import torch.distributed as dist

import tensorcomm.torch  # noqa: F401  registers "tensorcomm"
from tensorcomm.torch import Work, _desc, _reduce_op, _root, _timeout

class _Done(getattr(dist, "_Work", None) or dist.Work):
    """A work that is already done."""

    def wait(self, timeout=None):
        return True


_DONE = _Done()


class Floor(dist.ProcessGroup):
    """A Python group whose collectives do nothing and return a done work:
    what PyTorch's own dispatch to a Python group costs."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)

    def getBackendName(self):
        return "floor"

    def broadcast(self, tensors, opts=None):
        return _DONE

    def allreduce(self, tensors, opts=None):
        return _DONE


class FloorNone(Floor):
    """:class:`Floor` returning no work (c10d's "the backend has synced")."""

    def broadcast(self, tensors, opts=None):
        return None

    def allreduce(self, tensors, opts=None):
        return None


def loop(fn, clock, iters=20000, rounds=9):
    """(best, median) of ``rounds`` rounds of ``iters`` calls, in us per call."""
    for _ in range(iters // 10):
        fn()
    res = []
    for _ in range(rounds):
        t0 = clock()
        for _ in range(iters):
            fn()
        res.append((clock() - t0) / iters / 1000)
    res.sort()
    return res[0], res[len(res) // 2]


def main():
    dist.Backend.register_backend("floor", Floor, devices=["cpu"])
    dist.Backend.register_backend("floornone", FloorNone, devices=["cpu"])
    dist.init_process_group("tensorcomm")
    fl = dist.new_group(backend="floor")
    fn_ = dist.new_group(backend="floornone")
    pg = dist.distributed_c10d._get_default_group()
    t = torch.zeros(2)
    lst = [t]
    native = pg._group
    desc = _desc(t, "bench")
    bo = dist.BroadcastOptions()
    bo.asyncOp = False
    ao = dist.AllreduceOptions()
    ao.asyncOp = False
    done = native.broadcast(desc, 0, None, lst, True)
    tag = os.environ.get("TAG", "")
    pieces = {
        "floor dist.broadcast (Work)": lambda: dist.broadcast(t, src=0, group=fl),
        "floor dist.broadcast (None)": lambda: dist.broadcast(t, src=0, group=fn_),
        "floor dist.all_reduce (Work)": lambda: dist.all_reduce(t, group=fl),
        "floor dist.all_reduce (None)": lambda: dist.all_reduce(t, group=fn_),
        "_desc": lambda: _desc(t, "b"),
        "_root": lambda: _root(bo),
        "_timeout": lambda: _timeout(bo),
        "_reduce_op": lambda: _reduce_op(ao),
        "opts.asyncOp": lambda: bo.asyncOp,
        "Work(finished, result)": lambda: Work(done, lst),
        "Work(...).wait()": lambda: Work(done, lst).wait(),
        "native bcast blocking+wait": lambda: native.broadcast(desc, 0, None, lst, True).wait(),
        "native ar blocking+wait": lambda: native.all_reduce(desc, 0, 1.0, None, lst, True).wait(),
        "pg.broadcast (+wait if Work)": lambda: (pg.broadcast(lst, bo) or _DONE).wait(),
        "pg.allreduce (+wait if Work)": lambda: (pg.allreduce(lst, ao) or _DONE).wait(),
        "dist.broadcast": lambda: dist.broadcast(t, src=0),
        "dist.all_reduce": lambda: dist.all_reduce(t),
    }
    if dist.get_rank() == 0:
        print(f"# python_dispatch_pieces: {dist.get_world_size()} ranks, torch {torch.__version__}; "
              "us per call, best and median of 9 rounds")
    for name, fn in pieces.items():
        c = loop(fn, time.thread_time_ns)
        w = loop(fn, time.perf_counter_ns)
        if dist.get_rank() == 0:
            print(f"{tag}{name:<30}cpu {c[0]:6.2f} {c[1]:6.2f}   wall {w[0]:6.2f} {w[1]:6.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
