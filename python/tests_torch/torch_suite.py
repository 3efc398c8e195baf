"""Real PyTorch code against the "tensorcomm" backend, on N processes.

    python3 python/tests_torch/torch_suite.py --ranks 2

Each rank runs every check below with torch.distributed calls on a default
group of backend="tensorcomm" (and a Gloo group beside it for DDP's
comparison), records pass or fail per check, and the parent prints one line
per check and a total; the exit status is 1 if any check failed on any
rank. Set TENSORCOMM_TORCH_TRACE=1 to see every call PyTorch makes on the
group. Needs PyTorch (CPU is enough) and the tensorcomm wheel.
"""

import copy
import datetime
import sys

import torch
import torch.distributed as dist

import suite_runner

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def eq(got, expected, what=""):
    if not torch.equal(got, expected):
        raise AssertionError(f"{what}: expected {expected.tolist()}, found {got.tolist()}")


# ---------------------------------------------------------------- collectives
@check
def backend_is_tensorcomm(r, n):
    assert dist.get_backend() == "tensorcomm", dist.get_backend()
    assert dist.get_rank() == r and dist.get_world_size() == n


@check
def all_reduce_every_op(r, n):
    vals = [torch.tensor([p + 1, 2 * p + 3, 6], dtype=torch.int64) for p in range(n)]
    stack = torch.stack(vals)
    expect = {
        dist.ReduceOp.SUM: stack.sum(0),
        dist.ReduceOp.PRODUCT: stack.prod(0),
        dist.ReduceOp.MIN: stack.min(0).values,
        dist.ReduceOp.MAX: stack.max(0).values,
    }
    for op, e in expect.items():
        t = vals[r].clone()
        dist.all_reduce(t, op=op)
        eq(t, e, f"all_reduce {op}")
    band, bor, bxor = vals[0].clone(), vals[0].clone(), vals[0].clone()
    for v in vals[1:]:
        band &= v
        bor |= v
        bxor ^= v
    for op, e in [(dist.ReduceOp.BAND, band), (dist.ReduceOp.BOR, bor), (dist.ReduceOp.BXOR, bxor)]:
        t = vals[r].clone()
        dist.all_reduce(t, op=op)
        eq(t, e, f"all_reduce {op}")
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.allclose(t, torch.full((5,), (n + 1) / 2)), t
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    assert torch.allclose(t, torch.full((5,), 0.5 * n * (n + 1) / 2)), t


@check
def all_reduce_dtypes(r, n):
    for dtype in [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32]:
        t = torch.full((33,), r + 1, dtype=dtype)
        dist.all_reduce(t)
        eq(t, torch.full((33,), n * (n + 1) // 2, dtype=dtype), f"all_reduce {dtype}")
    b = torch.tensor([r == 0, False, True])
    dist.all_reduce(b, op=dist.ReduceOp.MAX)
    eq(b, torch.tensor([True, False, True]), "all_reduce bool")
    c = torch.full((3,), complex(r, 1))
    dist.all_reduce(c)
    eq(c, torch.full((3,), complex(n * (n - 1) / 2, n)), "all_reduce complex")
    big = torch.arange(1 << 20, dtype=torch.float32) * (r + 1)
    dist.all_reduce(big)
    assert torch.allclose(big, torch.arange(1 << 20, dtype=torch.float32) * n * (n + 1) / 2)
    tr = (torch.arange(12.0).reshape(3, 4) * (r + 1)).t()  # dense, not contiguous
    dist.all_reduce(tr)
    eq(tr, torch.arange(12.0).reshape(3, 4).t() * n * (n + 1) / 2, "all_reduce transposed")


@check
def async_work_and_future(r, n):
    t = torch.ones(8)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    value = fut.wait()
    work.wait()
    assert work.is_completed()
    eq(t, torch.full((8,), float(n)), "async all_reduce")
    assert isinstance(value, list) and torch.equal(value[0], t), value
    chained = dist.all_reduce(torch.ones(2), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    eq(chained.wait(), torch.full((2,), 2.0 * n), "future.then")


@check
def broadcast_and_reduce(r, n):
    t = torch.full((2, 3), float(r))
    dist.broadcast(t, src=n - 1)
    eq(t, torch.full((2, 3), float(n - 1)), "broadcast")
    t = torch.full((4,), r + 1, dtype=torch.int32)
    dst = 1 % n
    dist.reduce(t, dst=dst)
    eq(t, torch.full((4,), n * (n + 1) // 2 if r == dst else r + 1, dtype=torch.int32), "reduce")


@check
def all_gather_forms(r, n):
    mine = torch.tensor([r, 10 + r])
    outs = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, mine)
    for p in range(n):
        eq(outs[p], torch.tensor([p, 10 + p]), "all_gather")
    cat = torch.zeros(2 * n, dtype=torch.int64)
    dist.all_gather_into_tensor(cat, mine)
    eq(cat, torch.tensor([v for p in range(n) for v in (p, 10 + p)]), "all_gather_into_tensor")
    stacked = torch.zeros(n, 2, dtype=torch.int64)
    dist.all_gather_into_tensor(stacked, mine)
    eq(stacked, torch.tensor([[p, 10 + p] for p in range(n)]), "all_gather_into_tensor stacked")


@check
def reduce_scatter_forms(r, n):
    out = torch.zeros(2)
    dist.reduce_scatter(out, [torch.full((2,), float((r + 1) * (p + 1))) for p in range(n)])
    eq(out, torch.full((2,), n * (n + 1) / 2 * (r + 1)), "reduce_scatter")
    out = torch.zeros(3, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.arange(3 * n) + r, op=dist.ReduceOp.MAX)
    eq(out, torch.arange(3) + 3 * r + n - 1, "reduce_scatter_tensor")


@check
def all_to_all_forms(r, n):
    ins = [torch.full((p + 1,), 10 * r + p, dtype=torch.int32) for p in range(n)]
    outs = [torch.zeros(r + 1, dtype=torch.int32) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for p in range(n):
        eq(outs[p], torch.full((r + 1,), 10 * p + r, dtype=torch.int32), "all_to_all")
    send = [p + 1 for p in range(n)]
    recv = [r + 1] * n
    single_in = torch.cat([torch.full((p + 1,), 100 * r + p) for p in range(n)])
    single_out = torch.zeros(sum(recv), dtype=torch.int64)
    dist.all_to_all_single(single_out, single_in, recv, send)
    eq(single_out, torch.tensor([100 * p + r for p in range(n) for _ in range(r + 1)]), "all_to_all_single")
    even_out = torch.zeros(n, 2)
    dist.all_to_all_single(even_out, torch.full((n, 2), float(r)))
    eq(even_out, torch.arange(n, dtype=torch.float32).repeat_interleave(2).reshape(n, 2), "all_to_all_single even")


@check
def gather_and_scatter(r, n):
    outs = [torch.zeros(3) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((3,), r * 1.5), outs, dst=0)
    if r == 0:
        for p in range(n):
            eq(outs[p], torch.full((3,), p * 1.5), "gather")
    got = torch.zeros(2, dtype=torch.int32)
    ins = [torch.full((2,), 100 + p, dtype=torch.int32) for p in range(n)] if r == n - 1 else None
    dist.scatter(got, ins, src=n - 1)
    eq(got, torch.full((2,), 100 + r, dtype=torch.int32), "scatter")


@check
def point_to_point(r, n):
    nxt, prv = (r + 1) % n, (r - 1) % n
    s = dist.isend(torch.full((4,), float(r)), dst=nxt, tag=5)
    got = torch.zeros(4)
    dist.recv(got, src=prv, tag=5)
    s.wait()
    eq(got, torch.full((4,), float(prv)), "send/recv")
    if r == 0:
        senders = set()
        for _ in range(n - 1):
            buf = torch.zeros(1, dtype=torch.int64)
            src = dist.recv(buf, tag=9)
            assert buf.item() == src * 7, (buf, src)
            senders.add(src)
        assert senders == set(range(1, n)), senders
    else:
        dist.send(torch.tensor([r * 7]), dst=0, tag=9)
    ops = [dist.P2POp(dist.isend, torch.full((2,), float(r)), nxt), dist.P2POp(dist.irecv, got[:2], prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    eq(got[:2], torch.full((2,), float(prv)), "batch_isend_irecv")


@check
def barriers(r, n):
    dist.barrier()
    pg = dist.distributed_c10d._get_default_group()
    pg.monitored_barrier(datetime.timedelta(seconds=30), wait_all_ranks=True)


@check
def coalesced_forms(r, n):
    a, b = torch.full((3,), float(r + 1)), torch.full((2, 2), float(2 * r))
    if hasattr(dist, "all_reduce_coalesced"):
        dist.all_reduce_coalesced([a, b])
        eq(a, torch.full((3,), n * (n + 1) / 2), "all_reduce_coalesced")
        eq(b, torch.full((2, 2), float(n * (n - 1))), "all_reduce_coalesced")
    from torch.distributed.distributed_c10d import _coalescing_manager

    x, y = torch.ones(4), torch.full((2,), 2.0)
    with _coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(x)
        dist.all_reduce(y)
    cm.wait()
    eq(x, torch.full((4,), float(n)), "coalescing manager")
    eq(y, torch.full((2,), 2.0 * n), "coalescing manager")


@check
def object_collectives(r, n):
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "name": f"r{r}"})
    assert objs == [{"rank": p, "name": f"r{p}"} for p in range(n)], objs
    lst = [f"hello {r}", [r] * 3] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    assert lst == ["hello 0", [0, 0, 0]], lst
    gathered = [None] * n if r == 0 else None
    dist.gather_object(("x", r), gathered, dst=0)
    if r == 0:
        assert gathered == [("x", p) for p in range(n)], gathered
    out = [None]
    dist.scatter_object_list(out, [p * 11 for p in range(n)] if r == 0 else None, src=0)
    assert out == [r * 11], out


@check
def subgroups(r, n):
    sub = dist.new_group([0, n - 1], backend="tensorcomm")
    if r in (0, n - 1):
        t = torch.full((2,), float(r + 1))
        dist.all_reduce(t, group=sub)
        eq(t, torch.full((2,), float(1 + n)), "new_group all_reduce")
        assert dist.get_rank(sub) == [0, n - 1].index(r)


@check
def destroy_subgroup(r, n):
    """A subgroup has the name torch.distributed gave it and can be
    destroyed alone (PyTorch's test_destroy_group); the default group
    still works after."""
    sub = dist.new_group(list(range(n)), backend="tensorcomm")
    name = sub.group_name
    assert isinstance(name, str) and name, name
    assert name != dist.group.WORLD.group_name, name
    dist.barrier(group=sub)
    dist.destroy_process_group(sub)
    t = torch.ones(1)
    dist.all_reduce(t)
    eq(t, torch.full((1,), float(n)), "default group after destroying a subgroup")


@check
def timeout_raises_timeout_error(r, n):
    """A barrier that rank 0 waits on alone times out as a TimeoutError
    saying "Timed out" (PyTorch's test_barrier_timeout_* match it), in
    about the group's timeout."""
    import datetime
    import time

    import tensorcomm.torch as tt

    side = dist.new_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=1))
    if r == 0:
        t0 = time.monotonic()
        try:
            dist.barrier(group=side)
        except TimeoutError as e:
            assert isinstance(e, tt.DistTimeoutError) and isinstance(e, dist.DistBackendError), type(e)
            assert " Timed out " in str(e), e
            assert 0.9 <= time.monotonic() - t0 < 10, time.monotonic() - t0
        else:
            raise AssertionError("a barrier without the other ranks did not time out")
    # The other ranks leave the side group alone; everyone meets again here.
    dist.barrier()


@check
def bad_arguments_raise(r, n):
    try:
        dist.all_reduce(torch.zeros(3, dtype=torch.int16))
    except ValueError as e:
        assert "int16" in str(e), e
    else:
        raise AssertionError("an int16 all_reduce was accepted")
    try:
        dist.all_reduce(torch.zeros(8)[::2])
    except ValueError as e:
        assert "strides" in str(e), e
    else:
        raise AssertionError("a strided all_reduce was accepted")


@check
def failed_collective_raises_dist_backend_error(r, n):
    """Ranks disagree on a shape in a group of their own: every rank gets
    an exception naming a rank, and the default group is unaffected."""
    import tensorcomm.torch as tt

    side = dist.new_group(backend="tensorcomm")
    try:
        dist.broadcast(torch.zeros(4 + r), src=0, group=side)
    except dist.DistBackendError as e:
        assert isinstance(e, tt.DistBackendError) and "rank" in str(e), e
    except RuntimeError as e:
        assert "rank" in str(e), e
    else:
        raise AssertionError("mismatched shapes were not reported")
    t = torch.ones(1)
    dist.all_reduce(t)
    eq(t, torch.full((1,), float(n)), "default group after a failure elsewhere")


# ------------------------------------------------------------------ sparse
def sparse_input(r, dtype, dense):
    """Rank ``r``'s sparse COO tensor of sizes (3, 4, *dense): unsorted,
    with a repeated coordinate, overlapping the other ranks'."""
    i = torch.tensor([[r % 3, 2, r % 3, 0], [1, 0, 1, (r + 1) % 4]])
    v = (torch.arange(4 * (dense[0] if dense else 1)).reshape(4, *dense) + 3 * r).to(dtype)
    return torch.sparse_coo_tensor(i, v, (3, 4) + dense)


@check
def sparse_all_reduce_matches_gloo(r, n):
    gloo = dist.new_group(backend="gloo")
    for dtype, dense in [(torch.float32, ()), (torch.float64, (2,)), (torch.int64, ()), (torch.int32, (3,))]:
        s = sparse_input(r, dtype, dense)
        ours, theirs, late = s.clone(), s.clone(), s.clone()
        dist.all_reduce(ours)
        dist.all_reduce(theirs, group=gloo)
        work = dist.all_reduce(late, async_op=True)
        work.get_future().wait()
        for got, how in ((ours, "sync"), (late, "async")):
            what = f"sparse all_reduce {dtype} {how}"
            assert got.is_sparse and got.is_coalesced() == theirs.is_coalesced(), what
            eq(got._indices(), theirs._indices(), what + " indices")
            eq(got._values(), theirs._values(), what + " values")
    # Only rank 0 has entries.
    s = sparse_input(r, torch.float32, ()) if r == 0 else torch.sparse_coo_tensor(
        torch.zeros(2, 0, dtype=torch.int64), torch.zeros(0), (3, 4))
    ours, theirs = s.clone(), s.clone()
    dist.all_reduce(ours)
    dist.all_reduce(theirs, group=gloo)
    eq(ours._indices(), theirs._indices(), "one rank's entries: indices")
    eq(ours._values(), theirs._values(), "one rank's entries: values")


@check
def sparse_all_reduce_errors(r, n):
    s = sparse_input(r, torch.float32, ())
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        try:
            dist.all_reduce(s.clone(), op=op)
        except ValueError as e:
            assert "ReduceOp.SUM" in str(e), str(e)
        else:
            raise AssertionError(f"sparse all_reduce with {op} did not raise")
    try:
        dist.all_reduce_coalesced([torch.ones(2), s.clone()])
    except ValueError as e:
        assert "sparse" in str(e), str(e)
    else:
        raise AssertionError("all_reduce_coalesced of a dense and a sparse tensor did not raise")
    # Sparse on rank 0, dense elsewhere: a mismatch every rank reports.
    short = dist.new_group(backend="tensorcomm", timeout=datetime.timedelta(seconds=30))
    try:
        dist.all_reduce(s.clone() if r == 0 else torch.ones(3), group=short)
    except dist.DistBackendError as e:
        assert "mismatch" in str(e) and "all_reduce_sparse" in str(e), str(e)
    else:
        raise AssertionError("a sparse all_reduce against a dense one did not raise")
    dist.destroy_process_group(short)
    # The default group still works.
    t = s.clone()
    dist.all_reduce(t)
    assert t.is_coalesced()


# ------------------------------------------------------------------- DDP
def train(model, group, steps, r):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=group)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + r)
    for _ in range(steps):
        x = torch.randn(16, 20, generator=gen)
        y = torch.randn(16, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in ddp.module.parameters()]


@check
def ddp_trains_as_on_gloo(r, n):
    torch.manual_seed(r)  # different initial weights per rank: DDP broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    gloo = dist.new_group(backend="gloo")
    ours = train(copy.deepcopy(model), None, 30, r)
    theirs = train(copy.deepcopy(model), gloo, 30, r)
    worst = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    assert worst <= 1e-5, f"parameters differ from Gloo's by up to {worst}"
    # Every rank holds the same parameters.
    flat = torch.cat([p.flatten() for p in ours])
    top = flat.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    assert torch.equal(top, flat), "ranks disagree after DDP training"
    return f"max |tensorcomm - gloo| = {worst:.2e}"


# ---------------------------------------------------------------- runner
def worker(rank, n, port, out_dir):
    suite_runner.run_rank(rank, n, port, out_dir, CHECKS)


def main():
    n = suite_runner.ranks_from_args(__doc__.splitlines()[0])
    passed, failed, _ = suite_runner.report(suite_runner.collect(worker, n), n)
    print(f"torch suite, {n} ranks, torch {torch.__version__}: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
