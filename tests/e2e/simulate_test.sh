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
# as from a user's shell: OpenBLAS starts its threads before the PEs join their job
# shellcheck disable=SC2086
env -u OPENBLAS_NUM_THREADS "$exe" calibrate $cfg --output "$work/c.json" --max-pes 2 --seconds 0.002 >"$work/calibrate.txt"
grep -q "wrote $work/c.json" "$work/calibrate.txt"
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
# bad input: a clear error with what to change, exit status 1
# shellcheck disable=SC2086
if "$exe" simulate $cfg --cluster "$work/missing.json" 2>"$work/err1.txt"; then exit 1; fi
grep -q "cannot open cluster file" "$work/err1.txt" && grep -q "HINT" "$work/err1.txt"
# shellcheck disable=SC2086
if "$exe" simulate $cfg --cluster "$work/c.json" --dp 4 2>"$work/err2.txt"; then exit 1; fi
grep -q "the cluster" "$work/err2.txt" && grep -q "HINT" "$work/err2.txt"
echo "simulate_test: OK"
