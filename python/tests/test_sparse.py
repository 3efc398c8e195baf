"""The sparse all-reduce of the NumPy API (Gloo's sparse all_reduce: SUM
of COO tensors, coalesced result), on 2 and 3 ranks."""

import numpy as np
import pytest

from tensorcomm import errors

from conftest import run_ranks


def rank_entries(r):
    """Rank ``r``'s COO entries of a [5, 3] tensor with one dense dim of 2:
    unsorted, with a duplicate, overlapping the other ranks'."""
    rows = [r % 5, 4, r % 5, (2 * r) % 5]
    cols = [1, 0, 1, 2]
    values = np.array([[r + 1, 10 * r], [1, 1], [2, 3], [r, -r]], dtype=np.float64)
    return np.array([rows, cols], dtype=np.int64), values


def expected_sum(n):
    """The coalesced sum of every rank's entries: sorted unique coordinates."""
    acc = {}
    for r in range(n):
        idx, vals = rank_entries(r)
        for j in range(idx.shape[1]):
            key = (int(idx[0, j]), int(idx[1, j]))
            acc[key] = acc.get(key, np.zeros(2)) + vals[j]
    keys = sorted(acc)
    return np.array(keys, dtype=np.int64).T, np.array([acc[k] for k in keys])


def test_all_reduce_sparse_sums_and_coalesces(world):
    def body(pg):
        idx, vals = rank_entries(pg.rank())
        blocking = pg.all_reduce_sparse(idx, vals, (5, 3, 2)).wait()
        work = pg.all_reduce_sparse(idx, vals, (5, 3, 2), timeout=30)
        future = work.get_future()
        future.result(timeout=30)
        assert work.is_completed() and work.exception() is None
        return blocking, work.wait(), work.wait()

    e_idx, e_vals = expected_sum(world)
    for results in run_ranks(world, body):
        for idx, vals in results:
            assert idx.dtype == np.int64 and idx.shape == e_idx.shape
            assert vals.dtype == np.float64 and vals.shape == e_vals.shape
            assert idx.tolist() == e_idx.tolist()
            assert vals.tolist() == e_vals.tolist()


def test_all_reduce_sparse_empty_and_integer(world):
    def body(pg):
        r = pg.rank()
        # Only rank 1 has entries; int32 values, no dense dims.
        idx = np.array([[3, 1]] if r == 1 else np.zeros((1, 0)), dtype=np.int64)
        vals = np.array([7, 5] if r == 1 else [], dtype=np.int32)
        return pg.all_reduce_sparse(idx, vals, (4,)).wait()

    for idx, vals in run_ranks(world, body):
        assert idx.tolist() == [[1, 3]] and vals.tolist() == [5, 7] and vals.dtype == np.int32


def test_all_reduce_sparse_refuses_other_ops_and_bad_parts():
    def body(pg):
        idx, vals = rank_entries(pg.rank())
        for op in ("MAX", "AVG"):
            with pytest.raises(errors.InvalidArgumentError, match="(?i)sum"):
                pg.all_reduce_sparse(idx, vals, (5, 3, 2), op=op)
        with pytest.raises(errors.InvalidArgumentError, match="int64"):
            pg.all_reduce_sparse(idx.astype(np.int32), vals, (5, 3, 2))
        with pytest.raises(errors.InvalidArgumentError, match="out of range"):
            pg.all_reduce_sparse(idx, vals, (2, 3, 2))
        # Nothing was sent: the group still works.
        return pg.all_reduce_sparse(idx, vals, (5, 3, 2)).wait()[0].shape

    run_ranks(2, body)


def test_all_reduce_sparse_different_sizes_fail_on_every_rank():
    def body(pg):
        idx = np.array([[0]], dtype=np.int64)
        size = 4 if pg.rank() == 0 else 6
        with pytest.raises(errors.TensorcommError) as info:
            pg.all_reduce_sparse(idx, np.ones(1, np.float32), (size,), timeout=20).wait()
        return str(info.value)

    for message in run_ranks(2, body):
        assert "4" in message and "6" in message, message
