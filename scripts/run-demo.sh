#!/usr/bin/env bash
# `make run`: train a ~11.4M-parameter MoE (4 layers, top-2 of 8 routed experts
# + 1 shared) on the King James Bible for a few minutes, then print where the
# HTML report is. The text is tokenized by DEMO_TOKENIZER: bpe<N> (a
# SentencePiece BPE vocabulary of N pieces, trained here first, in seconds,
# on the training share of the corpus) or bytes. BPE 8192 trains better in
# the same time (docs/performance.md, "Tokenizer"): 135 of its steps take
# about as long as 200 byte-level steps.
#
# Environment: DEMO_TOKENIZER (default bpe8192), DEMO_STEPS (default 135;
# 200 for bytes), DEMO_THREADS (default: all CPUs), DEMO_CONFIG_ONLY=1 (write
# the config and stop), COREMESH (path of the executable, default build/coremesh).
set -euo pipefail
cd "$(dirname "$0")/.."

COREMESH=${COREMESH:-build/coremesh}
TOKENIZER=${DEMO_TOKENIZER:-bpe8192}
STEPS=${DEMO_STEPS:-$([ "$TOKENIZER" = bytes ] && echo 200 || echo 135)}
THREADS=${DEMO_THREADS:-0}
OUT=${DEMO_OUT:-out/train-demo}

if ! command -v bible >/dev/null 2>&1; then
  echo "run-demo: installing the bible-kjv corpus"
  bash scripts/install-deps.sh run
fi
mkdir -p data
if [ ! -s data/bible-kjv.txt ]; then
  echo "run-demo: preparing data/bible-kjv.txt from the bible-kjv package"
  bible "gen1:1-rev22:21" </dev/null >data/bible-kjv.txt.tmp
  mv data/bible-kjv.txt.tmp data/bible-kjv.txt
fi
echo "run-demo: corpus $(wc -c <data/bible-kjv.txt) bytes"

mkdir -p "$OUT"
case "$TOKENIZER" in
  bytes) VOCAB=256 TOKENIZER_FILE="" ;;
  bpe[0-9]*) VOCAB=${TOKENIZER#bpe} TOKENIZER_FILE="$OUT/$TOKENIZER.model" ;;
  *) echo "run-demo: DEMO_TOKENIZER is bytes or bpe<N> (e.g. bpe4096), not '$TOKENIZER'"; exit 2 ;;
esac
cat >"$OUT/demo-config.json" <<JSON
{
  "model": {
    "vocab_size": ${VOCAB}, "d_model": 256, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4,
    "max_seq_len": 128, "first_k_dense": 1, "dense_hidden": 768,
    "n_routed_experts": 8, "n_shared_experts": 1, "top_k": 2, "expert_hidden": 384,
    "gating": "sigmoid", "n_groups": 1, "topk_groups": 1,
    "bias_update": "margin", "bias_update_rate": 0.5, "aux_loss_alpha": 0.001, "capacity_factor": 0,
    "rope_theta": 10000, "init_std": 0.02, "tied_embeddings": true
  },
  "train": {
    "data": ["data/bible-kjv.txt"], "tokenizer": "${TOKENIZER_FILE}", "val_fraction": 0.02,
    "batch_size": 8, "seq_len": 128, "grad_accum": 1,
    "steps": ${STEPS}, "lr": 0.002, "min_lr": 0.0002, "warmup_steps": 20,
    "weight_decay": 0.1, "grad_clip": 1.0, "seed": 1,
    "val_every": 50, "val_batches": 16, "log_every": 10,
    "out_dir": "${OUT}", "ckpt_every": 100, "keep_checkpoints": 2, "threads": ${THREADS}
  }
}
JSON
[ "${DEMO_CONFIG_ONLY:-0}" = 1 ] && exit 0
if [ -n "$TOKENIZER_FILE" ] && [ ! -s "$TOKENIZER_FILE" ]; then  # the held-out 2% stays unseen
  "$COREMESH" tokenizer train --vocab "$VOCAB" --model bpe --data data/bible-kjv.txt --val-fraction 0.02 \
    --out "$TOKENIZER_FILE" | sed 's/^/run-demo: /'
fi

# The layout: the fastest of one PE on every core and, with 2 or more cores,
# data or expert parallelism over 2 PEs (same global batch of 8 sequences:
# 4 per PE), each measured for a few steps here. DEMO_LAYOUT=single|dp2|ep2
# chooses one without measuring.
layout_flags() {
  case "$1" in
    single) echo "" ;;
    dp2) echo "--dp 2 --batch-size 4" ;;
    ep2) echo "--ep 2 --batch-size 4" ;;
  esac
}
LAYOUT=${DEMO_LAYOUT:-}
if [ -z "$LAYOUT" ]; then
  candidates="single"
  [ "$(nproc)" -ge 2 ] && candidates="single dp2 ep2"
  best=0
  for c in $candidates; do
    # shellcheck disable=SC2046
    tps=$("$COREMESH" train --config "$OUT/demo-config.json" $(layout_flags "$c") --steps 12 \
            --warmup 2 --val-every 0 --ckpt-every 0 --sample-tokens 0 --report false --no-progress \
            --out "$OUT/probe-$c" 2>/dev/null | sed -n 's/^throughput: \([0-9.]*\) tokens\/s.*/\1/p')
    echo "run-demo: layout $c: ${tps:-failed} tokens/s (12-step probe)"
    if [ -n "$tps" ] && awk -v a="$tps" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$tps; LAYOUT=$c; fi
    rm -rf "$OUT/probe-$c"
  done
  [ -n "$LAYOUT" ] || { echo "run-demo: every layout failed; see: $COREMESH train --config $OUT/demo-config.json"; exit 1; }
fi
echo "run-demo: training with layout $LAYOUT $(layout_flags "$LAYOUT")"

# shellcheck disable=SC2046
"$COREMESH" train --config "$OUT/demo-config.json" $(layout_flags "$LAYOUT") --dry-run
# shellcheck disable=SC2046
"$COREMESH" train --config "$OUT/demo-config.json" $(layout_flags "$LAYOUT") --overwrite  # each `make run` starts over
