#!/usr/bin/env bash
# The one-command GPU check (issue 6): on a machine with an NVIDIA GPU and no network, build the gpu
# tests and GPU benchmarks, run `ctest -L gpu`, the op benchmarks and the training-step benchmarks
# (etude's bench/gpu/step_bench beside PyTorch's bench/gpu/torch_step_gpu.py, eager and
# torch.compile, same model, batch and GPU), and record register and spill counts of the main
# kernels (-Xptxas -v). Everything goes to stdout and to a report file in the build directory,
# ending with a table etude vs PyTorch. Run from anywhere:   tools/gpu_check.sh
#
# Environment (all optional):
#   BUILD_DIR   build directory (default: build-gpu in the repository)
#   CUDA_ARCH   compute capability to build for (default: the first GPU's, else 90)
#   JOBS        parallel build jobs (default: all cores)
#   BENCH_BATCH sequences per benchmark batch (default 4); BENCH_ITERS iterations per op (default 20)
#   STEP_WARMUP, STEP_STEPS  untimed and timed steps of the step benchmarks (default 3 and 10)
#   PYTHON      the Python with PyTorch for the peer (default python3)
#   GPU_CHECK_BUDGET_S  seconds the whole check may take (default 460, under 8 minutes): every
#               stage runs under `timeout`, capped by what is left of this budget
#   ETUDE_GPU_CHECK_DIRECT=1  skip CMake and build directly (the fallback below)
#   ETUDE_GPU_DEPS  a folder holding catch2/catch.hpp (Debian's catch2 2.x header) and optionally
#               cblas.h, for machines whose image lacks them (see "fallback" below)
#
# Two ways to build the tests. First CMake, as on CI. If configuring fails (a GPU machine's image
# may lack OpenBLAS, Catch2 or nlohmann_json, which the whole project's configure requires), the
# script builds the GPU programs directly with nvcc and g++: the benchmarks need nothing else; the
# tests need Catch2's header (from ETUDE_GPU_DEPS or /usr/include) and use tests/gpu/fallback/cblas.h
# when no cblas.h exists. From a development checkout with Debian's catch2 installed, for a device
# machine: `mkdir -p .gpu-deps/catch2 && cp /usr/include/catch2/catch.hpp .gpu-deps/catch2/`
# (.gpu-deps/ is ignored by git), carry .gpu-deps, and run with ETUDE_GPU_DEPS=.gpu-deps.
#
# Time: work that needs CPUs and no clean GPU timing starts in the background at once and overlaps
# the test build (which keeps only a few of the cores busy): the step benchmark's direct build
# (one nvcc per configuration), the ptxas pass, and a first torch.compile of the peer's models,
# which fills TorchInductor's cache in the build directory (its compile times are the cold ones
# the report gives; the timed torch.compile run later finds the cache warm). The check waits for
# them before the first timed benchmark. Any stage may fail or time out: the script goes on and
# reports; it exits 1 if the gpu tests failed or could not be built and run, 0 otherwise.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-gpu}"
JOBS="${JOBS:-$(nproc 2>/dev/null || echo 4)}"
BENCH_BATCH="${BENCH_BATCH:-4}"
BENCH_ITERS="${BENCH_ITERS:-20}"
STEP_WARMUP="${STEP_WARMUP:-3}"
STEP_STEPS="${STEP_STEPS:-10}"
PYTHON="${PYTHON:-python3}"
BUDGET_END=$(( SECONDS + ${GPU_CHECK_BUDGET_S:-460} ))
mkdir -p "$BUILD_DIR"
REPORT="$BUILD_DIR/gpu_check_report.txt"
: > "$REPORT"
log() { printf '%s\n' "$*" | tee -a "$REPORT"; }
# run a stage with its output in the report; returns the command's status
stage() {
  local name="$1"; shift
  log ""
  log "== $name  ($(date -u +%H:%M:%S))"
  log "\$ $*"
  local start=$SECONDS
  "$@" 2>&1 | tee -a "$REPORT"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && log "!! $name: timed out"
  log "-- $name: exit $rc after $((SECONDS - start)) s"
  return "$rc"
}
# seconds a stage may take: its own cap, less what the budget has left after `reserve` seconds
# kept for the stages after it; at least 1
limit() {
  local cap="$1" reserve="${2:-0}"
  local left=$(( BUDGET_END - SECONDS - reserve ))
  [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -lt 1 ] && cap=1
  echo "$cap"
}
# timeout with a hard kill 10 s after the polite one; the whole process group goes
tmo() { local t="$1"; shift; timeout -k 10 "$t" "$@"; }

# background jobs: bg NAME CAP COMMAND... runs COMMAND under timeout with its output in
# $BUILD_DIR/background/NAME.log; bg_wait NAME puts that log in the report as a stage
BG_DIR="$BUILD_DIR/background"
mkdir -p "$BG_DIR"
declare -A BG_PID BG_START
bg() {
  local name="$1" cap="$2"; shift 2
  log "-- background job $name, limit $cap s: $*"
  rm -f "$BG_DIR/$name.rc" "$BG_DIR/$name.time"
  ( start=$SECONDS; timeout -k 10 "$cap" "$@" > "$BG_DIR/$name.log" 2>&1; rc=$?
    echo "$((SECONDS - start))" > "$BG_DIR/$name.time"; echo "$rc" > "$BG_DIR/$name.rc" ) &
  BG_PID[$name]=$!
  BG_START[$name]=$SECONDS
}
bg_wait() {
  local name="$1"
  [ -n "${BG_PID[$name]:-}" ] || return 1
  wait "${BG_PID[$name]}" 2>/dev/null
  local rc
  rc="$(cat "$BG_DIR/$name.rc" 2>/dev/null || echo 1)"
  log ""
  log "== background job $name  (waited for: $(date -u +%H:%M:%S))"
  tee -a "$REPORT" < "$BG_DIR/$name.log"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && log "!! $name: timed out"
  log "-- $name: exit $rc after $(cat "$BG_DIR/$name.time" 2>/dev/null || echo '?') s (started at ${BG_START[$name]} s)"
  unset "BG_PID[$name]"
  return "$rc"
}

if [ -z "${CUDA_ARCH:-}" ]; then
  CUDA_ARCH="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d ' .')"
  [ -n "$CUDA_ARCH" ] || CUDA_ARCH=90
fi
HAVE_GPU=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU' && HAVE_GPU=1

log "etude GPU check — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
log "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with local changes)')"
log "build dir: $BUILD_DIR, sm_$CUDA_ARCH, $JOBS jobs, budget ${GPU_CHECK_BUDGET_S:-460} s"
stage "GPU" tmo 30 nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
stage "nvcc" tmo 30 nvcc --version
[ "$HAVE_GPU" -eq 1 ] || log "!! no CUDA device (nvidia-smi sees no GPU): the GPU stages will say so and skip"
TESTS_RC=1
TEST_BIN=""
BENCH_BIN=""

# ---- background: step benchmark build, ptxas pass, PyTorch's first compile -----------------------------
NVFLAGS=(-std=c++20 -O3 -arch="sm_$CUDA_ARCH" -I"$ROOT/include" -Xcompiler=-Wall,-Wextra)
SB_DIR="$BUILD_DIR/step_bench"
SB_BIN="$SB_DIR/step_bench"
mkdir -p "$SB_DIR"
rm -f "$SB_BIN"
# one nvcc per configuration (ETUDE_STEP_BENCH_PART 1..4) and one for the driver, in parallel
bg step_bench_build "$(limit 330 120)" bash -c '
  src="$1"; out="$2"; shift 2
  pids=()
  for part in 0 1 2 3 4; do
    nvcc "$@" -DETUDE_STEP_BENCH_PART=$part -c "$src" -o "$out/part$part.o" & pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] && nvcc "$@" "$out"/part[0-4].o -o "$out/step_bench" -lcublasLt -lcublas' \
  _ "$ROOT/bench/gpu/step_bench.cu" "$SB_DIR" "${NVFLAGS[@]}"
PTX_LOG="$BUILD_DIR/ptxas_report.txt"
bg ptxas_pass "$(limit 330 120)" bash -c '
  log="$1"; root="$2"; shift 2
  : > "$log"
  rc=0
  for tu in tests/gpu/ops_device_attention.cu tests/gpu/ops_device.cu; do
    nvcc "$@" -Xptxas -v -c "$root/$tu" -o /dev/null >> "$log" 2>&1 || { echo "!! ptxas pass over $tu failed (see $log)"; rc=1; }
  done
  exit $rc' _ "$PTX_LOG" "$ROOT" -std=c++20 -O3 -arch="sm_$CUDA_ARCH" -I"$ROOT/include"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$BUILD_DIR/torchinductor}"
TORCH_STEP="$ROOT/bench/gpu/torch_step_gpu.py"
# the order of the compiled runs: the targets first (MusicGen-small, tiny), so a timeout costs least
TORCH_CONFIGS=(musicgen_small tiny small)
if [ "$HAVE_GPU" -eq 1 ]; then
  bg torch_compile_cold "$(limit 300 150)" \
    "$PYTHON" "$TORCH_STEP" "${TORCH_CONFIGS[@]}" --mode compile --warmup 1 --steps 1
fi

# ---- build: CMake first (ETUDE_GPU_CHECK_DIRECT=1 goes straight to the direct build) ----------------
if [ -z "${ETUDE_GPU_CHECK_DIRECT:-}" ] && stage "configure (CMake)" tmo "$(limit 120 200)" cmake -S "$ROOT" -B "$BUILD_DIR" \
     -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DETUDE_BUILD_EXAMPLES=OFF -DETUDE_INSTALL=OFF; then
  stage "build (CMake)" tmo "$(limit 300 180)" cmake --build "$BUILD_DIR" --target test_gpu_ops test_gpu_step test_gpu_cond test_gpu_contracts test_gpu_generate test_gpu_session ops_bench -j "$JOBS" \
    && { TEST_BIN="$BUILD_DIR/tests/gpu/test_gpu_ops"; BENCH_BIN="$BUILD_DIR/bench/gpu/ops_bench"; }
  if [ -n "$TEST_BIN" ]; then
    stage "gpu tests (ctest -L gpu)" tmo "$(limit 240 150)" ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure -V
    TESTS_RC=$?
    # ctest reports a skipped test (exit 77: no device) as passing; the binary itself says so
    grep -q "no CUDA device: gpu tests skipped" "$REPORT" && { log "!! no CUDA device seen by the tests"; TESTS_RC=1; }
  fi
else
  # ---- build: direct fallback ------------------------------------------------------------------------
  log "building the GPU programs directly (CMake configure failed or ETUDE_GPU_CHECK_DIRECT is set)"
  FB="$BUILD_DIR/fallback"
  mkdir -p "$FB"
  stage "build ops_bench (nvcc)" tmo "$(limit 300 180)" nvcc "${NVFLAGS[@]}" "$ROOT/bench/gpu/ops_bench.cu" -o "$FB/ops_bench" -lcublasLt -lcublas \
    && BENCH_BIN="$FB/ops_bench"
  CATCH_DIR=""
  for d in "${ETUDE_GPU_DEPS:-}" /usr/include /usr/local/include; do
    [ -n "$d" ] && [ -f "$d/catch2/catch.hpp" ] && { CATCH_DIR="$d"; break; }
  done
  # a CBLAS whose header and library both work, else the plain-loop fallback header
  CBLAS_INC=(-I"$ROOT/tests/gpu/fallback")
  CBLAS_LIB=()
  DEPS_INC=()
  [ -n "${ETUDE_GPU_DEPS:-}" ] && DEPS_INC=(-I"$ETUDE_GPU_DEPS" -L"$ETUDE_GPU_DEPS")
  for lib in -lopenblas -lcblas -lblas; do
    if printf '#include <cblas.h>\nint main(){float a=1,b=1,c=0;cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,1,1,1,1.f,&a,1,&b,1,0.f,&c,1);return c!=1;}\n' \
         | g++ -x c++ "${DEPS_INC[@]}" - -o "$FB/cblas_probe" "$lib" 2>/dev/null && "$FB/cblas_probe"; then
      CBLAS_INC=("${DEPS_INC[@]}")
      CBLAS_LIB=("${DEPS_INC[@]}" "$lib")
      break
    fi
  done
  [ ${#CBLAS_LIB[@]} -eq 0 ] && log "no working CBLAS: the CPU oracle uses tests/gpu/fallback/cblas.h (plain loops)"
  if [ -z "$CATCH_DIR" ]; then
    log "!! Catch2's catch2/catch.hpp not found (set ETUDE_GPU_DEPS): the gpu tests cannot be built here"
  else
    HOSTFLAGS=(-std=c++20 -O2 -fopenmp -I"$ROOT/include" -I"$CATCH_DIR" "${CBLAS_INC[@]}" -I"$(dirname "$(command -v nvcc)")/../include")
    stage "build gpu test device objects (nvcc)" tmo "$(limit 300 180)" bash -c "
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/ops_device.cu' -o '$FB/ops_device.o' &
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/ops_device_attention.cu' -o '$FB/ops_device_attention.o' &
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/step_device_fp32.cu' -o '$FB/step_device_fp32.o' &
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/step_device_bf16.cu' -o '$FB/step_device_bf16.o' &
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/step_device_fp16.cu' -o '$FB/step_device_fp16.o' &
      nvcc ${NVFLAGS[*]} -c '$ROOT/tests/gpu/step_device_policies.cu' -o '$FB/step_device_policies.o' &
      g++ ${HOSTFLAGS[*]} -c '$ROOT/tests/gpu/ops.cpp' -o '$FB/ops.o' &
      g++ ${HOSTFLAGS[*]} -c '$ROOT/tests/gpu/step.cpp' -o '$FB/step.o' &
      g++ ${HOSTFLAGS[*]} -c '$ROOT/tests/gpu/main.cpp' -o '$FB/main.o' &
      rc=0; for _ in 1 2 3 4 5 6 7 8 9; do wait -n || rc=1; done; exit \$rc" \
    && stage "link gpu tests" tmo "$(limit 60 180)" nvcc -arch="sm_$CUDA_ARCH" "$FB/main.o" "$FB/ops.o" "$FB/ops_device.o" "$FB/ops_device_attention.o" \
         -o "$FB/test_gpu_ops" -lcublasLt -lcublas -lgomp "${CBLAS_LIB[@]}" \
    && TEST_BIN="$FB/test_gpu_ops"
    [ -n "$TEST_BIN" ] && stage "link gpu step tests" tmo "$(limit 60 180)" nvcc -arch="sm_$CUDA_ARCH" "$FB/main.o" "$FB/step.o" \
         "$FB/step_device_fp32.o" "$FB/step_device_bf16.o" "$FB/step_device_fp16.o" "$FB/step_device_policies.o" \
         "$FB/ops_device.o" "$FB/ops_device_attention.o" \
         -o "$FB/test_gpu_step" -lcublasLt -lcublas -lgomp "${CBLAS_LIB[@]}" \
      && STEP_TEST_BIN="$FB/test_gpu_step"
    if [ -n "$TEST_BIN" ]; then
      OMP_NUM_THREADS="${OMP_NUM_THREADS:-$JOBS}" stage "gpu tests (direct)" tmo "$(limit 240 150)" "$TEST_BIN" --durations yes
      TESTS_RC=$?
    fi
    if [ -n "${STEP_TEST_BIN:-}" ]; then
      OMP_NUM_THREADS="${OMP_NUM_THREADS:-$JOBS}" stage "gpu step tests (direct)" tmo "$(limit 240 150)" "$STEP_TEST_BIN" --durations yes \
        || TESTS_RC=1
    else
      log "!! the gpu step tests were not built"
      TESTS_RC=1
    fi
  fi
fi

# ---- the background jobs end before anything is timed ---------------------------------------------
bg_wait step_bench_build
[ -x "$SB_BIN" ] || SB_BIN=""
bg_wait ptxas_pass
bg_wait torch_compile_cold
COLD_JSON="$BG_DIR/torch_compile_cold.log"

# ---- benchmarks ------------------------------------------------------------------------------------
if [ -n "$BENCH_BIN" ]; then
  stage "GPU op benchmarks" tmo "$(limit 90 130)" "$BENCH_BIN" "$BENCH_BATCH" "$BENCH_ITERS"
else
  log "!! ops_bench was not built"
fi

# ---- training-step benchmarks: etude, then PyTorch eager and torch.compile, same shapes and batch ------
# Each writes its JSON lines to a file beside the report as well; the table at the end reads them.
J_ETUDE="$BUILD_DIR/step_bench_etude.jsonl"
J_EAGER="$BUILD_DIR/step_bench_torch_eager.jsonl"
J_COMPILE="$BUILD_DIR/step_bench_torch_compile.jsonl"
: > "$J_ETUDE"; : > "$J_EAGER"; : > "$J_COMPILE"
if [ -n "$SB_BIN" ]; then
  stage "GPU step benchmark: etude" tmo "$(limit 120 100)" bash -c 'set -o pipefail; "$1" all --warmup "$2" --steps "$3" | tee "$4"' \
    _ "$SB_BIN" "$STEP_WARMUP" "$STEP_STEPS" "$J_ETUDE"
else
  log "!! step_bench was not built"
fi
# the peer uses the batch step_bench chose for MusicGen-small (from its plan), the others are fixed
MS_BATCH="$(sed -n 's/.*"bench": "musicgen_small", "impl": "etude", "precision": "bf16", "batch": \([0-9]*\).*/\1/p' "$J_ETUDE" | head -n1)"
TORCH_BATCH=()
[ -n "$MS_BATCH" ] && TORCH_BATCH=(--batch "musicgen_small=$MS_BATCH")
if [ "$HAVE_GPU" -eq 1 ]; then
  stage "GPU step benchmark: PyTorch eager" tmo "$(limit 120 60)" bash -c 'set -o pipefail; out="$1"; shift; "$@" | tee "$out"' \
    _ "$J_EAGER" "$PYTHON" "$TORCH_STEP" "${TORCH_CONFIGS[@]}" --mode eager --warmup "$STEP_WARMUP" --steps "$STEP_STEPS" "${TORCH_BATCH[@]}"
  stage "GPU step benchmark: PyTorch torch.compile" tmo "$(limit 300 15)" bash -c 'set -o pipefail; out="$1"; shift; "$@" | tee "$out"' \
    _ "$J_COMPILE" "$PYTHON" "$TORCH_STEP" "${TORCH_CONFIGS[@]}" --mode compile --warmup "$STEP_WARMUP" --steps "$STEP_STEPS" "${TORCH_BATCH[@]}"
else
  log ""
  log "== GPU step benchmark: PyTorch eager and torch.compile"
  log "no CUDA device: PyTorch step benchmarks skipped"
fi

# ---- registers and spills of the main kernels (ptxas pass above) ------------------------------------
log ""
log "== ptxas -v, sm_$CUDA_ARCH: registers, stack frame and spills per kernel (full output: $PTX_LOG)"
DEMANGLE=cat
command -v c++filt > /dev/null && DEMANGLE=c++filt
grep -E "Compiling entry function|Used [0-9]+ registers|bytes stack frame" "$PTX_LOG" 2>/dev/null \
  | sed -E "s/.*Compiling entry function '([^']*)'.*/kernel \1/; s/^ptxas info +: //" \
  | "$DEMANGLE" | tee -a "$REPORT"

# ---- the step table: etude against PyTorch eager and torch.compile ----------------------------------
log ""
log "== training step: etude vs PyTorch on the same GPU (median of $STEP_STEPS steps after $STEP_WARMUP)"
SUMMARY_PY="$(command -v "$PYTHON" || command -v python3 || true)"
if [ -z "$SUMMARY_PY" ]; then
  log "!! no Python to tabulate; the JSON lines are in $J_ETUDE, $J_EAGER, $J_COMPILE"
else
  tmo 30 "$SUMMARY_PY" - "$J_ETUDE" "$J_EAGER" "$J_COMPILE" "$COLD_JSON" "$HAVE_GPU" <<'PY' 2>&1 | tee -a "$REPORT"
import json, sys

def rows(path):
    out = {}
    try:
        for line in open(path):
            if line.startswith("{"):
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                out[(r.get("bench"), r.get("precision"))] = r
    except OSError:
        pass
    return out

etude, eager, comp, cold = (rows(p) for p in sys.argv[1:5])
if sys.argv[5] != "1":
    print("no CUDA device: the step benchmarks did not run (nothing to compare)")
    sys.exit(0)
keys = [("tiny", "bf16"), ("small", "bf16"), ("musicgen_small", "bf16"), ("tiny", "fp32")]
targets = {("tiny", "bf16"): 3.0, ("musicgen_small", "bf16"): 1.3}

def cell(r, fmt, field):
    if r is None:
        return "-"
    if "error" in r:
        return "FAIL"
    return fmt.format(r[field]) if field in r else "-"

head = f"{'config':14s} {'prec':4s} {'B x T':>10s} | {'tok/s':>8s} {'ms':>8s} {'MFU':>5s} {'GiB':>5s} | " \
       f"{'tok/s':>8s} {'MFU':>5s} {'GiB':>5s} | {'tok/s':>8s} {'MFU':>5s} {'GiB':>5s} {'cold s':>6s} {'warm s':>6s} | " \
       f"{'eager':>6s} {'compile':>7s} | target"
bars = [i for i, ch in enumerate(head) if ch == "|"]
top = " " * bars[0]
for name, (a, b) in zip(("etude", "torch eager", "torch.compile", "etude / torch"), zip(bars, bars[1:])):
    top += "|" + name.center(b - a - 1)
print(top + "|")
print(head)
print("-" * len(head))
for k in keys:
    e, g, c, c0 = etude.get(k), eager.get(k), comp.get(k), cold.get(k)
    any_r = next((r for r in (e, g, c) if r and "batch" in r), None)
    bt = f"{any_r['batch']}x{any_r['frames']}" if any_r else "-"
    def ratio(other):
        if e and other and "tokens_per_s" in e and "tokens_per_s" in other and other["tokens_per_s"]:
            return e["tokens_per_s"] / other["tokens_per_s"]
        return None
    re, rc = ratio(g), ratio(c)
    tgt = ""
    if k in targets:
        need = targets[k]
        tgt = f">= {need}x compile: " + ("met" if rc is not None and rc >= need else "missed" if rc is not None else "n/a")
        if k[0] == "musicgen_small":
            mfu = e.get("mfu") if e else None
            tgt += ", MFU >= 45%: " + ("met" if mfu is not None and mfu >= 0.45 else "missed" if mfu is not None else "n/a")
    pct = lambda r: cell(r, "{:.0%}", "mfu")
    print(f"{k[0]:14s} {k[1]:4s} {bt:>10s} | {cell(e, '{:.0f}', 'tokens_per_s'):>8s} {cell(e, '{:.2f}', 'ms_per_step'):>8s} "
          f"{pct(e):>5s} {cell(e, '{:.1f}', 'peak_alloc_gib'):>5s} | {cell(g, '{:.0f}', 'tokens_per_s'):>8s} "
          f"{pct(g):>5s} {cell(g, '{:.1f}', 'peak_alloc_gib'):>5s} | {cell(c, '{:.0f}', 'tokens_per_s'):>8s} "
          f"{pct(c):>5s} {cell(c, '{:.1f}', 'peak_alloc_gib'):>5s} {cell(c0, '{:.0f}', 'compile_s'):>6s} "
          f"{cell(c, '{:.0f}', 'compile_s'):>6s} | {('%.2fx' % re) if re else '-':>6s} {('%.2fx' % rc) if rc else '-':>7s} | {tgt}")
for name, table in (("etude", etude), ("torch eager", eager), ("torch.compile", comp)):
    for k, r in table.items():
        if "error" in r:
            print(f"!! {name} {k[0]} {k[1]}: {r['error']}")
peaks = sorted({(r.get("precision"), r.get("peak_tflops")) for t in (etude, eager, comp) for r in t.values() if "peak_tflops" in r})
print("tok/s: B*T frames per second. MFU: model FLOPs (etude::model::train_flops: 6N per position + 12*L*S*D,")
print("  causal half not discounted) per second over the H100/H200 SXM dense peak: "
      + (", ".join(f"{p} {v:g} TFLOP/s" for p, v in peaks) or "bf16 989, fp32 67 TFLOP/s") + ".")
print("GiB: peak allocated on the device (etude: trainer.memory().peak_allocated; torch: max_memory_allocated).")
print("cold s: the first torch.compile (in the background, while the builds ran); warm s: the timed run's, cache filled.")
PY
fi

log ""
log "== summary"
if [ "$TESTS_RC" -eq 0 ]; then log "gpu tests: PASSED"; else log "gpu tests: FAILED or not run (status $TESTS_RC)"; fi
log "total: $SECONDS s (budget ${GPU_CHECK_BUDGET_S:-460} s)"
log "report: $REPORT"
[ "$TESTS_RC" -eq 0 ] && exit 0 || exit 1
