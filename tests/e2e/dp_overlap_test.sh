#!/usr/bin/env bash
# Data parallel at dp=2 (one core per PE): the gradient sums of the comm
# stream overlap the backward's compute kernels (issue 14: "show the overlap
# in the Perfetto trace"). The signal waits park the comm stream without
# holding the PE's only worker; were they kernels that wait inside a worker,
# no compute kernel could run during them and bench/dp_overlap.py would
# find nothing hidden and fail.
# Usage: dp_overlap_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"

python3 "$here/tiny_run.py" "$work" 5 '{"model": {"d_model": 64, "n_layers": 4, "max_seq_len": 64,
  "dense_hidden": 128, "expert_hidden": 64}, "train": {"seq_len": 64, "steps": 4, "warmup_steps": 1,
  "val_every": 0, "val_batches": 1, "ckpt_every": 0}, "parallel": {"dp": 2}}'

"$exe" train --config "$work/cfg.json" --no-progress --profile "$work/profile" >"$work/log" 2>&1 ||
  { cat "$work/log"; echo "FAIL: the dp=2 run failed"; exit 1; }
python3 "$here/../../bench/dp_overlap.py" "$work/profile"
