#!/usr/bin/env bash
# Builds the libFuzzer harnesses for etude's four file readers and runs each for a bounded time.
#
#   tests/fuzz/run.sh [seconds per target (10)] [build dir (build/fuzz)]
#
# Seeds are valid files written by etude's own writers (make_corpus.cpp), the chorales manifest
# and the regression inputs committed under tests/fuzz/corpus/<target>; each target runs on its
# corpus under <build dir>/corpus/<target>, which keeps what it finds between runs. Exits non-zero
# when any run finds a crash, a sanitizer report, an escaping exception, a timeout or an
# out-of-memory, and prints the reproducer and the report. Skips (exit 0) when clang++ cannot
# build with -fsanitize=fuzzer. ETUDE_FUZZ_TARGETS picks targets (default: all four); CXX builds
# the seed generator (default g++).
set -euo pipefail

seconds=${1:-10}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${2:-build/fuzz}
cd "$root"
mkdir -p "$build"
build=$(cd "$build" && pwd)
targets=${ETUDE_FUZZ_TARGETS:-safetensors checkpoint shard manifest}
fuzz_cxx=${FUZZ_CXX:-clang++}
gen_cxx=${CXX:-g++}
blas_include=/usr/include/x86_64-linux-gnu  # Debian's multiarch home of OpenBLAS' cblas.h
extra_include=()
[[ -f $blas_include/cblas.h ]] && extra_include=(-I"$blas_include")

probe="$build/probe"
if ! command -v "$fuzz_cxx" >/dev/null 2>&1 ||
   ! printf '#include <omp.h>\nextern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return omp_get_max_threads() < 0; }\n' |
     "$fuzz_cxx" -x c++ - -fopenmp -fsanitize=fuzzer,address,undefined -o "$probe" >/dev/null 2>&1; then
  echo "fuzz: skipped: $fuzz_cxx cannot build with -fsanitize=fuzzer and -fopenmp (install clang, its libFuzzer runtime and libomp)"
  exit 0
fi

# true when $1 is missing or older than any header or fuzz source
stale() { [[ ! -e $1 ]] || [[ -n $(find include tests/fuzz -newer "$1" -type f -print -quit) ]]; }

for t in $targets; do
  bin="$build/fuzz_$t"
  if stale "$bin"; then
    echo "fuzz: building fuzz_$t"
    "$fuzz_cxx" -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -fopenmp -Iinclude "${extra_include[@]}" "tests/fuzz/fuzz_$t.cpp" -o "$bin" -lopenblas
  fi
done

seeds="$build/seeds"
if stale "$seeds/.done"; then
  echo "fuzz: writing seed corpora"
  "$gen_cxx" -std=c++20 -O1 -Iinclude "${extra_include[@]}" -fopenmp tests/fuzz/make_corpus.cpp \
    -o "$build/make_corpus" -lopenblas
  rm -rf "$seeds"
  "$build/make_corpus" "$seeds"
  cp data/chorales/manifest.json "$seeds/manifest/chorales.json"
  touch "$seeds/.done"
fi

failed=0
for t in $targets; do
  corpus="$build/corpus/$t"
  artifacts="$build/artifacts/$t/"
  log="$build/logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp -n "$seeds/$t"/* "$corpus"/
  # committed regression inputs: each once made a reader fail
  if [[ -d tests/fuzz/corpus/$t ]]; then cp -n tests/fuzz/corpus/"$t"/* "$corpus"/; fi
  before=$(find "$corpus" -type f | wc -l)
  rc=0
  "$build/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$artifacts" "$corpus" >"$log" 2>&1 || rc=$?
  after=$(find "$corpus" -type f | wc -l)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  if [[ $rc -eq 0 ]]; then
    result=ok
  else
    failed=1
    repro=$(sed -n 's/.*Test unit written to //p' "$log" | tail -1)
    result="FAILED (exit $rc; reproducer: ${repro:-none written}; log: $log)"
  fi
  echo "fuzz $t: ${execs:-?} executions (${rate:-?}/s) in ${seconds}s, ${cov:-cov: ?}, corpus $before -> $after files: $result"
  # the report itself, without libFuzzer's and libc's own frames, so that a CI log shows the cause
  if [[ $rc -ne 0 ]]; then
    sed -n '/ERROR: /,/^SUMMARY/p' "$log" |
      grep -v -e ' in fuzzer::' -e 'libc\.so' -e ' in _start' -e ' in __libc_start' -e ' in main ' -e '__sanitizer_print' |
      head -40 | sed 's/^/    /'
  fi
done
exit $failed
