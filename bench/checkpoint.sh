#!/usr/bin/env bash
# Checkpoint throughput beside the disk's own figure, in one run: dd writes 512 MiB with fsync to
# the same directory, then bench/checkpoint_bench saves, loads and asynchronously saves the small
# configuration's checkpoint there.   bench/checkpoint.sh [build-dir] [directory]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/bench}
dir=${2:-$build/checkpoint-bench}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DETUDE_BUILD_TESTS=OFF -DETUDE_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$build" --target checkpoint_bench -j 2 >/dev/null
mkdir -p "$dir"
dd if=/dev/zero of="$dir/dd.bin" bs=1M count=512 conv=fsync 2>&1 | tail -n 1 | sed 's/^/dd write (fsync): /'
dd if="$dir/dd.bin" of=/dev/null bs=1M 2>&1 | tail -n 1 | sed 's/^/dd read (page cache): /'
rm -f "$dir/dd.bin"
"$build/bench/checkpoint_bench" "$dir"
