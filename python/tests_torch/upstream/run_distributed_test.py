"""Runs PyTorch's own ``torch.distributed`` test suite against the
``"tensorcomm"`` backend.

The suite is ``DistributedTest._DistTestBase`` of
``torch/testing/_internal/distributed/distributed_test.py``, which every
PyTorch wheel ships; upstream runs it through
``test/distributed/test_distributed_spawn.py`` (not in the wheel), whose
few lines this file repeats: a ``TestDistBackend`` subclass that spawns
``WORLD_SIZE`` processes per test, each of which calls
``dist.init_process_group(backend=BACKEND, init_method="file://...")``.

The suite knows only gloo, nccl, mpi and ucc: its skip decorators and
branches test ``BACKEND == "gloo"`` and friends. So the run sets
``BACKEND=gloo`` (the tests pick their CPU/Gloo branches and skips) and
this file replaces, in every process (the spawned ranks re-import this
file as ``__mp_main__``), ``torch.distributed.init_process_group`` and
``new_group`` with wrappers that turn a ``"gloo"`` backend (also in
``"cpu:gloo,..."`` strings) into ``"tensorcomm"``. Nothing else of
PyTorch or of the tests is changed. A test that asks the group for its
backend name (``dist.get_backend()``) then sees ``"tensorcomm"``, not
``"gloo"``.
The exception: the tests of ``_NAME_TESTS`` (``test_get_backend``), which
only compare ``dist.get_backend()`` with ``BACKEND``, run with
``BACKEND=tensorcomm``, the name of the backend under test, and no
substitution. ``--backend gloo`` turns the substitution off, for a Gloo baseline of the
same selection on the same machine.

Usage (the environment needs torch, expecttest and the tensorcomm
wheel)::

    python run_distributed_test.py [--world-size 2] [--timeout 60] \\
        [--backend tensorcomm|gloo] [-k REGEX ...] [--exclude REGEX ...] \\
        [--shard K/N] [--list] [--json out.json]

Shards run side by side (each invocation has its own TEMP_DIR and ports).

``--timeout`` is the suite's per-test limit
(``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``; a few tests have their own).

Per test: pass, fail (a rank raised, or timed out), skip (the suite's own
skip conditions: CUDA, NCCL-only, world size ...). A summary line and,
with ``--json``, every test's outcome and message are written at the end.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import time
import unittest


def _early_args():
    """--world-size, --timeout and --backend, set as environment variables
    before the suite is imported (the spawned ranks inherit them)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--world-size", type=int)
    p.add_argument("--timeout", type=int)
    p.add_argument("--backend", choices=["tensorcomm", "gloo"])
    known, _ = p.parse_known_args()
    if known.world_size is not None:
        os.environ["WORLD_SIZE"] = str(known.world_size)
    if known.timeout is not None:
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(known.timeout)
    if known.backend is not None:
        os.environ["TENSORCOMM_UPSTREAM_BACKEND"] = known.backend


if __name__ == "__main__":
    _early_args()
_TARGET = os.environ.get("TENSORCOMM_UPSTREAM_BACKEND", "tensorcomm")

# Tests that only compare the group's backend name with BACKEND
# (``dist.get_backend() == BACKEND.lower()``) and take no Gloo branch: they
# run with BACKEND naming the backend under test, so that they check what
# they mean to (the name a group was made with; ValueError for a
# non-member) instead of failing on the harness's BACKEND=gloo.
_NAME_TESTS = {"test_get_backend"}


def _setup_env():
    """The environment distributed_test.py reads at import."""
    # The parent sets this around each test of _NAME_TESTS; spawned ranks
    # inherit it.
    os.environ["BACKEND"] = os.environ.get("TENSORCOMM_UPSTREAM_SUITE_BACKEND", "gloo")
    os.environ.setdefault("WORLD_SIZE", "2")
    os.environ.setdefault("INIT_METHOD", "env://")
    if "TEMP_DIR" not in os.environ:
        tmp = tempfile.mkdtemp(prefix="tc-upstream-")
        os.makedirs(os.path.join(tmp, "barrier"), exist_ok=True)
        os.environ["TEMP_DIR"] = tmp


def _swap(backend):
    """``backend`` with Gloo replaced by the target backend."""
    if _TARGET == "gloo" or backend is None:
        return backend
    if isinstance(backend, str):
        return re.sub(r"\bgloo\b", _TARGET, backend, flags=re.IGNORECASE)
    if str(backend).lower() == "gloo":
        return _TARGET
    return backend


def _patch():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if _TARGET != "gloo":
        import tensorcomm.torch  # noqa: F401  registers "tensorcomm"

    real_init = c10d.init_process_group
    real_new_group = c10d.new_group

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _swap(kwargs["backend"])
        elif args:
            args = (_swap(args[0]),) + tuple(args[1:])
        return real_init(*args, **kwargs)

    def new_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _swap(kwargs["backend"])
        elif len(args) >= 3:
            args = tuple(args[:2]) + (_swap(args[2]),) + tuple(args[3:])
        return real_new_group(*args, **kwargs)

    for mod in (dist, c10d):
        mod.init_process_group = init_process_group
        mod.new_group = new_group


_setup_env()
_patch()

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """test_distributed_spawn.py's class."""

    def setUp(self):
        named = _TARGET != "gloo" and self._testMethodName in _NAME_TESTS
        os.environ["TENSORCOMM_UPSTREAM_SUITE_BACKEND"] = _TARGET if named else "gloo"
        super().setUp()
        self._spawn_processes()


class _Result(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = []
        self._t0 = None

    def startTest(self, test):
        self._t0 = time.time()
        super().startTest(test)

    def _add(self, test, outcome, message=""):
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes.append({"test": name, "outcome": outcome, "seconds": round(time.time() - self._t0, 2),
                              "message": message})

    def addSuccess(self, test):
        super().addSuccess(test)
        self._add(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._add(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._add(test, "fail", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._add(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._add(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._add(test, "fail", "unexpected success")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, default=2, help="ranks per test (2 or more)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per test")
    p.add_argument("--backend", choices=["tensorcomm", "gloo"], default="tensorcomm",
                   help="gloo: no substitution, for a baseline")
    p.add_argument("-k", action="append", default=[], help="run the tests whose name matches this regex (repeatable)")
    p.add_argument("--exclude", action="append", default=[], help="leave out tests whose name matches this regex")
    p.add_argument("--shard", default="1/1", help="K/N: run the K-th of N interleaved slices of the selection")
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument("--json", help="write every test's outcome here")
    args = p.parse_args()

    names = sorted(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))
    if args.k:
        names = [n for n in names if any(re.search(k, n) for k in args.k)]
    if args.exclude:
        names = [n for n in names if not any(re.search(k, n) for k in args.exclude)]
    k, n = (int(x) for x in args.shard.split("/"))
    names = names[k - 1::n]
    if args.list:
        print("\n".join(names))
        print(f"{len(names)} tests", file=sys.stderr)
        return 0

    import torch

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    runner = unittest.TextTestRunner(verbosity=2, resultclass=_Result, stream=sys.stdout)
    t0 = time.time()
    result = runner.run(suite)
    counts = {k: sum(1 for o in result.outcomes if o["outcome"] == k) for k in ("pass", "fail", "skip")}
    summary = (f"upstream distributed_test: torch {torch.__version__}, backend {_TARGET} "
               f"(BACKEND=gloo), world size {os.environ['WORLD_SIZE']}, {len(names)} tests: "
               f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip, "
               f"{time.time() - t0:.0f} s")
    print(summary)
    for o in result.outcomes:
        if o["outcome"] == "fail":
            print(f"FAILED {o['test']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "torch": torch.__version__, "backend": _TARGET,
                       "world_size": int(os.environ["WORLD_SIZE"]), "counts": counts,
                       "tests": result.outcomes}, f, indent=1)
    return 0 if counts["fail"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
