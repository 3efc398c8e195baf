"""Every collective of the NumPy API, checked against values computed here,
on 2 and 3 ranks."""

import numpy as np
import pytest

from tensorcomm import ReduceOp, errors

from conftest import run_ranks


def test_all_reduce_every_op(world):
    def body(pg):
        r = pg.rank()
        out = {}
        for op, dtype in [
            ("SUM", np.float32),
            ("AVG", np.float64),
            ("PRODUCT", np.int32),
            ("MIN", np.int64),
            ("MAX", np.float16),
            ("BAND", np.int64),
            ("BOR", np.uint8),
            ("BXOR", np.int8),
        ]:
            x = np.array([r + 1, 2 * r + 3, 7], dtype=dtype)
            pg.all_reduce(x, op=op).wait()
            out[op] = x.tolist()
        x = np.full(5, r + 1.0, np.float32)
        pg.all_reduce(x, op=ReduceOp.premul_sum(0.5)).wait()
        out["PREMUL_SUM"] = x.tolist()
        b = np.array([r == 0, False, True])
        pg.all_reduce(b, op="max").wait()
        out["bool"] = b.tolist()
        return out

    n = world
    vals = [[r + 1, 2 * r + 3, 7] for r in range(n)]
    cols = list(zip(*vals))
    for out in run_ranks(n, body):
        assert out["SUM"] == [float(sum(c)) for c in cols]
        assert out["AVG"] == pytest.approx([sum(c) / n for c in cols])
        assert out["PRODUCT"] == [int(np.prod(c)) for c in cols]
        assert out["MIN"] == [min(c) for c in cols]
        assert out["MAX"] == [float(max(c)) for c in cols]
        band = [c[0] for c in cols]
        for c_i, c in enumerate(cols):
            acc_and, acc_or, acc_xor = c[0], c[0], c[0]
            for v in c[1:]:
                acc_and &= v
                acc_or |= v
                acc_xor ^= v
            band[c_i] = (acc_and, acc_or, acc_xor)
        assert out["BAND"] == [b[0] for b in band]
        assert out["BOR"] == [b[1] for b in band]
        assert out["BXOR"] == [b[2] for b in band]
        assert out["PREMUL_SUM"] == pytest.approx([0.5 * n * (n + 1) / 2] * 5)
        assert out["bool"] == [True, False, True]


def test_large_all_reduce_goes_through_shared_memory(world):
    def body(pg):
        x = np.arange(1 << 18, dtype=np.float32) * (pg.rank() + 1)
        pg.all_reduce(x).wait()
        return x

    n = world
    expected = np.arange(1 << 18, dtype=np.float32) * (n * (n + 1) / 2)
    for x in run_ranks(n, body):
        np.testing.assert_allclose(x, expected, rtol=1e-6)


def test_broadcast_and_reduce(world):
    def body(pg):
        r = pg.rank()
        b = np.full((2, 3), r, np.int32)
        pg.broadcast(b, root=pg.size() - 1).wait()
        red = np.full(4, r + 1.0)
        pg.reduce(red, root=1, op="sum").wait()
        return b.tolist(), red.tolist()

    n = world
    for r, (b, red) in enumerate(run_ranks(n, body)):
        assert b == [[n - 1] * 3] * 2
        assert red == ([n * (n + 1) / 2] * 4 if r == 1 else [r + 1.0] * 4)


def test_transposed_arrays_are_reduced_in_place(world):
    def body(pg):
        base = np.arange(12, dtype=np.float64).reshape(3, 4) * (pg.rank() + 1)
        t = base.T  # dense, not contiguous
        pg.all_reduce(t).wait()
        return base

    n = world
    for base in run_ranks(n, body):
        np.testing.assert_array_equal(base, np.arange(12.0).reshape(3, 4) * n * (n + 1) / 2)


def test_all_gather_forms(world):
    def body(pg):
        r, n = pg.rank(), pg.size()
        mine = np.array([r, 10 + r], np.int64)
        outs = [np.zeros(2, np.int64) for _ in range(n)]
        pg.all_gather(outs, mine).wait()
        cat = np.zeros(2 * n, np.int64)
        pg.all_gather_into_tensor(cat, mine).wait()
        stacked = np.zeros((n, 2), np.int64)
        pg.all_gather_into_tensor(stacked, mine).wait()
        co = [[np.zeros(1, np.float32), np.zeros(3, np.float32)] for _ in range(n)]
        pg.all_gather_coalesced(co, [np.full(1, r, np.float32), np.full(3, -r, np.float32)]).wait()
        fs = [np.zeros(n, np.int32), np.zeros(2 * n, np.int32)]
        pg.all_gather_into_tensor_coalesced(fs, [np.full(1, r, np.int32), np.full(2, r * 2, np.int32)]).wait()
        return [o.tolist() for o in outs], cat.tolist(), stacked.tolist(), co, [f.tolist() for f in fs]

    n = world
    for outs, cat, stacked, co, fs in run_ranks(n, body):
        assert outs == [[p, 10 + p] for p in range(n)]
        assert cat == [v for p in range(n) for v in (p, 10 + p)]
        assert stacked == [[p, 10 + p] for p in range(n)]
        for p in range(n):
            assert co[p][0].tolist() == [p] and co[p][1].tolist() == [-p] * 3
        assert fs[0] == list(range(n))
        assert fs[1] == [2 * p for p in range(n) for _ in range(2)]


def test_gather_and_scatter(world):
    def body(pg):
        r, n = pg.rank(), pg.size()
        root = n - 1
        outs = [np.zeros(3, np.float32) for _ in range(n)] if r == root else None
        pg.gather(np.full(3, r * 1.5, np.float32), outs, root=root).wait()
        got = np.zeros(2, np.int32)
        ins = [np.full(2, 100 + p, np.int32) for p in range(n)] if r == 0 else None
        pg.scatter(got, ins, root=0).wait()
        return (None if outs is None else [o.tolist() for o in outs]), got.tolist()

    n = world
    for r, (gathered, got) in enumerate(run_ranks(n, body)):
        if r == n - 1:
            assert gathered == [[p * 1.5] * 3 for p in range(n)]
        else:
            assert gathered is None
        assert got == [100 + r] * 2


def test_reduce_scatter_forms(world):
    def body(pg):
        r, n = pg.rank(), pg.size()
        out = np.zeros(2, np.float64)
        pg.reduce_scatter(out, [np.full(2, (r + 1) * (p + 1), np.float64) for p in range(n)]).wait()
        out2 = np.zeros(3, np.int64)
        pg.reduce_scatter_tensor(out2, np.arange(3 * n, dtype=np.int64) + r, op="max").wait()
        outs3 = [np.zeros(1, np.float32), np.zeros(2, np.float32)]
        pg.reduce_scatter_tensor_coalesced(
            outs3, [np.ones(n, np.float32), np.full(2 * n, r, np.float32)], op=ReduceOp.SUM
        ).wait()
        return out.tolist(), out2.tolist(), [o.tolist() for o in outs3]

    n = world
    tri = n * (n + 1) / 2
    for r, (out, out2, outs3) in enumerate(run_ranks(n, body)):
        assert out == [tri * (r + 1)] * 2
        assert out2 == [3 * r + i + n - 1 for i in range(3)]
        assert outs3 == [[float(n)], [float(sum(range(n)))] * 2]


def test_all_to_all_even_and_uneven(world):
    def body(pg):
        r, n = pg.rank(), pg.size()
        # rank r sends p+1 elements of value 10*r+p to rank p
        ins = [np.full(p + 1, 10 * r + p, np.int32) for p in range(n)]
        outs = [np.zeros(r + 1, np.int32) for _ in range(n)]
        pg.all_to_all(outs, ins).wait()
        send = [p + 1 for p in range(n)]
        recv = [r + 1] * n
        single_in = np.concatenate([np.full(p + 1, 100 * r + p, np.int64) for p in range(n)])
        single_out = np.zeros(sum(recv), np.int64)
        pg.all_to_all_single(single_out, single_in, recv, send).wait()
        even_out = np.zeros((n, 2), np.float32)
        pg.all_to_all_single(even_out, np.full((n, 2), r, np.float32)).wait()
        return [o.tolist() for o in outs], single_out.tolist(), even_out.tolist()

    n = world
    for r, (outs, single, even) in enumerate(run_ranks(n, body)):
        assert outs == [[10 * p + r] * (r + 1) for p in range(n)]
        assert single == [100 * p + r for p in range(n) for _ in range(r + 1)]
        assert even == [[float(p)] * 2 for p in range(n)]


def test_all_reduce_coalesced_and_barriers(world):
    def body(pg):
        a = np.full(3, pg.rank() + 1, np.int32)
        b = np.full((2, 2), 2 * pg.rank(), np.int32)
        pg.all_reduce_coalesced([a, b], op="sum").wait()
        pg.barrier().wait()
        pg.monitored_barrier(timeout=30, wait_all=True).wait()
        return a.tolist(), b.tolist()

    n = world
    for a, b in run_ranks(n, body):
        assert a == [n * (n + 1) // 2] * 3
        assert b == [[n * (n - 1)] * 2] * 2


def test_send_recv_and_any_source(world):
    def body(pg):
        r, n = pg.rank(), pg.size()
        nxt, prv = (r + 1) % n, (r - 1) % n
        s = pg.send(np.full(4, r, np.float32), dst=nxt, tag=5)
        got = np.zeros(4, np.float32)
        pg.recv(got, src=prv, tag=5).wait()
        s.wait()
        if r == 0:
            senders = []
            for _ in range(n - 1):
                buf = np.zeros(1, np.int64)
                w = pg.recv_any_source(buf, tag=9)
                w.wait()
                assert buf[0] == w.source_rank() * 7
                senders.append(w.source_rank())
            return got.tolist(), sorted(senders)
        pg.send(np.array([r * 7], np.int64), dst=0, tag=9).wait()
        return got.tolist(), None

    n = world
    for r, (got, senders) in enumerate(run_ranks(n, body)):
        assert got == [float((r - 1) % n)] * 4
        if r == 0:
            assert senders == list(range(1, n))


def test_new_group(world):
    def body(pg):
        sub = pg.new_group([0, pg.size() - 1])
        if sub is None:
            return None
        x = np.full(2, pg.rank() + 1, np.int64)
        sub.all_reduce(x).wait()
        return sub.rank(), sub.size(), x.tolist()

    n = world
    for r, res in enumerate(run_ranks(n, body)):
        if r in (0, n - 1):
            assert res == ([0, n - 1].index(r), 2, [1 + n] * 2)
        else:
            assert res is None


def test_work_handles(world):
    def body(pg):
        x = np.ones(8, np.float32)
        w = pg.all_reduce(x)
        seen = []
        import threading

        done = threading.Event()
        w.add_done_callback(lambda exc: (seen.append(exc), done.set()))
        fut = w.get_future()
        assert w.wait() is True
        assert w.is_completed() and w.exception() is None
        assert fut.result(timeout=30) is None
        assert done.wait(30) and seen == [None]
        # Waiting twice gives the same outcome; a work dropped before it
        # finishes keeps its array alive until the collective is done.
        assert w.wait() is True
        pg.all_reduce(np.ones(1 << 16, np.float64))
        y = np.ones(3)
        pg.all_reduce(y).wait()
        return x.tolist(), y.tolist()

    n = world
    for x, y in run_ranks(n, body):
        assert x == [float(n)] * 8
        assert y == [float(n)] * 3


def test_blocking_calls_return_finished_works(world):
    # The native group's blocking=True (what tensorcomm.torch uses for a
    # synchronous torch.distributed call) runs the collective before it
    # returns: the work is complete at once and wait() gives the outcome.
    def body(pg):
        r = pg.rank()
        g = pg._g
        x = np.full(4, r + 1.0, np.float32)
        w = g.all_reduce((x.ctypes.data, 0, (4,), None), 0, 1.0, None, x, True)
        finished = w.is_completed()
        assert w.wait() is True and w.exception() is None
        b = np.full(3, float(r), np.float64)
        wb = g.broadcast((b.ctypes.data, 1, (3,), None), 1, None, b, True)
        finished = finished and wb.is_completed()
        assert wb.wait() is True
        assert g.barrier(None, True).is_completed()
        return finished, x.tolist(), b.tolist()

    n = world
    total = float(sum(range(1, n + 1)))
    for finished, x, b in run_ranks(n, body):
        assert finished
        assert x == [total] * 4
        assert b == [1.0] * 3


def test_blocking_call_failure_is_raised_by_wait():
    # A collective that fails (shapes differ between the ranks) still
    # returns its work from a blocking call; wait() and exception() report
    # the failure, as for a work waited on later.
    def body(pg):
        n = 3 + pg.rank()
        x = np.ones(n, np.float32)
        w = pg._g.all_reduce((x.ctypes.data, 0, (n,), None), 0, 1.0, None, x, True)
        assert w.is_completed()
        with pytest.raises(errors.TensorcommError) as raised:
            w.wait()
        assert isinstance(w.exception(), errors.TensorcommError)
        return str(raised.value)

    for message in run_ranks(2, body, timeout=20):
        assert "all_reduce" in message and "rank" in message, message


def test_dropped_work_keeps_its_array_until_the_collective_is_done():
    import gc
    import threading
    import time
    import weakref

    arrived = threading.Event()

    def body(pg):
        if pg.rank() == 1:
            assert arrived.wait(30)
            y = np.full(1024, 2.0, np.float32)
            pg.all_reduce(y).wait()
            pg.all_reduce(np.zeros(1)).wait()
            return y[:2].tolist()
        x = np.ones(1024, np.float32)
        ref = weakref.ref(x)
        pg.all_reduce(x)  # the Work is dropped at once, x right after
        del x
        gc.collect()
        # Rank 1 has not come yet: the collective still owns the array.
        alive_while_running = ref() is not None
        arrived.set()
        z = np.zeros(1)
        pg.all_reduce(z).wait()  # after the first one, in call order
        deadline = time.monotonic() + 10
        while ref() is not None and time.monotonic() < deadline:
            pg.rank()  # a native call: releases left pending run
            gc.collect()
            time.sleep(0.01)
        return alive_while_running, ref() is None

    (alive, released), y = run_ranks(2, body, timeout=30)
    assert y == [3.0, 3.0]
    assert alive, "the array was freed while its collective was running"
    assert released, "the array was never released after its collective finished"
