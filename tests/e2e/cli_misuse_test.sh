#!/usr/bin/env bash
# Command-line misuse found by sweeps: each is refused with what to change
# (a HINT line, no raw library error), and nothing the user saved changes.
# Usage: cli_misuse_test.sh <coremesh executable> <work dir>
set -euo pipefail
exe=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
python3 "$(dirname "$0")/tiny_run.py" "$work" 3 '{"train": {"steps": 2, "warmup_steps": 1, "val_every": 0}}'

# refused WANT CMD...: CMD exits nonzero with WANT and a HINT in its output
refused() {
  local want=$1 out status=0
  shift
  out=$("$@" 2>&1) || status=$?
  [ "$status" -ne 0 ] || { echo "$out"; fail "accepted: $*"; }
  grep -qF -- "$want" <<<"$out" || { echo "$out"; fail "'$want' not said for: $*"; }
  grep -q "HINT" <<<"$out" || { echo "$out"; fail "no HINT for: $*"; }
  if grep -qE "basic_string|json.exception|basic_filebuf|stoll|stoull" <<<"$out"; then echo "$out"; fail "a raw library error for: $*"; fi
  echo "refused: $want"
}

# The user's --config file in --out would be replaced by the run's full config.
mkdir -p "$work/mine"
cp "$work/cfg.json" "$work/mine/config.json"
refused "holds the --config file" "$exe" train --config "$work/mine/config.json" --out "$work/mine" --no-progress
cmp -s "$work/cfg.json" "$work/mine/config.json" || fail "the user's config.json changed"
refused "out_dir is empty" "$exe" train --config "$work/cfg.json" --out "" --no-progress
refused "is a directory" "$exe" train --config "$work/mine" --no-progress
refused "sample_prompt is not UTF-8" "$exe" train --config "$work/cfg.json" --sample-prompt "$(printf '\xff')" --no-progress
refused "schedule_file '$work/nope' is not a file" "$exe" train --config "$work/cfg.json" --schedule-file "$work/nope" --no-progress
echo '{"modle": {"d_model": 64}, "data": ["x.txt"]}' >"$work/flat.json"
refused "unknown config section 'modle'" "$exe" train --config "$work/flat.json" --no-progress
out=$("$exe" train --config "$work/cfg.json" --batch-size 0 --no-progress 2>&1 || true)
if grep -q "moe_replicas" <<<"$out"; then echo "$out"; fail "a zero batch also gave the layout's advice"; fi
refused "step time overflows" "$exe" schedule --schedule 1f1b --costs 1e307,2e307,1e307,0
# a pipeline run's validations sample no text: said, not left to be found out
"$exe" train --config "$work/cfg.json" --pp 2 --sample-tokens 8 --dry-run 2>&1 | grep -q "validations sample no text" ||
  fail "no note that pp runs sample no text"
# extras are said in the order they were typed (CLI11 joined them in reverse)
out=$("$exe" eval --checkpoint "$work/none" --top-p 0.9 --min-p 0.1 2>&1 || true)
grep -qF -- "not expected: --top-p 0.9 --min-p 0.1" <<<"$out" || { echo "$out"; fail "extras out of order"; }
# nanosecond costs draw a chart (the axis ran past its end: an uncaught out_of_range)
"$exe" schedule --schedule 1f1b --pp 2 --microbatches 2 --costs 1e-10,2e-10,1e-10,0 >/dev/null 2>&1 || fail "tiny costs"
# Sizes that would take gigabytes (the OOM killer) or minutes are refused at once.
refused "more than 100000" "$exe" schedule --schedule 1f1b --microbatches 100000000
refused "more than 100000" "$exe" schedule --schedule 1f1b --pp 100000
refused "more than 100000" "$exe" train --pp 2 --microbatches 100000000 --dry-run
# Values past what the run can hold are refused by name (lr 1e39 became inf at the first step,
# then a segfault; 2^30 + 1 data ranks x ep 4 wrapped to 4 PEs; 1e20 steps saturated to 2^63 - 1).
refused "train.lr = 1e+39 must be positive and a normal float" "$exe" train --lr 1e39 --dry-run
refused "train.eps = 1e-50" "$exe" train --eps 1e-50 --dry-run
refused "= 4294967300 PEs, more than 65536" "$exe" train --dp 1073741825 --ep 4 --dry-run
refused "expects an integer in [-2^63, 2^63)" "$exe" train --steps 99999999999999999999 --dry-run
refused "model.max_seq_len = 2147483647 must be in" "$exe" train --seq-len 2147483647 --max-seq-len 2147483647 --dry-run
"$exe" train --pp 4 --virtual-stages 2 --dry-run >/dev/null 2>&1 || fail "virtual_stages counted for 1f1b (only interleaved cuts them)"
refused "init_std = 1e+30 must be in (0, 1]" "$exe" train --init-std 1e30 --dry-run
# A one-PE run far past the machine's memory is refused before it loads its data (it ended in std::bad_alloc).
refused "more than twice this machine's" "$exe" train --config "$work/cfg.json" --batch-size 2147483647 --out "$work/huge" --no-progress
# So is a launched layout whose PEs together are (each alone would fit).
refused "the run's 4 PEs on this machine need about 833" "$exe" train --config "$work/cfg.json" --dp 4 --batch-size 262144 --out "$work/huge" --no-progress
# Two runs in one --out: the second is refused while the first runs (both ran, their checkpoints
# interleaved and the second's metrics.jsonl replaced the first's).
"$exe" train --config "$work/cfg.json" --out "$work/busy" --steps 1000000 --no-progress >/dev/null 2>&1 &
first=$!
for _ in $(seq 1200); do [ -s "$work/busy/.coremesh.lock" ] && break; sleep 0.1; done
refused "is in use by another run (process $first" "$exe" train --config "$work/cfg.json" --out "$work/busy" --steps 10 --overwrite --no-progress
kill -TERM $first
wait $first || true
# A non-finite gradient stops the run before its step is saved (the step with a NaN gradient norm
# was checkpointed with NaN weights, and pruning deleted the last good checkpoint).
refused "at step 2 (nothing of this step is saved)" "$exe" train --config "$work/cfg.json" --out "$work/nan" --lr 1e30 \
  --grad-clip 0 --steps 6 --ckpt-every 1 --keep-checkpoints 1 --no-progress
[ -e "$work/nan/checkpoints/step_00000001.safetensors" ] || fail "the last good checkpoint is gone"
# A file past ulimit -f is an error that names the limit (SIGXFSZ killed the run without a word).
(ulimit -f 300; refused "raise the file size limit (ulimit -f)" "$exe" train --config "$work/cfg.json" --out "$work/fsize" --no-progress)
# A layout's dry run sums one PE's memory in its summary (rank 0's host share without the heap gave
# a negative "run-ahead and cache").
out=$("$exe" train --config "$work/cfg.json" --dp 2 --dry-run 2>&1) || { echo "$out"; fail "dp 2 dry run"; }
grep -q "^memory if run on one PE: .*run-ahead and cache [0-9]" <<<"$out" || { echo "$out"; fail "the dp 2 dry run's summary"; }
# The stop message's `--resume DIR` alone continues that run: its config.json, into DIR (it
# failed: "no training data").
# From another directory, with relative data paths (config.json holds them absolute) and a trailing '/'.
python3 -c "import json, sys; c = json.load(open(sys.argv[1])); c['train']['data'] = ['corpus.txt']; json.dump(c, open(sys.argv[2], 'w'))" \
  "$work/cfg.json" "$work/cfg_rel.json"
(cd "$work" && "$exe" train --config cfg_rel.json --out cont --steps 2 --no-progress >/dev/null 2>&1) || fail "a 2-step run"
out=$(cd / && "$exe" train --resume "$work/cont/checkpoints/" --steps 3 --no-progress 2>&1) || { echo "$out"; fail "--resume DIR alone"; }
grep -q "resumed from '$work/cont/checkpoints/' at step 2" <<<"$out" || { echo "$out"; fail "--resume DIR alone did not resume"; }
[ -e "$work/cont/checkpoints/step_00000003.safetensors" ] || fail "--resume DIR alone did not train into DIR"
# A misspelled launcher option is refused (it was started as the program: status 127).
refused "unknown option '--tag-outputs' of coremesh run" "$exe" run -n 2 --tag-outputs /bin/true
# A bad environment value is an error with a hint (the device's started workers aborted the process).
refused "unknown log level 'verbose'" env COREMESH_LOG_LEVEL=verbose "$exe" info
refused "COREMESH_ALLOC_CACHE_MB=-1 is out of range" env COREMESH_ALLOC_CACHE_MB=-1 "$exe" demo --out "$work/demo"
# Train settings are checked before a dry run, simulate or plan prints figures made of them.
refused "batch_size = 0 must be positive" "$exe" train --batch-size 0 --dry-run
cluster=$(dirname "$0")/../../clusters/h800-deepseek-v3.json
refused "batch_size = -4 must be positive" "$exe" simulate --cluster "$cluster" --batch-size -4
refused "seq_len" "$exe" plan --cluster "$cluster" --pes 8 --seq-len -4
out=$("$exe" simulate --cluster "$cluster" --d-model 8192 --layers 48 --heads 64 --kv-heads 64 --dense-hidden 32768 \
  --expert-hidden 4096 --experts 64 2>&1) || { echo "$out"; fail "simulate of a layout too large"; }
grep -q "does not fit: .* the device holds 80 GB" <<<"$out" || { echo "$out"; fail "simulate did not say the layout does not fit"; }
out=$("$exe" plan --cluster "$cluster" --pes 8 --memory-gb 0.0001 2>&1) || { echo "$out"; fail "plan under a tiny limit"; }
grep -q "no layout fits the memory limit" <<<"$out" || { echo "$out"; fail "plan did not say nothing fits"; }
# Tokenizer training: an output that cannot be written is refused before training; thread counts
# SentencePiece cannot take are refused (negative) or capped (it trains on at most 128).
tr '.' '\n' <"$work/corpus.txt" >"$work/lines.txt"
refused "is a directory" "$exe" tokenizer train --vocab 300 --data "$work/lines.txt" --out "$work"
refused "is negative" "$exe" tokenizer train --vocab 300 --data "$work/lines.txt" --out "$work/t.model" --threads -5
"$exe" tokenizer train --vocab 300 --data "$work/lines.txt" --out "$work/t.model" --threads 300 >"$work/tok.log" 2>&1 ||
  { cat "$work/tok.log"; fail "--threads 300 (more than SentencePiece's 128)"; }
# A heap size past any address space (it overflowed into a negative size)
refused "too large a size" "$exe" run -n 1 --heap 1e30 /bin/true
refused "too large a size" "$exe" run -n 1 --heap inf /bin/true
# A bad option exits 1, as --help documents (CLI11's own codes were 104-109).
status=0
"$exe" tune --tune-time-limit 0 >/dev/null 2>&1 || status=$?
[ "$status" -eq 1 ] || fail "a bad option exited $status"
"$exe" --help >/dev/null || fail "--help did not exit 0"
# `run -n 2 -- prog`, as mpirun takes it: the -- ends run's options ("./prog was not expected")
[ "$("$exe" run -n 2 -- /bin/echo hi | grep -c '^hi$')" -eq 2 ] || fail "run -n 2 -- /bin/echo hi"
[ "$("$exe" run -n 1 /bin/echo a -- b)" = "a -- b" ] || fail "a -- after the program's name is the program's"
# A stopped job takes the processes its PEs started with it (a shell's background job was left running).
printf '#!/bin/sh\nif [ "$COREMESH_PE" = 0 ]; then sleep 1; exit 2; fi\nsleep 4711 &\nwait\n' >"$work/pe.sh"
chmod +x "$work/pe.sh"
status=0
"$exe" run -n 2 "$work/pe.sh" >"$work/pe.log" 2>&1 || status=$?
[ "$status" -eq 2 ] || { cat "$work/pe.log"; fail "the failing PE's status was not the job's ($status)"; }
sleep 0.3
# (a process may end between the glob and the read: its failed redirection must not stop the script)
for cmdline in /proc/[0-9]*/cmdline; do { tr '\0' ' ' <"$cmdline"; } 2>/dev/null || true; echo; done >"$work/processes"
if grep -q "^sleep 4711" "$work/processes"; then fail "a PE's background process outlived the stopped job"; fi
# ...but not what the launcher's process had started before the job (`tool & exec coremesh run ...`)
bash -c "sleep 4712 & echo \$! >'$work/tool.pid'; exec '$exe' run -n 2 sh -c 'sleep 0.5; exit 3'" >/dev/null 2>&1 || true
kill -0 "$(cat "$work/tool.pid")" 2>/dev/null || fail "the job killed a process the launcher had before it"
kill "$(cat "$work/tool.pid")"
# A profile directory that cannot be made is refused before training, not after it.
echo hi >"$work/afile"
refused "cannot create profile directory" "$exe" train --config "$work/cfg.json" --out "$work/profiled" --profile "$work/afile/sub" --no-progress
[ ! -e "$work/profiled/checkpoints" ] || fail "trained before refusing the profile directory"

# A trained run for the commands that read one.
"$exe" train --config "$work/cfg.json" --no-progress >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "training failed"; }
refused "temperature inf" "$exe" generate --checkpoint "$work/run" --prompt "And " --temperature inf --no-progress
# A resume that moves the validation split is refused; other changed settings are named.
refused "val_fraction" "$exe" train --config "$work/cfg.json" --resume "$work/run" --steps 3 --val-fraction 0.3 --no-progress
out=$("$exe" train --config "$work/cfg.json" --resume "$work/run" --steps 3 --lr 0.0005 --no-progress 2>&1) || { echo "$out"; fail "resume with another lr failed"; }
grep -q "settings other than its run's: lr" <<<"$out" || { echo "$out"; fail "the changed lr was not named"; }
# ... and so are a new step count's stretched decay and a layout's other batch (both said nothing).
grep -q "steps 2 -> 3 (the learning rate's decay now ends at step 3)" <<<"$out" || { echo "$out"; fail "the new steps were not named"; }
out=$("$exe" train --config "$work/cfg.json" --resume "$work/run" --steps 3 --grad-accum 2 --out "$work/accum" --no-progress 2>&1) || { echo "$out"; fail "resume with grad_accum 2 failed"; }
grep -q "tokens per step 128 -> 256" <<<"$out" || { echo "$out"; fail "the doubled tokens per step were not named"; }
# A directory with a checkpoint's name is not a checkpoint (it was the newest, then "cannot map: No such device").
mkdir "$work/run/checkpoints/step_00000099.safetensors"
out=$("$exe" train --resume "$work/run" --steps 4 --out "$work/dirname" --no-progress 2>&1) || { echo "$out"; fail "a directory named like a checkpoint"; }
refused "no checkpoint found in" "$exe" eval --checkpoint "$work/run/checkpoints/step_00000099.safetensors/" --no-progress
rmdir "$work/run/checkpoints/step_00000099.safetensors"
# Resuming with a model flag that the checkpoint does not match: the hint names the run's config.json.
refused "--config $work/run/config.json" "$exe" train --resume "$work/run" --d-model 64 --no-progress
mkfifo "$work/fifo"
refused "is not a regular file" timeout 20 "$exe" train --config "$work/cfg.json" --data "$work/fifo" --out "$work/f" --no-progress
out=$("$exe" generate --checkpoint "$work/run" --prompt "a" --seed -1 2>&1) && { echo "$out"; fail "--seed -1 was accepted (it wrapped)"; }
grep -q "give a whole number" <<<"$out" || { echo "$out"; fail "--seed -1 was not explained"; }
echo "PASS"
