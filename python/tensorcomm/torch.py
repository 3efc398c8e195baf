"""A ``torch.distributed`` backend named ``"tensorcomm"``.

Importing this module registers the backend; an existing script needs one
changed line (and the import)::

    import tensorcomm.torch  # registers "tensorcomm"
    dist.init_process_group(backend="tensorcomm")  # was "gloo"

Every init method works unchanged (torchrun's ``env://``, ``tcp://``,
``file://``, an explicit ``store=``): the group meets the other ranks
through the store PyTorch hands its backends. Tensors are CPU or CUDA
tensors, used in place (no copy): float32, float64, float16, bfloat16,
int8, uint8, int32, int64, bool (complex tensors are viewed as real by
``torch.distributed`` where an op allows). CUDA tensors go through the
Rust CPU group's staged path, as on Gloo: each call's CUDA tensors (all on
one GPU) are copied to pinned host memory on a stream ordered after the
caller's current stream (``torch.cuda.current_stream(device)`` at call
time), the collective runs on the host copies, and the results are copied
back; ``Work.wait()`` makes the current stream at wait time wait for those
copies without blocking the host, ``Work.synchronize()`` also blocks the
host, and ``get_future()`` gives a CUDA-aware future. Ranks may mix CPU
and CUDA tensors, and may share a GPU. A sparse CUDA tensor's all-reduce
goes through host copies made on the current stream. Tensors on other
devices (``meta``, ``mps``, ...) raise
:class:`tensorcomm.errors.InvalidArgumentError`. Collective errors raise
:class:`DistBackendError` (a ``torch.distributed.DistBackendError`` and a
:class:`tensorcomm.errors.TensorcommError`) with the message of the Rust
library, which names the ranks; bad arguments raise
:class:`tensorcomm.errors.InvalidArgumentError` (a ``ValueError``).

Set ``TENSORCOMM_TORCH_TRACE=1`` to print every method PyTorch calls on the
group (and the failures), to see what a PyTorch version expects.
"""

import os
import sys
import threading

import torch
import torch.distributed as dist

from . import _tensorcomm as _native
from .errors import CollectiveTimeoutError, InvalidArgumentError, TensorcommError

_TRACE = os.environ.get("TENSORCOMM_TORCH_TRACE", "") not in ("", "0")

BACKEND_NAME = "tensorcomm"

# Index of each dtype in the native module's DTYPES.
_DTYPE_CODES = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int8: 4,
    torch.uint8: 5,
    torch.int32: 6,
    torch.int64: 7,
    torch.bool: 8,
}

_OP_NAMES = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"]
_RED_OP_TYPE = getattr(dist.ReduceOp, "RedOpType", None)
_OP_CODES = {}
# The same by the integer value of each RedOpType (``opts.reduceOp.op.value``,
# cheaper to look up than the enum), without PREMUL_SUM, whose factor
# _reduce_op reads.
_OP_VALUE_CODES = {}
for _code, _name in enumerate(_OP_NAMES):
    _value = getattr(_RED_OP_TYPE, _name, None) if _RED_OP_TYPE is not None else None
    if _value is not None:
        _OP_CODES[_value] = _code
        if _name != "PREMUL_SUM" and isinstance(getattr(_value, "value", None), int):
            _OP_VALUE_CODES[_value.value] = _code

_DistBackendError = getattr(dist, "DistBackendError", RuntimeError)
try:

    class DistBackendError(_DistBackendError, TensorcommError):
        """A collective of the tensorcomm backend failed (also a
        ``torch.distributed.DistBackendError``)."""

except TypeError:  # pragma: no cover - layouts that cannot combine
    DistBackendError = _DistBackendError

try:

    class DistTimeoutError(DistBackendError, CollectiveTimeoutError):
        """A collective of the tensorcomm backend timed out: a
        :class:`DistBackendError` that is also a ``TimeoutError`` (and a
        :class:`tensorcomm.errors.CollectiveTimeoutError`)."""

except TypeError:  # pragma: no cover - layouts that cannot combine
    DistTimeoutError = DistBackendError

# Gloo's timeout messages read "[file:line] Timed out waiting ...", and
# PyTorch's own tests (distributed_test.py's barrier timeout tests) and
# users match "Timed out"; the Rust message follows it.
_TIMEOUT_PREFIX = "[tensorcomm] Timed out waiting for other ranks: "


def _seconds(timeout):
    """A timedelta or a number of seconds as float seconds (None stays None)."""
    if timeout is None:
        return None
    return timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)


def _wait_seconds(timeout):
    """What a work's wait() passes on: None (the group's timeout) for no
    timeout or one that is not positive."""
    seconds = _seconds(timeout)
    return seconds if seconds is not None and seconds > 0 else None


def _as_dist_error(error):
    """``error`` (a tensorcomm error) as the exception PyTorch users catch."""
    if isinstance(error, (InvalidArgumentError, DistBackendError)):
        return error
    if isinstance(error, CollectiveTimeoutError):
        wrapped = DistTimeoutError(_TIMEOUT_PREFIX + str(error))
    else:
        wrapped = DistBackendError(str(error))
    wrapped.__cause__ = error
    return wrapped


_STRIDED = torch.strided
_SPARSE_COO = torch.sparse_coo


def _desc(tensor, what):
    """The native descriptor of a tensor: (address, dtype, shape, strides)
    for a CPU tensor; for a CUDA tensor also (device index, the caller's
    current stream there), which the collective is ordered after."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, found {type(tensor).__name__}")
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None or tensor.layout is not _STRIDED:
        _refuse(tensor, what)
    if tensor.is_cpu:
        # tensor.shape is a torch.Size, a tuple: the native side reads it as is.
        return (tensor.data_ptr(), code, tensor.shape, tensor.stride())
    if tensor.is_cuda:
        device = tensor.get_device()
        return (tensor.data_ptr(), code, tensor.shape, tensor.stride(), (device, _current_stream(device)))
    _refuse(tensor, what)


def _current_stream(device):
    """The raw handle of PyTorch's current stream on CUDA ``device`` (0:
    the legacy default stream)."""
    return torch.cuda.current_stream(device).cuda_stream


def _cuda_place(device):
    """What a work's ``wait()`` passes for device work on GPU ``device``
    (``None``: host-only work)."""
    return None if device is None else (device, _current_stream(device))


def _refuse(tensor, what):
    """Raises the error that says why ``_desc`` cannot take ``tensor``."""
    if not (tensor.is_cpu or tensor.is_cuda):
        raise InvalidArgumentError(
            f"{what}: expected a CPU or CUDA tensor, found one on {tensor.device} "
            "(the tensorcomm backend runs collectives on CPU tensors, and on CUDA tensors "
            "through host copies)"
        )
    if tensor.dtype not in _DTYPE_CODES:
        raise InvalidArgumentError(
            f"{what}: expected dtype float32, float64, float16, bfloat16, int8, uint8, int32, "
            f"int64 or bool, found {tensor.dtype}"
        )
    if tensor.layout is _SPARSE_COO:
        raise InvalidArgumentError(
            f"{what}: expected a dense (strided) tensor, found a sparse COO one (only all_reduce "
            "with ReduceOp.SUM takes sparse tensors, one per call)"
        )
    raise InvalidArgumentError(f"{what}: expected a dense (strided) tensor, found layout {tensor.layout}")


def _descs(tensors, what):
    return [_desc(t, f"{what}[{i}]") for i, t in enumerate(tensors)]


def _one(tensors, what):
    """The single tensor of a c10d tensor list."""
    if len(tensors) != 1:
        raise InvalidArgumentError(
            f"{what}: expected exactly one tensor per rank, found {len(tensors)} "
            "(several tensors per process are not supported)"
        )
    return tensors[0]


def _reduce_op(opts):
    """(code, factor) of the reduce op in ``opts`` (SUM without opts)."""
    try:
        return _OP_VALUE_CODES[opts.reduceOp.op.value], 1.0
    except (AttributeError, KeyError, TypeError):
        return _reduce_op_slow(opts)


def _reduce_op_slow(opts):
    """:func:`_reduce_op` of options it has no fast path for: none, an op
    without ``.op.value``, PREMUL_SUM (with its factor)."""
    if opts is None:
        return 0, 1.0
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return 0, 1.0
    kind = getattr(op, "op", op)
    code = _OP_CODES.get(kind)
    if code is None:
        name = getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]
        if name.upper() not in _OP_NAMES:
            raise InvalidArgumentError(f"expected a torch.distributed.ReduceOp, found {op!r}")
        code = _OP_NAMES.index(name.upper())
    if code != 8:
        return code, 1.0
    # PREMUL_SUM carries its factor; ReduceOp pickles as (kind, factor).
    try:
        factor = op.__getstate__()[1]
    except Exception as e:  # noqa: BLE001
        raise InvalidArgumentError(f"PREMUL_SUM: could not read the factor of {op!r}: {e}") from e
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return 8, float(factor)


def _timeout(opts):
    """The per-call timeout of ``opts`` in seconds (``None``: the group's)."""
    try:
        seconds = opts.timeout.total_seconds()
    except AttributeError:
        return _timeout_slow(opts)
    return seconds if seconds > 0 else None


def _timeout_slow(opts):
    """:func:`_timeout` of options without a ``timedelta`` timeout."""
    t = getattr(opts, "timeout", None) if opts is not None else None
    if t is None:
        return None
    seconds = t.total_seconds() if hasattr(t, "total_seconds") else float(t)
    return seconds if seconds > 0 else None


def _root(opts):
    return getattr(opts, "rootRank", 0) if opts is not None else 0


def _splits(sizes):
    return [int(s) for s in sizes] if sizes else []


_WorkBase = getattr(dist, "_Work", None) or dist.Work


def _sync_takes_no_work():
    """The native collectives whose synchronous ``torch.distributed``
    caller, the function of the same name, takes ``None`` for a work from
    the backend (c10d's "the backend has synced at C++ level": it waits
    only on a work it got), read from that function's source; a
    collective whose function is missing, differs or has no readable
    source is left out (it gets a finished work, as before)."""
    import inspect

    names = (
        "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
        "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
        "gather", "scatter", "barrier",
    )
    takes = set()
    for name in names:
        try:
            if "work is not None" in inspect.getsource(getattr(dist.distributed_c10d, name)):
                takes.add(name)
        except Exception:  # no source, odd install: keep returning a work
            pass
    return frozenset(takes)


# The native collectives whose synchronous successful call returns no Work
# (see ``ProcessGroupTensorcomm._go``): making one and waiting on it cost
# about 1 us of a small call.
_SYNC_TAKES_NO_WORK = _sync_takes_no_work()


class Work(_WorkBase):
    """The work of one collective of the tensorcomm backend.

    ``wait()`` blocks (without the GIL) and raises the collective's error;
    ``get_future()`` gives a ``torch.futures.Future`` whose value is the
    collective's output tensors (what DDP's reducer reads); the tensors
    stay alive until the collective is done with them. The future is made
    on the first ``get_future()`` call, not before.
    """

    __slots__ = ("_native", "_result", "_future", "_device")

    def __init__(self, native, result):
        super().__init__()
        self._native = native
        self._result = result
        self._future = None
        # The GPU of its CUDA tensors (None: host tensors only).
        self._device = native.cuda_device

    def wait(self, timeout=None):
        """Blocks until the collective has finished on the host and raises
        its error; for CUDA tensors, makes the current stream of their
        GPU wait for the copies back into them, without blocking the host
        (as ProcessGroupGloo's CUDA work does)."""
        seconds = _wait_seconds(timeout)
        try:
            if self._device is None:
                return self._native.wait(seconds)
            return self._native.wait(seconds, _cuda_place(self._device))
        except TensorcommError as e:
            raise _as_dist_error(e) from None

    def synchronize(self):
        """:meth:`wait`, then, for CUDA tensors, blocks the host until
        their device work is done."""
        try:
            self._native.wait(None, _cuda_place(self._device), True)
        except TensorcommError as e:
            raise _as_dist_error(e) from None

    def is_completed(self):
        return self._native.is_completed()

    def is_success(self):
        return self._native.is_completed() and self._native.exception() is None

    def exception(self):
        e = self._native.exception()
        return None if e is None else _as_dist_error(e)

    def result(self):
        return self._result

    def source_rank(self):
        rank = self._native.source_rank()
        return -1 if rank is None else rank

    _source_rank = source_rank

    def _new_future(self):
        """An empty ``torch.futures.Future``; for CUDA work, one on the
        work's GPU, so that waiting on it orders the waiter's current
        stream after the collective."""
        if self._device is None:
            return torch.futures.Future()
        return torch.futures.Future(devices=[torch.device("cuda", self._device)])

    def get_future(self):
        if self._future is None:
            future = self._new_future()
            result = self._result

            def settle(exc):
                # On tensorcomm's callback thread, whose current stream has
                # been made to wait for any device work: set_result records
                # the point the waiters of a CUDA future wait for.
                if exc is None:
                    future.set_result(result)
                else:
                    future.set_exception(_as_dist_error(exc))

            self._native.add_done_callback(settle)
            self._future = future
        return self._future


class _SparseWork(Work):
    """The work of a sparse all-reduce: once the collective is done, the
    coalesced sum is copied into the caller's sparse tensor (as Gloo's
    sparse all-reduce does), by ``wait()`` or before ``get_future()``'s
    future completes."""

    __slots__ = ("_tensor", "_lock", "_copied")

    def __init__(self, native, tensors):
        super().__init__(native, tensors)
        self._tensor = tensors[0]
        if self._tensor.is_cuda:
            self._device = self._tensor.get_device()
        self._lock = threading.Lock()
        self._copied = False

    def _copy_result(self, seconds=None):
        with self._lock:
            if self._copied:
                return
            nnz, indices, values = self._native.wait(seconds)
            # A CUDA sparse tensor went through host copies: the sum comes
            # back to its device (on the current stream).
            t = self._tensor
            sparse_dim = t.sparse_dim()
            indices = torch.frombuffer(indices, dtype=torch.int64).view(sparse_dim, nnz) if nnz else \
                torch.zeros((sparse_dim, 0), dtype=torch.int64)
            dense = tuple(t.shape[sparse_dim:])
            values = torch.frombuffer(values, dtype=t.dtype).view((nnz,) + dense) if nnz else \
                torch.zeros((0,) + dense, dtype=t.dtype)
            total = torch.sparse_coo_tensor(indices, values, t.shape, is_coalesced=True)
            if t.is_cuda:
                total = total.to(t.device)
            with torch.no_grad():
                t.copy_(total)
            self._copied = True

    def wait(self, timeout=None):
        seconds = _wait_seconds(timeout)
        try:
            self._copy_result(seconds)
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        return True

    def synchronize(self):
        self.wait()
        if self._device is not None:
            # The sum was copied back to the GPU on the current stream.
            torch.cuda.current_stream(self._device).synchronize()

    def get_future(self):
        if self._future is None:
            future = self._new_future()
            result = self._result

            def settle(exc):
                if exc is None:
                    try:
                        self._copy_result()
                    except BaseException as e:  # noqa: BLE001 - handed to the future
                        exc = e
                if exc is None:
                    future.set_result(result)
                else:
                    future.set_exception(_as_dist_error(exc) if isinstance(exc, TensorcommError) else exc)

            self._native.add_done_callback(settle)
            self._future = future
        return self._future


class _Works(_WorkBase):
    """Several works as one (what ``end_coalescing`` returns)."""

    __slots__ = ("_works", "_future")

    def __init__(self, works):
        super().__init__()
        self._works = works
        self._future = None

    def wait(self, timeout=None):
        for w in self._works:
            w.wait(timeout)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def result(self):
        return [t for w in self._works for t in (w.result() or [])]

    def get_future(self):
        if self._future is None:
            if not self._works:
                self._future = torch.futures.Future()
                self._future.set_result([])
            else:
                futures = [w.get_future() for w in self._works]
                self._future = torch.futures.collect_all(futures).then(
                    lambda f: [t for g in f.value() for t in (g.value() or [])]
                )
        return self._future


class _Closed:
    """Stands for the native group after ``shutdown()``."""

    def __getattr__(self, name):
        raise InvalidArgumentError(f"{name}: the tensorcomm process group was shut down")


class ProcessGroupTensorcomm(dist.ProcessGroup):
    """The ``torch.distributed`` process group of the ``"tensorcomm"``
    backend: tensorcomm's CPU group (shared memory between the ranks of a
    host, TCP across hosts) behind PyTorch's Python process-group API.

    Made by PyTorch through ``init_process_group(backend="tensorcomm")``
    and ``new_group``; PyTorch and its C++ parts (DDP's reducer) call the
    methods below with c10d's arguments and option objects.
    """

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        seconds = _seconds(timeout)
        try:
            self._group = _native.cpu_group_from_store(store, rank, size, "tensorcomm", seconds)
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        self._coalesced = None

    # -- identity ---------------------------------------------------------
    def getBackendName(self):
        return BACKEND_NAME

    def _set_group_name(self, name):
        """Keeps the name ``torch.distributed`` gives the group. PyTorch's
        ``ProcessGroup`` stores it in its registered backends, and a
        Python group has none, so ``group_name`` (which
        ``destroy_process_group(group)`` reads) would raise "ProcessGroup
        name not set"."""
        self._group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        try:
            return self._group_name
        except AttributeError:
            return super().group_name

    def _get_backend(self, device):
        """The backend of ``device``'s type: this group for CPU and CUDA,
        as PyTorch asks of a group (``batch_isend_irecv`` does) before it
        reads the backend's ``supports_coalescing``; other device types
        raise the ``RuntimeError`` PyTorch's own groups raise."""
        kind = device if isinstance(device, str) else getattr(device, "type", str(device))
        if str(kind).split(":", 1)[0] in ("cpu", "cuda"):
            return self
        raise RuntimeError(f"No backend type associated with device type {kind}")

    def _go(self, method, opts, result, *args):
        """Starts the native collective ``method(*args)`` and returns its
        :class:`Work`, whose result is ``result``.

        A synchronous ``torch.distributed`` call (``opts.asyncOp`` False:
        the caller waits on the work at once) runs the collective to its
        end inside the native call, with the GIL released once, and
        raises its error here; it returns ``None`` (no work: c10d's "the
        backend has synced", which ``torch.distributed`` then does not
        wait on) where this PyTorch's function of the same name allows
        that, else a finished work.
        """
        try:
            blocking = opts.asyncOp is False and self._coalesced is None
        except AttributeError:  # no options, or a PyTorch without asyncOp
            blocking = False
        try:
            native = method(*args, blocking)
            if blocking and method.__name__ in _SYNC_TAKES_NO_WORK:
                native.wait()
                return None
        except InvalidArgumentError:
            raise
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        work = Work(native, result)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _p2p(self, method, result, *args):
        """Starts the native point-to-point ``method(*args)`` and returns
        its :class:`Work`."""
        try:
            native = method(*args)
        except InvalidArgumentError:
            raise
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        work = Work(native, result)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    # -- collectives ------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        t = tensors[0] if len(tensors) == 1 else _one(tensors, "allreduce")
        code, factor = _reduce_op(opts)
        try:
            desc = _desc(t, "allreduce")
        except InvalidArgumentError:
            if t.layout is _SPARSE_COO:
                return self._allreduce_sparse(tensors, t, code, opts)
            raise
        g = self._group
        return self._go(g.all_reduce, opts, tensors, desc, code, factor, _timeout(opts), tensors)

    def _allreduce_sparse(self, tensors, t, code, opts):
        """All-reduce of a sparse COO tensor, as Gloo's: SUM only; every
        rank's ``t`` becomes the coalesced sum (new indices and values, so
        its number of entries changes). A CUDA sparse tensor is copied to
        the host (after the work queued on the current stream) and the
        sum copied back, as Gloo does."""
        if code != 0:
            raise InvalidArgumentError(
                f"allreduce: unsupported reduction operation {_OP_NAMES[code]} for a sparse tensor "
                "(all_reduce of sparse tensors only works with ReduceOp.SUM, as on Gloo)"
            )
        if not (t.is_cpu or t.is_cuda) or t.dtype not in _DTYPE_CODES:
            _refuse(t._values(), "allreduce: the values of the sparse tensor")
        indices = t._indices().cpu().contiguous()
        values = t._values().detach().cpu().contiguous()
        try:
            blocking = opts.asyncOp is False and self._coalesced is None
        except AttributeError:
            blocking = False
        try:
            native = self._group.all_reduce_sparse(
                _desc(indices, "allreduce: sparse indices"), _desc(values, "allreduce: sparse values"),
                tuple(t.shape), 0, _timeout(opts), blocking,
            )
        except InvalidArgumentError:
            raise
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        work = _SparseWork(native, tensors)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def allreduce_coalesced(self, tensors, opts=None):
        code, factor = _reduce_op(opts)
        descs = _descs(tensors, "allreduce_coalesced")
        g = self._group
        return self._go(g.all_reduce_coalesced, opts, tensors, descs, code, factor, _timeout(opts), tensors)

    def broadcast(self, tensors, opts=None):
        t = tensors[0] if len(tensors) == 1 else _one(tensors, "broadcast")
        g = self._group
        return self._go(g.broadcast, opts, tensors, _desc(t, "broadcast"), _root(opts), _timeout(opts), tensors)

    def reduce(self, tensors, opts=None):
        t = _one(tensors, "reduce")
        code, factor = _reduce_op(opts)
        g = self._group
        return self._go(g.reduce, opts, tensors, _desc(t, "reduce"), _root(opts), code, factor, _timeout(opts), tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = _one(output_tensors, "allgather: output_tensors")
        t = _one(input_tensors, "allgather: input_tensors")
        return self._go(
            self._group.all_gather, opts, output_tensors, _descs(outputs, "allgather: outputs"),
            _desc(t, "allgather: input"), _timeout(opts), (output_tensors, input_tensors),
        )

    def _allgather_base(self, output, input, opts=None):
        return self._go(
            self._group.all_gather_into_tensor, opts, [output], _desc(output, "all_gather_into_tensor: output"),
            _desc(input, "all_gather_into_tensor: input"), _timeout(opts), (output, input),
        )

    all_gather_single = _allgather_base

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        descs = [_descs(o, f"allgather_coalesced: outputs[{r}]") for r, o in enumerate(output_lists)]
        return self._go(
            self._group.all_gather_coalesced, opts, output_lists, descs,
            _descs(input_list, "allgather_coalesced: inputs"), _timeout(opts), (output_lists, input_list),
        )

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._go(
            self._group.all_gather_into_tensor_coalesced, opts, outputs,
            _descs(outputs, "allgather_into_tensor_coalesced: outputs"),
            _descs(inputs, "allgather_into_tensor_coalesced: inputs"), _timeout(opts), (outputs, inputs),
        )

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        t = _one(input_tensors, "gather: input_tensors")
        root = _root(opts)
        outputs = None
        if self.rank() == root:
            outputs = _descs(_one(output_tensors, "gather: output_tensors"), "gather: outputs")
        return self._go(self._group.gather, opts, output_tensors, _desc(t, "gather: input"), outputs, root,
                        _timeout(opts), (output_tensors, input_tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        t = _one(output_tensors, "scatter: output_tensors")
        root = _root(opts)
        inputs = None
        if self.rank() == root:
            inputs = _descs(_one(input_tensors, "scatter: input_tensors"), "scatter: inputs")
        return self._go(self._group.scatter, opts, output_tensors, _desc(t, "scatter: output"), inputs, root,
                        _timeout(opts), (output_tensors, input_tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        t = _one(output_tensors, "reduce_scatter: output_tensors")
        inputs = _one(input_tensors, "reduce_scatter: input_tensors")
        code, factor = _reduce_op(opts)
        return self._go(self._group.reduce_scatter, opts, output_tensors, _desc(t, "reduce_scatter: output"),
                        _descs(inputs, "reduce_scatter: inputs"), code, factor, _timeout(opts),
                        (output_tensors, input_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        code, factor = _reduce_op(opts)
        return self._go(self._group.reduce_scatter_tensor, opts, [output],
                        _desc(output, "reduce_scatter_tensor: output"),
                        _desc(input, "reduce_scatter_tensor: input"), code, factor, _timeout(opts),
                        (output, input))

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        code, factor = _reduce_op(opts)
        return self._go(self._group.reduce_scatter_tensor_coalesced, opts, outputs,
                        _descs(outputs, "reduce_scatter_tensor_coalesced: outputs"),
                        _descs(inputs, "reduce_scatter_tensor_coalesced: inputs"), code, factor,
                        _timeout(opts), (outputs, inputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._go(self._group.all_to_all, opts, output_tensors, _descs(output_tensors, "alltoall: outputs"),
                        _descs(input_tensors, "alltoall: inputs"), _timeout(opts),
                        (output_tensors, input_tensors))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self._go(self._group.all_to_all_single, opts, [output], _desc(output, "all_to_all_single: output"),
                        _desc(input, "all_to_all_single: input"), _splits(output_split_sizes),
                        _splits(input_split_sizes), _timeout(opts), (output, input))

    all_to_all_single = alltoall_base

    def barrier(self, opts=None):
        return self._go(self._group.barrier, opts, [], _timeout(opts))

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """Blocks until every rank arrives; past ``timeout`` raises on every
        rank that came, naming the ranks that did not (all of them with
        ``wait_all_ranks``). ``torch.distributed.monitored_barrier`` only
        takes Gloo groups (2.15's: groups with a registered CPU backend,
        which a Python group such as this one lacks), so call it on the
        group."""
        seconds = _seconds(timeout)
        if seconds == 0:
            # A zero timeout times out at once, as Gloo's does (the native
            # call reads zero as "the group's timeout").
            seconds = 1e-6
        try:
            native = self._group.monitored_barrier(seconds, bool(wait_all_ranks))
        except InvalidArgumentError:
            raise
        except TensorcommError as e:
            raise _as_dist_error(e) from None
        Work(native, []).wait()

    def send(self, tensors, dstRank, tag=0):
        t = _one(tensors, "send")
        return self._p2p(self._group.send, tensors, _desc(t, "send"), int(dstRank), int(tag), None, tensors)

    def recv(self, tensors, srcRank, tag=0):
        t = _one(tensors, "recv")
        return self._p2p(self._group.recv, tensors, _desc(t, "recv"), int(srcRank), int(tag), None, tensors)

    def recv_anysource(self, tensors, tag=0):
        t = _one(tensors, "recv_anysource")
        return self._p2p(self._group.recv_any_source, tensors, _desc(t, "recv_anysource"), int(tag), None, tensors)

    # -- coalescing (torch.distributed's _coalescing_manager) -------------
    def start_coalescing(self, device=None):
        self._coalesced = []

    def end_coalescing(self, device=None):
        works, self._coalesced = self._coalesced or [], None
        return _Works(works)

    _start_coalescing = start_coalescing
    _end_coalescing = end_coalescing

    @property
    def supports_coalescing(self):
        return False

    # -- life -------------------------------------------------------------
    def shutdown(self):
        """Releases the group's connections and shared memory."""
        self._group = _Closed()

    def abort(self):
        self.shutdown()

    def _shutdown(self):
        self.shutdown()

    def flight_recorder_json(self):
        """The group's last collectives, as JSON text."""
        return self._group.flight_recorder_json()

    def __repr__(self):
        return f"ProcessGroupTensorcomm(rank={self.rank()}, size={self.size()})"

    if _TRACE:

        def __getattr__(self, name):
            print(f"[tensorcomm.torch] PyTorch asked for missing attribute {name!r}", file=sys.stderr, flush=True)
            raise AttributeError(name)


def _traced(cls):
    """Prints every call PyTorch makes on the group, and each failure."""
    for name, value in list(vars(cls).items()):
        if name.startswith("__") or name in ("_go", "_p2p") or not callable(value):
            continue

        def wrap(fn, name=name):
            def traced(self, *args, **kwargs):
                shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args]
                print(f"[tensorcomm.torch] rank {self.rank()}: {name}({shapes})", file=sys.stderr, flush=True)
                try:
                    return fn(self, *args, **kwargs)
                except BaseException as e:
                    print(f"[tensorcomm.torch] rank {self.rank()}: {name} failed: {type(e).__name__}: {e}",
                          file=sys.stderr, flush=True)
                    raise

            traced.__name__ = fn.__name__
            traced.__doc__ = fn.__doc__
            return traced

        setattr(cls, name, wrap(value))
    return cls


if _TRACE:
    _traced(ProcessGroupTensorcomm)


def _create(store, rank, size, timeout):
    """The creator ``torch.distributed`` calls for each group of the backend."""
    return ProcessGroupTensorcomm(store, rank, size, timeout)


def _register():
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    try:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
    except TypeError:  # PyTorch without the devices argument
        dist.Backend.register_backend(BACKEND_NAME, _create)


_register()

__all__ = ["BACKEND_NAME", "DistBackendError", "DistTimeoutError", "ProcessGroupTensorcomm", "Work"]
