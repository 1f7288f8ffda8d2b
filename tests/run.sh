#!/usr/bin/env bash
# The whole test suite, as CI runs it (after installing what it needs: .ci/install-deps, once):
#   1. Release build of the library's tests, examples and benchmarks; ctest (unit, parity, cuda_sim,
#      compile_fail, example, header self-sufficiency); where nvcc exists, every CUDA translation
#      unit is compiled (for ETUDE_CUDA_ARCHS, default 90: the H200's sm_90, one architecture, since
#      the sources hold no per-architecture code and CI has no GPU; a build of the project itself
#      defaults to 80;90) and the gpu tests run (or report themselves skipped without a device);
#   2. a second build (CPU only, no header check, of the cuda_sim tests only the simulator's own: stage 1
#      did the rest) under AddressSanitizer and UndefinedBehaviorSanitizer running the unit, parity,
#      example and those cuda_sim tests (an overrun of simulated device memory is ASan's report);
#   3. libFuzzer harnesses for the safetensors, checkpoint, shard and manifest readers, briefly;
#   4. the installed package consumed by find_package, add_subdirectory and FetchContent;
#   5. the Conan recipe created and its test_package run, offline.
# Usage: tests/run.sh [build root]   (default: build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build}
jobs=${ETUDE_JOBS:-2}
start=$SECONDS
step() { printf '\n=== %s   [%s, %d s in]\n' "$*" "$(date -u +%H:%M:%S)" "$((SECONDS - start))"; }

step "dependencies (installed once; a quick check after)"
"$root/.ci/install-deps"

step "release build and tests"
cmake -S "$root" -B "$out/release" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${ETUDE_CUDA_ARCHS:-90}"
cmake --build "$out/release" -j "$jobs"
ctest --test-dir "$out/release" --output-on-failure -j "$jobs"

step "address and undefined-behaviour sanitizers"
# -O1 -g1: the sanitizers' usual optimisation level, for the library's examples and the tests
# whose time goes into arithmetic; the other tests at -O0 (tests/CMakeLists.txt): most of this
# stage is compile time, and instrumented code compiles at more than twice the cost
cmake -S "$root" -B "$out/sanitize" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DETUDE_SANITIZE="address;undefined" \
      -DETUDE_BUILD_BENCH=OFF -DETUDE_ENABLE_CUDA=OFF -DETUDE_HEADER_CHECK=OFF -DETUDE_CUDA_SIM_TESTS=simulator \
      -DETUDE_TEST_OPTIMIZATION=-O0
cmake --build "$out/sanitize" -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$out/sanitize" --output-on-failure -j "$jobs" -L "unit|parity|example|cuda_sim"

step "fuzzing: each reader for a few seconds (tests/fuzz/run.sh; longer runs by hand)"
"$root/tests/fuzz/run.sh" "${ETUDE_FUZZ_SECONDS:-5}" "$out/fuzz"

step "package consumers"
"$root/tests/package/run.sh" "$out/release"

step "conan package"
"$root/conan/run.sh" "$out/conan"

step "all tests passed"
