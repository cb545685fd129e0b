#!/usr/bin/env python3
"""metrics.jsonl through the command line, on two PEs (dp 2):
  - only the leader writes it: one line per step, steps 1..N once each;
  - `--resume` from a checkpoint of a run that went further keeps the lines
    up to the checkpoint byte for byte and appends the rest, none twice; the
    later checkpoints and the old lines are set aside, not lost;
  - a new run, or another directory's run resumed, may not write among a
    run's checkpoints unless --overwrite;
  - report.html is drawn from it (its summary names the file).
usage: metrics_jsonl_test.py <coremesh executable> <work dir>"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

exe, work = sys.argv[1], Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
here = Path(__file__).parent
overrides = {"train": {"steps": 6, "warmup_steps": 2, "val_every": 3, "ckpt_every": 3, "keep_checkpoints": 0,
                       "report": True}, "parallel": {"dp": 2}}
subprocess.run([sys.executable, str(here / "tiny_run.py"), str(work), "5", json.dumps(overrides)], check=True)
run = work / "run"
metrics = run / "metrics.jsonl"


def fail(why, log=""):
    print(log)
    print(f"FAIL: {why}")
    sys.exit(1)


def train(*flags):
    done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", *flags],
                          capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        fail(f"coremesh train {' '.join(flags)} exited with {done.returncode}", done.stdout + done.stderr)
    return done.stdout + done.stderr


def lines():
    text = metrics.read_text()
    if not text.endswith("\n"):
        fail("metrics.jsonl does not end with a complete line")
    return text.splitlines()


log = train()
first = lines()
steps = [json.loads(line)["step"] for line in first]
if steps != [1, 2, 3, 4, 5, 6]:
    fail(f"dp 2 wrote steps {steps}, want 1..6 once each (only the leader writes)", log)
for line in first:
    j = json.loads(line)
    for key in ("loss", "lr", "grad_norm", "tokens", "tokens_per_s", "mfu", "expert_balance", "expert_load", "memory"):
        if key not in j:
            fail(f"step {j['step']} lacks {key}")
    if ("val_loss" in j) != (j["step"] % 3 == 0):
        fail(f"step {j['step']}: val_loss present = {'val_loss' in j}, validation runs every 3 steps")
report = (run / "report.html").read_text()
if str(metrics) not in report:
    fail("the report does not name metrics.jsonl as its source")

# Continue from step 3's checkpoint, as after a crash: lines 4..6 go, then come again.
log = train("--resume", str(run / "checkpoints" / "step_00000003.safetensors"))
if "resumed from" not in log:
    fail("the run did not resume", log)
again = lines()
steps = [json.loads(line)["step"] for line in again]
if steps != [1, 2, 3, 4, 5, 6]:
    fail(f"after --resume the file lists steps {steps}, want 1..6 once each", log)
if again[:3] != first[:3]:
    fail("lines up to the checkpoint changed on resume")
for a, b in zip(again[3:], first[3:]):
    if json.loads(a)["loss"] != json.loads(b)["loss"]:
        fail(f"resumed step {json.loads(a)['step']} has loss {json.loads(a)['loss']}, the first run {json.loads(b)['loss']}")
# The first run's later checkpoints would outrank the new ones (pruning and
# --resume take the highest step): they were set aside, with its metrics.
aside = run / "checkpoints" / "superseded_after_step_3"
if sorted(p.name for p in aside.glob("*")) != ["metrics.jsonl", "step_00000006.safetensors"] \
        or (aside / "metrics.jsonl").read_text().splitlines() != first or "superseded_after_step_3" not in log:
    fail(f"the abandoned checkpoints were not set aside whole (and said so): {sorted(aside.glob('*'))}", log)

# Resuming a finished run trains nothing and changes nothing; a checkpoint past --steps is refused.
before = metrics.read_bytes()
log = train("--resume", str(run))
if "nothing to train: the run is at step 6 of 6" not in log or metrics.read_bytes() != before:
    fail("resuming a finished run did not say so, or changed metrics.jsonl", log)
done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", "--resume", str(run),
                       "--steps", "4"], capture_output=True, text=True, timeout=240)
if done.returncode == 0 or "is at step 6, past this run's 4 steps" not in done.stdout + done.stderr:
    fail("a checkpoint past --steps is not refused", done.stdout + done.stderr)

# A new run into the same directory is refused (its checkpoints and metrics
# would mix with this run's), and nothing of the run changes; --overwrite
# starts over: the old checkpoints and lines go, the new run's come.
saved = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("step_*.safetensors")}
before = metrics.read_bytes()
done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", "--steps", "2"],
                      capture_output=True, text=True, timeout=240)
out = done.stdout + done.stderr
if done.returncode == 0 or "holds another run's checkpoints (the latest: step_00000006.safetensors)" not in out \
        or "--resume" not in out or "--overwrite" not in out:
    fail("a new run into a run's directory is not refused with what to do", out)
if {p.name: p.read_bytes() for p in (run / "checkpoints").glob("step_*.safetensors")} != saved \
        or metrics.read_bytes() != before:
    fail("the refused run changed the run's checkpoints or metrics")
done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", "--steps", "2",
                       "--overwrite", "--data", str(work / "missing.txt")], capture_output=True, text=True, timeout=240)
if done.returncode == 0 or {p.name: p.read_bytes() for p in (run / "checkpoints").glob("step_*.safetensors")} != saved \
        or metrics.read_bytes() != before:
    fail("--overwrite of a run that cannot start deleted the old run's files", done.stdout + done.stderr)
log = train("--steps", "2", "--overwrite")
names = sorted(p.name for p in (run / "checkpoints").glob("step_*.safetensors"))
if names != ["step_00000002.safetensors"] or [json.loads(line)["step"] for line in lines()] != [1, 2]:
    fail(f"--overwrite left checkpoints {names} and steps {[json.loads(line)['step'] for line in lines()]}", log)

# Resuming another directory's run into this one is refused as a new run is;
# with --overwrite it continues there.
other = work / "other"
train("--resume", str(run / "checkpoints" / "step_00000002.safetensors"), "--out", str(other), "--steps", "3")
saved = {p.name: p.read_bytes() for p in (run / "checkpoints").glob("step_*.safetensors")}
done = subprocess.run([exe, "train", "--config", str(work / "cfg.json"), "--no-progress", "--steps", "4",
                       "--resume", str(other)], capture_output=True, text=True, timeout=240)
if done.returncode == 0 or "holds another run's checkpoints (the latest: step_00000002.safetensors)" not in \
        done.stdout + done.stderr or {p.name: p.read_bytes() for p in (run / "checkpoints").glob("step_*.safetensors")} != saved:
    fail("resuming another directory's run into a run's directory is not refused", done.stdout + done.stderr)
log = train("--steps", "4", "--resume", str(other), "--overwrite")
names = sorted(p.name for p in (run / "checkpoints").glob("step_*.safetensors"))
if names != ["step_00000004.safetensors"] or [json.loads(line)["step"] for line in lines()] != [1, 2, 3, 4]:
    fail(f"--resume with --overwrite left checkpoints {names} and steps {[json.loads(line)['step'] for line in lines()]}", log)
print("PASS: dp 2 leader-only metrics.jsonl, resume keeps 1..3 and rewrites 4..6 with the same losses; "
      "a finished run resumes to nothing, a checkpoint past --steps is refused; "
      "a new run into the directory is refused, --overwrite starts over (only once the run can start); "
      "a rollback sets the later checkpoints aside; another directory's run resumes here only with --overwrite")
