#!/usr/bin/env bash
# `coremesh train` started by mpirun with the network path forced (every PE
# its own host, UCX over TCP on loopback; mpirun_net.sh) trains exactly as
# the self-launched run of the same data-parallel layout: the same final
# loss and a bit-identical checkpoint. Then a PE killed under mpirun stops
# the job, and nothing is left in /dev/shm.
# Usage: mpirun_train_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
run=$(dirname "$0")/mpirun_net.sh
. "$(dirname "$0")/../shm_names.sh"
shm_names_before "$work/shm_before.txt"

config() {  # config <out dir> <steps> <file>
  python3 - "$work" "$1" "$2" > "$3" <<'PY'
import json, sys, random
w, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
random.seed(3)
words = ["in the beginning ", "god created ", "the heaven ", "and the earth. ", "and void; "]
corpus = f"{w}/corpus.txt"
open(corpus, "w").write("".join(random.choice(words) for _ in range(20000)))
print(json.dumps({
    "model": {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2,
              "max_seq_len": 32, "first_k_dense": 1, "dense_hidden": 64, "n_routed_experts": 4,
              "top_k": 2, "expert_hidden": 32},
    "train": {"data": [corpus], "batch_size": 4, "seq_len": 32, "steps": steps, "warmup_steps": 2,
              "val_every": 0, "ckpt_every": steps, "sample_tokens": 0, "report": False, "cores": 1,
              "out_dir": out},
    "parallel": {"dp": 2}}))
PY
}

# 1. The same dp=2 run (same config, same run directory: the checkpoint
# names it), self-launched and under mpirun.
config "$work/run" 6 "$work/dp2.json"
"$exe" train --config "$work/dp2.json" --no-progress > "$work/self.log" 2>&1 \
  || { cat "$work/self.log"; fail "the self-launched run failed"; }
mv "$work/run" "$work/self"
"$run" 2 "$exe" train --config "$work/dp2.json" --no-progress > "$work/mpirun.log" 2>&1 \
  || { cat "$work/mpirun.log"; fail "the run under mpirun failed"; }
mv "$work/run" "$work/mpirun"
grep -q 'PE 1 of 2' "$work/mpirun.log" || { cat "$work/mpirun.log"; fail "no PE joined under mpirun"; }
a=$(grep '^done:' "$work/self.log") b=$(grep '^done:' "$work/mpirun.log")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "final losses differ: self-launched '$a', mpirun '$b'"
ckpt() { ls "$1"/checkpoints/step_*.safetensors | sort | tail -1; }
cmp "$(ckpt "$work/self")" "$(ckpt "$work/mpirun")" || fail "the checkpoints differ"
echo "dp=2 under mpirun (network path) = self-launched: $a, checkpoints bit-identical"

# 2. A PE killed under mpirun stops the job.
config "$work/long" 100000 "$work/long.json"
"$run" 2 "$exe" train --config "$work/long.json" --no-progress > "$work/kill.log" 2>&1 &
job=$!
victim=""
for _ in $(seq 1 300); do
  for pid in $(pgrep -f -- "--config $work/long.json" || true); do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && victim=$pid
  done
  [ -n "$victim" ] && grep -q 'PE 1 of 2' "$work/kill.log" && break
  sleep 0.1
done
[ -n "$victim" ] || { kill "$job"; fail "no PE 1 under mpirun"; }
sleep 1
start=$(date +%s)
kill -9 "$victim"
status=0
wait "$job" || status=$?
[ "$status" -ne 0 ] || fail "the job ended with status 0 after a PE was killed"
[ $(( $(date +%s) - start )) -lt 30 ] || fail "the job took too long to stop"
echo "a killed PE stops the job under mpirun (status $status)"

left=$(shm_names_left "$work/shm_before.txt")
[ -z "$left" ] || fail "left in /dev/shm: $left"
echo "PASS"
