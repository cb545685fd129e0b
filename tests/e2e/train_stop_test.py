#!/usr/bin/env python3
"""A training job asked to stop, and checkpoints under faults (issue 29).

  train_stop_test.py COREMESH WORK stop LAUNCH SIGNAL
      LAUNCH: single (1 PE), dp2, pp2, tp2, cp2 (`coremesh train --dp 2`
      starts its PEs), ep2_run (`coremesh run -n 2 coremesh train --ep 2`), dp2_mpirun (under
      mpirun, network path; the signal goes to every PE, as a batch system
      sends it). The job is signalled at a random step: it must exit
      128 + SIGNAL, name the checkpoint of the step it stopped at, leave no
      process or /dev/shm name, and `--resume` must end with the same
      per-step losses (metrics.jsonl, every digit) and a bit-identical final
      checkpoint as an uninterrupted run.
  train_stop_test.py COREMESH WORK kill9 ROUNDS
      1 PE, a checkpoint every step; killed with SIGKILL while a checkpoint's
      temporary file exists. The latest checkpoint must load and resume.
  train_stop_test.py COREMESH WORK final_validation
      1 PE; the run's last checkpoint is written before its final validation,
      which is long here: a SIGKILL while it runs loses no trained step.
  train_stop_test.py COREMESH WORK disk_full
      A file size limit below a checkpoint's size (RLIMIT_FSIZE, SIGXFSZ
      ignored), then a run directory on a tmpfs with room for one checkpoint
      (where a private mount namespace is allowed): the save fails with a
      message naming the file, the cause and what to do; the previous
      checkpoint stays and resumes.
"""
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time

exe, work, mode = sys.argv[1], sys.argv[2], sys.argv[3]
here = os.path.dirname(os.path.abspath(__file__))
mpirun_net = os.path.join(here, "..", "shmem", "mpirun_net.sh")
env = dict(os.environ, OPENBLAS_NUM_THREADS="1", COREMESH_WAIT_TIMEOUT_S="60")
if mode != "disk_full_enospc":  # that one runs in WORK/mnt, a tmpfs mounted over
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
rng = random.Random(os.getpid())


def fail(msg, log=None):
    if log:
        print(open(log).read() if os.path.exists(log) else log)
    print("FAIL:", msg)
    sys.exit(1)


def config(train, parallel=None, model=None):
    overrides = {"train": dict({"warmup_steps": 2, "val_every": 0, "log_every": 1000}, **train),
                 "parallel": parallel or {}, "model": model or {}}
    subprocess.run([sys.executable, os.path.join(here, "tiny_run.py"), work, "3", json.dumps(overrides)], check=True)
    return os.path.join(work, "cfg.json")


# `coremesh train` starts the PEs of these layouts itself
LAYOUTS = {"single": [], "dp2": ["--dp", "2"], "pp2": ["--pp", "2", "--grad-accum", "2"], "tp2": ["--tp", "2"],
           "cp2": ["--cp", "2"]}


def command(launch, cfg, *extra):
    train = [exe, "train", "--config", cfg, "--no-progress", *extra]
    if launch == "ep2_run":
        return [exe, "run", "-n", "2"] + train + ["--ep", "2"]
    if launch == "dp2_mpirun":
        return ["sh", mpirun_net, "2"] + train + ["--dp", "2"]
    return train + LAYOUTS[launch]


def run(cmd, log, **kw):
    with open(log, "w") as out:
        return subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=120, **kw).returncode


def lines(path):
    return open(path).read().splitlines() if os.path.exists(path) else []


def descendants(pid):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                kids.setdefault(int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]), []).append(int(p))
            except OSError:
                pass
    out, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def pes_of(job):  # the processes that run `coremesh train` under the job
    return [p for p in descendants(job) if b"train" in open(f"/proc/{p}/cmdline", "rb").read()] if job else []


def shm_names():
    return {n for n in os.listdir("/dev/shm") if n.startswith("cm-")}


def stop_test(launch, signame):
    sig = getattr(signal, signame)
    steps = 300
    cfg = config({"steps": steps, "ckpt_every": 0, "keep_checkpoints": 2})
    run_dir, ref_dir = os.path.join(work, "run"), os.path.join(work, "ref")
    # 1. uninterrupted (in run/, then moved: the checkpoint records its run directory)
    t = time.time()
    if run(command(launch, cfg), os.path.join(work, "ref.log")) != 0:
        fail("the uninterrupted run failed", os.path.join(work, "ref.log"))
    ref_seconds = time.time() - t
    os.rename(run_dir, ref_dir)
    # 2. signalled at a random step
    shm_before = shm_names()
    at = rng.randint(3, 40)
    log = os.path.join(work, "stop.log")
    with open(log, "w") as out:
        job = subprocess.Popen(command(launch, cfg), stdout=out, stderr=subprocess.STDOUT, env=env)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 60
    while len(lines(metrics)) < at and job.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    if job.poll() is not None:
        fail(f"the job ended before step {at}", log)
    pes = pes_of(job.pid)
    at = len(lines(metrics))  # steps done when the signal goes
    sent = time.time()
    for pid in pes if launch == "dp2_mpirun" else [job.pid]:
        os.kill(pid, sig)
    try:
        status = job.wait(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        fail(f"the job did not stop within 60 s of {signame}", log)
    took = time.time() - sent
    text = open(log).read()
    if status != 128 + sig:
        fail(f"exit status {status}, expected {128 + sig}", log)
    stopped = [l for l in text.splitlines() if l.startswith(f"stopped by {signame} after step ")]
    if not stopped:
        fail(f"no 'stopped by {signame} after step' line", log)
    step = int(stopped[0].split("after step ")[1].split()[0])
    ckpt = os.path.join(run_dir, "checkpoints", f"step_{step:08d}.safetensors")
    if f"checkpoint: {ckpt}" not in text or not os.path.exists(ckpt):
        fail(f"no checkpoint {ckpt} written and named", log)
    if not (at <= step < steps) or len(lines(metrics)) != step:
        fail(f"signalled at step {at}, stopped after {step} with {len(lines(metrics))} logged steps", log)
    time.sleep(0.2)
    alive = [p for p in pes if os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"]
    if alive:
        fail(f"PE processes {alive} survived", log)
    left = shm_names() - shm_before
    for _ in range(10):  # other tests' jobs come and go; a leftover stays
        if not left:
            break
        time.sleep(1)
        left &= shm_names()
    if left:
        fail(f"left in /dev/shm: {sorted(left)}")
    # 3. resumed: the same losses as the uninterrupted run, the same final checkpoint
    if run(command(launch, cfg, "--resume", run_dir), os.path.join(work, "resume.log")) != 0:
        fail("the resumed run failed", os.path.join(work, "resume.log"))
    keys = ("step", "loss", "aux_loss", "lr", "grad_norm", "expert_balance")
    pick = lambda path: [{k: json.loads(l).get(k) for k in keys} for l in lines(path)]
    a, b = pick(os.path.join(ref_dir, "metrics.jsonl")), pick(metrics)
    if len(a) != steps or a != b:
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        fail(f"per-step numbers differ from step {diff + 1}: {a[diff:diff + 1]} vs {b[diff:diff + 1]}")
    last = f"checkpoints/step_{steps:08d}.safetensors"
    if open(os.path.join(ref_dir, last), "rb").read() != open(os.path.join(run_dir, last), "rb").read():
        fail(f"the final checkpoints differ ({last})")
    print(f"{launch} {signame} at step {at}: stopped after step {step} in {took:.2f} s with status {status}, "
          f"{len(pes)} PE processes gone, nothing in /dev/shm; resumed to step {steps}: {steps} losses and the "
          f"final checkpoint identical to the uninterrupted run ({ref_seconds:.1f} s)")


def final_validation_test():
    # half the text held out and a wider model: a validation of its ~950 batches takes seconds
    cfg = config({"steps": 3, "val_fraction": 0.5, "val_batches": 1000000, "sample_tokens": 0},
                 model={"d_model": 128, "dense_hidden": 512, "expert_hidden": 256})
    log = os.path.join(work, "final.log")
    with open(log, "w") as out:
        job = subprocess.Popen(command("single", cfg), stdout=out, stderr=subprocess.STDOUT, env=env)
    ckpt = os.path.join(work, "run", "checkpoints", "step_00000003.safetensors")
    deadline = time.time() + 60
    while not os.path.exists(ckpt) and job.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # into the validation
    if job.poll() is not None or not os.path.exists(ckpt):
        job.kill()
        fail("the last step's checkpoint was not written while the final validation ran", log)
    job.kill()
    job.wait()
    if run(command("single", cfg, "--resume", os.path.join(work, "run")), os.path.join(work, "resume.log")) != 0 or \
            "nothing to train: the run is at step 3 of 3" not in open(os.path.join(work, "resume.log")).read():
        fail("the checkpoint written before the final validation does not resume", os.path.join(work, "resume.log"))
    print("killed during the final validation: the checkpoint of step 3 was there and resumes")
    # SIGINT during it: the validation stops within a few batches (it would run all ~950 first)
    with open(log, "w") as out:
        job = subprocess.Popen(command("single", cfg, "--out", os.path.join(work, "run2")), stdout=out,
                               stderr=subprocess.STDOUT, env=env)
    ckpt = os.path.join(work, "run2", "checkpoints", "step_00000003.safetensors")
    deadline = time.time() + 60
    while not os.path.exists(ckpt) and job.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    job.send_signal(signal.SIGINT)
    try:
        status = job.wait(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        fail("a SIGINT did not stop the final validation within 30 s", log)
    if status != 130:
        fail(f"a SIGINT during the final validation ended with status {status}", log)
    print("SIGINT during the final validation: stopped, status 130")
    # the resume validates what the stop cut short and adds it to step 3's line (it said "nothing to
    # train" and the run never had its final validation)
    resume_log = os.path.join(work, "resume2.log")
    if run(command("single", cfg, "--out", os.path.join(work, "run2"), "--resume", os.path.join(work, "run2"),
                   "--val-batches", "2"), resume_log) != 0 or "validation at step 3:" not in open(resume_log).read():
        fail("the resume did not run the final validation that the stop cut short", resume_log)
    lines = [json.loads(l) for l in open(os.path.join(work, "run2", "metrics.jsonl"))]
    if [l["step"] for l in lines] != [1, 2, 3] or "val_loss" not in lines[-1]:
        fail(f"metrics.jsonl after the resumed validation: {lines}")
    print("the resume validated step 3 and added it to its metrics line")


def kill9_test(rounds):
    # a model big enough that a checkpoint (~14 MiB) takes a while to write
    cfg = config({"steps": 100000, "ckpt_every": 1, "keep_checkpoints": 2, "batch_size": 2, "seq_len": 16},
                 model={"d_model": 256, "n_heads": 4, "n_kv_heads": 4, "dense_hidden": 512,
                        "expert_hidden": 256, "max_seq_len": 16})
    ckdir = os.path.join(work, "run", "checkpoints")
    hits = 0
    for r in range(rounds):
        log = os.path.join(work, f"kill{r}.log")
        resume = ["--resume", os.path.join(work, "run")] if r else []
        with open(log, "w") as out:
            job = subprocess.Popen(command("single", cfg, *resume), stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline, skip = time.time() + 60, rng.randint(0, 3)  # kill during the 1st..4th write of this run
        seen = set()
        while job.poll() is None and time.time() < deadline:
            names = os.listdir(ckdir) if os.path.isdir(ckdir) else []
            tmp = [n for n in names if ".tmp." in n]
            fresh = [n for n in tmp if n not in seen]
            seen.update(tmp)
            saved = any(n.startswith("step_") for n in names)  # a previous checkpoint to keep
            if fresh and saved and len(seen) > skip:
                job.kill()
                break
            time.sleep(0.0005)  # a write of this size takes milliseconds
        job.wait()
        if job.returncode != -9:
            fail(f"round {r}: the job was not killed (status {job.returncode})", log)
        hits += any(".tmp." in n for n in os.listdir(ckdir))
        latest = sorted(n for n in os.listdir(ckdir) if n.startswith("step_"))[-1]
        step = int(latest[5:13])
        check = os.path.join(work, f"check{r}.log")
        if run(command("single", cfg, "--resume", os.path.join(work, "run"), "--steps", str(step + 1),
                       "--out", os.path.join(work, f"check{r}")), check) != 0:  # its own directory each round
            fail(f"round {r}: the latest checkpoint {latest} does not resume", check)
    # the next save that completes removes the killed writers' temporaries
    dead = [n for n in os.listdir(ckdir) if ".tmp." in n]
    step = int(sorted(n for n in os.listdir(ckdir) if n.startswith("step_"))[-1][5:13])
    if run(command("single", cfg, "--resume", os.path.join(work, "run"), "--steps", str(step + 1)),
           os.path.join(work, "last.log")) != 0:
        fail("the last run failed", os.path.join(work, "last.log"))
    left = [n for n in os.listdir(ckdir) if ".tmp." in n]
    print(f"kill -9 while a checkpoint was written: {rounds} rounds, {hits} cut a write short (a temporary "
          f"file left); the latest checkpoint resumed every time; the next save removed {len(dead)} temporaries")
    if left:
        fail(f"temporaries of dead writers were not removed: {left}")


def disk_full_test(kind):
    """kind "fsize": a file size limit; "enospc": the run directory on a small
    tmpfs (this script again, in a mount namespace of its own)."""
    run_dir = os.path.join(work, "mnt" if kind == "enospc" else "", "run")
    cfg = config({"steps": 8, "ckpt_every": 4, "keep_checkpoints": 3, "out_dir": run_dir})
    if run(command("single", cfg, "--steps", "4"), os.path.join(work, "first.log")) != 0:
        fail("the first run failed", os.path.join(work, "first.log"))
    ckdir = os.path.join(run_dir, "checkpoints")
    first = os.path.join(ckdir, "step_00000004.safetensors")
    size = os.path.getsize(first)

    def limited():  # a file may not grow past half a checkpoint; writes past it fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, resource.RLIM_INFINITY))

    log = os.path.join(work, "full.log")
    status = run(command("single", cfg, "--resume", run_dir), log, preexec_fn=limited if kind == "fsize" else None)
    text = open(log).read()
    want = ["the checkpoint of step 8 was not saved",
            f"cannot write '{os.path.join(ckdir, 'step_00000008.safetensors')}' ({size} bytes)",
            f"the last complete one is '{first}'", f"--resume {ckdir}"]
    want += (["File too large", "raise the file size limit (ulimit -f)"] if kind == "fsize" else
             ["No space left on device", f"free at least 0.4 MiB on the file system of '{ckdir}'"])
    missing = [w for w in want if w not in text]
    if status != 1 or missing:
        fail(f"status {status}, message lacks {missing}", log)
    if sorted(os.listdir(ckdir)) != ["step_00000004.safetensors"]:
        fail(f"the checkpoint directory holds {sorted(os.listdir(ckdir))}")
    if run(command("single", cfg, "--resume", run_dir, "--steps", "5", "--out", os.path.join(work, "after")),
           os.path.join(work, "after.log")) != 0:
        fail("the previous checkpoint does not resume", os.path.join(work, "after.log"))
    line = next(l for l in text.splitlines() if "not saved" in l)
    print(f"disk full ({kind}): status 1, '{line.strip()}' / {text.split('HINT:')[1].splitlines()[0].strip()}; "
          "step 4's checkpoint intact and resumed")


def disk_full_tmpfs_test():
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt)
    # room for one checkpoint (430 KiB) and the logs, not for two
    inner = (f"mount -t tmpfs -o size=700k tmpfs {mnt} && "
             f"exec {sys.executable} {os.path.abspath(__file__)} {exe} {work} disk_full_enospc")
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"disk full (enospc): skipped, no private tmpfs here ({probe.stderr.strip()})")
        return
    r = subprocess.run(["unshare", "--mount", "sh", "-c", inner], capture_output=True, text=True)
    if r.returncode != 0:
        fail(r.stdout + r.stderr)
    print(r.stdout.replace("PASS\n", ""), end="")


if mode == "stop":
    stop_test(sys.argv[4], sys.argv[5])
elif mode == "final_validation":
    final_validation_test()
elif mode == "kill9":
    kill9_test(int(sys.argv[4]))
elif mode == "disk_full":
    disk_full_test("fsize")
    shutil.rmtree(work)
    os.makedirs(work)
    disk_full_tmpfs_test()
elif mode == "disk_full_enospc":  # inside disk_full_tmpfs_test's mount namespace
    disk_full_test("enospc")
else:
    fail(f"unknown mode {mode}")
print("PASS")
