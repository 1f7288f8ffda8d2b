#!/usr/bin/env bash
# The main job data-parallel under mpirun (label dist):
#   1. 2 ranks with ZeRO-1 train and checkpoint; one process resumes the run and finishes it with
#      the losses of an uninterrupted 2-rank run (to rounding: the same global batch, other cuts);
#   2. a rank SIGKILLed in the middle of training: the survivor fails within --dist-timeout with an
#      error naming the dead rank (mpirun --enable-recovery, so mpirun itself does not kill it);
#   3. the whole job SIGKILLed while it saves a checkpoint at every step, three times: every rerun
#      resumes from a complete checkpoint, none is rejected.
#   usage: train_tiny_mpi.sh <mpirun> <train_tiny>
set -u -o pipefail
mpirun=$1 tiny=$2
work=$(mktemp -d)
trap 'pkill -9 -f "$work" 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# train_tiny exits 1 when the validation loss did not fall below the unigram baseline, which these
# short runs need not reach; 2 is an error
ran() { local rc; "$@"; rc=$?; [[ $rc -le 1 ]]; }
mpi=("$mpirun" --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=passive)
common=(--steps 16 --frames 32 --batch 8 --lr 2e-3 --valid-every 8 --checkpoint-every 4 --samples 0 --workers 0)

echo "== 1. 2 ranks (ZeRO-1) stop at step 8; one process resumes and finishes"
ran "${mpi[@]}" "$tiny" "${common[@]}" --run-dir "$work/a" --zero1 --stop-after 8 > "$work/a1.log" 2>&1 ||
  { cat "$work/a1.log"; fail "the 2-rank run failed"; }
ls "$work/a/checkpoints" | grep -q 'ckpt-000000008.shard-1-of-2.safetensors' || fail "no shard of rank 1 at step 8"
OMP_NUM_THREADS=2 ran env OMP_NUM_THREADS=2 "$tiny" "${common[@]}" --run-dir "$work/a" > "$work/a2.log" 2>&1 || { cat "$work/a2.log"; fail "the resumed run failed"; }
grep -q "resuming .* at step 8" "$work/a2.log" || { cat "$work/a2.log"; fail "one process did not resume the 2-rank run"; }
ran "${mpi[@]}" "$tiny" "${common[@]}" --run-dir "$work/b" > "$work/b.log" 2>&1 || { cat "$work/b.log"; fail "the uninterrupted 2-rank run failed"; }
python3 - "$work/a/metrics.jsonl" "$work/b/metrics.jsonl" <<'PY' || fail "the resumed run's losses differ from the uninterrupted run's"
import json, sys
def rows(p):
    out = {}
    for line in open(p):
        r = json.loads(line)
        out[(r["split"], r["step"])] = r["ce"]
    return out
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = max(abs(a[k] - b[k]) / b[k] for k in b)
print(f"resumed on one process vs uninterrupted on 2 ranks: {len(b)} losses, largest relative difference {worst:.2e}")
assert worst < 1e-5
PY

echo "== 1b. SIGUSR1 to mpirun (Slurm's --signal) preempts: both ranks stop at one step with a checkpoint, exit 75"
# slow storage keeps the run in flight; workers and the delay change no bits
"${mpi[@]}" "$tiny" "${common[@]}" --workers 1 --loader-delay-ms 150 --run-dir "$work/p" > "$work/p1.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step    1 " "$work/p1.log" && break; sleep 0.1; done
kill -USR1 "$job"
wait "$job"
rc=$?
[[ $rc -eq 75 ]] || { cat "$work/p1.log"; fail "mpirun exited $rc after SIGUSR1, want 75"; }
step=$(sed -n 's/^preempted by .* at step \([0-9]*\): checkpoint written.*/\1/p' "$work/p1.log")
[[ -n $step && $step -lt 16 ]] || { cat "$work/p1.log"; fail "no preemption before the end in the log"; }
grep -q '"status": "preempted"' "$work/p/run.json" || fail "run.json does not say preempted"
ran "${mpi[@]}" "$tiny" "${common[@]}" --run-dir "$work/p" > "$work/p2.log" 2>&1 || { cat "$work/p2.log"; fail "the preempted run did not resume"; }
grep -q "resuming .* at step $step" "$work/p2.log" || { cat "$work/p2.log"; fail "the rerun did not resume at step $step"; }
[[ "$(tail -n 1 "$work/p/metrics.jsonl")" == "$(tail -n 1 "$work/b/metrics.jsonl")" ]] ||
  fail "the preempted and resumed 2-rank run ends elsewhere than the uninterrupted one"
echo "preempted at step $step, resumed, ended bit for bit where the uninterrupted run ends"

echo "== 2. rank 1 killed in the middle of training"
wrapper='"$0" "$@"; rc=$?; echo "exit status of rank $OMPI_COMM_WORLD_RANK: $rc"; exit $rc'
start=$(date +%s)
"${mpi[@]}" --enable-recovery bash -c "$wrapper" "$tiny" --steps 100000 --frames 32 --batch 8 --samples 0 --workers 0 \
  --checkpoint-every 100000 --valid-every 100000 --dist-timeout 5 --run-dir "$work/c" > "$work/c.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "^step   20 " "$work/c.log" && break; sleep 0.1; done
grep -q "^step   20 " "$work/c.log" || { cat "$work/c.log"; fail "the job did not reach step 20"; }
victim=""
for p in $(pgrep -f "train_tiny.*$work/c"); do
  tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1' && [[ $(cat "/proc/$p/comm") == train_tiny ]] && victim=$p
done
[[ -n $victim ]] || fail "rank 1's process not found"
killed=$(date +%s.%N)
kill -9 "$victim"
wait "$job"
ended=$(date +%s.%N)
rc=$(sed -n 's/^exit status of rank 0: \([0-9]*\)$/\1/p' "$work/c.log")
took=$(awk -v a="$killed" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')
echo "rank 0 exited with status ${rc:-none} ${took} s after rank 1 was killed"
grep -m1 "train_tiny:" "$work/c.log" || true
[[ -n $rc && $rc -ne 0 ]] || { tail -5 "$work/c.log"; fail "rank 0 did not fail"; }
grep -q "train_tiny: .*\(no data from rank 1\|rank 1 did not take\)" "$work/c.log" || { tail -5 "$work/c.log"; fail "rank 0's error does not name rank 1"; }
awk -v t="$took" 'BEGIN { exit !(t < 5 + 10) }' || fail "rank 0 took $took s (timeout 5 s)"

echo "== 3. the whole job killed while saving, three times"
for delay in 2.5 3.5 4.5; do
  "${mpi[@]}" "$tiny" --steps 400 --frames 32 --batch 8 --samples 0 --workers 0 --zero1 --checkpoint-every 1 \
    --valid-every 100000 --run-dir "$work/d" > "$work/d.log" 2>&1 &
  sleep "$delay"
  pkill -9 -f "train_tiny.*$work/d"
  pkill -9 -f "mpirun.*$work/d"
  wait 2>/dev/null
  # resume and stop at once: the newest complete checkpoint must be taken, nothing rejected
  "${mpi[@]}" "$tiny" --steps 400 --frames 32 --batch 8 --samples 0 --workers 0 --zero1 --checkpoint-every 1 \
    --valid-every 100000 --stop-after 1 --run-dir "$work/d" > "$work/d2.log" 2>&1 || { cat "$work/d2.log"; fail "the rerun after a kill failed"; }
  grep -q "rejected\|unusable" "$work/d2.log" && { cat "$work/d2.log"; fail "a checkpoint was rejected after the kill"; }
  echo "killed after ${delay} s: $(grep -m1 -o 'resuming .* at step [0-9]*' "$work/d2.log" || echo 'nothing to resume yet')"
done
echo "PASS"
