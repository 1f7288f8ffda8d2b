#!/usr/bin/env bash
# Crash test: the main job, checkpointing every other step (in the background), is killed with
# SIGKILL again and again and restarted each time: half of the kills at a random moment, half the
# instant a checkpoint's temporary file appears, i.e. inside an asynchronous save. Every restart
# must resume without an error, and the finished run must equal an uninterrupted one:
#   - the final checkpoint's tensors bit-identical,
#   - metrics.jsonl line for line, apart from the wall-clock "seconds",
#   - TensorBoard events holding every step exactly once,
#   - no temporary file left anywhere in the run directory.
#   crash_resume.sh <train_tiny> <scratch dir> [kills (default 20)] [steps (default 240)]
set -uo pipefail
job=$1
dir=$2
kills=${3:-20}
steps=${4:-240}
rm -rf "$dir"
mkdir -p "$dir"
common=(--steps "$steps" --frames 32 --batch 8 --valid-every 120 --checkpoint-every 2)
# a finished run says "done:" (its exit status also says whether it beat the unigram baseline)
"$job" "${common[@]}" --run-dir "$dir/straight" > "$dir/straight.log" 2>&1
grep -q "^done:" "$dir/straight.log" || { echo "the uninterrupted run failed:"; cat "$dir/straight.log"; exit 1; }
RANDOM=20261202
ckpt="$dir/crashed/checkpoints"
killed=0
in_save=0
attempt=0
while [ "$killed" -lt "$kills" ]; do
  attempt=$((attempt + 1))
  [ "$attempt" -gt $((kills * 4)) ] && { echo "could not kill the job $kills times in $attempt attempts"; exit 1; }
  "$job" "${common[@]}" --run-dir "$dir/crashed" > "$dir/run-$attempt.log" 2>&1 &
  pid=$!
  saving=0
  if [ $((attempt % 2)) -eq 0 ]; then
    # the moment a save's temporary exists, after a random start: the kill lands inside the write
    # (or its fsync) of the first, second, ... save of this attempt
    sleep "0.$((RANDOM % 10))"
    for ((i = 0; i < 200000; i++)); do
      if compgen -G "$ckpt/.ckpt-*.tmp.*" > /dev/null; then saving=1; break; fi
      kill -0 "$pid" 2> /dev/null || break
    done
  else
    sleep "$((RANDOM % 2)).$((RANDOM % 10))$((RANDOM % 10))"
  fi
  if kill -9 "$pid" 2> /dev/null; then
    killed=$((killed + 1))
    in_save=$((in_save + saving))
  fi
  wait "$pid" 2> /dev/null
  # (a kill that lands before the shell opened the log leaves none)
  if grep -qs "train_tiny:" "$dir/run-$attempt.log"; then
    echo "attempt $attempt failed instead of resuming:"; cat "$dir/run-$attempt.log"; exit 1
  fi
done
"$job" "${common[@]}" --run-dir "$dir/crashed" > "$dir/final.log" 2>&1
grep -q "^done:" "$dir/final.log" || { echo "the final run failed:"; cat "$dir/final.log"; exit 1; }
resumes=$(grep -ls "resuming" "$dir"/run-*.log "$dir/final.log" | wc -l)
left=$(find "$dir/crashed" -name '.*.tmp.*' | wc -l)
[ "$left" -eq 0 ] || { echo "temporaries left behind:"; find "$dir/crashed" -name '.*.tmp.*'; exit 1; }
/usr/bin/env python3 - "$dir/straight" "$dir/crashed" "$steps" <<'EOF' || exit 1
import json, struct, sys, os

straight, crashed, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])

def tensors(run):
    # the data region of the final checkpoint: every tensor byte (the header holds a wall time)
    with open(os.path.join(run, "checkpoints", "ckpt-%09d.safetensors" % steps), "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    return b[8 + n:]

def metrics(run):
    out = []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            r.pop("seconds", None)
            out.append(r)
    return out

def varint(b, i):
    v = s = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << s; s += 7
        if c < 0x80: return v, i

def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0: v, i = varint(b, i)
        elif w == 1: v = b[i:i + 8]; i += 8
        elif w == 5: v = b[i:i + 4]; i += 4
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else: raise ValueError("wire type %d" % w)
        yield f, v

def train_steps(run):
    # (step, tag) of every scalar in every event file; CRCs are the C++ reader's business
    seen = []
    d = os.path.join(run, "tensorboard")
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            b = f.read()
        i = 0
        while i < len(b):
            n = struct.unpack("<Q", b[i:i + 8])[0]
            event = b[i + 12:i + 12 + n]; i += 16 + n
            step, tags = 0, []
            for f, v in fields(event):
                if f == 2: step = v
                if f == 5:
                    for g, value in fields(v):
                        if g == 1: tags += [t.decode() for h, t in fields(value) if h == 1]
            seen += [(step, t) for t in tags if t == "train/ce"]
    return seen

problems = []
if tensors(straight) != tensors(crashed): problems.append("final weights and optimiser state differ")
a, b = metrics(straight), metrics(crashed)
if a != b:
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    problems.append("metrics.jsonl differs: %d vs %d lines, first difference at line %d" % (len(a), len(b), diff + 1))
ce = train_steps(crashed)
if sorted(ce) != [(s, "train/ce") for s in range(1, steps + 1)]:
    problems.append("TensorBoard train/ce: %d points, %d distinct steps, want each of 1..%d once"
                    % (len(ce), len(set(ce)), steps))
if problems:
    print("\n".join(problems)); sys.exit(1)
print("final tensors bit-identical, %d metrics lines equal, %d TensorBoard steps each once" % (len(b), len(ce)))
EOF
echo "killed $killed times ($in_save inside a save; $resumes restarts resumed from a checkpoint); no temporary left"
