# Sourced by the command-line test scripts (example_options.sh, example_session.sh):
#   expect STATUS TEXT PROGRAM ARGS...   the program exits with STATUS and its stderr contains
#                                        TEXT; otherwise says FAILED and why, and sets failed=1
failed=${failed:-0}
expect() {
  local want=$1 text=$2
  shift 2
  local err status
  err=$("$@" 2>&1 >/dev/null)
  status=$?
  if [[ $status -ne $want || "$err" != *"$text"* ]]; then
    echo "FAILED: $* exited $status (want $want) with: $err (want it to contain: $text)"
    failed=1
  fi
}
