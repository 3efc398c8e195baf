"""Arrays as the native module takes them: (address, dtype code, shape,
strides in elements), read from NumPy's ``__array_interface__`` (or from
any object offering one). Nothing is copied."""

from .errors import InvalidArgumentError

# Index of each dtype in the native module's DTYPES
# ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64", "bool").
_TYPESTR_CODES = {
    "<f4": 0,
    "<f8": 1,
    "<f2": 2,
    "|i1": 4,
    "|u1": 5,
    "<i4": 6,
    "<i8": 7,
    "|b1": 8,
}
_ITEMSIZE = {0: 4, 1: 8, 2: 2, 4: 1, 5: 1, 6: 4, 7: 8, 8: 1}

_SUPPORTED = "float32, float64, float16, int8, uint8, int32, int64 or bool"


def describe(array, what, writable=True):
    """The descriptor of ``array`` for the native module.

    ``what`` names the argument in errors; ``writable`` refuses read-only
    arrays (outputs).

    >>> import numpy as np
    >>> describe(np.zeros((2, 3), np.float32), "x")[1:]
    (0, (2, 3), None)
    """
    try:
        ai = array.__array_interface__
    except AttributeError:
        raise TypeError(
            f"{what}: expected a NumPy array (or an object with __array_interface__), "
            f"found {type(array).__name__}"
        ) from None
    address, readonly = ai["data"]
    if readonly and writable:
        raise InvalidArgumentError(
            f"{what}: expected a writable array (the collective writes it), found a read-only one"
        )
    code = _TYPESTR_CODES.get(ai["typestr"])
    if code is None:
        raise InvalidArgumentError(
            f"{what}: expected dtype {_SUPPORTED} (native byte order), "
            f"found {getattr(array, 'dtype', ai['typestr'])}"
        )
    strides = ai.get("strides")
    if strides is not None:
        size = _ITEMSIZE[code]
        if any(s % size for s in strides):
            raise InvalidArgumentError(
                f"{what}: expected strides that are multiples of the element size ({size}), "
                f"found {strides} bytes"
            )
        strides = tuple(s // size for s in strides)
    return (address, code, tuple(ai["shape"]), strides)


def describe_list(arrays, what, writable=True):
    """:func:`describe` of each array of a list or tuple."""
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{what}: expected a list of arrays, found {type(arrays).__name__}")
    return [describe(a, f"{what}[{i}]", writable) for i, a in enumerate(arrays)]
