#!/usr/bin/env bash
# Create the etude Conan package and run its test_package, offline.
#
# Usage: conan/run.sh [work dir]   (default: build/conan under the repo root)
#
# Uses a throwaway CONAN_HOME inside the work dir with every remote disabled,
# so it neither touches the network nor the user's ~/.conan2. System packages
# stand in for Conan ones through conan/profiles/debian ([platform_requires]).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
work="${1:-$root/build/conan}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

export CONAN_HOME="$work/conan-home"
mkdir -p "$CONAN_HOME"

if [[ ! -f "$CONAN_HOME/profiles/default" ]]; then
  conan profile detect --force
fi
conan remote disable "*" >/dev/null

conan create "$here" \
  --profile:all "$here/profiles/debian" \
  --build=missing \
  -c "tools.cmake.cmake_layout:test_folder=$work/test_package" \
  -c "tools.cmake.cmaketoolchain:user_presets="

echo "conan package: passed"
