"""The stores, and groups meeting through a store written in Python (the
way the PyTorch backend meets through torch.distributed's store)."""

import datetime
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tensorcomm
from tensorcomm import errors

from conftest import run_ranks


def check_store(store):
    store.set("a", b"1")
    store.set("s", "text")
    assert store.get("a") == b"1" and store.get("s") == b"text"
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5
    assert store.compare_set("c", b"", b"x") == b"x"
    assert store.compare_set("c", b"y", b"z") == b"x"
    store.wait(["a", "n"], timeout=5)
    assert store.check(["a"]) and not store.check(["missing"])
    store.append("a", b"2")
    assert store.get("a") == b"12"
    store.multi_set(["m1", "m2"], [b"p", b"q"])
    assert store.multi_get(["m1", "m2"]) == [b"p", b"q"]
    assert store.delete_key("m1") and not store.delete_key("m1")
    assert store.num_keys() >= 4
    store.queue_push("q", b"first")
    assert store.queue_len("q") == 1
    assert store.queue_pop("q", timeout=5) == b"first"
    with pytest.raises(errors.StoreTimeoutError, match="missing"):
        store.get("missing", timeout=0.05)
    store.barrier("b", 1, timeout=5)


def test_hash_store():
    check_store(tensorcomm.HashStore())


def test_file_store(tmp_path):
    check_store(tensorcomm.FileStore(str(tmp_path / "store")))


def test_tcp_store():
    server = tensorcomm.TcpStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=30)
    assert server.port > 0
    client = tensorcomm.TcpStore("127.0.0.1", server.port, timeout=30)
    check_store(client)
    assert server.get("a") == b"12"
    del client  # before the server, which lingers for connected clients
    del server


def test_prefix_store():
    base = tensorcomm.HashStore()
    check_store(tensorcomm.PrefixStore("job", base))
    assert base.get("job/a") == b"12"


def test_store_rejects_bad_values():
    with pytest.raises(errors.InvalidArgumentError, match="expected a store value"):
        tensorcomm.HashStore().set("k", 3.5)
    with pytest.raises(errors.InvalidArgumentError, match="timeout"):
        tensorcomm.HashStore().get("k", timeout=-1)


class DictStore:
    """A store with torch.distributed.Store's method signatures, in Python."""

    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()
        self.timeout = datetime.timedelta(seconds=30)

    def set(self, key, value):
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def get(self, key):
        self.wait([key], self.timeout)
        return self.data[key]

    def add(self, key, delta):
        with self.cond:
            value = int(self.data.get(key, b"0")) + delta
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def compare_set(self, key, expected, desired):
        with self.cond:
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = desired
                self.cond.notify_all()
            return self.data.get(key, expected)

    def wait(self, keys, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError(f"Wait timeout for keys {keys}")

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key):
        with self.cond:
            return self.data.pop(key, None) is not None

    def num_keys(self):
        return len(self.data)

    def multi_get(self, keys):
        return [self.data[k] for k in keys]

    def multi_set(self, keys, values):
        for k, v in zip(keys, values):
            self.set(k, v)


def test_group_through_a_python_store():
    store = DictStore()

    def body(pg):
        x = np.full(1000, pg.rank() + 1.0, np.float32)
        pg.all_reduce(x).wait()
        pg.barrier().wait()
        return float(x[0])

    assert run_ranks(3, body, store=store) == [6.0, 6.0, 6.0]
    assert any(k.startswith("test") for k in store.data)


def test_python_store_timeout_is_a_store_timeout():
    store = DictStore()
    store.timeout = datetime.timedelta(seconds=0.2)
    # Rank 1 of 2 never comes: setup fails within the timeout, naming the key
    # the Python store's wait() timed out on.
    with pytest.raises(errors.StoreTimeoutError, match=r"lonely/.*1"):
        tensorcomm.ProcessGroup.from_store(store, 0, 2, prefix="lonely", timeout=1)


def test_not_a_store():
    with pytest.raises(errors.InvalidArgumentError, match="expected a store"):
        tensorcomm.ProcessGroup.from_store(object(), 0, 1)


SCRIPT = """
import numpy as np, tensorcomm
pg = tensorcomm.init_process_group("cpu", "env://")
x = np.full(4, pg.rank() + 1.0, dtype=np.float32)
pg.all_reduce(x).wait()
print("rank", pg.rank(), "of", pg.size(), "sum", x[0])
"""


def test_env_init_in_separate_processes(tmp_path):
    """What `tensorcomm run --nproc-per-node 2 -- python script.py` does:
    two processes with the torchrun variables."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    server = tensorcomm.TcpStore("127.0.0.1", 0, world_size=1, is_master=True)
    port = server.port
    del server  # free the port for rank 0's store
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {rank} of 2 sum 3.0" in out, out


def test_under_tensorcomm_run(tmp_path):
    """The same script under the launcher, when a built one is around."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    candidates = [os.environ.get("TENSORCOMM_BIN", "")] + [
        os.path.join(root, "target", kind, "tensorcomm") for kind in ("release", "debug")
    ]
    launcher = next((c for c in candidates if c and os.path.isfile(c)), None)
    if launcher is None:
        pytest.skip("no tensorcomm binary built (cargo build -p tensorcomm-cli)")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([launcher, "run", "--nproc-per-node", "2", "--", sys.executable, str(script)],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank in range(2):
        assert f"rank {rank} of 2 sum 3.0" in out.stdout, out.stdout
