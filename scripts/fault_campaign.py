#!/usr/bin/python3
"""Fault campaign (issue 29): kill a random PE at a random step of a parallel
`coremesh train`, in every layout, many times, and check that nothing is lost.

Every round of a layout:
  1. starts the job (a tiny MoE, a checkpoint every 2 steps) and, once the
     log shows step K (random), kills PE P (random) with SIGKILL;
  2. the job must stop within --stop-limit seconds with a message naming PE P
     (the launcher's "PE P was killed"; under mpirun its "rank P", or the
     error of a PE whose send to P failed first: "to PE P failed"), leave none
     of its processes and no /dev/shm name;
  3. the last checkpoint is resumed on another layout (random, 1 PE included)
     to the end of the run; its per-step losses (metrics.jsonl) must match
     those of an uninterrupted 1-PE run within --tol (relative; the table
     counts the rounds that matched bit for bit).
Every layout trains the same global batch (4 micro-batches of 4 x 32 tokens
per step), so every run is comparable with the 1-PE reference; layouts whose
sums run in another order (dp 2 adds two pairs of micro-batches, not four in
a row; ep, tp, cp split GEMMs and softmaxes) differ from it by rounding only.

  scripts/fault_campaign.py                       # 20 rounds of each layout
  scripts/fault_campaign.py --rounds 3 --layouts dp,pp
  scripts/fault_campaign.py --net                 # under mpirun, network path
Prints a table (markdown); exits 1 if any round failed.
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (parallel flags, micro-batches per data rank); 4 micro-batches per step in all
LAYOUTS = {
    "single": ([], 4),
    "dp": (["--dp", "2"], 2),
    "ep": (["--ep", "2"], 2),
    "tp": (["--tp", "2"], 4),
    "cp": (["--cp", "2"], 4),
    "pp": (["--pp", "2"], 4),
    "mixed": (["--dp", "2", "--ep", "2"], 1),
    "mixed_pp": (["--pp", "2", "--tp", "2"], 4),
}


def world(layout):
    flags, n = LAYOUTS[layout][0], 1
    for i in range(0, len(flags), 2):
        n *= int(flags[i + 1])
    return n


def write_config(work, steps):
    rnd = random.Random(3)
    words = ["in the beginning ", "god created ", "the heaven ", "and the earth. ", "and void; "]
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("".join(rnd.choice(words) for _ in range(20000)))
    cfg = {"model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                     "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
                     "top_k": 2, "expert_hidden": 32},
           "train": {"data": [corpus], "batch_size": 4, "seq_len": 32, "sample_tokens": 0, "report": False,
                     "steps": steps, "warmup_steps": 2, "val_every": 0, "log_every": 1000, "ckpt_every": 2,
                     "keep_checkpoints": 2, "cores": 1}}
    path = os.path.join(work, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


class Campaign:
    def __init__(self, args):
        self.a = args
        self.exe = os.path.abspath(args.exe)
        self.work = os.path.abspath(args.work)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.cfg = write_config(self.work, args.steps)
        self.rng = random.Random(args.seed)
        self.env = dict(os.environ, OPENBLAS_NUM_THREADS="1", COREMESH_WAIT_TIMEOUT_S="30")

    def command(self, layout, out, *extra, net=False):
        flags, accum = LAYOUTS[layout]
        train = [self.exe, "train", "--config", self.cfg, "--no-progress", "--overwrite", "--out", out,
                 "--grad-accum", str(accum), *flags, *extra]
        if net and world(layout) > 1:
            return ["sh", os.path.join(ROOT, "tests", "shmem", "mpirun_net.sh"), str(world(layout))] + train
        return train

    def losses(self, run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return {j["step"]: j["loss"] for j in map(json.loads, f.read().splitlines())}

    def run(self, cmd, log):
        with open(log, "w") as out:
            return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, timeout=300).returncode

    def compare(self, got):
        """Worst relative difference from the reference over the steps of `got`."""
        return max(abs(loss - self.reference[step]) / abs(self.reference[step]) for step, loss in got.items())

    def pes(self, job, layout):
        """{pe: pid} of the job's PEs, from their environment."""
        key = "OMPI_COMM_WORLD_RANK=" if self.a.net else "COREMESH_PE="
        found = {}
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                environ = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
                cmdline = open(f"/proc/{p}/cmdline", "rb").read()
            except OSError:
                continue
            if self.cfg.encode() not in cmdline or b"train" not in cmdline:
                continue
            for e in environ:
                if e.startswith(key.encode()):
                    found[int(e[len(key):])] = int(p)
        return found

    @staticmethod
    def alive(pid):
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    @staticmethod
    def shm_names():
        return {n for n in os.listdir("/dev/shm") if n.startswith("cm-")}

    def round(self, layout, r):
        d = os.path.join(self.work, f"{layout}-{r}")
        os.makedirs(d)
        run_dir, log = os.path.join(d, "run"), os.path.join(d, "job.log")
        metrics = os.path.join(run_dir, "metrics.jsonl")
        shm_before = self.shm_names()
        at, n = self.rng.randint(3, self.a.steps - 6), world(layout)
        with open(log, "w") as out:
            job = subprocess.Popen(self.command(layout, run_dir, net=self.a.net), stdout=out,
                                   stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + 120
        pes = {}
        while job.poll() is None and time.time() < deadline:
            done = len(open(metrics).read().splitlines()) if os.path.exists(metrics) else 0
            if done >= at:
                pes = self.pes(job.pid, layout)
                if len(pes) == n:
                    break
            time.sleep(0.001)
        row = {"layout": layout, "round": r, "kill_step": at, "ok": False}
        if len(pes) != n:
            job.kill()
            job.wait()
            row["why"] = f"the job ended or did not show its {n} PEs before step {at}"
            return row
        victim = self.rng.randrange(n)
        row["pe"] = victim
        t0 = time.time()
        os.kill(pes[victim], signal.SIGKILL)
        row["killed_at"] = len(open(metrics).read().splitlines())
        try:
            status = job.wait(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
            status = None
        row["stop_s"] = time.time() - t0
        text = open(log).read()
        # mpirun names the first process to end: the killed one, or a peer whose
        # network send to it failed first (whose error names it)
        names = ([f"rank {victim} with PID", f"to PE {victim} failed", f"with PE {victim} to complete"] if self.a.net
                 else [f"PE {victim} was killed by signal 9"])
        named = any(n in text for n in names)
        time.sleep(0.1)
        survivors = [p for p in pes.values() if self.alive(p)]
        for p in survivors:
            os.kill(p, signal.SIGKILL)
        left = self.shm_names() - shm_before
        for _ in range(10):  # other jobs' names come and go; a leftover stays
            if not left:
                break
            time.sleep(0.5)
            left &= self.shm_names()
        ckdir = os.path.join(run_dir, "checkpoints")
        ckpts = sorted(f for f in os.listdir(ckdir) if f.startswith("step_")) if os.path.isdir(ckdir) else []
        problems = []
        if status in (None, 0):
            problems.append(f"the job did not stop (status {status})")
        if row["stop_s"] > self.a.stop_limit:
            problems.append(f"took {row['stop_s']:.1f} s to stop")
        if not named:
            problems.append(f"no message names PE {victim}")
        if survivors:
            problems.append(f"PE processes {survivors} survived")
        if left:
            problems.append(f"left in /dev/shm: {sorted(left)}")
        if not ckpts:
            problems.append("no checkpoint")
        # resume on another layout, to the end of the run
        if ckpts:
            other = self.rng.choice([l for l in self.a.resume_on if l != layout])
            row["resumed_on"], row["from_step"] = other, int(ckpts[-1][5:13])
            out = os.path.join(d, "resumed")
            status = self.run(self.command(other, out, "--resume", os.path.join(ckdir, ckpts[-1]), net=self.a.net),
                              os.path.join(d, "resume.log"))
            if status != 0:
                problems.append(f"the resumed run on {other} failed (status {status})")
            else:
                worst = row["worst_rel"] = self.compare(self.losses(out))
                if worst > self.a.tol:
                    problems.append(f"losses after resuming on {other} differ (worst relative {worst:.2e})")
        row["ok"] = not problems
        row["why"] = "; ".join(problems)
        if not row["ok"]:
            print(f"FAILED {layout} round {r}: {row['why']} (see {d})", file=sys.stderr)
        else:
            shutil.rmtree(d)
        return row

    def main(self):
        ref = os.path.join(self.work, "reference")
        if self.run(self.command("single", ref), ref + ".log") != 0:
            sys.exit(f"the 1-PE reference run failed: see {ref}.log")
        self.reference = self.losses(ref)
        rows, summary = [], []
        for layout in self.a.layouts:
            # the layout uninterrupted, for scale
            plain = os.path.join(self.work, f"{layout}-plain")
            if self.run(self.command(layout, plain, net=self.a.net), plain + ".log") != 0:
                sys.exit(f"the uninterrupted {layout} run failed: see {plain}.log")
            plain_rel = self.compare(self.losses(plain))
            mine = []
            for r in range(self.a.rounds):
                mine.append(self.round(layout, r))
                print(json.dumps(mine[-1]), flush=True)
            rows += mine
            ok = [x for x in mine if x["ok"]]
            stops = [x["stop_s"] for x in mine if "stop_s" in x]
            rels = [x["worst_rel"] for x in mine if "worst_rel" in x]
            summary.append(
                f"| {layout} ({world(layout)} PEs) | {len(ok)}/{len(mine)} | "
                f"{min(x['kill_step'] for x in mine)}-{max(x['kill_step'] for x in mine)} | "
                f"{', '.join(str(p) for p in sorted({x['pe'] for x in mine if 'pe' in x}))} | "
                f"{max(stops) if stops else float('nan'):.2f} | "
                f"{', '.join(sorted({x['resumed_on'] for x in mine if 'resumed_on' in x}))} | "
                f"{max(rels) if rels else float('nan'):.1e} ({sum(x == 0 for x in rels)} bit-exact) | "
                f"{plain_rel:.1e} |")
        print(f"\n{'mpirun, network path' if self.a.net else 'coremesh launcher, shm'}: {self.a.rounds} rounds per layout, "
              f"{self.a.steps}-step runs, seed {self.a.seed}")
        print("| layout | rounds passed | kill steps | PEs killed | slowest stop (s) | resumed on | "
              "worst loss diff after resume (rel) | uninterrupted layout vs 1 PE (rel) |")
        print("|---|---|---|---|---|---|---|---|")
        print("\n".join(summary))
        return 0 if all(x["ok"] for x in rows) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="rounds per layout (default 20)")
    p.add_argument("--layouts", default="dp,ep,tp,cp,pp,mixed,mixed_pp",
                   help=f"comma-separated, of {', '.join(l for l in LAYOUTS if l != 'single')}")
    p.add_argument("--resume-on", default="single,dp,ep,tp,cp,pp",
                   help="layouts a checkpoint may be resumed on (default: 1 PE and the 2-PE layouts)")
    p.add_argument("--net", action="store_true", help="under mpirun with the network path (tests/shmem/mpirun_net.sh)")
    p.add_argument("--steps", type=int, default=40, help="steps of a run (default 40)")
    p.add_argument("--tol", type=float, default=1e-6, help="relative loss tolerance (default 1e-6)")
    p.add_argument("--stop-limit", type=float, default=5.0, help="seconds a job may take to stop (default 5)")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--exe", default=os.path.join(ROOT, "build", "coremesh"))
    p.add_argument("--work", default="/tmp/coremesh_fault_campaign")
    a = p.parse_args()
    a.layouts = a.layouts.split(",")
    a.resume_on = a.resume_on.split(",")
    for l in a.layouts + a.resume_on:
        if l not in LAYOUTS:
            p.error(f"unknown layout '{l}'")
    return Campaign(a).main()


if __name__ == "__main__":
    sys.exit(main())
