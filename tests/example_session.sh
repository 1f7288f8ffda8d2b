#!/usr/bin/env bash
# The session library through its two programs' command lines (examples/train_tiny.cpp and
# examples/train_small.cpp):
#   - named configurations: --list, a chosen one recorded in run.json, an unknown name refused;
#   - overrides: --set and --options FILE validated with the field's words, recorded resolved;
#   - the second model's run directory holds what train_tiny's does (run.json's fields, metrics,
#     TensorBoard events, checkpoints), and it resumes;
#   - preemption: SIGTERM in the middle of a run stops it after the step in flight with a
#     checkpoint and exit status 75; the same command resumes it and it ends bit for bit where an
#     uninterrupted run ends (the final metrics line, every tensor of the final checkpoint); two
#     signals stop it at once (killed by the signal) and the directory still resumes;
#   - a shared machine: where the environment names no OpenMP waiting, the program restarts itself
#     once with short spins (GOMP_SPINCOUNT=1000) and run.json says who chose the waiting.
#   tests/example_session.sh TRAIN_TINY TRAIN_SMALL DIR
set -uo pipefail
tiny=$1
small=$2
dir=$3
rm -rf "$dir"
mkdir -p "$dir"
. "$(dirname "$0")/checks.sh"

# --- named configurations and overrides -----------------------------------------------------------
list=$("$small" --list) || fail "train_small --list exited $?"
[[ "$list" == *"small "*"signature"* && "$list" == *"small_bf16 "* ]] || fail "train_small --list: $list"
expect 2 "no configuration is named 'nope'; this program has: small, small_bf16" "$small" --config nope --run-dir "$dir/x"
expect 2 "--set lr=abc: lr: 'abc' is not a number" "$small" --set lr=abc --run-dir "$dir/x"
expect 2 "--set nothing=1: no option is named 'nothing'" "$small" --set nothing=1 --run-dir "$dir/x"
expect 2 "--set steps: 'steps' is not NAME=VALUE" "$small" --set steps --run-dir "$dir/x"
echo '{"steps": 0}' >"$dir/bad.json"
expect 2 "--options: $dir/bad.json: steps: 0 is out of range" "$small" --options "$dir/bad.json" --run-dir "$dir/x"
expect 2 "--options: $dir/missing.json: cannot be read" "$small" --options "$dir/missing.json" --run-dir "$dir/x"
expect 2 "--batch: 3 is not a multiple of 2" "$tiny" --set batch=3 --synthetic --run-dir "$dir/x"
# a batch the process's address space cannot hold is refused with the plan, never a crash
out=$( (ulimit -v 3000000; "$tiny" --synthetic --batch 8192 --frames 256 --run-dir "$dir/x") 2>&1)
status=$?
[[ $status -eq 2 && "$out" == *"the memory plan for batch 8192"*"the address-space limit (ulimit -v"*"activations"*"The largest microbatch of 256 frames that fits is"* ]] ||
  fail "an oversized batch under ulimit -v: exit $status: $out"
# frames the model cannot take, and a split with no example long enough, before any data is made
expect 2 "frames: 5000 is more than this configuration's model takes" "$tiny" --synthetic --frames 5000 --run-dir "$dir/x"
expect 2 "allows at most 511 frames; lower frames or raise max_len" "$small" --frames 5000 --run-dir "$dir/x"
expect 2 "none of its 315 examples has the 800 frames a segment of 1000 needs" "$tiny" --frames 1000 --run-dir "$dir/x"
[[ -e "$dir/x" ]] && fail "a refused command line wrote $dir/x"
# a run directory whose checkpoints/ leads elsewhere is refused, and what it leads to is untouched
mkdir -p "$dir/linked" "$dir/elsewhere"
: >"$dir/linked/.etude-run"  # an etude run (its lock file)
echo theirs >"$dir/elsewhere/ckpt-000000002.safetensors"
ln -s "$dir/elsewhere" "$dir/linked/checkpoints"
expect 2 "$dir/linked/checkpoints: a symbolic link (to $dir/elsewhere) where etude keeps its checkpoints" \
  "$tiny" --synthetic --steps 2 --fresh --run-dir "$dir/linked"
[[ "$(ls "$dir/elsewhere")" == "ckpt-000000002.safetensors" && "$(cat "$dir/elsewhere/ckpt-000000002.safetensors")" == theirs ]] ||
  fail "a refused run touched what its checkpoints link leads to: $(ls -l "$dir/elsewhere")"
help=$("$small" --help) || fail "train_small --help exited $?"
[[ "$help" == *"--weight-decay"* && "$help" == *"--set"* && "$help" == *"--config"* ]] || fail "train_small --help: $help"

# precedence: the file, then the flags, then --set
echo '{"steps": 6, "lr": 0.0005, "valid_every": 3}' >"$dir/opts.json"
common=(--frames 16 --checkpoint-every 3 --workers 0)
"$small" --config small_bf16 "${common[@]}" --options "$dir/opts.json" --lr 0.002 --set lr=0.0015 --set batch=4 \
  --run-dir "$dir/small" >"$dir/small.log" 2>&1
status=$?
[[ $status -eq 0 || $status -eq 1 ]] || { fail "train_small exited $status"; cat "$dir/small.log"; }
python3 - "$dir/small/run.json" <<'PY' || fail "train_small's run.json: options or configuration not as resolved"
import json, sys
r = json.load(open(sys.argv[1]))
o = r["options"]
assert o["steps"] == 6 and o["lr"] == 0.0015 and o["batch"] == 4 and o["valid_every"] == 3, o
assert o["warmup_steps"] == 1 and r["configuration"]["hyper"]["lr"] == 0.0015, (o, r["configuration"]["hyper"])
assert r["configuration_name"] == "small_bf16" and r["precision"] == "bf16", r["configuration_name"]
assert len(r["configuration_signature"]) == 16, r.get("configuration_signature")
assert r["configuration"]["config"]["model"]["shape"]["dim"] == 1024, r["configuration"]["config"]["model"]
assert r["status"] == "finished" and r["summary"]["step"] == 6, r["status"]
PY

# the same records as the main job's: run.json's fields, metrics, events, checkpoints
# (run with no OpenMP waiting in its environment, so that etude chooses it: run/threads.hpp)
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$tiny" --synthetic --steps 6 --batch 4 "${common[@]}" --valid-every 3 \
  --samples 0 --run-dir "$dir/tiny" >"$dir/tiny.log" 2>&1
ran $? || { fail "train_tiny --synthetic failed"; cat "$dir/tiny.log"; }
python3 - "$dir/tiny/run.json" "$dir/small/run.json" <<'PY' || fail "train_small's run.json lacks fields train_tiny's has"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert list(a) == list(b), (list(a), list(b))
assert list(a["options"]) == list(b["options"])
assert a["hardware"]["openmp_waiting"].startswith("GOMP_SPINCOUNT=1000 (set by etude"), a["hardware"]
assert b["hardware"]["openmp_waiting"] == "OMP_WAIT_POLICY=passive (the environment's)", b["hardware"]
PY
for f in run.json metrics.jsonl tensorboard checkpoints/latest; do
  [[ -e "$dir/small/$f" ]] || fail "train_small's run directory has no $f"
done
[[ $(grep -c '"split":"train"' "$dir/small/metrics.jsonl") -eq 6 ]] || fail "train_small's metrics.jsonl: not 6 train lines"
"$small" --config small_bf16 "${common[@]}" --options "$dir/opts.json" --set lr=0.003 --set batch=4 \
  --run-dir "$dir/small" >"$dir/small2.log" 2>&1
grep -q "hyper.lr: 0.003 here, 0.0015 in the checkpoint" "$dir/small2.log" ||
  fail "train_small resumed with another learning rate: $(tail -3 "$dir/small2.log")"
# more steps is accepted on resume, and recorded
"$small" --config small_bf16 "${common[@]}" --options "$dir/opts.json" --set lr=0.0015 --set batch=4 --steps 7 \
  --run-dir "$dir/small" >"$dir/small3.log" 2>&1
ran $? || fail "train_small with more steps failed: $(tail -3 "$dir/small3.log")"
grep -q "resuming with a changed option: hyper.total_steps: 7 here, 6 in the checkpoint" "$dir/small3.log" ||
  fail "train_small did not resume with more steps: $(head -3 "$dir/small3.log")"
grep -q '"hyper.total_steps: 7 here, 6 in the checkpoint"' "$dir/small/run.json" ||
  fail "run.json does not record the changed steps"

# --- a shared machine: OpenMP's threads spin briefly unless the environment says otherwise ----------
# libgomp shows what it read at its start (OMP_DISPLAY_ENV): the program starts once with the
# runtime's default, then once more, exec'd by itself, with GOMP_SPINCOUNT=1000; a waiting the
# environment names is kept, and the program starts once.
starts() { grep -c 'OPENMP DISPLAY ENVIRONMENT BEGIN' <<<"$1"; }
out=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_DISPLAY_ENV=verbose "$small" --list 2>&1) || fail "--list exited $?"
[[ $(starts "$out") -eq 2 && "$(grep GOMP_SPINCOUNT <<<"$out" | tail -1)" == *"'1000'"* && "$out" == *"small_bf16"* ]] ||
  fail "with no OpenMP waiting named, the second start does not have GOMP_SPINCOUNT=1000: $out"
out=$(env GOMP_SPINCOUNT=7 OMP_DISPLAY_ENV=verbose "$small" --list 2>&1) || fail "--list exited $?"
[[ $(starts "$out") -eq 1 && "$out" == *"GOMP_SPINCOUNT = '7'"* ]] || fail "GOMP_SPINCOUNT=7 was not kept: $out"
out=$(env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=verbose "$small" --list 2>&1) || fail "--list exited $?"
[[ $(starts "$out") -eq 1 && "$out" == *"OMP_WAIT_POLICY = 'ACTIVE'"* ]] || fail "OMP_WAIT_POLICY=active was not kept: $out"

# --- preemption -----------------------------------------------------------------------------------
# slow storage (--loader-delay-ms) keeps the run in flight long enough to be signalled mid-way
run=(--steps 24 --batch 4 --frames 16 --valid-every 8 --checkpoint-every 8 --samples 0)
"$tiny" "${run[@]}" --run-dir "$dir/straight" >"$dir/straight.log" 2>&1
ran $? || { fail "the straight run failed"; cat "$dir/straight.log"; }
train_lines() {
  local n
  n=$(grep -c '"split":"train"' "$1/metrics.jsonl" 2>/dev/null)
  echo "${n:-0}"
}

signal_after() {  # signal_after DIR LINES SIGNAL... : start a run, send each signal once LINES steps are recorded
  local d=$1 lines=$2
  shift 2
  "$tiny" "${run[@]}" --loader-delay-ms 150 --run-dir "$d" >"$d.log" 2>&1 &
  local pid=$! waited=0
  while [[ $(train_lines "$d") -lt $lines ]] && kill -0 $pid 2>/dev/null && [[ $waited -lt 600 ]]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  for s in "$@"; do
    kill -s "$s" $pid
    sleep 0.05  # two signals of one kind sent at once may arrive as one
  done
  wait $pid
}
signal_after "$dir/preempted" 3 TERM
status=$?
[[ $status -eq 75 ]] || { fail "SIGTERM: exit status $status, want 75"; tail -5 "$dir/preempted.log"; }
step=$(train_lines "$dir/preempted")
grep -q "preempted by SIGTERM at step $step: checkpoint written" "$dir/preempted.log" ||
  fail "SIGTERM: no 'preempted by SIGTERM at step $step' in the log: $(tail -2 "$dir/preempted.log")"
python3 - "$dir/preempted/run.json" "$step" <<'PY' || fail "SIGTERM: run.json does not record the preemption"
import json, sys
r = json.load(open(sys.argv[1]))
step = int(sys.argv[2])
assert r["status"] == "preempted" and r["summary"]["step"] == step, (r["status"], r["summary"])
assert r["checkpoints"][-1].endswith("ckpt-%09d.safetensors" % step), r["checkpoints"]
PY
"$tiny" "${run[@]}" --run-dir "$dir/preempted" >"$dir/resumed.log" 2>&1
ran $? || fail "the resumed run failed: $(tail -3 "$dir/resumed.log")"
grep -q "resuming .* at step $step" "$dir/resumed.log" || fail "the rerun did not resume at step $step"
[[ "$(tail -n 1 "$dir/straight/metrics.jsonl")" == "$(tail -n 1 "$dir/preempted/metrics.jsonl")" ]] ||
  fail "the preempted and resumed run ends elsewhere than the straight one"
python3 - "$dir/straight/checkpoints/ckpt-000000024.safetensors" "$dir/preempted/checkpoints/ckpt-000000024.safetensors" <<'PY' ||
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and len(a) > 10, (len(a), len(b))
diff = [k for k in a if a[k] != b[k]]
assert not diff, diff[:5]
PY
  fail "the final checkpoints' tensors differ between the straight and the preempted run"

# a second signal stops at once; the directory is left resumable
signal_after "$dir/twice" 2 TERM TERM
status=$?
[[ $status -eq 143 ]] || fail "two SIGTERMs: exit status $status, want 143 (killed by the signal)"
"$tiny" "${run[@]}" --stop-after 1 --run-dir "$dir/twice" >"$dir/twice2.log" 2>&1 ||
  fail "after two SIGTERMs the directory does not run again: $(tail -3 "$dir/twice2.log")"

[[ $failed -eq 0 ]] && echo "configurations, overrides, the second model's records and preemption behave"
exit $failed
