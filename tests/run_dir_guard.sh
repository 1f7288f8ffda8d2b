#!/usr/bin/env bash
# The main job owns its run directory: a second instance on a live run is refused with the first
# one's pid (with --fresh too, deleting nothing), and the first runs on unaffected, ending exactly
# where a run alone ends; a directory that is not an etude run is refused untouched; a run whose
# checkpoints are all unusable refuses to start over until told to (--discard-unusable).
#   run_dir_guard.sh <train_tiny> <scratch dir>
set -uo pipefail
job=$1
dir=$2
rm -rf "$dir"
mkdir -p "$dir"
fail() { echo "$*"; exit 1; }
common=(--steps 40 --frames 32 --batch 8 --valid-every 20 --checkpoint-every 10)
# (a run this short need not beat the unigram baseline: exit 1 with "done:" is a finished run)
"$job" "${common[@]}" --run-dir "$dir/alone" > "$dir/alone.log" 2>&1
grep -q "^done:" "$dir/alone.log" || fail "the lone run failed: $(cat "$dir/alone.log")"

"$job" "${common[@]}" --run-dir "$dir/shared" > "$dir/first.log" 2>&1 &
first=$!
for ((i = 0; i < 600; i++)); do grep -q "^step" "$dir/first.log" && break; sleep 0.1; done
grep -q "^step" "$dir/first.log" || fail "the first instance never started: $(cat "$dir/first.log")"
before=$(cd "$dir/shared" && find . -type f | sort)
for extra in "" "--fresh" "--seed 7"; do
  # shellcheck disable=SC2086
  "$job" "${common[@]}" $extra --run-dir "$dir/shared" > "$dir/second.log" 2>&1
  rc=$?
  [ "$rc" -eq 2 ] || fail "a second instance ($extra) exited $rc instead of being refused: $(cat "$dir/second.log")"
  grep -q "in use by another etude run (pid $first," "$dir/second.log" || fail "the refusal does not name pid $first: $(cat "$dir/second.log")"
done
after=$(cd "$dir/shared" && find . -type f | sort)
missing=$(comm -23 <(echo "$before") <(echo "$after") | grep -v '\.tmp\.' || true)
[ -z "$missing" ] || fail "files of the live run disappeared: $missing"
wait "$first"
grep -q "^done:" "$dir/first.log" || fail "the first instance did not finish: $(cat "$dir/first.log")"
strip() { sed 's/"seconds":[^,}]*,\{0,1\}//' "$1"; }
[ "$(strip "$dir/alone/metrics.jsonl")" = "$(strip "$dir/shared/metrics.jsonl")" ] || fail "the first instance's metrics differ from a run alone"

# not an etude run: refused, nothing touched
mkdir -p "$dir/thesis" && echo "chapter 1" > "$dir/thesis/notes.txt"
"$job" "${common[@]}" --fresh --run-dir "$dir/thesis" > "$dir/thesis.log" 2>&1
[ $? -eq 2 ] && grep -q "not an etude run directory" "$dir/thesis.log" || fail "a foreign directory was not refused: $(cat "$dir/thesis.log")"
[ "$(ls -A "$dir/thesis")" = "notes.txt" ] || fail "the foreign directory was changed: $(ls -A "$dir/thesis")"

# every checkpoint unusable: refused with the files named; told to, it starts over from step 0
for f in "$dir/alone/checkpoints"/ckpt-*.safetensors; do printf 'X' | dd of="$f" bs=1 seek=100 conv=notrunc 2> /dev/null; done
"$job" "${common[@]}" --run-dir "$dir/alone" > "$dir/unusable.log" 2>&1
[ $? -eq 2 ] && grep -q "none of its .* checkpoints can be resumed" "$dir/unusable.log" &&
  grep -q "ckpt-000000040.safetensors" "$dir/unusable.log" || fail "unusable checkpoints were not refused: $(cat "$dir/unusable.log")"
"$job" "${common[@]}" --discard-unusable --run-dir "$dir/alone" > "$dir/over.log" 2>&1
grep -q "^done:" "$dir/over.log" || fail "--discard-unusable failed: $(cat "$dir/over.log")"
grep -q "resuming" "$dir/over.log" && fail "--discard-unusable resumed instead of starting over"
[ -f "$dir/alone/checkpoints/rejected/ckpt-000000040.safetensors" ] || fail "the rejected checkpoints were not kept in rejected/"
[ "$(grep -c '"split":"train"' "$dir/alone/metrics.jsonl")" -eq 40 ] || fail "metrics after starting over do not hold each step once"
echo "second instances refused with the holder's pid, the first unaffected; foreign directory untouched; unusable checkpoints refused, then set aside"
