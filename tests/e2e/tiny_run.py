#!/usr/bin/env python3
"""Writes a tiny corpus and a training config for the e2e tests.
  usage: tiny_run.py WORK_DIR SEED '{"model": {...}, "train": {...}, ...}'
The JSON is merged over the defaults below (section by section); the data
path and out_dir point into WORK_DIR."""
import json
import random
import sys

work, seed, overrides = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
random.seed(seed)
words = ["in the beginning ", "god created ", "the heaven ", "and the earth. ", "and void; "]
open(f"{work}/corpus.txt", "w").write("".join(random.choice(words) for _ in range(20000)))
cfg = {"model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                 "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
                 "top_k": 2, "expert_hidden": 32},
       "train": {"data": [f"{work}/corpus.txt"], "batch_size": 4, "seq_len": 32, "sample_tokens": 0,
                 "report": False, "out_dir": f"{work}/run"},
       "parallel": {}}
for section, values in overrides.items():
    cfg.setdefault(section, {}).update(values)
json.dump(cfg, open(f"{work}/cfg.json", "w"))
