#!/usr/bin/env bash
# Grids and --repeat through train_small's command line (examples/grid_cli.hpp on
# etude/run/grid.hpp):
#   - a grid file of 3 short runs sweeping lr gives 3 run directories, grid.json, summary.md and
#     summary.csv, and valid_ce.png (decoded by tests/check_grid_plot.py: size, each run's colour);
#     each run.json names the grid as its parent and the other two as its comparison runs;
#   - run again, nothing retrains (finished runs are skipped, their records untouched);
#   - --grid-commands prints one command per run and writes a Slurm array script; --grid-run past
#     the end and a bad value in the file are refused naming the index, the file, field and value;
#   - --repeat 2 over seeds, interrupted after the first run's 3rd step (exit 0, the second not
#     started), then resumed: the first run resumes from its checkpoint, and grid.json and
#     summary.md report the final validation ce's mean, spread, min and max over the two seeds.
#   tests/example_grid.sh TRAIN_SMALL DIR [plot|no-plot]   (no-plot: a build without libpng)
set -uo pipefail
small=$1
dir=$2
plot=${3:-plot}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dir"
mkdir -p "$dir"
. "$here/checks.sh"
short=(--steps 4 --frames 16 --batch 4 --workers 0 --valid-every 2 --checkpoint-every 2)

cat >"$dir/lr.json" <<'JSON'
{"name": "lr", "base": {"config": "small"}, "sweep": {"lr": [1e-3, 3e-3, 1e-2]}}
JSON
g=$dir/grid
"$small" --grid "$dir/lr.json" "${short[@]}" --run-dir "$g" >"$dir/grid.log" 2>&1
ran $? || fail "the grid failed: $(tail -5 "$dir/grid.log")"
for run in lr=0.001 lr=0.003 lr=0.01; do
  [[ -f "$g/$run/run.json" && -f "$g/$run/metrics.jsonl" ]] || fail "no run directory $g/$run"
done
for f in grid.json summary.md summary.csv; do [[ -s "$g/$f" ]] || fail "no $g/$f"; done
python3 - "$g" <<'PY' || fail "the grid's records"
import csv, json, os, sys
g = sys.argv[1]
grid = json.load(open(os.path.join(g, "grid.json")))
names = ["lr=0.001", "lr=0.003", "lr=0.01"]
assert [r["name"] for r in grid["runs"]] == names, grid["runs"]
assert all(r["status"] == "finished" for r in grid["runs"]), grid["runs"]
rows = list(csv.DictReader(open(os.path.join(g, "summary.csv"))))
assert [r["run"] for r in rows] == names, rows
for i, name in enumerate(names):
    record = json.load(open(os.path.join(g, name, "run.json")))
    assert record["status"] == "finished" and record["configuration_name"] == "small", record["status"]
    parent = record["parent_run"]
    assert parent["grid"] == "lr" and parent["swept"] == {"lr": [1e-3, 3e-3, 1e-2][i]}, parent
    assert sorted(parent["comparison_runs"]) == sorted(os.path.join(g, n) for n in names if n != name), parent
    assert abs(float(rows[i]["valid_ce"]) - record["summary"]["valid"]["ce"]) < 1e-5, (rows[i], record["summary"])
    assert float(rows[i]["tokens_per_second"]) > 0 and int(rows[i]["peak_allocated_bytes"]) > 0, rows[i]
    assert f"| {i} | {name} |" in open(os.path.join(g, "summary.md")).read()
PY
if [[ $plot == plot ]]; then
  python3 "$here/check_grid_plot.py" "$g/valid_ce.png" 3 || fail "the grid's plot"
  ETUDE_CHECK_PLOT_BY_HAND=1 python3 "$here/check_grid_plot.py" "$g/valid_ce.png" 3 || fail "the grid's plot, decoded by hand"
fi

# run again: every run is skipped and its files are left as they were
before=$(cd "$g" && sha256sum */run.json */metrics.jsonl)
"$small" --grid "$dir/lr.json" "${short[@]}" --run-dir "$g" >"$dir/again.log" 2>&1
ran $? || fail "the grid run again failed: $(tail -5 "$dir/again.log")"
[[ $(grep -c "finished before: skipped" "$dir/again.log") -eq 3 ]] || fail "run again, not every run was skipped"
grep -q "^step " "$dir/again.log" && fail "run again, the grid trained"
[[ "$(cd "$g" && sha256sum */run.json */metrics.jsonl)" == "$before" ]] || fail "run again, the runs' records changed"

# commands for a scheduler
cmds=$("$small" --grid "$dir/lr.json" "${short[@]}" --run-dir "$g" --grid-commands 2>/dev/null)
[[ $(wc -l <<<"$cmds") -eq 3 ]] || fail "--grid-commands printed: $cmds"
[[ "$(sed -n 3p <<<"$cmds")" == *"--grid $dir/lr.json"*"--grid-run 2" ]] || fail "--grid-commands' third: $cmds"
grep -q -- "--array=0-2" "$g/slurm_array.sh" && grep -q 'SLURM_ARRAY_TASK_ID' "$g/slurm_array.sh" ||
  fail "slurm_array.sh: $(cat "$g/slurm_array.sh")"
# a printed command runs its run (here: finished, so skipped)
out=$(eval "$(sed -n 2p <<<"$cmds")" 2>&1) || ran $? || fail "the second command failed: $out"
[[ "$out" == *"run 1 (lr=0.003) finished before: skipped"* ]] || fail "the second command: $out"
expect 2 "grid-run: 3 is not a run of grid 'lr'" "$small" --grid "$dir/lr.json" --run-dir "$g" --grid-run 3
expect 2 "--grid-commands needs --grid FILE or --repeat N" "$small" --grid-commands --run-dir "$dir/none"
expect 2 "--grid and --repeat: give one of them" "$small" --grid "$dir/lr.json" --repeat 2 --run-dir "$dir/none"
[[ -e "$dir/none" ]] && fail "a refused command line wrote $dir/none"
echo '{"name": "bad", "sweep": {"lr": [1e-3, "fast"]}}' >"$dir/bad.json"
expect 2 "$dir/bad.json: sweep.lr: value \"fast\"" "$small" --grid "$dir/bad.json" --run-dir "$dir/bad"
[[ -e "$dir/bad" ]] && fail "a refused grid wrote $dir/bad"

# --repeat 2: interrupted in its first run, then resumed
r=$dir/repeat
"$small" --repeat 2 --seed 5 "${short[@]}" --set stop_after=3 --run-dir "$r" >"$dir/repeat1.log" 2>&1 ||
  fail "--repeat 2 with stop_after exited $?: $(tail -5 "$dir/repeat1.log")"
[[ -f "$r/seed=5/run.json" && ! -e "$r/seed=6/run.json" ]] || fail "--repeat stopped: $(ls "$r")"
"$small" --repeat 2 --seed 5 "${short[@]}" --run-dir "$r" >"$dir/repeat2.log" 2>&1
ran $? || fail "--repeat 2 resumed: $(tail -5 "$dir/repeat2.log")"
grep -q "resuming .*seed=5 at step 3" "$dir/repeat2.log" || fail "--repeat did not resume seed=5 at step 3"
python3 - "$r" <<'PY' || fail "--repeat's spread over seeds"
import json, math, os, sys
r = sys.argv[1]
grid = json.load(open(os.path.join(r, "grid.json")))
ce = [json.load(open(os.path.join(r, f"seed={s}", "run.json")))["summary"]["valid"]["ce"] for s in (5, 6)]
spread = grid["over_seeds"][0]
mean = sum(ce) / 2
std = math.sqrt(sum((c - mean) ** 2 for c in ce))  # n - 1 = 1
assert spread["runs"] == ["seed=5", "seed=6"], spread
assert abs(spread["mean"] - mean) < 1e-9 and abs(spread["stddev"] - std) < 1e-9, (spread, mean, std)
assert spread["min"] == min(ce) and spread["max"] == max(ce), spread
md = open(os.path.join(r, "summary.md")).read()
assert f"| - | 2 | {mean:.4f} | {std:.4f} | {min(ce):.4f} | {max(ce):.4f} |" in md, md
PY

[[ $failed -eq 0 ]] && echo "grids: 3 runs, their records, summary and plot; reruns skip; commands; --repeat's spread"
exit $failed
