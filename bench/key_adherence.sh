#!/usr/bin/env bash
# Key adherence of the main job: trains examples/train_tiny (the tiny model conditioned on key and
# mode, Bach chorales) unless the run directory already holds a checkpoint, then samples every one
# of the 24 keys (12 tonics x major/minor) with guidance (--cfg-coef 3) and without (1) through
# examples/generate, and analyses each sample's MIDI with music21 (bench/key_adherence.py): how often
# the analysed key, the tonic alone, the mode alone equal the asked ones.
#   bench/key_adherence.sh [build-dir]      (default build/release; examples built there)
# Environment: ETUDE_KEYS_RUN (run directory, default build/bench-keys), ETUDE_KEYS_STEPS (training
# steps, default 300), ETUDE_KEYS_SAMPLES (samples per key and guidance, default 4),
# ETUDE_KEYS_FRAMES (frames per sample, default 128 = 8 bars of 4/4), ETUDE_KEYS_CFG (default "1 3"),
# ETUDE_KEYS_VENV (venv for music21, default build/bench-venv, created with PyPI's music21 if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
build=${1:-$root/build/release}
run=${ETUDE_KEYS_RUN:-$root/build/bench-keys}
steps=${ETUDE_KEYS_STEPS:-300}
samples=${ETUDE_KEYS_SAMPLES:-4}
frames=${ETUDE_KEYS_FRAMES:-128}
read -r -a coefs <<<"${ETUDE_KEYS_CFG:-1 3}"
venv=${ETUDE_KEYS_VENV:-$root/build/bench-venv}
out=$run/key-adherence

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DETUDE_ENABLE_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target train_tiny generate -j 2 >/dev/null
if [[ ! -x $venv/bin/python ]] || ! "$venv/bin/python" -c "import music21" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q music21
fi

env=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
if ! compgen -G "$run/checkpoints/*" >/dev/null; then
  echo "training: $steps steps into $run (load before: $(cat /proc/loadavg))"
  t0=$(date +%s)
  "${env[@]}" "$build/examples/train_tiny" --steps "$steps" --run-dir "$run" --fresh --samples 0 | tail -n 3
  echo "trained in $(( $(date +%s) - t0 )) s (load after: $(cat /proc/loadavg))"
fi

echo "sampling: 24 keys x guidance (${coefs[*]}) x $samples samples of $frames frames (load before: $(cat /proc/loadavg))"
t0=$(date +%s)
rm -rf "$out"
for c in "${coefs[@]}"; do
  for mode in major minor; do
    for tonic in C C# D Eb E F F# G Ab A Bb B; do
      "${env[@]}" "$build/examples/generate" --checkpoint "$run" --key "$tonic" --mode "$mode" --frames "$frames" \
          --batch "$samples" --cfg-coef "$c" --seed 1 --no-wav --no-png --output "$out/cfg$c/$tonic-$mode" >/dev/null
    done
  done
done
echo "sampled in $(( $(date +%s) - t0 )) s (load after: $(cat /proc/loadavg))"
"$venv/bin/python" "$here/key_adherence.py" "$out"
