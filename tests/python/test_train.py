"""coremesh.train: the C++ trainer from Python, configured like `coremesh train`.
The same config through Python and through the command line gives the same
losses (one implementation), and the metrics come back as dicts."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import coremesh as cm
from coremesh import train

WORDS = ["in the beginning ", "god created ", "the heaven ", "and the earth. ",
         "and the earth was ", "without form, ", "and void; ", "and darkness "]


@pytest.fixture
def config(tmp_path):
    corpus = tmp_path / "corpus.txt"
    x, text = 7, []
    for _ in range(6000):
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        text.append(WORDS[(x >> 33) % 8])
    corpus.write_text("".join(text))
    return {
        "model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                  "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
                  "top_k": 2, "expert_hidden": 32, "n_shared_experts": 1},
        "train": {"data": [str(corpus)], "batch_size": 4, "seq_len": 32, "steps": 12, "lr": 3e-3,
                  "min_lr": 3e-4, "warmup_steps": 3, "val_every": 6, "val_batches": 2,
                  "out_dir": str(tmp_path / "run"), "cores": 1, "report": False, "sample_tokens": 8},
    }


def test_run_returns_the_metrics_and_matches_the_command_line(config, tmp_path):
    result = train.run(config)
    records = result["records"]
    assert result["steps_done"] == 12 and len(records) == 12
    assert [r["step"] for r in records] == list(range(12))
    assert result["final_loss"] == records[-1]["loss"]
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert all(r["expert_balance"] >= 1.0 and r["tokens_per_s"] > 0 for r in records)
    assert [v["step"] for v in result["validation"]] == [5, 11]  # every val_every steps
    assert result["final_val_loss"] == result["validation"][-1]["loss"] < records[0]["loss"]
    assert os.path.exists(result["checkpoint"])
    # metrics.jsonl: a line per step (counted from 1), the same numbers
    lines = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [m["step"] for m in lines] == list(range(1, 13))
    assert [m["loss"] for m in lines] == [r["loss"] for r in records]
    assert [m["step"] for m in lines if "val_loss" in m] == [6, 12]

    path = tmp_path / "cfg.json"
    config["train"]["out_dir"] = str(tmp_path / "cli_run")
    path.write_text(json.dumps(config))
    out = subprocess.run([os.environ["COREMESH_RUN"], "train", "--config", str(path), "--no-progress"],
                         check=True, capture_output=True, text=True).stdout
    cli_loss = float(re.search(r"done: 12 steps, loss ([\d.]+)", out).group(1))
    assert f"{result['final_loss']:.4f}" == f"{cli_loss:.4f}", out


def test_trainer_steps_validates_and_resumes(config, tmp_path):
    trainer = train.Trainer(str(_write(config, tmp_path)))  # a JSON path works too
    first = trainer.run(until_step=6)
    assert trainer.step == 6 and first["steps_done"] == 6 and trainer.cores == 1
    assert len(trainer.records) == 6 and trainer.validate() > 0
    assert isinstance(trainer.sample(), str)
    resumed = train.Trainer(config)
    resumed.resume(first["checkpoint"])
    assert resumed.step == 6 and resumed.metrics_path == config["train"]["out_dir"] + "/metrics.jsonl"
    a, b = trainer.run(until_step=8, save_at_end=False), resumed.run(until_step=8, save_at_end=False)
    assert a["final_loss"] == b["final_loss"]  # a resumed run continues bit-exactly
    assert len(a["final_balance"]) == 1  # one MoE layer
    with pytest.raises(cm.InvalidArgument, match="past the config's"):
        trainer.run(until_step=config["train"]["steps"] + 1)
    trainer.queue_step()  # returns at once; Python may work meanwhile
    record = trainer.finish_step()
    assert record["step"] == 8 and trainer.step == 9 and record["loss"] > 0
    trainer.resume(first["checkpoint"])  # rewound in-process: the records past it go
    assert [r["step"] for r in trainer.records] == list(range(6))
    for before in (6, -5):  # not after the trainer's step 6; negative (only -1 means "all")
        with pytest.raises(cm.InvalidArgument, match="is not after step 6"):
            trainer.run(until_step=before)
    trainer.run(save_at_end=False)
    with pytest.raises(cm.InvalidArgument, match="has done all 12 steps"):
        trainer.queue_step()  # past the config's steps


def test_a_trainer_is_used_from_one_thread_at_a_time_and_not_while_a_step_is_queued(config):
    """Another thread inside the same trainer is refused (it crashed or corrupted the step's loss);
    so are validate, sample, save_checkpoint, resume and run while a step is queued (validate gave a
    wrong loss, save_checkpoint a file whose state was one step past its name)."""
    import threading
    trainer = train.Trainer(config)
    trainer.queue_step()
    for call in (trainer.validate, trainer.sample, trainer.save_checkpoint, lambda: trainer.run(save_at_end=False),
                 lambda: trainer.resume(config["train"]["out_dir"])):
        with pytest.raises(cm.InvalidArgument, match="while a step is queued"):
            call()
    trainer.finish_step()
    errors, stop = [], threading.Event()

    def validate_meanwhile():
        while not stop.is_set():
            try:
                trainer.validate()
            except cm.InvalidArgument as e:
                errors.append(str(e))
    other = threading.Thread(target=validate_meanwhile)
    other.start()
    try:
        for _ in range(3):
            try:
                trainer.run(until_step=trainer.step + 1, save_at_end=False)
            except cm.InvalidArgument as e:
                errors.append(str(e))
    finally:
        stop.set()
        other.join()
    assert errors and all("while another thread is inside the same trainer" in e for e in errors), errors


def test_a_new_run_refuses_another_runs_directory(config):
    out = config["train"]["out_dir"]
    config["train"]["warmup_steps"] = 1
    first = train.run(config, steps=2)
    kept = open(first["checkpoint"], "rb").read(), open(out + "/metrics.jsonl").read()
    with pytest.raises(cm.InvalidArgument, match="(?s)holds another run.s checkpoints.*overwrite=True"):
        train.run(config, steps=3)
    with pytest.raises(cm.InvalidArgument, match="holds another run's checkpoints"):
        train.Trainer(config).run(until_step=1)
    stepped = train.Trainer(config)  # steps without run(): saving would prune the other run's checkpoint
    stepped.queue_step()
    stepped.finish_step()
    with pytest.raises(cm.InvalidArgument, match="holds another run's checkpoints"):
        stepped.save_checkpoint()
    with pytest.raises(cm.InvalidArgument, match="holds another run's checkpoints"):
        stepped.run(until_step=2)
    assert (open(first["checkpoint"], "rb").read(), open(out + "/metrics.jsonl").read()) == kept
    train.run(config, steps=3, overwrite=True)  # the old run goes: only the new one's files stay
    assert os.listdir(out + "/checkpoints") == ["step_00000003.safetensors"]
    assert [json.loads(line)["step"] for line in open(out + "/metrics.jsonl")] == [1, 2, 3]


def test_config_is_validated_with_a_hint(config):
    full = train.config(config)
    assert full["train"]["batch_size"] == 4 and "lr" in full["train"] and "d_model" in full["model"]
    config["train"]["batch_size"] = 0
    with pytest.raises(cm.InvalidArgument, match="HINT"):
        train.run(config)
    with pytest.raises(cm.InvalidArgument, match="cannot open config"):
        train.Trainer("/nonexistent/cfg.json")
    with pytest.raises(cm.InvalidArgument, match="is a directory"):
        train.config("/tmp")
    with pytest.raises(cm.InvalidArgument, match="cannot open config '/nonexistent.json'"):
        train.config(b"/nonexistent.json")  # a bytes path is a path
    config["train"]["batch_size"] = 4
    config["train"]["lr"] = float("nan")
    with pytest.raises(cm.InvalidArgument, match="(?s)not JSON.*HINT: give numbers \\(finite"):
        train.config(config)
    config["train"]["lr"] = 1e-3
    config["train"]["steps"] = np.int64(4)  # NumPy scalars are numbers
    config["train"]["min_lr"] = np.float32(1e-4)
    assert train.config(config)["train"]["steps"] == 4
    config["train"]["sample_prompt"] = object()
    with pytest.raises(cm.InvalidArgument, match="not JSON: it holds a value of type object") as raised:
        train.config(config)
    assert "Traceback" not in str(raised.value) and "encoder.py" not in str(raised.value)
    del config["train"]["sample_prompt"]
    for bad in (None, 42, [1, 2]):
        with pytest.raises(cm.InvalidArgument, match="not a dict or a path"):
            train.Trainer(bad)
    config["paralel"] = {"dp": 2}  # a misspelt section was ignored
    with pytest.raises(cm.InvalidArgument, match="unknown config section 'paralel'"):
        train.config(config)


def _write(config, tmp_path):
    path = tmp_path / "trainer.json"
    path.write_text(json.dumps(config))
    return path


def test_tune_writes_a_cache_that_trains_to_the_same_losses(config, tmp_path):
    config["train"]["steps"] = 4
    config["train"]["val_every"] = 0
    cache = tmp_path / "tuning.json"
    summary = train.tune(config, str(cache), budget=0.5)
    assert summary["keys"] > 10 and summary["with_choice"] > 0 and summary["runs"] > 2
    assert summary["tuned_ms"] > 0 and "op keys" in summary["summary"]
    assert summary["agreed"] == []  # one process: no group exchange has a chunk count to agree on
    entries = json.loads(cache.read_text())["entries"]
    assert len(entries) == summary["keys"]
    heuristic = train.run(config)["records"]
    try:
        assert cm.runtime.load_tuning_cache(str(cache)) == len(entries)
        tuned = train.run(config, overwrite=True)["records"]
    finally:
        cm.runtime.drop_tuned_tilings()
    assert [r["loss"] for r in tuned] == [r["loss"] for r in heuristic]
    with pytest.raises(cm.InvalidArgument):
        cm.runtime.load_tuning_cache(str(tmp_path / "missing.json"))


def test_ctrl_c_stops_after_the_step_and_saves(config, tmp_path):
    config["train"].update(steps=100000, val_every=0, ckpt_every=0, sample_tokens=0)
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys\nfrom coremesh import train\n"
        "try:\n    train.run(json.loads(sys.argv[1]))\n"
        "except KeyboardInterrupt as e:\n    print('interrupted:', e, flush=True)\n    sys.exit(3)\n")
    job = subprocess.Popen([sys.executable, str(script), json.dumps(config)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    metrics = os.path.join(config["train"]["out_dir"], "metrics.jsonl")
    for _ in range(600):  # until a few steps are done
        if os.path.exists(metrics) and len(open(metrics).readlines()) >= 3:
            break
        time.sleep(0.05)
    job.send_signal(2)  # SIGINT, as Ctrl-C
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 3, out
    saved = re.search(r"stopped after step (\d+); checkpoint: (\S+)", out)
    assert saved and os.path.exists(saved.group(2)), out
    assert int(saved.group(1)) >= 3 and len(open(metrics).readlines()) == int(saved.group(1))
