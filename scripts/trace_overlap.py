#!/usr/bin/env python3
"""How much of the sliced MoE exchanges a --profile trace hides behind compute.

Per PE trace (trace_pe<k>.json, Chrome format, one track per stream): the
exchange time is the union of the intervals on the "moe comm" stream tracks
(the sends, the parked signal waits, the regroups and copies out); the
compute time is the union of the non-communication kernels on every other
stream of the same PE. Hidden = |exchange ∩ compute| / |exchange|.

usage: trace_overlap.py TRACE_OR_DIR... [--min-hidden F] [--skip-ms MS]
  --min-hidden F  exit 1 unless every PE hides at least F of its exchange
  --skip-ms MS    leave out the first MS of each trace (warm-up, capture)
Prints one line per PE: exchange ms, hidden ms, hidden fraction.
"""
import argparse
import glob
import json
import os
import sys


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
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap(path, skip_ms):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    comm_tracks = {tid for tid, name in names.items() if "moe comm" in name}
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "wait")]
    if not spans:
        return None
    start = min(e["ts"] for e in spans) + skip_ms * 1e3
    exchange, compute = [], []
    for e in spans:
        if e["ts"] < start:
            continue
        interval = (e["ts"], e["ts"] + e["dur"])
        if e["tid"] in comm_tracks:
            exchange.append(interval)
        elif e["cat"] == "kernel" and e["args"].get("kind") != "comm":
            compute.append(interval)
    exchange, compute = union(exchange), union(compute)
    total = length(exchange)
    hidden = length(intersect(exchange, compute))
    return total / 1e3, hidden / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--min-hidden", type=float, default=None)
    ap.add_argument("--skip-ms", type=float, default=0.0)
    args = ap.parse_args()
    traces = []
    for p in args.paths:
        traces += sorted(glob.glob(os.path.join(p, "**", "trace*.json"), recursive=True)) if os.path.isdir(p) else [p]
    if not traces:
        sys.exit(f"no trace*.json under {args.paths}: run with --profile DIR")
    worst = None
    for path in traces:
        got = overlap(path, args.skip_ms)
        if got is None or got[0] == 0:
            sys.exit(f"{path}: no MoE exchange on a 'moe comm' track: run with moe_replicas >= 2 and an MoE model")
        total, hidden = got
        fraction = hidden / total
        worst = fraction if worst is None else min(worst, fraction)
        print(f"{path}: exchange {total:.1f} ms, hidden {hidden:.1f} ms ({100 * fraction:.1f}%)")
    if args.min_hidden is not None and worst < args.min_hidden:
        sys.exit(f"only {100 * worst:.1f}% of the exchange hidden behind compute (want >= {100 * args.min_hidden:.0f}%)")


if __name__ == "__main__":
    main()
