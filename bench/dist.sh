#!/usr/bin/env bash
# Data-parallel CPU benchmark: 2 ranks x 1 thread (mpirun) against 1 rank x 2 threads on the same
# global batch, for tiny and small, plain and ZeRO-1, interleaved round by round so that other load
# falls on every variant alike; then bench/dist_model.py predicts the 2-rank step from the measured
# compute and MPI bandwidth and prints it beside the measurement.
# Usage: bench/dist.sh [build dir] [rounds]   (default build/release, 3)
# OpenBLAS's variables are unset for every run (this machine's OPENBLAS_CORETYPE halves it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
rounds=${2:-3}
bin=$build/bench/dist_bench
[[ -x $bin ]] || { echo "dist.sh: $bin is missing: configure with Open MPI installed and build target dist_bench" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load=$(cut -d' ' -f1 /proc/loadavg)
echo "load average before: $load (a figure taken with other processes running is not comparable)"
mpi=(mpirun --oversubscribe --bind-to core -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive)
[[ $(id -u) -eq 0 ]] && mpi+=(--allow-run-as-root)
run() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@"; }
for r in $(seq "$rounds"); do
  for m in tiny small; do
    run env OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive "$bin" "$m" --steps 5 >> "$out/one.jsonl"
    run "${mpi[@]}" "$bin" "$m" --steps 5 >> "$out/two.jsonl"
    run "${mpi[@]}" "$bin" "$m" --steps 5 --zero1 >> "$out/zero1.jsonl"
  done
done
echo "load average after: $(cut -d' ' -f1 /proc/loadavg)"
python3 - "$out" "$root" <<'PY'
import json, statistics, subprocess, sys, os
out, root = sys.argv[1], sys.argv[2]
def load(name):
    rows = {}
    for line in open(os.path.join(out, name)):
        r = json.loads(line)
        rows.setdefault(r["bench"], []).append(r)
    return rows
one, two, z = load("one.jsonl"), load("two.jsonl"), load("zero1.jsonl")
def med(rows, key): return statistics.median(r[key] for r in rows)
print("| model | 1 rank x 2 threads tok/s | 2 ranks x 1 thread tok/s | ratio | ZeRO-1 tok/s | comm wait share | bytes sent/step/rank |")
print("|---|---|---|---|---|---|---|")
calib = {"example": False, "ranks": 2, "threads_per_rank": 1, "configs": []}
for m in ("tiny", "small"):
    a, b, c = med(one[m], "tokens_per_s"), med(two[m], "tokens_per_s"), med(z[m], "tokens_per_s")
    spread = (min(r["tokens_per_s"] for r in two[m]), max(r["tokens_per_s"] for r in two[m]))
    print(f"| {m} | {a:.0f} | {b:.0f} ({spread[0]:.0f}-{spread[1]:.0f}) | {b / a:.2f} | {c:.0f} | "
          f"{med(two[m], 'comm_share') * 100:.1f}% | {med(two[m], 'bytes_sent_per_step') / 1e6:.1f} MB |")
    r0 = two[m][0]
    calib["configs"].append({k: r0[k] for k in ("codebooks", "card", "dim", "layers", "heads", "batch", "frames", "grad_bytes")}
                            | {"name": m, "compute_ms": med(two[m], "compute_ms"), "comm_wait_ms": med(two[m], "comm_wait_ms"),
                               "step_ms": med(two[m], "step_ms")})
# the owners' reduce bandwidth at the gradient size: what bytes sent per step took while blocked
calib["mpi_bandwidth_gbs"] = statistics.median(
    med(two[m], "bytes_sent_per_step") / max(1e-9, med(two[m], "comm_wait_ms") / 1e3) / 1e9 for m in ("tiny", "small"))
path = os.path.join(out, "calibration.json")
json.dump(calib, open(path, "w"), indent=1)
print(json.dumps(calib))
subprocess.run([sys.executable, os.path.join(root, "bench", "dist_model.py"), "--calibrate", path], check=False)
PY
