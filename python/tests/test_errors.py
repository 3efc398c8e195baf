"""Bad input and failed collectives raise typed exceptions whose messages
say what was expected, what was found, and which rank."""

import threading
import time

import numpy as np
import pytest

import tensorcomm
from tensorcomm import errors

from conftest import run_ranks


@pytest.fixture(scope="module")
def solo():
    return tensorcomm.init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")


def test_unsupported_dtype(solo):
    with pytest.raises(errors.InvalidArgumentError, match=r"expected dtype .* found int16"):
        solo.all_reduce(np.zeros(3, np.int16))


def test_not_an_array(solo):
    with pytest.raises(TypeError, match=r"expected a NumPy array .* found list"):
        solo.all_reduce([1.0, 2.0])


def test_gaps_are_refused(solo):
    with pytest.raises(errors.InvalidArgumentError, match=r"no gaps.*strides \[2\]"):
        solo.all_reduce(np.zeros(8, np.float32)[::2])


def test_negative_strides_are_refused(solo):
    with pytest.raises(errors.InvalidArgumentError, match="non-negative strides"):
        solo.all_reduce(np.zeros(4, np.float32)[::-1])


def test_read_only_output_is_refused(solo):
    x = np.zeros(4, np.float32)
    x.setflags(write=False)
    with pytest.raises(errors.InvalidArgumentError, match="writable"):
        solo.broadcast(x)


def test_bad_reduce_op(solo):
    with pytest.raises(errors.InvalidArgumentError, match=r"expected a reduce op .* found 'median'"):
        solo.all_reduce(np.zeros(2), op="median")
    with pytest.raises(errors.InvalidArgumentError, match="BXOR"):
        solo.all_reduce(np.zeros(2, np.float32), op="bxor")


def test_bad_root(solo):
    with pytest.raises(errors.InvalidArgumentError, match="root"):
        solo.broadcast(np.zeros(2), root=3)


def test_shape_mismatch_between_ranks_names_both_calls():
    def body(pg):
        x = np.zeros(4 + pg.rank(), np.float32)
        try:
            pg.broadcast(x, root=0).wait()
        except errors.TensorcommError as e:
            return type(e), str(e)
        return None, "no error"

    for kind, message in run_ranks(2, body, timeout=20):
        assert kind is not None, message
        assert issubclass(kind, errors.CollectiveError), (kind, message)
        assert "rank" in message and "broadcast" in message, message


def test_monitored_barrier_names_the_missing_rank():
    def body(pg):
        if pg.rank() == 1:
            time.sleep(3)  # arrives after rank 0 gave up
            return None
        try:
            pg.monitored_barrier(timeout=0.5).wait()
        except errors.CollectiveTimeoutError as e:
            return str(e)
        return "no error"

    message = run_ranks(2, body, timeout=20)[0]
    assert "1" in message and "monitored_barrier" in message.lower().replace(" ", "_"), message


def test_wait_timeout_raises_and_the_work_goes_on():
    def body(pg):
        if pg.rank() == 0:
            got = np.zeros(2, np.float32)
            w = pg.recv(got, src=1, tag=1)
            with pytest.raises(errors.CollectiveTimeoutError, match="did not finish within"):
                w.wait(timeout=0.2)
            assert not w.is_completed()
            w.wait()
            return got.tolist()
        time.sleep(1.0)
        pg.send(np.full(2, 4.0, np.float32), dst=0, tag=1).wait()
        return None

    assert run_ranks(2, body, timeout=20)[0] == [4.0, 4.0]


def test_gil_is_released_while_waiting():
    """Rank 0 waits for a message that rank 1 sends only after running
    Python code on another thread: that needs the GIL rank 0 would hold."""
    ticks = []

    def body(pg):
        if pg.rank() == 0:
            got = np.zeros(1, np.int64)
            pg.recv(got, src=1, tag=2).wait()
            return int(got[0])
        for i in range(50):
            ticks.append(i)
            time.sleep(0.01)
        pg.send(np.array([len(ticks)], np.int64), dst=0, tag=2).wait()
        return None

    assert run_ranks(2, body, timeout=30)[0] == 50


def test_failed_work_reports_through_exception_and_callbacks():
    def body(pg):
        if pg.rank() == 1:
            return None  # never sends
        w = pg.recv(np.zeros(1), src=1, tag=3, timeout=0.3)
        seen = []
        done = threading.Event()
        w.add_done_callback(lambda exc: (seen.append(exc), done.set()))
        with pytest.raises(errors.TensorcommError):
            w.wait()
        assert w.is_completed()
        assert isinstance(w.exception(), errors.TensorcommError)
        assert done.wait(30) and isinstance(seen[0], errors.TensorcommError)
        return str(seen[0])

    message = run_ranks(2, body, timeout=20)[0]
    assert "rank" in message, message
