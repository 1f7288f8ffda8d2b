#!/usr/bin/env bash
# Crash test: the main job, checkpointing every other step, is killed with SIGKILL at random
# moments (at least 20 times) and restarted each time; every restart must resume from its newest
# good checkpoint, and the finished run must end exactly where an uninterrupted run ends.
#   crash_resume.sh <train_tiny> <scratch dir> [kills]
set -uo pipefail
job=$1
dir=$2
kills=${3:-20}
rm -rf "$dir"
mkdir -p "$dir"
common=(--steps 240 --frames 32 --batch 8 --valid-every 120 --checkpoint-every 2)
"$job" "${common[@]}" --fresh --run-dir "$dir/straight" > "$dir/straight.log" 2>&1
RANDOM=20261130
killed=0
attempt=0
while [ "$killed" -lt "$kills" ]; do
  attempt=$((attempt + 1))
  [ "$attempt" -gt $((kills * 4)) ] && { echo "could not kill the job $kills times"; exit 1; }
  "$job" "${common[@]}" --run-dir "$dir/crashed" > "$dir/run-$attempt.log" 2>&1 &
  pid=$!
  # somewhere between start-up and a few steps in
  sleep "$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))"
  if kill -9 "$pid" 2>/dev/null; then
    killed=$((killed + 1))
  fi
  wait "$pid" 2>/dev/null
  if grep -q "train_tiny:" "$dir/run-$attempt.log"; then
    echo "attempt $attempt failed instead of resuming:"; cat "$dir/run-$attempt.log"; exit 1
  fi
done
"$job" "${common[@]}" --run-dir "$dir/crashed" > "$dir/final.log" 2>&1
grep -q "train_tiny:" "$dir/final.log" && { echo "the final run failed:"; cat "$dir/final.log"; exit 1; }
a=$(tail -n 1 "$dir/straight/metrics.jsonl")
b=$(tail -n 1 "$dir/crashed/metrics.jsonl")
[ -n "$a" ] && [ "$a" = "$b" ] || { echo "after $killed kills the final records differ:"; echo "$a"; echo "$b"; exit 1; }
resumes=$(grep -l "resuming" "$dir"/run-*.log "$dir/final.log" | wc -l)
echo "killed $killed times ($resumes restarts resumed from a checkpoint); final record identical: $b"
