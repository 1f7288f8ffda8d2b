#!/usr/bin/env bash
# The main job resumes: a run stopped part way and started again ends exactly where an
# uninterrupted run ends (same final validation record, to the last digit).
#   example_resume.sh <train_tiny> <scratch dir>
set -euo pipefail
job=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
common=(--steps 30 --frames 32 --batch 8 --valid-every 15 --checkpoint-every 10)
"$job" "${common[@]}" --fresh --run-dir "$dir/straight" > "$dir/straight.log" || true
"$job" "${common[@]}" --fresh --run-dir "$dir/resumed" --stop-after 17 > "$dir/first.log"
"$job" "${common[@]}" --run-dir "$dir/resumed" > "$dir/second.log" || true
grep -q "resuming .* at step 17" "$dir/second.log" || { echo "the second invocation did not resume"; cat "$dir/second.log"; exit 1; }
a=$(tail -n 1 "$dir/straight/metrics.jsonl")
b=$(tail -n 1 "$dir/resumed/metrics.jsonl")
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "final records differ:"; echo "$a"; echo "$b"; exit 1; }
grep -q '"status": "finished"' "$dir/resumed/run.json" || { echo "run.json does not say finished"; exit 1; }
# the samples written at the end: every file of the uninterrupted run, bit for bit, listed in run.json
n=0
for f in "$dir/straight/samples/"sample-*; do
  cmp -s "$f" "$dir/resumed/samples/$(basename "$f")" || { echo "sample $(basename "$f") differs"; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 3 ] || { echo "expected samples (npy, mid, ...) in $dir/straight/samples, found $n files"; exit 1; }
grep -q '"midi": ".*sample-0-C-major.mid"' "$dir/resumed/run.json" || { echo "run.json does not list the samples"; exit 1; }
echo "resumed run matches the uninterrupted one, samples included ($n files): $b"
