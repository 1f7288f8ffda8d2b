#!/usr/bin/env bash
# Runs test_dist_mpi_failure under `mpirun --enable-recovery -np 2` (so that mpirun does not kill
# the survivor itself when rank 1 dies) and checks what rank 0 makes of rank 1's death or hang:
# rank 0's exit status is non-zero, it failed within the timeout (plus a margin) with a
# message naming rank 1 and the collective, and the whole job ended in bounded time.
#   usage: mpi_failure.sh <mpirun> <program> kill|hang <timeout seconds>
set -u -o pipefail
mpirun=$1 program=$2 mode=$3 timeout=$4

start=$(date +%s.%N)
# mpirun --enable-recovery exits 0 even where a rank exited non-zero (Open MPI 4.1.4): each rank's
# own exit status is reported by a shell around it.
wrapper='"$0" "$@"; rc=$?; echo "exit status of rank $OMPI_COMM_WORLD_RANK: $rc"; exit $rc'
out=$("$mpirun" --allow-run-as-root --oversubscribe --enable-recovery -np 2 \
        bash -c "$wrapper" "$program" "$mode" "$timeout" 2>&1)
rc=$(sed -n 's/^exit status of rank 0: \([0-9]*\)$/\1/p' <<<"$out")
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
printf '%s\n' "$out"
echo "mpi_failure.sh: mode $mode, rank 0's exit status ${rc:-none}, ${elapsed} s in all"

fail() { echo "FAIL ($mode): $*"; exit 1; }
[[ -n "$rc" ]] || fail "rank 0 did not exit by itself"
[[ $rc -ne 0 ]] || fail "rank 0 exited 0; it should have failed"
line=$(printf '%s\n' "$out" | grep -m1 '^rank 0: failed after') || fail "no failure reported by rank 0"
waited=$(sed -E 's/^rank 0: failed after ([0-9.]+) s:.*/\1/' <<<"$line")
grep -q "rank 0 of 2" <<<"$line" || fail "the message does not name this rank: $line"
grep -q "no data from rank 1\|rank 1 did not take" <<<"$line" || fail "the message does not name rank 1: $line"
grep -q "'gradients step 7 b[01]\(', 'gradients step 7 b[01]\)\?'" <<<"$line" || fail "the message does not name the collective: $line"
grep -q "did not complete in $timeout s" <<<"$line" || fail "the message does not give the timeout: $line"
awk -v w="$waited" -v t="$timeout" 'BEGIN { exit !(w >= t && w < t + 3) }' || fail "rank 0 waited $waited s, timeout $timeout s"
# start-up, the timeout, and for a hang rank 1's own sleep (2 x timeout) and its own timeout
awk -v e="$elapsed" -v t="$timeout" 'BEGIN { exit !(e < 5 * t + 15) }' || fail "the job took $elapsed s"
echo "PASS ($mode): rank 0 failed after $waited s naming rank 1 and the collective"
