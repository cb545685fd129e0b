#!/usr/bin/env bash
# A parallel `coremesh train` whose PE dies or hangs (issue: failure):
#   - a PE killed mid-run stops the whole job within 5 s, naming the PE;
#   - a PE that stops responding is named by the others' watchdog with what
#     they wait for, and the job stops;
#   - nothing is left in /dev/shm; the last completed checkpoint is intact
#     and a run resumes from it.
# Usage: train_fault_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$work" <<'PY'
import json, sys, random
w = sys.argv[1]
random.seed(3)
words = ["in the beginning ", "god created ", "the heaven ", "and the earth. ", "and void; "]
open(f"{w}/corpus.txt", "w").write("".join(random.choice(words) for _ in range(20000)))
cfg = {"model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
                 "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
                 "top_k": 2, "expert_hidden": 32},
       "train": {"data": [f"{w}/corpus.txt"], "batch_size": 4, "seq_len": 32, "steps": 100000,
                 "warmup_steps": 2, "val_every": 0, "ckpt_every": 3, "keep_checkpoints": 2,
                 "sample_tokens": 0, "report": False, "out_dir": f"{w}/run"},
       "parallel": {"dp": 2}}
json.dump(cfg, open(f"{w}/cfg.json", "w"))
PY

. "$(dirname "$0")/../shm_names.sh"
shm_names_before "$work/shm_before.txt"

# The PE with COREMESH_PE=$2 among the children of launcher $1.
pe_pid() {
  for child in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "COREMESH_PE=$2"; then echo "$child"; return; fi
  done
}

# Starts the job in the background and waits for its first checkpoint.
start_job() {
  COREMESH_WAIT_TIMEOUT_S=${1:-60} "$exe" train --config "$work/cfg.json" --no-progress >"$work/log" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    ls "$work"/run/checkpoints/step_*.safetensors >/dev/null 2>&1 && return
    kill -0 "$job" 2>/dev/null || { cat "$work/log"; fail "the job ended before its first checkpoint"; }
    sleep 0.1
  done
  fail "no checkpoint after 60 s"
}

# 1. A PE killed mid-run.
start_job
victim=$(pe_pid "$job" 1)
[ -n "$victim" ] || fail "no PE 1 under the launcher"
start=$(date +%s.%N)
kill -9 "$victim"
status=0
wait "$job" || status=$?
took=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$start" "$(date +%s.%N)")
[ "$status" -ne 0 ] || fail "the job ended with status 0 after a PE was killed"
grep -q "PE 1 was killed" "$work/log" || { cat "$work/log"; fail "the launcher's message does not name PE 1"; }
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 5.0 else 1)" "$took" || fail "the job took $took s to stop"
echo "killed PE 1: the job stopped in $took s with status $status: $(grep 'PE 1 was killed' "$work/log" | head -1)"

# 2. The last checkpoint is intact and resumable (one more step).
last=$(ls "$work"/run/checkpoints/step_*.safetensors | sort | tail -1)
step=$(basename "$last" .safetensors | sed 's/step_0*//')
"$exe" train --config "$work/cfg.json" --no-progress --resume "$work/run" --steps $((step + 1)) \
  --out "$work/resumed" >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resuming $last failed"; }
grep -q "resumed from" "$work/resume.log" || fail "the resumed run did not report its checkpoint"
echo "resumed from $last at step $step"

# 3. A PE that hangs (stopped): the other's watchdog names what it waits for.
rm -rf "$work/run"
start_job 3
victim=$(pe_pid "$job" 1)
kill -STOP "$victim"
status=0
wait "$job" || status=$?
kill -9 "$victim" 2>/dev/null || true
[ "$status" -ne 0 ] || fail "the job ended with status 0 while a PE hung"
grep -q "error on PE 0: .*waits.*PE 1" "$work/log" || { cat "$work/log"; fail "no watchdog message naming what PE 0 waits for"; }
echo "hung PE 1: $(grep -m1 'waits' "$work/log")"

# 4. Nothing left in /dev/shm.
left=$(shm_names_left "$work/shm_before.txt")
[ -z "$left" ] || fail "left in /dev/shm: $left"
echo "PASS"
