"""The exceptions tensorcomm raises.

Every error of the Rust library arrives as one of these classes, with the
library's message, which names the op, the sequence number and the ranks
involved::

    try:
        pg.all_reduce(grads).wait()
    except tensorcomm.errors.CollectiveTimeoutError as e:
        print("a rank did not arrive:", e)
"""


class TensorcommError(RuntimeError):
    """Base class of every tensorcomm error.

    >>> issubclass(CollectiveError, TensorcommError)
    True
    """


class InvalidArgumentError(TensorcommError, ValueError):
    """An argument was refused before anything was sent: a wrong dtype,
    shape, root, reduce op or layout (the message says what was expected
    and what was found).

    >>> issubclass(InvalidArgumentError, ValueError)
    True
    """


class CollectiveError(TensorcommError):
    """A collective failed: a peer closed its connection, the group broke.

    >>> issubclass(CollectiveTimeoutError, CollectiveError)
    True
    """


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective (or a wait on it) ran out of time; the message names
    the ranks that did not arrive.

    >>> issubclass(CollectiveTimeoutError, TimeoutError)
    True
    """


class CollectiveMismatchError(CollectiveError):
    """Ranks called different collectives (or the same one with another
    dtype, shape or root) at the same point; the message describes both.

    >>> issubclass(CollectiveMismatchError, CollectiveError)
    True
    """


class StoreError(TensorcommError):
    """A store operation failed (connection, protocol, a non-counter key).

    >>> issubclass(StoreTimeoutError, StoreError)
    True
    """


class StoreTimeoutError(StoreError, TimeoutError):
    """A store's get/wait/barrier ran out of time; the message names the
    keys.

    >>> issubclass(StoreTimeoutError, TimeoutError)
    True
    """


class StoreKeyError(StoreError, KeyError):
    """A non-blocking read found no such key.

    >>> issubclass(StoreKeyError, KeyError)
    True
    """


__all__ = [
    "TensorcommError",
    "InvalidArgumentError",
    "CollectiveError",
    "CollectiveTimeoutError",
    "CollectiveMismatchError",
    "StoreError",
    "StoreTimeoutError",
    "StoreKeyError",
]
