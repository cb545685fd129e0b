"""coremesh from Python: the RFC's runtime API, the kernel library, SHMEM and the trainer.

    import coremesh as cm
    from coremesh import ops, runtime

    s2 = runtime.Stream()
    a = cm.from_numpy(np.ones((1024, 2048), np.float32))     # zero-copy
    b = cm.from_numpy(np.ones((2048, 4096), np.float32))
    c1 = ops.matmul(a, b)                                     # async, current stream
    with runtime.StreamLimitCtx(s2, cube_num=1):
        c2 = ops.matmul(a, b)                                 # on s2, at most 1 cube core
    runtime.synchronize()
    np.asarray(c2)                                            # zero-copy view

Submodules: runtime, ops, profiler, shmem, train, graph. Errors: Error (a
RuntimeError) and its kinds InvalidArgument (also a ValueError),
TimeoutError and KernelError. See docs/python.md.
"""

import sys as _sys

import numpy as _np

from . import _C
from ._C import (Error, InvalidArgument, KernelError, Tensor, TimeoutError, empty, from_dlpack,
                 from_numpy, full, zeros)

# The extension's submodules under their public names: `import coremesh.runtime`
# and `from coremesh.ops import matmul` work like for plain modules.
for _name in ("runtime", "ops", "profiler", "shmem", "train", "graph"):
    _module = getattr(_C, _name)
    _module.__name__ = f"{__name__}.{_name}"
    _sys.modules[_module.__name__] = _module
    globals()[_name] = _module


class _Capture:
    """with graph.capture(stream) as cap: ...  -- cap.graph is the captured Graph.

    begin_capture(stream) on entry, end_capture() on a normal exit; an
    exception inside the block ends the capture and propagates."""

    def __init__(self, stream):
        self.stream, self.graph = stream, None

    def __enter__(self):
        graph.begin_capture(self.stream)
        return self

    def __exit__(self, kind, value, tb):
        captured = graph.end_capture() if kind is None else None
        if kind is not None:
            try:
                graph.end_capture()
            except Error:
                pass  # the original exception says more
        self.graph = captured
        return False


graph.capture = _Capture


# dtype names, as ms.float32 & co.
float32, bfloat16, float8_e4m3, float8_e5m2, int32, int64 = "f32", "bf16", "f8e4m3", "f8e5m2", "i32", "i64"


def tensor(data, dtype=None):
    """A new tensor holding a copy of `data` (array-like; float64 becomes f32).

    dtype converts after the copy ('bf16', 'f8e4m3', ... with exact rounding).
    from_numpy shares memory instead of copying.
    """
    src = _np.asarray(data)
    if src.dtype == _np.float64:
        src = src.astype(_np.float32)
    elif src.dtype.kind in "iub" and src.dtype != _np.int32:
        src = src.astype(_np.int64)
    t = empty(src.shape, "f32" if src.dtype == _np.float32 else str(src.dtype))
    _np.asarray(t)[...] = src
    return t if dtype is None else t.to(dtype)


__all__ = ["Tensor", "Error", "InvalidArgument", "KernelError", "TimeoutError", "empty", "zeros",
           "full", "tensor", "from_numpy", "from_dlpack", "runtime", "ops", "profiler", "shmem",
           "train", "graph", "float32", "bfloat16", "float8_e4m3", "float8_e5m2", "int32", "int64"]
