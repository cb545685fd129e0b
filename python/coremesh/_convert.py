"""What `coremesh.Tensor(input_data, dtype)` copies: array-likes made into a
C-contiguous float32, int32 or int64 NumPy array (tensor.cpp copies it and
converts to bf16/fp8 when asked).

Without dtype: floats (float16/32/64) become f32, int32 stays i32, other
integers and bools become i64. With dtype: the values are converted to it;
integer dtypes take whole numbers within their range only. Everything else
(ragged lists, strings, None, complex numbers, ...) raises
coremesh.InvalidArgument that says what to change.
"""

import numpy as np

from ._C import InvalidArgument

_HOST = {"f32": np.float32, "bf16": np.float32, "f8e4m3": np.float32, "f8e5m2": np.float32,
         "i32": np.int32, "i64": np.int64}


def _fail(problem, hint):
    raise InvalidArgument(f"Tensor(input_data): {problem}\n  HINT: {hint}")


def _size(length):
    return "a scalar" if length is None else f"{length} elements"


def _ragged_path(data, path="input_data"):
    """Where nested lists stop being rectangular: a message, or None."""
    if not isinstance(data, (list, tuple)):
        return None
    lengths = [len(x) if isinstance(x, (list, tuple, np.ndarray)) else None for x in data]
    if any(n is not None for n in lengths):
        for i, n in enumerate(lengths):
            if n != lengths[0]:
                return f"{path}[{i}] has {_size(n)} but {path}[0] has {_size(lengths[0])}"
    for i, x in enumerate(data):
        inner = _ragged_path(x, f"{path}[{i}]")
        if inner:
            return inner
    return None


def host_array(data, dtype):
    """(array, dtype name): `data` as a C-contiguous float32/int32/int64 array
    and the coremesh dtype of the tensor ('f32', 'bf16', ...). `dtype` is a
    canonical name or None."""
    try:
        src = np.asarray(data)
    except ValueError as e:
        where = _ragged_path(data)
        if where:
            _fail(f"the nested lists are ragged: {where}",
                  "give every row at one depth the same length (pad the short rows), "
                  "or make one Tensor per row")
        _fail(f"cannot read it as an array ({e})",
              "pass a NumPy array, a (nested) list of numbers or a number")
    except Exception as e:  # noqa: BLE001 -- whatever np.asarray raised, say what to pass
        _fail(f"cannot read a {type(data).__name__} as an array ({e})",
              "pass a NumPy array, a (nested) list of numbers, a number or a coremesh Tensor "
              "(torch: coremesh.from_dlpack(t).clone())")
    kind = src.dtype.kind
    if kind == "O":
        if any(isinstance(x, int) and not -2**63 <= x < 2**64 for x in (data if isinstance(data, (list, tuple)) else [data])):
            _fail("an integer does not fit in int64 (NumPy made it a Python object)",
                  "use integers in [-2**63, 2**63) or floats (dtype=coremesh.float32)")
        where = _ragged_path(data)
        if where:
            _fail(f"the nested lists are ragged: {where}",
                  "give every row at one depth the same length (pad the short rows)")
        _fail("it holds Python objects (None or non-numbers), not numbers",
              "replace None with a number (e.g. float('nan') or 0) and pass numbers only")
    if kind not in "biuf":
        names = {"c": "complex numbers", "U": "strings", "S": "bytes", "M": "dates", "m": "time deltas"}
        _fail(f"coremesh has no dtype for {names.get(kind, str(src.dtype))} (NumPy dtype {src.dtype})",
              "pass real numbers: float32, int32 or int64 values (e.g. x.real or x.astype(np.float32))")
    if dtype is None:
        dtype = "f32" if kind == "f" else "i32" if src.dtype == np.int32 else "i64"
    host = _HOST[dtype]
    if host is not np.float32:
        if kind == "f" and not np.all(np.isfinite(src) & (src == np.round(src))):
            _fail(f"dtype {dtype} takes whole numbers; the data has fractions, NaN or inf",
                  "round first (np.round(x)) or use dtype=coremesh.float32")
        info = np.iinfo(host)
        if src.size and (int(src.min()) < info.min or int(src.max()) > info.max):
            _fail(f"values from {src.min()} to {src.max()} do not fit in {dtype}",
                  "use dtype=coremesh.int64" if host is np.int32 else "use dtype=coremesh.float32")
    return src.astype(host, order="C", copy=False), dtype  # (ascontiguousarray makes 0-d 1-d)
