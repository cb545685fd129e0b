#!/usr/bin/env python3
"""--dry-run's memory estimate against the measured peak RSS, rank by rank
(issue 29: within 25%), with the demo's model shape on a small corpus: one
PE and ep 2 in f32 and fp8 (the exchange's buffers and sends; fp8 rows on the wire). A run that holds far more than it estimates (the
host running ahead of the device, a copy of a checkpoint in memory, freed
pages kept by malloc, a parallel rank's exchange not counted) fails it.
bench/memory_layouts.py does the runs and the comparison.
usage: memory_estimate_test.py <coremesh executable> <work dir>"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

exe, work = sys.argv[1], Path(sys.argv[2])
here = Path(__file__).parent
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
demo_model = {"d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 128,
              "first_k_dense": 1, "dense_hidden": 768, "n_routed_experts": 8, "n_shared_experts": 1,
              "top_k": 2, "expert_hidden": 384}
subprocess.run([sys.executable, str(here / "tiny_run.py"), str(work), "3",
                json.dumps({"model": demo_model, "train": {"batch_size": 8, "seq_len": 128, "warmup_steps": 1}})],
               check=True)
done = subprocess.run([sys.executable, str(here / ".." / ".." / "bench" / "memory_layouts.py"), "--coremesh", exe,
                       "--steps", "6", "--config", str(work / "cfg.json"),
                       "--only", "1 PE", "ep 2", "ep 2, fp8", "--check"])
print("PASS" if done.returncode == 0 else "FAIL: a rank's peak is outside 0.75-1.25 of its estimate")
sys.exit(done.returncode)
