#!/usr/bin/env python3
"""How much of the MoE expert exchanges a --profile trace hides behind compute.

Per PE trace (trace_pe<k>.json, Chrome format, one track per stream): the
exchange time is the union of the expert exchange's intervals (kernels and
parked waits named ep_*: the sends, the signal waits, the regroups and the
copies out); the compute time is the union of the kernels that are not
communication. Hidden = |exchange ∩ compute| / |exchange|: with one slice
(moe_replicas 1) the exchange runs on the compute's own stream and nothing
is hidden.

usage: trace_overlap.py TRACE_OR_DIR... [--min-hidden F] [--skip-ms MS]
  --min-hidden F  exit 1 unless every PE hides at least F of its exchange
  --skip-ms MS    leave out the first MS of each trace (warm-up, capture)
Prints one line per PE: the traced time, the exchange's (and its share), the
hidden part.
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
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "wait")]
    if not spans:
        return None
    start = min(e["ts"] for e in spans) + skip_ms * 1e3
    exchange, compute = [], []
    for e in spans:
        if e["ts"] < start:
            continue
        interval = (e["ts"], e["ts"] + e["dur"])
        if e["name"].startswith("ep_"):
            exchange.append(interval)
        elif e["cat"] == "kernel" and e["args"].get("kind") != "comm":
            compute.append(interval)
    if not exchange:
        return None
    traced = max(b for _, b in compute + exchange) - start
    exchange, compute = union(exchange), union(compute)
    return traced / 1e3, length(exchange) / 1e3, length(intersect(exchange, compute)) / 1e3


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
        if got is None:
            sys.exit(f"{path}: no expert exchange (ep_*) in the trace: profile an expert-parallel run (ep >= 2)")
        traced, total, hidden = got
        fraction = hidden / total
        worst = fraction if worst is None else min(worst, fraction)
        print(f"{path}: traced {traced:.1f} ms, exchange {total:.1f} ms ({100 * total / traced:.1f}%), "
              f"hidden {hidden:.1f} ms ({100 * fraction:.1f}%)")
    if args.min_hidden is not None and worst < args.min_hidden:
        sys.exit(f"only {100 * worst:.1f}% of the exchange hidden behind compute (want >= {100 * args.min_hidden:.0f}%)")


if __name__ == "__main__":
    main()
