#!/usr/bin/env bash
# Generation against Hugging Face: etude's cached generator (bench/generate_bench --cached-only) and
# transformers' MusicgenForCausalLM.generate (bench/hf_generate.py, Debian's PyTorch) on the same tiny
# shape (K 4, C 2048, dim 256, 4 layers, 4 heads, delay pattern), batch, length and sampling (top-k 250,
# temperature 1), random weights on both sides (a speed comparison, not a token comparison), one after
# the other in the same run with the same thread count; prints one table with the ratio.
#   bench/generate.sh [build-dir]     (default build/bench; configured here only if it has no cache)
# ETUDE_BENCH_THREADS (default "1 2"), ETUDE_BENCH_FRAMES (default "500"; "500 1500" for 30 s) and
# ETUDE_BENCH_BATCHES (default "1 4") choose the grid. The machine's OPENBLAS_CORETYPE /
# OPENBLAS_L2_SIZE are removed for both sides; PyTorch runs with OMP_WAIT_POLICY=passive.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/bench}
read -r -a threads_list <<<"${ETUDE_BENCH_THREADS:-1 2}"
read -r -a frames_list <<<"${ETUDE_BENCH_FRAMES:-500}"
read -r -a batch_list <<<"${ETUDE_BENCH_BATCHES:-1 4}"

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DETUDE_BUILD_TESTS=OFF -DETUDE_BUILD_EXAMPLES=OFF \
        -DETUDE_BUILD_BENCH=ON >/dev/null
fi
cmake --build "$build" --target generate_bench -j 2 >/dev/null

out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "load before: $(cat /proc/loadavg)"
for t in "${threads_list[@]}"; do
  env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$t")
  for f in "${frames_list[@]}"; do
    for b in "${batch_list[@]}"; do
      "${env[@]}" "$build/bench/generate_bench" --frames "$f" --batch "$b" --cached-only | grep '"batch"' |
        sed "s/^{/{\"side\": \"etude\", /" | tee -a "$out"
    done
  done
  "${env[@]}" OMP_WAIT_POLICY=passive /usr/bin/python3 "$here/hf_generate.py" --threads "$t" \
      --frames "${frames_list[@]}" --batch "${batch_list[@]}" | sed "s/^{/{\"side\": \"hf\", /" | tee -a "$out"
done
echo "load after: $(cat /proc/loadavg)"

/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
key = lambda r: (r["threads"], r["batch"], r["frames"])
etude = {key(r): r for r in rows if r["side"] == "etude"}
hf = {key(r): r for r in rows if r["side"] == "hf"}
print("| threads | batch | frames | etude s | etude tokens/s | HF s | HF tokens/s | etude/HF |")
print("|---|---|---|---|---|---|---|---|")
for k in sorted(etude):
    e, h = etude[k], hf[k]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {e['cached_s']:.2f} | {e['cached_tokens_per_s']:.0f} | {h['seconds']:.2f} |"
          f" {h['tokens_per_s']:.0f} | {e['cached_tokens_per_s'] / h['tokens_per_s']:.1f}x |")
PY
