#!/bin/sh
# coremesh calibrate / simulate / plan end to end on a tiny model: the cluster
# file calibrate writes loads, simulate prints a step and writes a Perfetto
# trace whose last event ends at the step, plan ranks layouts of 2 PEs, and bad
# input (a missing cluster file, a layout the cluster cannot hold) is refused
# with a hint.
#   simulate_test.sh COREMESH WORKDIR
set -eu
exe=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
cfg="--d-model 64 --layers 2 --heads 4 --kv-heads 2 --dense-hidden 128 --experts 4 --top-k 2 --expert-hidden 64 --batch-size 2 --seq-len 32 --max-seq-len 32"
# an output path calibrate cannot write is refused before it measures
for bad in "$work" "$work/no_such_dir/c.json" ""; do
  # shellcheck disable=SC2086
  if "$exe" calibrate $cfg --output "$bad" --max-pes 2 2>"$work/err0.txt"; then exit 1; fi
  grep -q "HINT" "$work/err0.txt" || { cat "$work/err0.txt"; exit 1; }
done
# files of the user's beside the output stay as they are (the PEs' figures go to a private temporary)
echo precious >"$work/c.json.links.json"
echo precious >"$work/c.json.tmp"
# as from a user's shell: OpenBLAS starts its threads before the PEs join their job
# shellcheck disable=SC2086
env -u OPENBLAS_NUM_THREADS "$exe" calibrate $cfg --output "$work/c.json" --max-pes 2 --seconds 0.002 >"$work/calibrate.txt"
grep -q "wrote $work/c.json" "$work/calibrate.txt"
[ "$(cat "$work/c.json.links.json")" = precious ] && [ "$(cat "$work/c.json.tmp")" = precious ]
# shellcheck disable=SC2086
"$exe" simulate $cfg --cluster "$work/c.json" --ep 2 --trace "$work/t.json" --json >"$work/sim.json"
# shellcheck disable=SC2086
"$exe" plan $cfg --cluster "$work/c.json" --pes 2 --global-batch 4 >"$work/plan.txt"
grep -q "layouts of 2 PEs" "$work/plan.txt"
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
cluster = json.load(open(f"{w}/c.json"))
assert cluster["schema"] == "coremesh-cluster/1" and cluster["measured"]["ops"], cluster.keys()
seams = cluster["links"]["intra_host"]["seams"]  # the TP seams' own collectives, fitted apart
assert set(seams) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}, seams
assert all(f["bandwidth"] > 0 and f["latency_seconds"] >= 0 for f in seams.values()), seams
# what the hypervisor took while it measured (steal), in the file's sources
steal = [s for s in cluster["sources"] if s.startswith("the hypervisor took ")]
assert len(steal) == 1 and 0 <= float(steal[0].split()[3].rstrip("%")) <= 100, cluster["sources"]
sim = json.load(open(f"{w}/sim.json"))
assert sim["pes"] == 2 and sim["step_seconds"] > 0 and 0 < sim["mfu"] <= 1, sim
events = [e for e in json.load(open(f"{w}/t.json"))["traceEvents"] if e["ph"] == "X"]
end = max(e["ts"] + e["dur"] for e in events) / 1e6
assert abs(end - sim["step_seconds"]) <= 1e-6 * sim["step_seconds"] + 1e-9, (end, sim["step_seconds"])
print("simulate: step", sim["step_seconds"], "s;", len(events), "trace events")
PY
# a calibrated CPU cluster's peak is per measured core count: a PE with 8
# cores has 8 times the peak (its MFU was 686% against one core's)
cat >"$work/cores8.json" <<'JSON'
{"schema": "coremesh-cluster/1", "name": "8 cores", "devices": 1,
 "device": {"name": "cpu", "peak_flops": {"f32": 1e11}, "memory_bandwidth": 1e10},
 "host": {"devices": 1, "cpu_cores": 8}, "measured": {"threads": 1},
 "links": {"intra_host": {"latency_seconds": 1e-6, "bandwidth": 1e10},
           "inter_host": {"latency_seconds": 1e-6, "bandwidth": 1e10}}}
JSON
"$exe" simulate --cluster "$work/cores8.json" --experts 0 --json >"$work/all_cores.json"
"$exe" simulate --cluster "$work/cores8.json" --experts 0 --cores 1 --json >"$work/one_core.json"
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
every, one = (json.load(open(f"{w}/{name}.json")) for name in ("all_cores", "one_core"))
assert 0 < every["mfu"] <= 1 and abs(every["mfu"] - one["mfu"]) < 1e-9, (every["mfu"], one["mfu"])
assert abs(one["step_seconds"] / every["step_seconds"] - 8) < 1e-6, (one["step_seconds"], every["step_seconds"])
PY
# bad input: a clear error with what to change, exit status 1
# shellcheck disable=SC2086
if "$exe" simulate $cfg --cluster "$work/missing.json" 2>"$work/err1.txt"; then exit 1; fi
grep -q "cannot open cluster file" "$work/err1.txt" && grep -q "HINT" "$work/err1.txt"
# shellcheck disable=SC2086
if "$exe" simulate $cfg --cluster "$work/c.json" --dp 4 2>"$work/err2.txt"; then exit 1; fi
grep -q "the cluster" "$work/err2.txt" && grep -q "HINT" "$work/err2.txt"
echo "simulate_test: OK"
