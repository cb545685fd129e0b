#!/usr/bin/env python3
"""`coremesh eval` through the command line:
  - without --data it scores the run's held-out validation split: the same
    windows as the run's last validation, so the same loss;
  - --max-bytes scores that many bytes (whole windows, spread over the split),
    with or without --data, and refuses less than one window;
  - a run whose data files are gone or changed is refused with what to do.
usage: eval_test.py <coremesh executable> <work dir>"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

exe, work = sys.argv[1], Path(sys.argv[2])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
here = Path(__file__).parent
# 1028 bytes, a quarter held out: 257 validation bytes = 8 windows of 32 + 1,
# which the run's validation (2 batches of 4) covers exactly.
overrides = {"train": {"steps": 3, "warmup_steps": 1, "val_fraction": 0.25, "val_batches": 2, "val_every": 0}}
subprocess.run([sys.executable, str(here / "tiny_run.py"), str(work), "3", json.dumps(overrides)], check=True)
corpus = work / "corpus.txt"
corpus.write_bytes(corpus.read_bytes()[:1028])
run = work / "run"


def fail(why, log=""):
    print(log)
    print(f"FAIL: {why}")
    sys.exit(1)


def coremesh(*args, ok=True):
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=240)
    if (done.returncode == 0) != ok:
        fail(f"coremesh {' '.join(args)} exited with {done.returncode}", done.stdout + done.stderr)
    return done.stdout + done.stderr


def scored(out):
    m = re.search(r"eval: (\d+) tokens \((\d+) bytes\) of (.*) in windows of (\d+): loss ([0-9.]+) nats/token", out)
    if not m:
        fail("no eval line", out)
    if m.group(1) != m.group(2):
        fail("a byte-level model scored tokens that are not bytes", out)
    return int(m.group(2)), m.group(3), float(m.group(5))


log = coremesh("train", "--config", str(work / "cfg.json"), "--no-progress")
last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
if "val_loss" not in last:
    fail("the run's last step did not validate", log)

out = coremesh("eval", "--checkpoint", str(run), "--no-progress")
n, what, loss = scored(out)
if n != 256 or "validation split" not in what or str(corpus) not in what:
    fail(f"eval without --data scored {n} bytes of '{what}', want the 256 bytes of the validation split", out)
if abs(loss - last["val_loss"]) > 1e-5 * last["val_loss"]:
    fail(f"eval's loss {loss} is not the run's last validation loss {last['val_loss']}", out)

n, _, _ = scored(coremesh("eval", "--checkpoint", str(run), "--max-bytes", "70"))
if n != 64:
    fail(f"--max-bytes 70 scored {n} bytes, want 64 (two whole windows of 32)")
n, what, _ = scored(coremesh("eval", "--checkpoint", str(run), "--data", str(corpus), "--max-bytes", "320"))
if n != 320 or "validation" in what:
    fail(f"--data with --max-bytes 320 scored {n} bytes of '{what}', want 320 of the file")
n, _, _ = scored(coremesh("eval", "--checkpoint", str(run), "--data", str(corpus)))
if n != 32 * ((1028 - 1) // 32):
    fail(f"--data scored {n} bytes, want every whole window of the file")
out = coremesh("eval", "--checkpoint", str(run), "--max-bytes", "10", ok=False)
if "max_bytes 10 is less than one window of 32 tokens" not in out:
    fail("--max-bytes below a window is not refused clearly", out)
for flag in ("--batch-size", "--seq-len"):
    out = coremesh("eval", "--checkpoint", str(run), flag, "-3", ok=False)
    if f"{flag}: Value -3 not in range" not in out:
        fail(f"{flag} -3 is not refused", out)

corpus.rename(work / "moved.txt")
out = coremesh("eval", "--checkpoint", str(run), ok=False)
if "is not here" not in out or "--data" not in out:
    fail("a run whose data is gone is not refused with a hint", out)
corpus.write_bytes((work / "moved.txt").read_bytes()[:1000])
out = coremesh("eval", "--checkpoint", str(run), ok=False)
if "changed since it was trained" not in out:
    fail("a run whose data changed is not refused", out)
print("PASS: eval scores the run's validation split (its last validation loss), honours --max-bytes, refuses "
      "missing or changed data")
