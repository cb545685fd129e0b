#!/usr/bin/env python3
"""How much of the data-parallel gradient communication the backward hides.

Reads the Perfetto/Chrome traces that `coremesh train --profile DIR` writes
per PE (DIR/pe<k>/trace_pe<k>.json) and, per PE, measures on the time axis:
  comm     the union of the comm stream's intervals: its kernels (puts, sums)
           and its parked signal waits (cat "wait", no core held);
  hidden   the part of comm during which a compute-stream kernel ran.
The comm stream is the stream track with the most SHMEM puts / signal waits;
the compute streams are the other stream tracks. Prints one line per PE and the
total, and exits 1 if a PE hid none of its communication (no overlap).
  usage: dp_overlap.py DIR [--min-hidden FRACTION]
"""
import glob
import json
import os
import sys

COMM_NAMES = ("shmem_signal_wait", "shmem_put_signal", "shmem_put")


def union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def intersect(xs, ys):
    """Total length of the intersection of two unions of disjoint intervals."""
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def analyze(path):
    events = json.load(open(path))["traceEvents"]
    tracks = {}  # stream track tid -> [(ts, end, name, cat)]
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "wait"):
            tracks.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"], e["name"], e["cat"]))
    comm_count = {t: sum(n in COMM_NAMES for _, _, n, _ in evs) for t, evs in tracks.items()}
    comm_tid = max(comm_count, key=comm_count.get, default=None)
    if comm_tid is None or comm_count[comm_tid] == 0:
        raise SystemExit(f"{path}: no stream track with SHMEM puts or signal waits (is dp >= 2?)")
    comm = union((a, b) for a, b, _, _ in tracks[comm_tid])
    parked = union((a, b) for a, b, _, c in tracks[comm_tid] if c == "wait")
    compute = union((a, b) for t, evs in tracks.items() if t != comm_tid for a, b, _, c in evs if c == "kernel")
    return {"comm_us": length(comm), "hidden_us": intersect(comm, compute), "parked_us": length(parked),
            "compute_us": length(compute)}


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
