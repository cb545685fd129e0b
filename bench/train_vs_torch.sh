#!/usr/bin/env bash
# Training throughput, coremesh vs PyTorch 1.13 on the same model and data
# (the `make run` demo model), 1 and 2 threads, in the same run. Each round
# runs coremesh then PyTorch; the table gives the median over the rounds of
# each side's tokens/s and of the per-round ratio (a shared machine is noisy).
# Prints a markdown table for docs/performance.md, section "## Training".
#   usage: bench/train_vs_torch.sh [steps] [rounds]   (default 20 steps, 3 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
bench_setup train 20 3 "$@"
echo "| threads | coremesh tokens/s | PyTorch 1.13 tokens/s | ratio | coremesh MFU |"
echo "|---|---|---|---|---|"
for threads in 1 2; do
  demo_config "$threads" "$STEPS" "$threads"
  : >"$WORK/ours" ; : >"$WORK/mfu"; : >"$WORK/torch"; : >"$WORK/ratio"
  for _ in $(seq "$ROUNDS"); do
    ours=$("$COREMESH" train --config "$WORK/$threads.json" --overwrite --no-progress | sed -n 's/^throughput: \([0-9.]*\) tokens\/s, MFU \([0-9.]*\)%.*/\1 \2/p')
    torch=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive \
            /usr/bin/python3 bench/train_torch.py "$WORK/run_$threads/config.json" "$STEPS")  # the full config coremesh wrote
    set -- $ours
    echo "$1" >>"$WORK/ours"; echo "$2" >>"$WORK/mfu"; echo "$torch" >>"$WORK/torch"
    awk -v a="$1" -v b="$torch" 'BEGIN { printf "%.4f\n", a / b }' >>"$WORK/ratio"
  done
  printf "| %s | %.0f | %.0f | %.2fx | %.1f%% |\n" "$threads" "$(median <"$WORK/ours")" \
    "$(median <"$WORK/torch")" "$(median <"$WORK/ratio")" "$(median <"$WORK/mfu")"
done
