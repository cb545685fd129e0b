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

The RFC's (MindSpore's) spellings work as written after `import coremesh as ms`:

    from coremesh import Tensor, ops
    a = Tensor(np.ones([1024, 2048]), ms.float32)            # a copy
    with ms.runtime.MyMsJitStreamCtx(s1): ...                # = runtime.StreamCtx
    ms.set_device_limit(ms.runtime.current_device(), cube_num=12, vector_num=24)
    a.asnumpy(), a.shape, a.dtype == ms.float32
    depend = ops.Depend()                                    # returns its first argument

tests/python/test_rfc_snippets.py runs every Python snippet of the RFC.

Submodules: runtime, ops, profiler, shmem, train, graph, parallel. Errors: Error (a
RuntimeError) and its kinds InvalidArgument (also a ValueError),
TimeoutError and KernelError. See docs/python.md.
"""

import sys as _sys


from . import _C
from ._C import (Error, InvalidArgument, KernelError, Tensor, TimeoutError, empty, from_dlpack,
                 from_numpy, full, zeros)

# The extension's submodules under their public names: `import coremesh.runtime`
# and `from coremesh.ops import matmul` work like for plain modules.
for _name in ("runtime", "ops", "profiler", "shmem", "train", "graph", "parallel"):
    _module = getattr(_C, _name)
    _module.__name__ = f"{__name__}.{_name}"
    _sys.modules[_module.__name__] = _module
    globals()[_name] = _module


class _Capture:
    """with graph.capture(stream) as cap: ...  -- cap.graph is the captured Graph.

    begin_capture(stream) on entry, with `stream` the current stream inside the
    block (ops launched there are captured, as torch.cuda.graph does);
    end_capture() on a normal exit; an exception inside the block ends the
    capture and propagates."""

    def __init__(self, stream):
        """stream: the runtime.Stream to capture; cap.graph is None until a normal exit."""
        self.stream, self.graph = stream, None
        self._current = runtime.StreamCtx(stream)

    def __enter__(self):
        graph.begin_capture(self.stream)
        self._current.__enter__()
        return self

    def __exit__(self, kind, value, tb):
        self._current.__exit__(kind, value, tb)
        captured = graph.end_capture() if kind is None else None
        if kind is not None:
            try:
                graph.end_capture()
            except Error:
                pass  # the original exception says more
        self.graph = captured
        return False


graph.capture = _Capture

# The RFC's graph-mode stream scope (MindSpore jit): coremesh captures what
# runs inside StreamCtx the same way, so it is the same scope.
runtime.MyMsJitStreamCtx = runtime.StreamCtx


class Depend:
    """depend = ops.Depend(); value = depend(value, expr) -- MindSpore's order hint.

    In a MindSpore graph it makes `expr` run before later uses of `value`.
    coremesh runs (and captures) a stream's ops in program order, so that order
    already holds: it returns `value` unchanged. Order across streams comes
    from events (Event.record/wait, Stream.record_event/wait_event)."""

    def __call__(self, value, expr):
        return value

    def __repr__(self):
        return "coremesh.ops.Depend()"


ops.Depend = Depend

# The RFC also writes the limit functions at the top level (ms.set_device_limit).
from .runtime import (get_device_limit, get_stream_limit, reset_device_limit,  # noqa: E402
                      reset_stream_limit, set_device_limit, set_stream_limit)


# dtype names, as ms.float32 & co.; t.dtype == ms.float32 for an f32 tensor.
float32, bfloat16, float8_e4m3, float8_e5m2, int32, int64 = "f32", "bf16", "f8e4m3", "f8e5m2", "i32", "i64"

# MindSpore dtypes coremesh does not have: a clear error instead of a bare AttributeError.
_MISSING_DTYPES = {"float16": "float32 or bfloat16", "half": "float32 or bfloat16", "float64": "float32",
                   "double": "float32", "int8": "int32", "int16": "int32", "uint8": "int32",
                   "uint16": "int32", "uint32": "int64", "uint64": "int64", "bool_": "int32",
                   "complex64": "float32 (real and imaginary parts apart)",
                   "complex128": "float32 (real and imaginary parts apart)"}


def __getattr__(name):
    if name in _MISSING_DTYPES:
        raise AttributeError(f"coremesh has no dtype {name}: use coremesh.{_MISSING_DTYPES[name]} "
                             f"(the dtypes are float32, bfloat16, float8_e4m3, float8_e5m2, int32, int64)")
    raise AttributeError(f"module 'coremesh' has no attribute '{name}'")


def tensor(data, dtype=None):
    """A new tensor holding a copy of `data`: Tensor(data, dtype) (see its help).

    from_numpy shares memory instead of copying.
    """
    return Tensor(data, dtype)


__all__ = ["Tensor", "Error", "InvalidArgument", "KernelError", "TimeoutError", "empty", "zeros",
           "full", "tensor", "from_numpy", "from_dlpack", "runtime", "ops", "profiler", "shmem",
           "train", "graph", "float32", "bfloat16", "float8_e4m3", "float8_e5m2", "int32", "int64",
           "set_device_limit", "get_device_limit", "reset_device_limit", "set_stream_limit",
           "get_stream_limit", "reset_stream_limit"]
