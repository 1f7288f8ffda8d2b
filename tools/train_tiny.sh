#!/usr/bin/env bash
# The main job, as README's quick start runs it: installs what the build needs (once; a quick check
# after), builds examples/train_tiny in build/ and runs it. Arguments go to train_tiny
# (--steps, --device cuda, --fresh, --run-dir ...; see examples/train_tiny.cpp).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/.ci/install-deps"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j "${ETUDE_JOBS:-2}" --target train_tiny
cd "$root"
exec "$root/build/examples/train_tiny" "$@"
