#!/usr/bin/env bash
# One command for the step benchmark: builds bench/step_bench, runs it and PyTorch's step
# (bench/torch_step.py, Debian's python3-torch) on the same shapes, same machine, same run, and
# prints the ratios etude/PyTorch and the fraction of the sgemm ceiling.
#   bench/run.sh [build-dir]        (default build/bench)
# Both sides run with 2 threads under the same OpenBLAS environment: the machine's
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE settings are removed for this command only, and PyTorch
# gets OMP_WAIT_POLICY=passive, its best setting on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/bench}
threads=${ETUDE_BENCH_THREADS:-2}
steps=${ETUDE_BENCH_STEPS:-5}

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DETUDE_BUILD_TESTS=OFF -DETUDE_BUILD_EXAMPLES=OFF \
      -DETUDE_BUILD_BENCH=ON >/dev/null
cmake --build "$build" --target step_bench -j "$threads" >/dev/null

clean_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"${clean_env[@]}" "$build/bench/step_bench" ceiling | tee -a "$out"
for cfg in "tiny 4 2048 256 4 4 8 256" "small 4 2048 512 8 8 4 512"; do
  read -r name k c d h l b t <<<"$cfg"
  "${clean_env[@]}" "$build/bench/step_bench" "$name" --steps "$steps" | tee -a "$out"
  "${clean_env[@]}" OMP_WAIT_POLICY=passive /usr/bin/python3 "$here/torch_step.py" --codebooks "$k" --card "$c" \
      --dim "$d" --heads "$h" --layers "$l" --batch "$b" --frames "$t" --steps "$((steps + 1))" --threads "$threads" |
    sed "s/^{/{\"bench\": \"torch_$name\", /" | tee -a "$out"
done

/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = {r["bench"]: r for r in map(json.loads, open(sys.argv[1]))}
ceiling = rows["sgemm_ceiling"]["gflops"]
for name in ("tiny", "small"):
    e, t = rows[name], rows["torch_" + name]
    print(f"{name:6s} etude {e['ms_per_step']:8.1f} ms/step {e['tokens_per_s']:7.0f} tok/s {e['gflops']:6.1f} GFLOP/s"
          f" ({e['gflops'] / ceiling:.0%} of sgemm {ceiling:.0f}) | torch {t['ms_per_step']:8.1f} ms/step"
          f" {t['tokens_per_s']:7.0f} tok/s | etude/torch {e['tokens_per_s'] / t['tokens_per_s']:.2f}x")
PY
