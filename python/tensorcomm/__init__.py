"""tensorcomm for Python: collectives between processes on NumPy arrays,
and (``import tensorcomm.torch``) a ``torch.distributed`` backend.

The shape follows the Rust API. Under ``tensorcomm run --nproc-per-node 2``
(or torchrun), this script runs as is on each rank::

    import numpy as np
    import tensorcomm

    pg = tensorcomm.init_process_group("cpu", "env://")
    grads = np.full(4, pg.rank() + 1.0, dtype=np.float32)
    pg.all_reduce(grads).wait()              # op defaults to SUM
    assert (grads == 3.0).all()              # 1 + 2 on two ranks

Arrays are used in place (no copy): a collective reads and writes the
array's own memory, and its :class:`Work` keeps the array alive until the
collective is done. Supported dtypes: float32, float64, float16, int8,
uint8, int32, int64, bool; arrays must be contiguous or densely permuted
(a transposed matrix). Every blocking call releases the GIL. Errors are
:mod:`tensorcomm.errors` exceptions carrying the Rust library's message.
"""

import atexit
import concurrent.futures

from . import errors
from ._arrays import describe as _d
from ._arrays import describe_list as _dl
from ._tensorcomm import (
    FileStore,
    HashStore,
    PrefixStore,
    Store,
    TcpStore,
    Work,
    __version__,
)
from ._tensorcomm import _mark_finalizing
from ._tensorcomm import cpu_group_from_store as _cpu_group_from_store
from ._tensorcomm import init_process_group as _init_process_group
from .errors import InvalidArgumentError, TensorcommError

atexit.register(_mark_finalizing)


class ReduceOp:
    """How reducing collectives combine the ranks' values (c10d's names).

    Pass one of the constants, its name as a string (``"sum"``, any case),
    or ``ReduceOp.premul_sum(factor)`` (the sum times ``factor``, floating
    dtypes only). ``BAND``/``BOR``/``BXOR`` take integer and bool arrays.

    >>> ReduceOp.AVG
    'AVG'
    >>> ReduceOp.premul_sum(0.5)
    ReduceOp.premul_sum(0.5)
    """

    SUM = "SUM"
    AVG = "AVG"
    PRODUCT = "PRODUCT"
    MIN = "MIN"
    MAX = "MAX"
    BAND = "BAND"
    BOR = "BOR"
    BXOR = "BXOR"

    class _PremulSum:
        __slots__ = ("factor",)

        def __init__(self, factor):
            self.factor = float(factor)

        def __repr__(self):
            return f"ReduceOp.premul_sum({self.factor})"

    @staticmethod
    def premul_sum(factor):
        """The sum multiplied by ``factor``.

        >>> ReduceOp.premul_sum(2).factor
        2.0
        """
        return ReduceOp._PremulSum(factor)


_OP_CODES = {"SUM": 0, "AVG": 1, "PRODUCT": 2, "PROD": 2, "MIN": 3, "MAX": 4, "BAND": 5, "BOR": 6, "BXOR": 7}


def _op(op):
    """(code, factor) of a reduce op given as a name or premul_sum."""
    if isinstance(op, str):
        code = _OP_CODES.get(op.upper())
        if code is not None:
            return code, 1.0
    elif isinstance(op, ReduceOp._PremulSum):
        return 8, op.factor
    raise InvalidArgumentError(
        f"expected a reduce op (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or "
        f"ReduceOp.premul_sum(factor)), found {op!r}"
    )


def _work_future(work):
    """A concurrent.futures.Future of ``work``'s outcome."""
    future = concurrent.futures.Future()

    def settle(exc):
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)

    work.add_done_callback(settle)
    return future


def get_future(work):
    """A :class:`concurrent.futures.Future` that completes (result ``None``,
    or the collective's exception) when ``work`` does; callbacks added to
    it run on tensorcomm's callback thread.

    >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
    >>> import numpy as np
    >>> get_future(pg.barrier()).result(timeout=30) is None
    True
    """
    return _work_future(work)


# NumPy dtype of each native dtype code (bfloat16 has none).
_NUMPY_DTYPES = {0: "<f4", 1: "<f8", 2: "<f2", 4: "|i1", 5: "|u1", 6: "<i4", 7: "<i8", 8: "|b1"}


class SparseWork:
    """The work of :meth:`ProcessGroup.all_reduce_sparse`: ``wait()``
    blocks (without the GIL) and returns the coalesced sum as
    ``(indices, values)`` NumPy arrays, or raises the collective's error."""

    __slots__ = ("_native", "_sparse_dim", "_dtype", "_dense_shape")

    def __init__(self, native, sparse_dim, dtype_code, dense_shape):
        self._native = native
        self._sparse_dim = sparse_dim
        self._dtype = _NUMPY_DTYPES[dtype_code]
        self._dense_shape = dense_shape

    def wait(self, timeout=None):
        import numpy as np

        nnz, indices, values = self._native.wait(timeout)
        return (
            np.frombuffer(indices, np.int64).reshape(self._sparse_dim, nnz),
            np.frombuffer(values, self._dtype).reshape((nnz,) + self._dense_shape),
        )

    def is_completed(self):
        return self._native.is_completed()

    def exception(self):
        return self._native.exception()

    def add_done_callback(self, callback):
        """Calls ``callback(None)`` or ``callback(exception)`` once the
        collective has finished, as :meth:`Work.add_done_callback`."""
        self._native.add_done_callback(callback)

    def get_future(self):
        """A :class:`concurrent.futures.Future` of the outcome (``None``);
        ``wait()`` gives the sum."""
        return _work_future(self)

    def __repr__(self):
        return f"SparseWork(completed={self.is_completed()})"


class ProcessGroup:
    """A group of ranks running collectives on NumPy arrays.

    Made by :func:`init_process_group`, :meth:`from_store` or
    :meth:`new_group`. Every collective returns a :class:`Work` at once;
    ``.wait()`` blocks (without the GIL) and raises the collective's error.
    ``timeout`` (seconds) overrides the group's default for one call; ranks
    are this group's ranks.

    >>> import numpy as np
    >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
    >>> x = np.arange(4, dtype=np.int64)
    >>> pg.all_reduce(x, op="max").wait()
    True
    >>> x.tolist()
    [0, 1, 2, 3]
    """

    __slots__ = ("_g",)

    def __init__(self, native):
        self._g = native

    @classmethod
    def from_store(cls, store, rank, size, prefix="tensorcomm", timeout=None, transport=None):
        """A CPU group of ``size`` ranks meeting through ``store`` (a
        tensorcomm :class:`Store`, or any object with
        ``torch.distributed.Store``'s methods); every rank passes the same
        ``prefix``.

        >>> store = HashStore()
        >>> pg = ProcessGroup.from_store(store, 0, 1)
        >>> (pg.rank(), pg.size())
        (0, 1)
        """
        return cls(_cpu_group_from_store(store, rank, size, prefix, timeout, None, transport))

    def rank(self):
        """This rank in the group."""
        return self._g.rank()

    def size(self):
        """The number of ranks in the group."""
        return self._g.size()

    def backend(self):
        """The backend's name (``"cpu"``, ``"nccl"``, ``"auto"``)."""
        return self._g.backend()

    def global_ranks(self):
        """The default group's rank of each rank of this group."""
        return self._g.global_ranks()

    def all_reduce(self, array, op=ReduceOp.SUM, timeout=None):
        """Reduces ``array`` over all ranks with ``op``; every rank gets the
        result in place.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> g = np.ones(3, np.float32)
        >>> pg.all_reduce(g, op=ReduceOp.AVG).wait() and g.tolist()
        [1.0, 1.0, 1.0]
        """
        code, factor = _op(op)
        return self._g.all_reduce(_d(array, "all_reduce: array"), code, factor, timeout, array)

    def all_reduce_coalesced(self, arrays, op=ReduceOp.SUM, timeout=None):
        """:meth:`all_reduce` of several arrays of one dtype as one
        collective.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> a, b = np.ones(2), np.zeros(3)
        >>> pg.all_reduce_coalesced([a, b]).wait()
        True
        """
        code, factor = _op(op)
        return self._g.all_reduce_coalesced(_dl(arrays, "all_reduce_coalesced: arrays"), code, factor, timeout, arrays)

    def broadcast(self, array, root=0, timeout=None):
        """Copies ``array`` of rank ``root`` into ``array`` of every rank.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.broadcast(np.arange(3), root=0).wait()
        True
        """
        return self._g.broadcast(_d(array, "broadcast: array"), root, timeout, array)

    def reduce(self, array, root=0, op=ReduceOp.SUM, timeout=None):
        """Reduces ``array`` over all ranks into ``array`` of rank ``root``
        (the others' arrays are left unchanged).

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.reduce(np.ones(2), root=0, op="product").wait()
        True
        """
        code, factor = _op(op)
        return self._g.reduce(_d(array, "reduce: array"), root, code, factor, timeout, array)

    def all_gather(self, outputs, array, timeout=None):
        """Copies ``array`` of every rank ``r`` into ``outputs[r]`` (one
        array per rank, each of ``array``'s dtype and shape).

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = [np.zeros(2)]
        >>> pg.all_gather(out, np.ones(2)).wait() and out[0].tolist()
        [1.0, 1.0]
        """
        return self._g.all_gather(
            _dl(outputs, "all_gather: outputs"), _d(array, "all_gather: array", False), timeout, (outputs, array)
        )

    def all_gather_into_tensor(self, output, array, timeout=None):
        """:meth:`all_gather` into one ``output`` holding every rank's
        array in rank order, concatenated along axis 0 (shape
        ``(size * d0, ...)``) or stacked (shape ``(size, d0, ...)``).

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = np.zeros(2, np.int32)
        >>> pg.all_gather_into_tensor(out, np.array([4, 5], np.int32)).wait() and out.tolist()
        [4, 5]
        """
        return self._g.all_gather_into_tensor(
            _d(output, "all_gather_into_tensor: output"),
            _d(array, "all_gather_into_tensor: array", False),
            timeout,
            (output, array),
        )

    def all_gather_coalesced(self, outputs, arrays, timeout=None):
        """:meth:`all_gather` of several arrays at once: ``outputs[r][i]``
        receives ``arrays[i]`` of rank ``r``.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = [[np.zeros(1), np.zeros(2)]]
        >>> pg.all_gather_coalesced(out, [np.ones(1), np.ones(2)]).wait()
        True
        """
        if not isinstance(outputs, (list, tuple)):
            raise TypeError(f"all_gather_coalesced: expected a list of lists of arrays, found {type(outputs).__name__}")
        descs = [_dl(o, f"all_gather_coalesced: outputs[{r}]") for r, o in enumerate(outputs)]
        return self._g.all_gather_coalesced(
            descs, _dl(arrays, "all_gather_coalesced: arrays", False), timeout, (outputs, arrays)
        )

    def all_gather_into_tensor_coalesced(self, outputs, arrays, timeout=None):
        """:meth:`all_gather_into_tensor` of several pairs as one
        collective: ``outputs[i]`` receives every rank's ``arrays[i]``.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.all_gather_into_tensor_coalesced([np.zeros(2)], [np.ones(2)]).wait()
        True
        """
        return self._g.all_gather_into_tensor_coalesced(
            _dl(outputs, "all_gather_into_tensor_coalesced: outputs"),
            _dl(arrays, "all_gather_into_tensor_coalesced: arrays", False),
            timeout,
            (outputs, arrays),
        )

    def gather(self, array, outputs=None, root=0, timeout=None):
        """Copies ``array`` of every rank ``r`` into ``outputs[r]`` of rank
        ``root``; only the root passes ``outputs``.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = [np.zeros(2)]
        >>> pg.gather(np.ones(2), out, root=0).wait() and out[0].tolist()
        [1.0, 1.0]
        """
        descs = None if outputs is None else _dl(outputs, "gather: outputs")
        return self._g.gather(_d(array, "gather: array", False), descs, root, timeout, (outputs, array))

    def scatter(self, output, inputs=None, root=0, timeout=None):
        """Copies ``inputs[r]`` of rank ``root`` into ``output`` of every
        rank ``r``; only the root passes ``inputs``.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = np.zeros(2)
        >>> pg.scatter(out, [np.ones(2)], root=0).wait() and out.tolist()
        [1.0, 1.0]
        """
        descs = None if inputs is None else _dl(inputs, "scatter: inputs", False)
        return self._g.scatter(_d(output, "scatter: output"), descs, root, timeout, (output, inputs))

    def reduce_scatter(self, output, inputs, op=ReduceOp.SUM, timeout=None):
        """Reduces ``inputs[r]`` over all ranks into ``output`` of rank
        ``r`` (one input per rank, each of ``output``'s dtype and shape).

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = np.zeros(2)
        >>> pg.reduce_scatter(out, [np.ones(2)]).wait() and out.tolist()
        [1.0, 1.0]
        """
        code, factor = _op(op)
        return self._g.reduce_scatter(
            _d(output, "reduce_scatter: output"),
            _dl(inputs, "reduce_scatter: inputs", False),
            code,
            factor,
            timeout,
            (output, inputs),
        )

    def reduce_scatter_tensor(self, output, array, op=ReduceOp.SUM, timeout=None):
        """:meth:`reduce_scatter` from one ``array`` holding the per-rank
        inputs concatenated along axis 0 (or stacked).

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = np.zeros(2)
        >>> pg.reduce_scatter_tensor(out, np.ones(2)).wait()
        True
        """
        code, factor = _op(op)
        return self._g.reduce_scatter_tensor(
            _d(output, "reduce_scatter_tensor: output"),
            _d(array, "reduce_scatter_tensor: array", False),
            code,
            factor,
            timeout,
            (output, array),
        )

    def reduce_scatter_tensor_coalesced(self, outputs, arrays, op=ReduceOp.SUM, timeout=None):
        """:meth:`reduce_scatter_tensor` of several pairs as one collective.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.reduce_scatter_tensor_coalesced([np.zeros(2)], [np.ones(2)]).wait()
        True
        """
        code, factor = _op(op)
        return self._g.reduce_scatter_tensor_coalesced(
            _dl(outputs, "reduce_scatter_tensor_coalesced: outputs"),
            _dl(arrays, "reduce_scatter_tensor_coalesced: arrays", False),
            code,
            factor,
            timeout,
            (outputs, arrays),
        )

    def all_to_all(self, outputs, inputs, timeout=None):
        """Copies ``inputs[p]`` of this rank into ``outputs[r]`` of rank
        ``p`` (``r`` being this rank), for every pair; sizes may differ per
        peer as long as each pair agrees.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = [np.zeros(3)]
        >>> pg.all_to_all(out, [np.ones(3)]).wait() and out[0].tolist()
        [1.0, 1.0, 1.0]
        """
        return self._g.all_to_all(
            _dl(outputs, "all_to_all: outputs"), _dl(inputs, "all_to_all: inputs", False), timeout, (outputs, inputs)
        )

    def all_to_all_single(self, output, array, output_split_sizes=None, input_split_sizes=None, timeout=None):
        """All-to-all over rows (axis 0): ``input_split_sizes[p]`` rows of
        ``array`` go to rank ``p``, ``output_split_sizes[p]`` rows of
        ``output`` come from it; ``None`` splits equally.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> out = np.zeros(4)
        >>> pg.all_to_all_single(out, np.arange(4.0), [4], [4]).wait() and out.tolist()
        [0.0, 1.0, 2.0, 3.0]
        """
        return self._g.all_to_all_single(
            _d(output, "all_to_all_single: output"),
            _d(array, "all_to_all_single: array", False),
            list(output_split_sizes or []),
            list(input_split_sizes or []),
            timeout,
            (output, array),
        )

    def all_reduce_sparse(self, indices, values, sizes, op=ReduceOp.SUM, timeout=None):
        """Sums a sparse COO tensor over all ranks (``op`` must be SUM),
        as Gloo's sparse all-reduce does: ``indices`` (int64, shape
        ``[sparse_dim, nnz]``, duplicates allowed), ``values`` (shape
        ``[nnz, dense dims...]``) and ``sizes`` (the full shape, the same
        on every rank). The arrays are copied when the call returns; the
        returned :class:`SparseWork`'s ``wait()`` gives the coalesced sum
        as new ``(indices, values)`` arrays, the same on every rank.

        >>> import numpy as np
        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> idx = np.array([[2, 0, 2]])
        >>> i, v = pg.all_reduce_sparse(idx, np.array([1.0, 2.0, 3.0]), (4,)).wait()
        >>> i.tolist(), v.tolist()
        ([[0, 2]], [2.0, 4.0])
        """
        code, _ = _op(op)
        d_indices = _d(indices, "all_reduce_sparse: indices", writable=False)
        d_values = _d(values, "all_reduce_sparse: values", writable=False)
        sizes = tuple(int(s) for s in sizes)
        native = self._g.all_reduce_sparse(d_indices, d_values, sizes, code, timeout)
        return SparseWork(native, d_indices[2][0] if d_indices[2] else 0, d_values[1], tuple(d_values[2][1:]))

    def barrier(self, timeout=None):
        """Completes once every rank has called it.

        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.barrier().wait()
        True
        """
        return self._g.barrier(timeout)

    def monitored_barrier(self, timeout=None, wait_all=False):
        """A barrier that names the ranks that did not come within
        ``timeout`` seconds (all of them with ``wait_all``), raising
        :class:`~tensorcomm.errors.CollectiveTimeoutError` on every rank
        that came.

        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.monitored_barrier(timeout=10).wait()
        True
        """
        return self._g.monitored_barrier(timeout, wait_all)

    def send(self, array, dst, tag=0, timeout=None):
        """Sends ``array`` to rank ``dst``, for a :meth:`recv` (or
        :meth:`recv_any_source`) with the same ``tag`` into an array of the
        same size. Two ranks, as threads of this process:

        >>> import numpy as np, threading
        >>> store = HashStore()
        >>> def rank1():
        ...     pg = ProcessGroup.from_store(store, 1, 2, prefix="doc-send")
        ...     pg.send(np.arange(3.0), dst=0, tag=7).wait()
        >>> t = threading.Thread(target=rank1); t.start()
        >>> pg = ProcessGroup.from_store(store, 0, 2, prefix="doc-send")
        >>> x = np.zeros(3)
        >>> pg.recv(x, src=1, tag=7).wait() and x.tolist()
        [0.0, 1.0, 2.0]
        >>> t.join()
        """
        return self._g.send(_d(array, "send: array", False), dst, tag, timeout, array)

    def recv(self, array, src, tag=0, timeout=None):
        """Receives the message rank ``src`` sent with ``tag`` into
        ``array`` (see :meth:`send`)."""
        return self._g.recv(_d(array, "recv: array"), src, tag, timeout, array)

    def recv_any_source(self, array, tag=0, timeout=None):
        """Receives the first message any rank sent with ``tag``; after
        ``wait()``, the work's ``source_rank()`` names the sender.

        >>> import numpy as np, threading
        >>> store = HashStore()
        >>> def rank1():
        ...     pg = ProcessGroup.from_store(store, 1, 2, prefix="doc-any")
        ...     pg.send(np.ones(1), dst=0, tag=3).wait()
        >>> t = threading.Thread(target=rank1); t.start()
        >>> pg = ProcessGroup.from_store(store, 0, 2, prefix="doc-any")
        >>> w = pg.recv_any_source(np.zeros(1), tag=3)
        >>> w.wait() and w.source_rank()
        1
        >>> t.join()
        """
        return self._g.recv_any_source(_d(array, "recv_any_source: array"), tag, timeout, array)

    def new_group(self, ranks):
        """The sub-group of ``ranks`` (every rank of this group calls it, in
        the same order); ``None`` on ranks not in it.

        >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
        >>> pg.new_group([0]).size()
        1
        """
        sub = self._g.new_group(list(ranks))
        return None if sub is None else ProcessGroup(sub)

    def flight_recorder_json(self):
        """The group's last collectives, as JSON text."""
        return self._g.flight_recorder_json()

    def __repr__(self):
        return f"ProcessGroup(backend={self.backend()!r}, rank={self.rank()}, size={self.size()})"


def init_process_group(backend="cpu", init_method="env://", timeout=None, group_name=None, transport=None):
    """Meets the other ranks and returns the default group.

    ``backend``: ``"cpu"`` (or ``"gloo"``), ``"nccl"`` or ``"auto"``.
    ``init_method``: ``"env://"`` (MASTER_ADDR, MASTER_PORT, RANK,
    WORLD_SIZE, as ``tensorcomm run`` and torchrun set them),
    ``"tcp://host:port?rank=R&world_size=W"`` or
    ``"file:///path?rank=R&world_size=W"``. ``timeout``: seconds for setup
    and each collective (default 30 min). ``transport``: ``"auto"``,
    ``"tcp"`` or ``"shm"`` (default: ``TENSORCOMM_TRANSPORT``, else auto).

    >>> pg = init_process_group("cpu", "tcp://127.0.0.1:0?rank=0&world_size=1")
    >>> (pg.rank(), pg.size())
    (0, 1)
    """
    return ProcessGroup(_init_process_group(backend, init_method, timeout, group_name, transport))


__all__ = [
    "FileStore",
    "HashStore",
    "PrefixStore",
    "ProcessGroup",
    "ReduceOp",
    "SparseWork",
    "Store",
    "TcpStore",
    "TensorcommError",
    "Work",
    "__version__",
    "errors",
    "get_future",
    "init_process_group",
]
