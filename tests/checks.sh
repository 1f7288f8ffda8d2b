# Sourced by the command-line test scripts (example_options.sh, example_session.sh, example_grid.sh):
#   fail MESSAGE                         says FAILED: MESSAGE and sets failed=1
#   ran STATUS                           true for 0 or 1 (a short run may end above the unigram
#                                        baseline, which the main job reports as 1)
#   expect STATUS TEXT PROGRAM ARGS...   the program exits with STATUS and its stderr contains
#                                        TEXT; otherwise fails, saying what it got
failed=${failed:-0}
fail() {
  echo "FAILED: $*"
  failed=1
}
ran() { [[ $1 -eq 0 || $1 -eq 1 ]]; }
expect() {
  local want=$1 text=$2
  shift 2
  local err status
  err=$("$@" 2>&1 >/dev/null)
  status=$?
  [[ $status -eq $want && "$err" == *"$text"* ]] ||
    fail "$* exited $status (want $want) with: $err (want it to contain: $text)"
}
