#!/usr/bin/env python3
"""How much of the MoE expert exchanges a --profile trace hides behind compute.

Per PE trace (trace_pe<k>.json, Chrome format, one track per stream), the
expert exchange's intervals are those named ep_*, of two kinds:
  transfer  the parked signal waits (ep_wait): the rows are on their way, or
            the peer is not there yet; the PE's core is free for other work
  work      the exchange's own kernels (ep_send, ep_regroup, ep_receive):
            they copy rows on a core of this PE (on the network path, into
            the transport), so on a PE of one core nothing runs beside them
Compute is the kernels that are not communication. Hidden = |transfer ∩
compute| / |transfer|: with one slice (moe_replicas 1) the exchange runs on
the compute's own stream and nothing is hidden. The exchange's share of the
step counts both kinds (their union).

usage: trace_overlap.py TRACE_OR_DIR... [--min-hidden F] [--skip-ms MS]
  --min-hidden F  exit 1 unless every PE hides at least F of its transfers
  --skip-ms MS    leave out the first MS of each trace (warm-up, capture)
Prints one line per PE.
"""
import argparse
import glob
import json
import os
import sys

from trace_intervals import length, overlap as overlap_length, union


def overlap(path, skip_ms):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "wait")]
    if not spans:
        return None
    start = min(e["ts"] for e in spans) + skip_ms * 1e3
    transfer, work, compute = [], [], []
    for e in spans:
        if e["ts"] < start:
            continue
        interval = [e["ts"], e["ts"] + e["dur"]]
        if e["name"].startswith("ep_"):
            (transfer if e["cat"] == "wait" else work).append(interval)
        elif e["cat"] == "kernel" and e["args"].get("kind") != "comm":
            compute.append(interval)
    if not transfer:
        return None
    ms = lambda x: x / 1e3
    traced = max(b for _, b in compute + transfer + work) - start
    transfer, compute = union(transfer), union(compute)
    return {"traced": ms(traced), "exchange": ms(length(union(transfer + work))), "transfer": ms(length(transfer)),
            "hidden": ms(overlap_length(transfer, compute)), "work": ms(length(union(work)))}


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
        fraction = got["hidden"] / got["transfer"]
        worst = fraction if worst is None else min(worst, fraction)
        print(f"{path}: traced {got['traced']:.1f} ms; exchange {got['exchange']:.1f} ms "
              f"({100 * got['exchange'] / got['traced']:.1f}% of it): transfers {got['transfer']:.1f} ms "
              f"({100 * got['transfer'] / got['traced']:.1f}% of it), "
              f"{got['hidden']:.1f} ms hidden ({100 * fraction:.1f}%); exchange kernels {got['work']:.1f} ms")
    if args.min_hidden is not None and worst < args.min_hidden:
        sys.exit(f"only {100 * worst:.1f}% of the exchange's transfers hidden behind compute "
                 f"(want >= {100 * args.min_hidden:.0f}%)")


if __name__ == "__main__":
    main()
