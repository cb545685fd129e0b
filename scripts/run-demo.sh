#!/usr/bin/env bash
# `make run`: train a ~10M-parameter MoE (4 layers, top-2 of 8 routed experts
# + 1 shared) on the King James Bible, byte-level, for a few minutes, then
# print where the HTML report is.
#
# Environment: DEMO_STEPS (default 200), DEMO_THREADS (default: all CPUs),
# COREMESH (path of the executable, default build/coremesh).
set -euo pipefail
cd "$(dirname "$0")/.."

COREMESH=${COREMESH:-build/coremesh}
STEPS=${DEMO_STEPS:-200}
THREADS=${DEMO_THREADS:-0}
OUT=${DEMO_OUT:-out/train-demo}

if ! command -v bible >/dev/null 2>&1; then
  echo "run-demo: installing the bible-kjv corpus"
  bash scripts/install-deps.sh
fi
mkdir -p data
if [ ! -s data/bible-kjv.txt ]; then
  echo "run-demo: preparing data/bible-kjv.txt from the bible-kjv package"
  bible "gen1:1-rev22:21" </dev/null >data/bible-kjv.txt.tmp
  mv data/bible-kjv.txt.tmp data/bible-kjv.txt
fi
echo "run-demo: corpus $(wc -c <data/bible-kjv.txt) bytes"

mkdir -p "$OUT"
cat >"$OUT/demo-config.json" <<JSON
{
  "model": {
    "vocab_size": 256, "d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4,
    "max_seq_len": 128, "first_k_dense": 1, "dense_hidden": 768,
    "n_routed_experts": 8, "n_shared_experts": 1, "top_k": 2, "expert_hidden": 384,
    "gating": "sigmoid", "n_groups": 1, "topk_groups": 1,
    "bias_update_rate": 0.001, "aux_loss_alpha": 0.0001, "capacity_factor": 0,
    "rope_theta": 10000, "init_std": 0.02, "tied_embeddings": true
  },
  "train": {
    "data": ["data/bible-kjv.txt"], "val_fraction": 0.02,
    "batch_size": 8, "seq_len": 128, "grad_accum": 1,
    "steps": ${STEPS}, "lr": 0.002, "min_lr": 0.0002, "warmup_steps": 20,
    "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1,
    "val_every": 50, "val_batches": 16, "log_every": 10,
    "out_dir": "${OUT}", "ckpt_every": 100, "keep_checkpoints": 2, "threads": ${THREADS}
  }
}
JSON

"$COREMESH" train --config "$OUT/demo-config.json" --dry-run
"$COREMESH" train --config "$OUT/demo-config.json"
