"""Python launch overhead per kernel: coremesh.ops.add from Python vs the same
launch from C++ (bench/launch_overhead.cpp, same measurement) vs torch eager
dispatch of the same small op (torch.add, which also computes it).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_launch.py [--build build]

Rounds alternate C++, Python and torch; each figure is the median over
rounds of the median over batches. Prints a markdown table.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # torch single-threaded: a small op anyway
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import coremesh as cm  # noqa: E402
from coremesh import ops, runtime  # noqa: E402


def per_call_ns(batch, reps, fn, sync):
    """Median over `reps` batches of the host nanoseconds per call of `batch` calls."""
    samples = []
    for r in range(reps + 2):  # two warm-up batches
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter_ns() - t0) / batch)
        sync()  # drain outside the timed part
    return statistics.median(samples[2:])


def python_round(elements, batch, reps):
    a, b = cm.full([elements], 1.0), cm.full([elements], 2.0)
    add, synchronize = ops.add, runtime.synchronize

    def add_sync():
        add(a, b)
        synchronize()

    return (per_call_ns(batch, reps, lambda: add(a, b), synchronize),
            per_call_ns(batch // 10, reps, add_sync, synchronize))


def torch_round(elements, batch, reps):
    ta, tb = torch.full((elements,), 1.0), torch.full((elements,), 2.0)
    return per_call_ns(batch, reps, lambda: torch.add(ta, tb), lambda: None)


def cpp_round(binary, elements, batch, reps):
    out = subprocess.run([binary, str(elements), str(batch), str(reps)], check=True,
                         capture_output=True, text=True).stdout
    values = dict(re.findall(r"(\w+)=([\d.]+)", out))
    return float(values["launch_ns"]), float(values["launch_sync_ns"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--elements", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    binary = os.path.join(args.build, "bench", "bench_launch_overhead")
    cpp, py, th = [], [], []
    for _ in range(args.rounds):
        cpp.append(cpp_round(binary, args.elements, args.batch, args.reps))
        py.append(python_round(args.elements, args.batch, args.reps))
        th.append(torch_round(args.elements, args.batch, args.reps))
    c_launch, c_sync = (statistics.median(x) / 1e3 for x in zip(*cpp))
    p_launch, p_sync = (statistics.median(x) / 1e3 for x in zip(*py))
    t_add = statistics.median(th) / 1e3
    load = os.getloadavg()[0]
    print(f"Small op: add of two f32 vectors of {args.elements} elements; {runtime.current_device().num_cores} "
          f"worker cores; medians of {args.rounds} alternating rounds x {args.reps} batches; "
          f"load average {load:.1f} at the end.", file=sys.stderr)
    print("| per kernel | C++ | Python | Python - C++ | torch 1.13 eager (computes too) |")
    print("|---|---|---|---|---|")
    print(f"| launch (back-to-back, host time per call) | {c_launch:.2f} us | {p_launch:.2f} us | "
          f"{p_launch - c_launch:+.2f} us | {t_add:.2f} us |")
    print(f"| launch + synchronize() | {c_sync:.2f} us | {p_sync:.2f} us | {p_sync - c_sync:+.2f} us | "
          f"{t_add:.2f} us |")
    print(f"Python launch vs torch eager dispatch: {p_launch / t_add:.2f}x the time per call; "
          f"extra Python cost per launch {p_launch - c_launch:.2f} us (goal <= 2 us).", file=sys.stderr)

if __name__ == "__main__":
    sys.exit(main())
