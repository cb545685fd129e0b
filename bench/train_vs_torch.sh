#!/usr/bin/env bash
# Training throughput, coremesh vs PyTorch 1.13 on the same model and data
# (the `make run` demo model), 1 and 2 threads, in the same run. Prints a
# markdown table for docs/performance.md, section "## Training".
#   usage: bench/train_vs_torch.sh [steps] (default 12)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-12}
COREMESH=${COREMESH:-build/coremesh}
WORK=$(mktemp -d /tmp/coremesh_bench_train.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
[ -s data/bible-kjv.txt ] || { mkdir -p data; bible "gen1:1-rev22:21" </dev/null >data/bible-kjv.txt; }
echo "| threads | coremesh tokens/s | PyTorch 1.13 tokens/s | ratio | coremesh MFU |"
echo "|---|---|---|---|---|"
for threads in 1 2; do
  sed -e "s/\"steps\": [0-9]*/\"steps\": $STEPS/" -e "s/\"threads\": [0-9]*/\"threads\": $threads/" \
      -e "s/\"val_every\": [0-9]*/\"val_every\": 0/" -e "s/\"ckpt_every\": [0-9]*/\"ckpt_every\": 0/" \
      -e "s|\"out_dir\": \"[^\"]*\"|\"out_dir\": \"$WORK/run$threads\"|" \
      bench/train_demo_config.json >"$WORK/cfg$threads.json"
  ours=$("$COREMESH" train --config "$WORK/cfg$threads.json" --no-progress | sed -n 's/^throughput: \([0-9.]*\) tokens\/s, MFU \([0-9.]*\)%.*/\1 \2/p')
  torch=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive \
          /usr/bin/python3 bench/train_torch.py "$WORK/run$threads/config.json" "$STEPS")  # the full config coremesh wrote
  set -- $ours
  ratio=$(awk -v a="$1" -v b="$torch" 'BEGIN { printf "%.2f", a / b }')
  echo "| $threads | $1 | $torch | ${ratio}x | $2% |"
done
