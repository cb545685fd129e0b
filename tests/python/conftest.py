"""Shared helpers of the Python suite (run by ctest with PYTHONPATH=build/python).

The tests run on the process's default device; ctest sets COREMESH_CORES=4,
so the device has 4 worker cores and a spec of 4 cube and 4 vector cores.
"""

import csv

import numpy as np
import pytest

import coremesh as cm
from coremesh import profiler, runtime


@pytest.fixture
def profiled():
    """Profiler on for one test, records cleared before and after; limits restored
    (the device's and the default stream's)."""
    runtime.synchronize()
    profiler.clear()
    profiler.start()
    yield
    runtime.synchronize()
    profiler.stop()
    profiler.clear()
    runtime.reset_device_limit(runtime.current_device())
    runtime.reset_stream_limit(runtime.default_stream())


class Operands:
    """The RFC tests' operands: 384x384 matrices a, b and vectors x (1.0), y (2.0)."""

    def __init__(self, vector_len=1 << 20):
        self.a = cm.full([384, 384], 0.01)
        self.b = cm.full([384, 384], 0.02)
        self.x = cm.full([vector_len], 1.0)
        self.y = cm.full([vector_len], 2.0)


def records_of(stream):
    """Profiler records of the kernels that ran on `stream`, by start time."""
    return sorted((r for r in profiler.records() if r.stream == stream.id), key=lambda r: r.start_ns)


def any_overlap(a, b):
    return any(x.start_ns < y.end_ns and y.start_ns < x.end_ns for x in a for y in b)


def span_of(records):
    return min(r.start_ns for r in records), max(r.end_ns for r in records)


def kernel_details(tmp_path):
    """Rows of kernel_details.csv (as the RFC reads block_dim there)."""
    csv_path = profiler.export(str(tmp_path))[0]
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def rows_named(rows, name):
    return [r for r in rows if r["name"] == name]


def cm_array(values, dtype=np.float32):
    """A coremesh tensor over a fresh contiguous NumPy copy of `values`."""
    return cm.from_numpy(np.ascontiguousarray(values, dtype=dtype))


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)
