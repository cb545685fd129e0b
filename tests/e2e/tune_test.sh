#!/usr/bin/env bash
# The tiling tuner end to end (issue 33): `coremesh tune` writes a tuning
# cache for a run's ops; `train --tune-cache` trains with it to the same loss,
# bit for bit, as with the heuristic tilings (the tuner keeps only tilings
# that leave the step's gradients unchanged); `train --tune` does both; a
# stale cache (another machine) is ignored with a warning; the same at 2 PEs
# (tp 2: each PE tunes its own shards' keys, in lockstep).
# Usage: tune_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
python3 "$here/tiny_run.py" "$work" 3 '{"model": {"d_model": 64, "n_layers": 2, "max_seq_len": 64, "dense_hidden": 128,
  "expert_hidden": 64}, "train": {"batch_size": 8, "seq_len": 64, "steps": 4, "warmup_steps": 1, "val_every": 0,
  "ckpt_every": 0}}'
fail() { echo "FAIL: $*"; exit 1; }
loss() { sed -n 's/^done: .* loss \([0-9.]*\).*/\1/p' "$1"; }
train() {  # log, then flags
  local log=$1
  shift
  "$exe" train --config "$work/cfg.json" --no-progress --overwrite --out "$work/run" "$@" >"$log" 2>&1 || { cat "$log"; fail "train $*"; }
}

for layout in one tp2; do
  flags=()
  [ $layout = tp2 ] && flags=(--tp 2)
  cache=$work/$layout.json
  "$exe" tune --config "$work/cfg.json" --tune-cache "$cache" --no-progress "${flags[@]}" >"$work/tune_$layout.log" 2>&1 ||
    { cat "$work/tune_$layout.log"; fail "$layout: coremesh tune"; }
  grep -q "^.*tuned [0-9]* op keys" "$work/tune_$layout.log" || { cat "$work/tune_$layout.log"; fail "$layout: no summary"; }
  n=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['format']=='coremesh-tuning-cache'; print(len(j['entries']))" "$cache")
  [ "$n" -gt 10 ] || fail "$layout: only $n tuned keys"
  train "$work/heuristic_$layout.log" "${flags[@]}"
  train "$work/tuned_$layout.log" "${flags[@]}" --tune-cache "$cache"
  ! grep -q "has no tiling for" "$work/tuned_$layout.log" || { cat "$work/tuned_$layout.log"; fail "$layout: untuned keys"; }
  a=$(loss "$work/heuristic_$layout.log") b=$(loss "$work/tuned_$layout.log")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "$layout: loss $a with heuristic tilings, $b with tuned ones"
  echo "$layout: $n tuned keys, loss $a both ways"
done

# --tune: tune, then train; the cache keeps the other layout's keys
train "$work/tune_and_train.log" --tune --tune-cache "$work/one.json"
grep -q "tuned [0-9]* op keys" "$work/tune_and_train.log" || fail "--tune printed no summary"
[ "$(loss "$work/tune_and_train.log")" = "$(loss "$work/heuristic_one.log")" ] || fail "--tune changed the loss"

# a file that is not a tuning cache is refused, not overwritten
cp "$work/cfg.json" "$work/not_a_cache.json"
if "$exe" tune --config "$work/cfg.json" --tune-cache "$work/not_a_cache.json" --no-progress >"$work/refused.log" 2>&1; then
  fail "tune overwrote a file that is not a tuning cache"
fi
grep -q "is not a tuning cache" "$work/refused.log" || { cat "$work/refused.log"; fail "no clear refusal"; }
cmp -s "$work/cfg.json" "$work/not_a_cache.json" || fail "the refused file changed"

# a rerun under a time limit keeps the earlier search's picks (it measured nothing)
python3 -c "import json,sys; print(sum(e['evaluations'] for e in json.load(open(sys.argv[1]))['entries']))" \
  "$work/one.json" >"$work/evaluations_before"
"$exe" tune --config "$work/cfg.json" --tune-cache "$work/one.json" --no-progress --tune-time-limit 0.001 \
  >"$work/limited.log" 2>&1 || { cat "$work/limited.log"; fail "time-limited tune"; }
after=$(python3 -c "import json,sys; print(sum(e['evaluations'] for e in json.load(open(sys.argv[1]))['entries']))" \
  "$work/one.json")
[ "$after" -ge "$(cat "$work/evaluations_before")" ] || fail "a time-limited rerun replaced measured picks ($after evaluations left)"

# the cache is written through a temporary of its own: a user's NAME.tmp stays
echo precious >"$work/fresh.json.tmp"
"$exe" tune --config "$work/cfg.json" --tune-cache "$work/fresh.json" --no-progress --tune-time-limit 0.001 \
  >"$work/fresh.log" 2>&1 || { cat "$work/fresh.log"; fail "tune into a new cache"; }
[ "$(cat "$work/fresh.json.tmp")" = precious ] || fail "tune overwrote the user's fresh.json.tmp"

# a cache from another machine is ignored, with a warning that says why, and
# tune refuses to add to it (that would drop the other machine's tilings)
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); j['machine']='another machine | 64 cpus'; json.dump(j, open(sys.argv[1],'w'))" \
  "$work/one.json"
train "$work/stale.log" --tune-cache "$work/one.json"
grep -q "ignoring the stale tuning cache.*another machine" "$work/stale.log" || { cat "$work/stale.log"; fail "no stale warning"; }
cp "$work/one.json" "$work/other_machine.json"
if "$exe" tune --config "$work/cfg.json" --tune-cache "$work/one.json" --no-progress >"$work/other.log" 2>&1; then
  fail "tune added to another machine's cache"
fi
grep -q "holds another machine's or coremesh's tilings" "$work/other.log" || { cat "$work/other.log"; fail "no clear refusal"; }
cmp -s "$work/one.json" "$work/other_machine.json" || fail "the other machine's cache changed"
echo "OK"
