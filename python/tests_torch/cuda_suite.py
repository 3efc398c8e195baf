"""CUDA tensors through the "tensorcomm" backend, on N processes.

    python3 python/tests_torch/cuda_suite.py --ranks 2

Rank r puts its tensors on cuda:(r % device count), so ranks may share
one GPU (the CPU group stages CUDA tensors through pinned host memory).
Each check runs torch.distributed calls on CUDA tensors and compares the
results with the expected values; the ordering checks write the input
with a kernel queued behind a long sleep on a side stream made current,
call the collective, and read the result on that stream after wait(), so
a group that did not order its copies after the caller's stream, or a
wait() that did not make that stream wait, reads stale values. Without
CUDA (torch.cuda.is_available() false) the CUDA checks print SKIP; the
device-refusal check runs everywhere. The parent prints one line per
check and a total; the exit status is 1 if any check failed on any rank.
Needs PyTorch and the tensorcomm wheel.
"""

import sys

import torch
import torch.distributed as dist

import suite_runner

CHECKS = []
HAS_CUDA = torch.cuda.is_available()


def check(fn, cuda=True):
    fn.needs_cuda = cuda
    CHECKS.append(fn)
    return fn


def anywhere(fn):
    return check(fn, cuda=False)


def dev(r):
    return torch.device("cuda", r % torch.cuda.device_count())


def eq(got, expected, what=""):
    got = got.cpu()
    expected = expected.cpu()
    if not torch.equal(got, expected):
        raise AssertionError(f"{what}: expected {expected.tolist()}, found {got.tolist()}")


def close(got, expected, what="", tol=1e-6):
    got = got.cpu().double()
    expected = expected.cpu().double()
    if not torch.allclose(got, expected, rtol=tol, atol=tol):
        raise AssertionError(f"{what}: expected {expected.tolist()}, found {got.tolist()}")


def slow_fill(t, value, stream, spin=200_000_000):
    """Queues a long spin, then ``t.fill_(value)``, on ``stream``: a copy
    not ordered after ``stream`` reads ``t`` before the fill."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(spin)
        t.fill_(value)


# ---------------------------------------------------------------- errors
@anywhere
def unsupported_device_is_refused(r, n):
    t = torch.empty(4, device="meta")
    try:
        dist.all_reduce(t)
    except ValueError as e:
        assert "meta" in str(e) and "CPU or CUDA" in str(e), str(e)
    else:
        raise AssertionError("all_reduce of a meta tensor did not raise")
    # The group still works.
    c = torch.ones(2)
    dist.all_reduce(c)
    eq(c, torch.full((2,), float(n)), "all_reduce after the refusal")


@check
def strided_cuda_tensor_is_refused(r, n):
    t = torch.zeros(8, device=dev(r))[::2]
    try:
        dist.all_reduce(t)
    except ValueError as e:
        assert "contiguous" in str(e), str(e)
    else:
        raise AssertionError("all_reduce of a strided (gapped) CUDA view did not raise")


# ---------------------------------------------------------------- collectives
@check
def all_reduce_sum_avg(r, n):
    d = dev(r)
    t = torch.arange(6, dtype=torch.float32, device=d) + r
    dist.all_reduce(t)
    expect = sum(torch.arange(6, dtype=torch.float32) + p for p in range(n))
    eq(t, expect, "all_reduce SUM")
    t = torch.arange(6, dtype=torch.float32, device=d) + r
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    close(t, expect / n, "all_reduce AVG")
    i = torch.tensor([r + 1, 10 * (r + 1)], dtype=torch.int64, device=d)
    dist.all_reduce(i, op=dist.ReduceOp.MAX)
    eq(i, torch.tensor([n, 10 * n]), "all_reduce MAX int64")
    for dtype in (torch.float16, torch.bfloat16):
        h = torch.full((5,), r + 1.0, dtype=dtype, device=d)
        dist.all_reduce(h)
        eq(h, torch.full((5,), n * (n + 1) / 2, dtype=dtype), f"all_reduce SUM {dtype}")


@check
def all_reduce_async_and_future(r, n):
    d = dev(r)
    t = torch.full((1024,), float(r + 1), device=d)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    total = n * (n + 1) / 2
    eq(t, torch.full((1024,), total), "async all_reduce")
    u = torch.full((3,), 2.0, device=d)
    fut = dist.all_reduce(u, async_op=True).get_future()
    out = fut.wait()
    got = out[0] if isinstance(out, (list, tuple)) else out
    eq(got, torch.full((3,), 2.0 * n), "get_future().wait()")
    # Work.synchronize blocks the host until the copies back are done.
    v = torch.ones(7, device=d)
    w = dist.all_reduce(v, async_op=True)
    w.synchronize()
    eq(v, torch.full((7,), float(n)), "Work.synchronize")


@check
def all_reduce_permuted_layout(r, n):
    d = dev(r)
    base = (torch.arange(12, dtype=torch.float32, device=d) + r).view(3, 4)
    t = base.t()  # dense, not contiguous
    dist.all_reduce(t)
    expect = sum((torch.arange(12, dtype=torch.float32) + p).view(3, 4) for p in range(n)).t()
    eq(t, expect, "all_reduce of a transposed CUDA tensor")


@check
def broadcast_reduce(r, n):
    d = dev(r)
    root = n - 1
    t = torch.full((4,), float(r * 10), device=d)
    dist.broadcast(t, src=root)
    eq(t, torch.full((4,), float(root * 10)), "broadcast")
    t = torch.full((4,), float(r + 1), device=d)
    dist.reduce(t, dst=0)
    if r == 0:
        eq(t, torch.full((4,), n * (n + 1) / 2), "reduce")


@check
def all_gather_forms(r, n):
    d = dev(r)
    x = torch.tensor([r, r + 100], dtype=torch.int32, device=d)
    out = torch.empty(2 * n, dtype=torch.int32, device=d)
    dist.all_gather_into_tensor(out, x)
    eq(out, torch.tensor([v for p in range(n) for v in (p, p + 100)], dtype=torch.int32),
       "all_gather_into_tensor")
    outs = [torch.empty(2, dtype=torch.int32, device=d) for _ in range(n)]
    dist.all_gather(outs, x)
    for p, o in enumerate(outs):
        eq(o, torch.tensor([p, p + 100], dtype=torch.int32), f"all_gather[{p}]")


@check
def gather_scatter(r, n):
    d = dev(r)
    x = torch.full((3,), float(r), device=d)
    outs = [torch.empty(3, device=d) for _ in range(n)] if r == 0 else None
    dist.gather(x, gather_list=outs, dst=0)
    if r == 0:
        for p, o in enumerate(outs):
            eq(o, torch.full((3,), float(p)), f"gather[{p}]")
    y = torch.empty(2, device=d)
    ins = [torch.full((2,), float(p * 7), device=d) for p in range(n)] if r == 0 else None
    dist.scatter(y, scatter_list=ins, src=0)
    eq(y, torch.full((2,), float(r * 7)), "scatter")


@check
def reduce_scatter_forms(r, n):
    d = dev(r)
    x = torch.arange(2 * n, dtype=torch.float32, device=d) + r
    out = torch.empty(2, device=d)
    dist.reduce_scatter_tensor(out, x)
    full = sum(torch.arange(2 * n, dtype=torch.float32) + p for p in range(n))
    eq(out, full[2 * r:2 * r + 2], "reduce_scatter_tensor")
    out = torch.empty(2, device=d)
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
    close(out, full[2 * r:2 * r + 2] / n, "reduce_scatter_tensor AVG")
    ins = [torch.full((2,), float(r + p), device=d) for p in range(n)]
    out = torch.empty(2, device=d)
    dist.reduce_scatter(out, ins)
    eq(out, torch.full((2,), float(sum(q + r for q in range(n)))), "reduce_scatter")


@check
def all_to_all_forms(r, n):
    d = dev(r)
    x = torch.tensor([r * 100 + p for p in range(n)], dtype=torch.float32, device=d)
    out = torch.empty(n, device=d)
    dist.all_to_all_single(out, x)
    eq(out, torch.tensor([p * 100 + r for p in range(n)], dtype=torch.float32), "all_to_all_single")
    # Uneven splits: rank p sends p+1 elements to every rank.
    x = torch.full(((r + 1) * n,), float(r), device=d)
    out = torch.empty(sum(p + 1 for p in range(n)), device=d)
    dist.all_to_all_single(out, x, output_split_sizes=[p + 1 for p in range(n)],
                           input_split_sizes=[r + 1] * n)
    eq(out, torch.tensor([float(p) for p in range(n) for _ in range(p + 1)]), "all_to_all_single splits")
    ins = [torch.full((2,), float(r * 10 + p), device=d) for p in range(n)]
    outs = [torch.empty(2, device=d) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for p, o in enumerate(outs):
        eq(o, torch.full((2,), float(p * 10 + r)), f"all_to_all[{p}]")


@check
def send_recv(r, n):
    d = dev(r)
    nxt, prv = (r + 1) % n, (r - 1) % n
    x = torch.full((5,), float(r), device=d)
    y = torch.empty(5, device=d)
    if r % 2 == 0:
        dist.send(x, nxt)
        dist.recv(y, prv)
    else:
        dist.recv(y, prv)
        dist.send(x, nxt)
    eq(y, torch.full((5,), float(prv)), "send/recv")
    y = torch.empty(5, device=d)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt), dist.P2POp(dist.irecv, y, prv)])
    for q in reqs:
        q.wait()
    eq(y, torch.full((5,), float(prv)), "batch_isend_irecv")


@check
def coalesced_and_barrier(r, n):
    d = dev(r)
    a = torch.full((3,), float(r), device=d)
    b = torch.full((2,), float(2 * r), device=d)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    s = float(sum(range(n)))
    eq(a, torch.full((3,), s), "coalesced a")
    eq(b, torch.full((2,), 2 * s), "coalesced b")
    dist.barrier()


@check
def mixed_cpu_and_cuda_ranks(r, n):
    # Rank 0 passes a CUDA tensor, the others host tensors.
    t = torch.full((4,), float(r + 1), device=dev(r) if r == 0 else "cpu")
    dist.all_reduce(t)
    eq(t, torch.full((4,), n * (n + 1) / 2), "all_reduce of CUDA on rank 0, CPU elsewhere")
    out = torch.empty(n, device="cpu" if r == 0 else dev(r))
    dist.all_gather_into_tensor(out, torch.tensor([float(r)], device=dev(r)))
    eq(out, torch.arange(n, dtype=torch.float32), "CUDA input, output on the host on rank 0")


@check
def sparse_all_reduce(r, n):
    d = dev(r)
    i = torch.tensor([[r, 3]])
    v = torch.tensor([1.0, float(r + 1)])
    s = torch.sparse_coo_tensor(i, v, (n + 3,)).to(d)
    dist.all_reduce(s)
    assert s.is_cuda and s.is_coalesced(), (s.device, s.is_coalesced())
    expect = torch.zeros(n + 3)
    for p in range(n):
        expect[p] += 1.0
        expect[3] += p + 1
    eq(s.to_dense(), expect, "sparse all_reduce on CUDA")


# ---------------------------------------------------------------- stream ordering
@check
def ordered_after_side_stream(r, n):
    d = dev(r)
    side = torch.cuda.Stream(device=d)
    numel = 1 << 20
    total = n * (n + 1) / 2
    for async_op in (True, False):
        t = torch.zeros(numel, device=d)
        torch.cuda.synchronize(d)
        with torch.cuda.stream(side):
            slow_fill(t, float(r + 1), side)
            work = dist.all_reduce(t, async_op=async_op)
            if async_op:
                work.wait()
            # Read on the side stream after wait(): must see the sum.
            doubled = t * 2
        side.synchronize()
        eq(doubled[:4], torch.full((4,), 2 * total), f"side stream, async_op={async_op}: read after wait")
        eq(doubled.min().reshape(1), torch.tensor([2 * total]), f"side stream, async_op={async_op}: every element")


@check
def ordering_for_every_op(r, n):
    d = dev(r)
    side = torch.cuda.Stream(device=d)
    numel = 1 << 16
    with torch.cuda.stream(side):
        x = torch.zeros(numel * n, device=d)
        slow_fill(x, float(r + 1), side)
        out = torch.empty(numel, device=d)
        dist.reduce_scatter_tensor(out, x, async_op=True).wait()
        rs = out.clone()
        y = torch.zeros(numel, device=d)
        slow_fill(y, float(r + 1), side)
        g = torch.empty(numel * n, device=d)
        dist.all_gather_into_tensor(g, y, async_op=True).wait()
        ag = g.clone()
        b = torch.zeros(numel, device=d)
        slow_fill(b, float(r + 5), side)
        dist.broadcast(b, src=0, async_op=True).wait()
        bc = b.clone()
        a = torch.zeros(numel * n, device=d)
        slow_fill(a, float(r), side)
        o = torch.empty(numel * n, device=d)
        dist.all_to_all_single(o, a, async_op=True).wait()
        aa = o.clone()
    side.synchronize()
    total = n * (n + 1) / 2
    eq(rs.min().reshape(1), torch.tensor([total]), "reduce_scatter_tensor on a side stream")
    eq(ag.view(n, numel).min(1).values, torch.arange(1, n + 1, dtype=torch.float32),
       "all_gather_into_tensor on a side stream")
    eq(bc.max().reshape(1), torch.tensor([5.0]), "broadcast on a side stream")
    eq(aa.view(n, numel).min(1).values, torch.arange(n, dtype=torch.float32),
       "all_to_all_single on a side stream")


@check
def send_recv_on_side_stream(r, n):
    if n < 2:
        return "needs 2 ranks"
    d = dev(r)
    side = torch.cuda.Stream(device=d)
    numel = 1 << 18
    with torch.cuda.stream(side):
        if r == 0:
            x = torch.zeros(numel, device=d)
            slow_fill(x, 42.0, side)
            dist.isend(x, 1).wait()
        elif r == 1:
            y = torch.zeros(numel, device=d)
            dist.irecv(y, 0).wait()
            z = y + 1
    side.synchronize()
    if r == 1:
        eq(z.min().reshape(1), torch.tensor([43.0]), "recv read on a side stream after wait")


# ---------------------------------------------------------------- runner
def worker(rank, n, port, out_dir):
    if HAS_CUDA:
        torch.cuda.set_device(dev(rank))
    suite_runner.run_rank(
        rank, n, port, out_dir, CHECKS,
        skip=lambda fn: "torch.cuda.is_available() is false" if fn.needs_cuda and not HAS_CUDA else None)


def main():
    n = suite_runner.ranks_from_args(__doc__.splitlines()[0])
    passed, failed, skipped = suite_runner.report(suite_runner.collect(worker, n), n)
    gpus = torch.cuda.device_count() if HAS_CUDA else 0
    print(f"cuda suite, {n} ranks, {gpus} GPUs, torch {torch.__version__}: "
          f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
