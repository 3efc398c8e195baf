"""Helpers for the NumPy-level tests: ranks as threads of this process
(the GIL is released while collectives run, so they progress together)."""

import itertools
import threading

import pytest

import tensorcomm

_groups = itertools.count()


def run_ranks(size, body, timeout=60.0, store=None, prefix=None):
    """Runs ``body(pg)`` on ``size`` ranks (threads) of one new group and
    returns their results in rank order; re-raises the first rank's error."""
    store = store if store is not None else tensorcomm.HashStore()
    prefix = prefix or f"test{next(_groups)}"
    results = [None] * size
    failures = [None] * size

    def rank_main(rank):
        try:
            pg = tensorcomm.ProcessGroup.from_store(store, rank, size, prefix=prefix, timeout=timeout)
            results[rank] = body(pg)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            failures[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
        if t.is_alive():
            raise AssertionError(f"a rank did not finish within {timeout + 30} s")
    for rank, failure in enumerate(failures):
        if failure is not None:
            raise AssertionError(f"rank {rank} failed: {type(failure).__name__}: {failure}") from failure
    return results


@pytest.fixture(params=[2, 3], ids=lambda n: f"{n}ranks")
def world(request):
    return request.param
