#!/usr/bin/env bash
# The example programs' command lines: a bad number is named with what is wrong (never a bare
# "stol", never silently truncated or saturated), a usage error exits with the program's usage
# status, and --help prints the options and exits 0.
#   example_options.sh <train_tiny> [<will_it_fit>]
set -uo pipefail
train=$1
fit=${2:-}
failed=0
. "$(dirname "$0")/checks.sh"
expect 2 "train_tiny: --steps: 'abc' is not an integer" "$train" --steps abc
expect 2 "--steps: 0 is out of range: the least allowed is 1" "$train" --steps 0
expect 2 "--steps: 99999999999999999999 is out of range" "$train" --steps 99999999999999999999
expect 2 "--batch: 3 is not a multiple of 2" "$train" --batch 3
expect 2 "--frames: '32.5' is not an integer" "$train" --frames 32.5
expect 2 "--lr: -1 is out of range" "$train" --lr -1
expect 2 "--lr: inf is not a finite number" "$train" --lr inf
expect 2 "--stop-after: -1 is out of range" "$train" --stop-after -1
expect 2 "--workers: 100000 is out of range" "$train" --workers 100000
expect 2 "--seed: -1 is out of range" "$train" --seed -1
expect 2 "--device: 'gpu': use cpu or cuda" "$train" --device gpu
expect 2 "--steps: 1 required INT missing" "$train" --steps
expect 2 "not expected: --bogus" "$train" --bogus
expect 2 "--diagnostics-every: -1 is out of range" "$train" --diagnostics-every -1
expect 2 "--dead-after: 0 is out of range" "$train" --dead-after 0
expect 2 "--trace-steps: '5-3' is not a step N or a range N-M" "$train" --trace-steps 5-3
expect 2 "--trace-steps: 'x' is not a step N" "$train" --trace-steps x
expect 2 "--stall-warning-ms: 0 is out of range" "$train" --stall-warning-ms 0
expect 2 "--loader-delay-ms: -1 is out of range" "$train" --loader-delay-ms -1
expect 2 "plant_nan: 'out_norm.weight:1:0': out_norm.weight is 1 x" "$train" --synthetic --steps 4 --plant-nan out_norm.weight:1:0 --run-dir "$(mktemp -d)/run"
expect 2 "plant_nan: 'nothing:0:0': no weight is named nothing" "$train" --synthetic --steps 4 --plant-nan nothing:0:0 --run-dir "$(mktemp -d)/run"
# --diagnostics-every on synthetic tokens, whose conditions are all null: the condition tables are
# reported dead in run.json, and the group scalars reach metrics.jsonl (4 small steps, about a second)
diag_dir=$(mktemp -d)
# (its exit status says whether 4 steps beat the unigram baseline: not asked here)
"$train" --synthetic --steps 4 --batch 4 --frames 16 --valid-every 4 --checkpoint-every 4 --samples 0 \
  --diagnostics-every 2 --dead-after 2 --run-dir "$diag_dir/run" >"$diag_dir/out" 2>&1
grep -q 'step 4: condition_provider.conditioners.key.embed.weight: gradient exactly zero for 2 consecutive' \
  "$diag_dir/run/run.json" 2>/dev/null ||
  { echo "FAILED: --diagnostics-every: no dead-parameter warning for the key table in run.json"; failed=1; }
[[ "$(grep -c '"grad/heads/norm"' "$diag_dir/run/metrics.jsonl" 2>/dev/null)" -eq 2 ]] ||
  { echo "FAILED: --diagnostics-every 2: grad/heads/norm not on steps 2 and 4 of metrics.jsonl"; failed=1; }
# the data diagnostics of the same steps: the delay pattern never predicts the last codebook's first
# 3 of 16 frames, and synthetic batches have no padding
python3 - "$diag_dir/run/metrics.jsonl" <<'PY' || { echo "FAILED: --diagnostics-every 2: data/ scalars"; failed=1; }
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "data/pattern_masked_q3" in r]
assert [r["step"] for r in rows] == [2, 4], rows
for r in rows:
    assert r["data/pattern_masked_q3"] == 3 / 16 and r["data/pad_q3"] == 0 and r["data/empty"] == 0, r
PY
# the activation statistics of the same steps, and a trace of steps 3-4 that Chrome's format accepts
python3 - "$diag_dir/run/metrics.jsonl" <<'PY' || { echo "FAILED: --diagnostics-every 2: act/ and attn/ scalars"; failed=1; }
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "act/layer0/ffn_act/rms" in r]
assert [r["step"] for r in rows] == [2, 4], rows
for r in rows:
    assert r["act/model/lnf/non_finite"] == 0 and 0 < r["attn/layer0/head0/relative_entropy"] <= 1, r
PY
"$train" --synthetic --steps 4 --batch 4 --frames 16 --samples 0 --trace-steps 3-4 --run-dir "$diag_dir/trace" \
  >"$diag_dir/out" 2>&1
python3 - "$diag_dir/trace/trace.json" <<'PY' || { echo "FAILED: --trace-steps 3-4: trace.json"; failed=1; }
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
steps = [e["args"]["step"] for e in events if e.get("cat") == "steps"]
assert steps == [3, 4], steps
assert sum(1 for e in events if e["ph"] == "X" and e.get("cat") == "forward") > 40
assert sum(1 for e in events if e["ph"] == "C") == 4
PY
# a planted NaN is named as the op that read it, and the run stops with status 2 (an etude error)
"$train" --synthetic --steps 4 --batch 4 --frames 16 --samples 0 --run-dir "$diag_dir/nan" \
  --plant-nan transformer.layers.2.linear1.weight:5:7 >"$diag_dir/out" 2>&1
status=$?
grep -q "layer 2 ffn_up (forward) wrote nan into ffn_pre.*linear1.weight, which holds nan at row 5, column 7" \
  "$diag_dir/out" && [[ $status -eq 2 ]] ||
  { echo "FAILED: --plant-nan: status $status, $(tail -1 "$diag_dir/out")"; failed=1; }
rm -rf "$diag_dir"
help=$("$train" --help) || { echo "FAILED: train_tiny --help exited $?"; failed=1; }
[[ "$help" == *"--checkpoint-every"* && "$help" == *"--run-dir"* ]] || { echo "FAILED: train_tiny --help: $help"; failed=1; }
if [[ -n "$fit" ]]; then
  expect 2 "will_it_fit: --seconds: 'abc' is not a number" "$fit" --seconds abc
  expect 2 "--world-size: 0 is out of range" "$fit" --world-size 0
  expect 2 "--memory: '99999999999999999999' is neither" "$fit" --memory 99999999999999999999
  expect 2 "--hop: -1 is out of range" "$fit" --hop -1
  "$fit" --help | grep -q -- "--global-batch" || { echo "FAILED: will_it_fit --help"; failed=1; }
fi
[[ $failed -eq 0 ]] && echo "every bad option was named and refused"
exit $failed
