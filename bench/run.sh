#!/usr/bin/env bash
# One command for the step benchmark: builds bench/step_bench and, in interleaved rounds, times
# etude's training step (fp32 and bf16) beside its peers on the same model and batch: Debian's
# PyTorch 1.13 (bench/torch_step.py on its parity fast path) and PyPI's PyTorch 2.x with
# torch.compile, fp32 and bf16 autocast. Every round also measures the machine's ceilings (fp32 FMA
# peak, the bf16 dot-product peak where the CPU has AVX512_BF16, the AMX bf16 tile peak where it has
# AMX, and the fp32 and bf16 gemms etude uses: oneDNN, or OpenBLAS sgemm without it), and every
# result is printed as a fraction of the ceilings of the instructions it ran on, and as ratios
# within its round.
#   bench/run.sh [build-dir]        (default build/bench)
#
# Figures that cannot lie: each measurement's timed window records the CPU time other processes
# took (/proc/stat's busy time minus the benchmark's own, bench/cpu_load.{hpp,py}); a figure taken
# while others used more than ETUDE_BENCH_MAX_OTHERS cores (default 0.1), or whose load could not
# be read, is marked CONTENDED, and ETUDE_BENCH_STRICT=1 refuses to print figures at all then.
#
# PyPI's torch is installed on first use into build/bench-venv (plain `pip install torch` from
# PyPI, a few GB with its CUDA dependencies; the log goes to build/bench-venv-install.log); if it
# cannot be installed the peer is skipped and the summary says so. It is reported as shipped: it
# links MKL, which takes a slow path on AMD processors, and nothing here overrides that.
#
# Both sides run with ETUDE_BENCH_THREADS threads (default 2) under the same OpenBLAS environment:
# the machine's OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE settings are removed for this command only,
# and PyTorch gets OMP_WAIT_POLICY=passive, its best setting on 2 cores.
#   ETUDE_BENCH_STEPS   timed steps per measurement (default 5)
#   ETUDE_BENCH_ROUNDS  interleaved rounds (default 3)
#   ETUDE_BENCH_CONFIGS which configurations (default "tiny small"; tiny_long is tiny with one
#                       sequence of 2048 frames, the same B·T as tiny: what long sequences cost)
#   ETUDE_BENCH_TORCH2  0 skips PyPI's torch (default 1)
#   ETUDE_BENCH_BUILD_JOBS  parallel compile jobs for step_bench (default the thread count)
#
# Every run appends its summary to docs/benchmarks.md as one dated section naming the CPU (model
# name; avx2, fma, avx512f, avx512_bf16, amx_bf16 present or not), the commit and the settings
# (bench/step_report.py --record), so a figure needs no hand edit:
#   ETUDE_BENCH_RECORD  the file to append to (default docs/benchmarks.md); 0 records nothing
#   ETUDE_BENCH_LINES   report and record the JSON lines of an earlier run (kept with
#                       ETUDE_BENCH_KEEP_LINES=FILE) instead of measuring: no build, no timing
#   ETUDE_BENCH_KEEP_LINES  a copy of this run's JSON lines goes here
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/bench}
threads=${ETUDE_BENCH_THREADS:-2}
steps=${ETUDE_BENCH_STEPS:-5}
rounds=${ETUDE_BENCH_ROUNDS:-3}
configs=${ETUDE_BENCH_CONFIGS:-tiny small}
max_others=${ETUDE_BENCH_MAX_OTHERS:-0.1}
venv=$root/build/bench-venv
record=${ETUDE_BENCH_RECORD:-$root/docs/benchmarks.md}
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ $commit != unknown && -n $(git -C "$root" status --porcelain -- include bench 2>/dev/null) ]]; then
  commit+=" with local changes to include/ or bench/"
fi
skipped=()
failed=()

# The summary of the JSON lines in $1, printed and (unless ETUDE_BENCH_RECORD=0) recorded.
summarise() {
  local report=(/usr/bin/python3 "$here/step_report.py" "$1" --max-others "$max_others")
  [[ ${ETUDE_BENCH_STRICT:-0} == 1 ]] && report+=(--strict)
  local s f
  for s in "${skipped[@]}"; do report+=(--skipped "$s"); done
  for f in "${failed[@]}"; do report+=(--failed "$f"); done
  if [[ $record != 0 ]]; then
    report+=(--record "$record" --commit "$commit")
    if [[ -n ${ETUDE_BENCH_LINES:-} ]]; then
      report+=(--setting "reported from $(basename "$ETUDE_BENCH_LINES"), measured earlier; the commit is the one reporting")
    else
      report+=(--setting "$threads threads each" --setting "$steps timed steps" --setting "$rounds interleaved rounds"
               --setting "configurations: $configs" --setting "contended above $max_others cores of others")
    fi
  fi
  "${report[@]}"
}

if [[ -n ${ETUDE_BENCH_LINES:-} ]]; then
  summarise "$ETUDE_BENCH_LINES"
  exit
fi
if ! [[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $steps =~ ^[0-9]+$ && $steps -ge 1 ]]; then
  echo "ETUDE_BENCH_ROUNDS and ETUDE_BENCH_STEPS must be whole numbers of at least 1" >&2
  exit 2
fi

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DETUDE_BUILD_TESTS=OFF -DETUDE_BUILD_EXAMPLES=OFF \
      -DETUDE_BUILD_BENCH=ON >/dev/null
cmake --build "$build" --target step_bench -j "${ETUDE_BENCH_BUILD_JOBS:-$threads}" >/dev/null

# PyPI's torch 2.x, installed once into build/bench-venv.
torch2=""
torch2_ok() { [[ -x $venv/bin/python ]] && "$venv/bin/python" -c \
  'import sys, torch; sys.exit(0 if int(torch.__version__.split(".")[0]) >= 2 and hasattr(torch, "compile") else 1)' \
  2>/dev/null; }
if [[ ${ETUDE_BENCH_TORCH2:-1} == 0 ]]; then
  skipped+=("torch 2 compiled: skipped (ETUDE_BENCH_TORCH2=0)")
else
  if ! torch2_ok; then
    echo "Installing PyPI's torch into $venv (first use; a few GB, log in $root/build/bench-venv-install.log)" >&2
    mkdir -p "$root/build"
    if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install --progress-bar off torch numpy; } \
         >"$root/build/bench-venv-install.log" 2>&1; then
      echo "Could not install PyPI's torch; see $root/build/bench-venv-install.log" >&2
    fi
  fi
  if torch2_ok; then
    torch2=$venv/bin/python
  else
    skipped+=("torch 2 compiled: skipped (PyPI's torch could not be installed or imported into $venv; see build/bench-venv-install.log)")
  fi
fi

clean_env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS="$threads")
torch_env=("${clean_env[@]}" OMP_WAIT_POLICY=passive TORCHINDUCTOR_COMPILE_THREADS=1)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load=(/usr/bin/python3 "$here/cpu_load.py")
step_bench=$build/bench/step_bench

{
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) online;" \
       "$threads threads each; steps: $steps timed; rounds: $rounds; contended above $max_others cores of others"
  if [[ -n $torch2 ]]; then
    "$torch2" -c 'import torch
mkl = torch.backends.mkl.is_available()
print(f"PyPI torch {torch.__version__}, reported as shipped:",
      "it links MKL, which takes a slow path on AMD processors; no override applied" if mkl else "without MKL")' \
      2>/dev/null
  fi
}
"${load[@]}" --idle 3 | tee -a "$out"
/usr/bin/python3 -c 'import json, sys
o = json.loads(open(sys.argv[1]).readlines()[-1])["others_cores"]
if o < 0 or o > float(sys.argv[2]):
    print(f"WARNING: before the run other processes used {o:.2f} cores; figures will be marked CONTENDED")' \
  "$out" "$max_others"

# A peer that fails (a compiler error in torch.compile, say) is noted and the run goes on; etude's
# own failures stop it.
peer() {
  local who=$1
  shift
  if ! "${torch_env[@]}" "${load[@]}" "${tags[@]}" --tag who="$who" -- "$@" | tee -a "$out"; then
    failed+=("$who failed on $name in round $round; its error is above")
  fi
}

for round in $(seq 1 "$rounds"); do
  for ceiling in fma_peak bf16_dot_peak amx_bf16_peak fp32_gemm bf16_gemm; do
    "${clean_env[@]}" "${load[@]}" --tag round="$round" -- "$step_bench" "$ceiling" | tee -a "$out"
  done
  for name in $configs; do
    case $name in
      tiny) read -r k c d h l b t <<<"4 2048 256 4 4 8 256" ;;
      tiny_long) read -r k c d h l b t <<<"4 2048 256 4 4 1 2048" ;;
      small) read -r k c d h l b t <<<"4 2048 512 8 8 4 512" ;;
      *) echo "unknown configuration $name (tiny, tiny_long, small)" >&2; exit 2 ;;
    esac
    shape=(--codebooks "$k" --card "$c" --dim "$d" --heads "$h" --layers "$l" --batch "$b" --frames "$t"
           --threads "$threads")
    tags=(--tag round="$round" --tag config="$name")
    for precision in fp32 bf16; do
      "${clean_env[@]}" "${load[@]}" "${tags[@]}" --tag who="etude $precision" -- \
        "$step_bench" "$name" --precision "$precision" --steps "$steps" | tee -a "$out"
    done
    peer "torch 1.13 fp32" /usr/bin/python3 "$here/torch_step.py" "${shape[@]}" --steps "$((steps + 1))"
    if [[ -n $torch2 ]]; then
      peer "torch 2 compiled fp32" "$torch2" "$here/torch_step.py" "${shape[@]}" --compile --steps "$((steps + 2))"
      peer "torch 2 compiled bf16" "$torch2" "$here/torch_step.py" "${shape[@]}" --compile --bf16 \
        --steps "$((steps + 2))"
    fi
  done
done

echo
[[ -n ${ETUDE_BENCH_KEEP_LINES:-} ]] && cp "$out" "$ETUDE_BENCH_KEEP_LINES"
summarise "$out"
