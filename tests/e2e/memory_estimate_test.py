#!/usr/bin/env python3
"""--dry-run's memory estimate against the measured peak RSS of the run, on
one PE with the demo's model shape (issue 29: within 25%). A run that holds
far more than it estimates (the host running ahead of the device, a copy of
a checkpoint in memory, freed pages kept by malloc) fails it.
usage: memory_estimate_test.py <coremesh executable> <work dir>"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

exe, work = sys.argv[1], Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
demo_model = {"d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 128,
              "first_k_dense": 1, "dense_hidden": 768, "n_routed_experts": 8, "n_shared_experts": 1,
              "top_k": 2, "expert_hidden": 384}
overrides = {"model": demo_model,
             "train": {"batch_size": 8, "seq_len": 128, "steps": 6, "warmup_steps": 1, "val_every": 3,
                       "val_batches": 8, "ckpt_every": 3, "keep_checkpoints": 1}}
subprocess.run([sys.executable, str(Path(__file__).parent / "tiny_run.py"), str(work), "3",
                json.dumps(overrides)], check=True)
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def run(*flags):
    done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", *flags],
                          capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        sys.exit(f"FAIL: coremesh train {' '.join(flags)} exited with {done.returncode}")
    return done.stdout


def size(pattern, text):
    m = re.search(pattern + r" ([0-9.]+) (B|KiB|MiB|GiB)", text)
    if not m:
        print(text)
        sys.exit(f"FAIL: no '{pattern}' in the output")
    return float(m.group(1)) * UNITS[m.group(2)]


estimate = size(r"total", run("--dry-run"))
peak = size(r"peak RSS", run())
ratio = peak / estimate
print(f"estimate {estimate / 2**20:.1f} MiB, peak RSS {peak / 2**20:.1f} MiB, ratio {ratio:.2f}")
if not 0.75 <= ratio <= 1.25:
    sys.exit(f"FAIL: the peak is {ratio:.2f}x the estimate (allowed 0.75-1.25)")
print("PASS")
