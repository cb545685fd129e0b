#!/usr/bin/python3
"""Soak (issue 29): a long parallel `coremesh train` with checkpoints, watching
every PE for growth. Samples each PE's resident set, open file descriptors and
the job's /dev/shm names once a second; after the run, compares each PE's
RSS at the end with its RSS at step --settle (growth must be <= --max-growth),
and the descriptor and /dev/shm counts at the end with those at --settle
(no growth allowed).

  scripts/soak.py                                  # both layouts, 1000 steps
  scripts/soak.py --steps 300 --layouts dp_ep_tp
Prints a table (markdown); exits 1 if any layout grew or failed.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {  # name: parallel flags (8 PEs each) and micro-batches per step
    "dp_ep_tp": (["--dp", "2", "--ep", "2", "--tp", "2"], 1),
    "pp_ep_dp": (["--pp", "2", "--ep", "2", "--dp", "2"], 4),
}


def write_config(work, steps, micro_batches):
    rnd = random.Random(7)
    words = ["in the beginning ", "god created ", "the heaven ", "and the earth. ", "and void; "]
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("".join(rnd.choice(words) for _ in range(40000)))
    cfg = {"model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                     "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
                     "top_k": 2, "expert_hidden": 32},
           "train": {"data": [corpus], "batch_size": 4, "seq_len": 32, "grad_accum": micro_batches,
                     "steps": steps, "warmup_steps": 10, "val_every": 100, "val_batches": 2,
                     "ckpt_every": 100, "keep_checkpoints": 2, "log_every": 10, "sample_tokens": 0,
                     "report": False, "out_dir": os.path.join(work, "run")}}
    path = os.path.join(work, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def pe_pids(launcher):
    """The PE processes: the launcher's children running coremesh."""
    try:
        kids = open(f"/proc/{launcher}/task/{launcher}/children").read().split()
    except OSError:
        return []
    return [int(k) for k in kids]


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def shm_names():
    return len([n for n in os.listdir("/dev/shm") if n.startswith("cm-")])


def steps_done(metrics):
    try:
        with open(metrics) as f:
            return sum(1 for line in f if line.endswith("\n"))
    except OSError:
        return 0


def soak(exe, layout, steps, settle, work):
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    flags, mb = LAYOUTS[layout]
    cfg = write_config(work, steps, mb)
    log = open(os.path.join(work, "log.txt"), "w")
    job = subprocess.Popen([exe, "run", "-n", "8", exe, "train", "--config", cfg, "--no-progress", *flags],
                           stdout=log, stderr=subprocess.STDOUT)
    metrics = os.path.join(work, "run", "metrics.jsonl")
    at_settle, last, start = None, None, time.time()
    while job.poll() is None:
        time.sleep(1)
        pids = pe_pids(job.pid)
        if len(pids) != 8:
            continue
        sample = {"step": steps_done(metrics), "rss": [rss_kib(p) for p in pids],
                  "fds": [fds(p) for p in pids], "shm": shm_names()}
        if None in sample["rss"] or None in sample["fds"]:
            continue
        if at_settle is None and sample["step"] >= settle:
            at_settle = sample
        last = sample
    row = {"layout": layout, "steps": steps_done(metrics), "seconds": time.time() - start, "rc": job.returncode}
    if at_settle and last:
        row["rss_settle_mib"] = max(at_settle["rss"]) / 1024
        row["rss_end_mib"] = max(last["rss"]) / 1024
        row["growth"] = max(e / s - 1 for s, e in zip(at_settle["rss"], last["rss"]))
        row["fd_growth"] = max(e - s for s, e in zip(at_settle["fds"], last["fds"]))
        row["shm_growth"] = last["shm"] - at_settle["shm"]
        row["shm_left"] = shm_names()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", default=os.path.join(ROOT, "build", "coremesh"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--settle", type=int, default=100, help="the step whose RSS is the baseline")
    ap.add_argument("--max-growth", type=float, default=0.02)
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--work", default="/tmp/coremesh-soak")
    a = ap.parse_args()
    print("| layout (8 PEs) | steps | s | RSS at step {} (max PE) | RSS at end | growth (worst PE) | fds | /dev/shm | |"
          .format(a.settle))
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for layout in a.layouts.split(","):
        r = soak(a.exe, layout, a.steps, a.settle, os.path.join(a.work, layout))
        ok = (r["rc"] == 0 and r["steps"] == a.steps and "growth" in r and r["growth"] <= a.max_growth
              and r["fd_growth"] <= 0 and r["shm_growth"] <= 0 and r["shm_left"] == 0)
        failed |= not ok
        if "growth" in r:
            print(f"| {layout} | {r['steps']} | {r['seconds']:.0f} | {r['rss_settle_mib']:.1f} MiB | "
                  f"{r['rss_end_mib']:.1f} MiB | {100 * r['growth']:+.2f}% | {r['fd_growth']:+d} | "
                  f"{r['shm_growth']:+d} ({r['shm_left']} left) | {'ok' if ok else 'FAIL'} |")
        else:
            print(f"| {layout} | {r['steps']} | {r['seconds']:.0f} | - | - | - | - | - | FAIL (exit {r['rc']}) |")
        sys.stdout.flush()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
