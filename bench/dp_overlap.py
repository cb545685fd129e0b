#!/usr/bin/env python3
"""How much of a parallel run's communication its compute hides.

Reads the Perfetto/Chrome traces that `coremesh train --profile DIR` writes
per PE (DIR/pe<k>/trace_pe<k>.json) and, per PE, measures on the time axis:
  comm     the union of the communication intervals on any stream: kernels of
           kind "comm" (puts, signal hand-offs), parked signal waits (cat
           "wait", no core held) and the in-order sums of the collectives;
  hidden   the part of comm during which another kernel (compute) ran.
Data-parallel gradient sums run on a comm stream beside the backward;
tensor-parallel all-reduces on the compute stream hide nothing; ring
attention's puts run on a comm stream while the compute stream attends.
Prints one line per PE (and per stream that carries communication: a
tensor-parallel run's comm stream apart from its compute stream) and the
total, and exits 1 if a PE hid none of its communication (no overlap).
  usage: dp_overlap.py DIR [--min-hidden FRACTION]
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from trace_intervals import length, overlap as intersect, union  # noqa: E402

REDUCTIONS = ("sum_in_order",)  # the sums of the collectives, vector kernels


def analyze(path):
    events = json.load(open(path))["traceEvents"]
    comm_iv, parked_iv, compute_iv = [], [], []
    by_stream = {}  # track name -> that stream's communication intervals
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "wait"):
            continue
        iv = (e["ts"], e["ts"] + e["dur"])
        if e["cat"] == "wait":
            parked_iv.append(iv)
        if e["cat"] == "wait" or e.get("args", {}).get("kind") == "comm" or e["name"] in REDUCTIONS:
            comm_iv.append(iv)
            by_stream.setdefault(names.get(e["tid"], str(e["tid"])), []).append(iv)
        else:
            compute_iv.append(iv)
    if not comm_iv:
        raise SystemExit(f"{path}: no communication in the trace (is the run parallel?)")
    comm, parked, compute = union(comm_iv), union(parked_iv), union(compute_iv)
    streams = {k: (length(union(v)), intersect(union(v), compute)) for k, v in by_stream.items()}
    return {"comm_us": length(comm), "hidden_us": intersect(comm, compute), "parked_us": length(parked),
            "compute_us": length(compute), "streams": streams}


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    min_hidden = 0.0
    if "--min-hidden" in args:
        k = args.index("--min-hidden")
        min_hidden = float(args[k + 1])
        del args[k:k + 2]
    paths = sorted(glob.glob(os.path.join(args[0], "pe*", "trace_pe*.json")))
    if not paths:
        raise SystemExit(f"no pe*/trace_pe*.json under {args[0]}: run coremesh train --profile {args[0]} at dp >= 2")
    ok = True
    total_comm = total_hidden = 0.0
    for p in paths:
        r = analyze(p)
        frac = r["hidden_us"] / r["comm_us"] if r["comm_us"] else 0.0
        total_comm += r["comm_us"]
        total_hidden += r["hidden_us"]
        print(f"{os.path.basename(p)}: comm {r['comm_us'] / 1e3:.1f} ms (parked waits {r['parked_us'] / 1e3:.1f} ms), "
              f"hidden behind compute kernels {r['hidden_us'] / 1e3:.1f} ms = {100 * frac:.1f}%; "
              f"compute {r['compute_us'] / 1e3:.1f} ms")
        for name, (c, h) in sorted(r["streams"].items()):
            print(f"  {name}: comm {c / 1e3:.1f} ms, hidden {h / 1e3:.1f} ms = {100 * h / c if c else 0:.1f}%")
        if r["hidden_us"] <= 0 or frac < min_hidden:
            ok = False
    frac = total_hidden / total_comm if total_comm else 0.0
    print(f"total: comm {total_comm / 1e3:.1f} ms, hidden {total_hidden / 1e3:.1f} ms = {100 * frac:.1f}%")
    if not ok:
        print(f"FAIL: a PE hid {'no' if min_hidden == 0 else 'too little'} communication behind its backward")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
