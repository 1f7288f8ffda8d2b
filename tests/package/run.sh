#!/usr/bin/env bash
# Package tests: prove etude can be consumed from outside its own build.
#
# Usage: tests/package/run.sh <etude build dir>
#
# Installs the configured etude build into a scratch prefix under the build
# dir, then configures, builds and runs each consumer project in this folder:
#   find_package      against the installed prefix (CMAKE_PREFIX_PATH)
#   add_subdirectory  against the source tree
#   fetch_content     against the source tree (SOURCE_DIR) and against a
#                     source tarball (URL file://), both offline
# Prints one line per consumer; exits non-zero if any step fails.
set -u -o pipefail

if [[ $# -ne 1 || ! -f "$1/CMakeCache.txt" ]]; then
  echo "usage: $0 <configured etude build dir>" >&2
  exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="$(cd "$1" && pwd)"
work="$build/package-tests"
prefix="$work/prefix"

rm -rf "$work"
mkdir -p "$work"

# Build the consumers with the compiler and build type etude was configured with.
cache_value() {
  sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1
}
common_args=()
cxx="$(cache_value CMAKE_CXX_COMPILER)"
[[ -n "$cxx" ]] && common_args+=("-DCMAKE_CXX_COMPILER=$cxx")
build_type="$(cache_value CMAKE_BUILD_TYPE)"
common_args+=("-DCMAKE_BUILD_TYPE=${build_type:-Release}")

failures=0

# run_consumer <label> <source dir> <extra cmake args...>
run_consumer() {
  local label="$1" src="$2"
  shift 2
  local bdir="$work/$label" log="$work/$label.log" output rc
  if ! cmake -S "$src" -B "$bdir" "${common_args[@]}" "$@" >"$log" 2>&1; then
    echo "FAIL $label: configure failed (log: $log)"
    tail -n 25 "$log" | sed 's/^/    /'
  elif ! cmake --build "$bdir" --parallel >>"$log" 2>&1; then
    echo "FAIL $label: build failed (log: $log)"
    tail -n 25 "$log" | sed 's/^/    /'
  else
    output="$("$bdir/consumer" 2>&1)"
    rc=$?
    # the optional rendering targets, in the consumers that build that program too
    if [[ $rc -eq 0 && -x "$bdir/render_consumer" ]]; then
      output="$output; $("$bdir/render_consumer" 2>&1)"
      rc=$?
    fi
    printf '%s\n' "$output" >>"$log"
    if [[ $rc -eq 0 ]]; then
      echo "PASS $label: $output"
      return 0
    fi
    echo "FAIL $label: consumer exited with $rc: $output"
  fi
  failures=$((failures + 1))
  return 1
}

if ! cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1; then
  echo "FAIL install: cmake --install failed (log: $work/install.log)"
  tail -n 25 "$work/install.log" | sed 's/^/    /'
  exit 1
fi

run_consumer find_package "$here/find_package" \
  "-DCMAKE_PREFIX_PATH=$prefix" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
run_consumer add_subdirectory "$here/add_subdirectory" \
  "-DETUDE_SOURCE_DIR=$root"
run_consumer fetch_content "$here/fetch_content" \
  "-DETUDE_SOURCE_DIR=$root"

# A source tarball of what a consumer needs (no git metadata, no build dirs).
archive="$work/etude-src.tar.gz"
if tar -czf "$archive" -C "$root" --transform 's,^,etude/,' \
     CMakeLists.txt cmake include 2>"$work/archive.log"; then
  run_consumer fetch_content_url "$here/fetch_content" \
    "-DETUDE_ARCHIVE=$archive"
else
  echo "FAIL fetch_content_url: could not create $archive (log: $work/archive.log)"
  failures=$((failures + 1))
fi

if [[ $failures -ne 0 ]]; then
  echo "package tests: $failures failed"
  exit 1
fi
echo "package tests: all passed"
