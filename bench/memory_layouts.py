#!/usr/bin/env python3
"""Memory per rank: `--dry-run`'s estimate against the measured peak RSS of
every PE, for each layout that fits this machine (issue 29: within 25%).

The demo's model (bench/train_demo_config.json), each run with a validation
of 16 batches and a checkpoint, so that their memory counts too. The
estimate: one PE's `total` (weights, gradients, AdamW, activations,
workspace, process); a parallel rank's `total` column of the layout table
(its symmetric heap, where its weights, gradients, AdamW state and exchange
buffers live, plus its step's host memory and the process). The peak: each
PE's own `peak RSS` (getrusage), beside its "tensors at most" (the host
allocator's high-water mark) and the step estimate the trainer holds it to.
With --check it exits 1 if a rank is outside 0.75-1.25: the test
e2e_memory_estimate runs some layouts of it that way on its own corpus
(--config, --only).
  usage: memory_layouts.py [--coremesh EXE] [--steps N] [--config CFG.json] [--only NAME ...] [--check]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LAYOUTS = [
    ("1 PE", []),
    ("dp 2", ["--dp", "2"]),
    ("dp 2, ZeRO-1", ["--dp", "2", "--zero", "1"]),
    ("ep 2", ["--ep", "2"]),
    ("ep 2, 2 slices", ["--ep", "2", "--moe-replicas", "2"]),
    ("ep 2, shadowed experts", ["--ep", "2", "--expert-balance", "shadow"]),
    ("ep 2, fp8", ["--ep", "2", "--precision", "fp8"]),
    ("tp 2", ["--tp", "2"]),
    ("tp 2 + SP", ["--tp", "2", "--sequence-parallel", "true"]),
    ("cp 2 ring", ["--cp", "2", "--aux-alpha", "0"]),
    ("cp 2 Ulysses", ["--cp", "2", "--cp-comm", "ulysses", "--aux-alpha", "0"]),
    ("pp 2 1F1B, 4 micro-batches", ["--pp", "2", "--grad-accum", "4"]),
    ("dp 2 x ep 2", ["--dp", "2", "--ep", "2"]),
    ("pp 2 x tp 2", ["--pp", "2", "--tp", "2", "--grad-accum", "4"]),
]
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
SIZE = r"([0-9.]+) (B|KiB|MiB|GiB)"


def size(value, unit):
    return float(value) * UNITS[unit]


def train(cfg, flags):
    done = subprocess.run([ARGS.coremesh, "train", "--config", cfg, "--overwrite", "--no-progress", *flags], capture_output=True,
                          text=True, timeout=900, cwd=ROOT, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    if done.returncode != 0:
        sys.exit(f"coremesh train {' '.join(flags)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def estimates(cfg, flags):
    """Per rank: (estimate total, step estimate)."""
    out = train(cfg, flags + ["--dry-run"])
    rows = re.findall(rf"^\s+(\d+)\s+dp .*? {SIZE}\s+{SIZE}\s+{SIZE}\s*$", out, re.M)
    if rows:
        return {int(r[0]): (size(r[5], r[6]), size(r[1], r[2])) for r in rows}
    m = re.search(rf"activations {SIZE}.*workspace {SIZE}.* total {SIZE}", out)
    return {0: (size(m.group(5), m.group(6)), size(m.group(1), m.group(2)) + size(m.group(3), m.group(4)))}


def peaks(cfg, flags):
    """Per PE: (peak RSS, tensors at most)."""
    out = train(cfg, flags)
    found = {}
    for m in re.finditer(rf"^memory(?: on PE (\d+))?: .*tensors at most {SIZE}, peak RSS {SIZE}", out, re.M):
        found[int(m.group(1) or 0)] = (size(m.group(4), m.group(5)), size(m.group(2), m.group(3)))
    return found


def main():
    steps = ARGS.steps
    cfg_in = json.load(open(ARGS.config))
    bad = 0
    with tempfile.TemporaryDirectory(prefix="coremesh_bench_memory.") as work:
        cfg_in["train"].update({"steps": steps, "val_every": steps // 2, "val_batches": 16,
                                "ckpt_every": steps // 2, "keep_checkpoints": 1, "sample_tokens": 0,
                                "report": False, "out_dir": os.path.join(work, "run")})
        cfg = os.path.join(work, "cfg.json")
        json.dump(cfg_in, open(cfg, "w"))
        print(f"{os.path.basename(ARGS.config)}, {steps} steps, a validation of 16 batches and a checkpoint "
              f"every {steps // 2}; MiB per rank (`bench/memory_layouts.py`).\n")
        print("| layout | rank | estimate | peak RSS | peak / estimate | step estimate | tensors at most |")
        print("|---|---|---|---|---|---|---|")
        ratios = []
        for name, flags in LAYOUTS:
            if ARGS.only and name not in ARGS.only:
                continue
            est, got = estimates(cfg, flags), peaks(cfg, flags)
            for rank in sorted(got):
                (total, step), (rss, tensors) = est[rank], got[rank]
                ratio = rss / total
                ratios.append(ratio)
                bad += not 0.75 <= ratio <= 1.25
                print(f"| {name} | {rank} | {total / 2**20:.1f} | {rss / 2**20:.1f} | {ratio:.2f} | "
                      f"{step / 2**20:.1f} | {tensors / 2**20:.1f} |", flush=True)
        ratios.sort()
        print(f"\n{len(ratios)} ranks: peak / estimate from {ratios[0]:.2f} to {ratios[-1]:.2f}, "
              f"median {ratios[len(ratios) // 2]:.2f}; {bad} outside 0.75-1.25.")
    return 1 if bad and ARGS.check else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coremesh", default=os.path.join(ROOT, "build", "coremesh"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--config", default=os.path.join(ROOT, "bench", "train_demo_config.json"))
    parser.add_argument("--only", nargs="*", help="layouts by name, e.g. '1 PE' 'ep 2'")
    parser.add_argument("--check", action="store_true", help="exit 1 if a rank is outside 0.75-1.25")
    ARGS = parser.parse_args()
    sys.exit(main())
