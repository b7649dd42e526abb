# Helpers of the end-to-end test scripts, sourced right after `set -u`. Takes
# DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both) as $bin and $src, makes
# $work, a scratch directory removed at exit; failures and passes count the
# checks.
bin=${DYNAFLOW_BIN:?}
src=${DYNAFLOW_SOURCE_DIR:?}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failures=0
passes=0
# Set when checks were left out (e.g. ../shared/traces absent): finish then
# exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), not passed.
skipped=""

pass() { passes=$((passes + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

check() {  # check NAME COMMAND... : the command must succeed
  local name=$1
  shift
  if "$@"; then pass; else fail "$name"; fi
}

# expect_code NAME CODE CMD...: runs CMD (stdout to $work/out, stderr to
# $work/err) and compares its exit code.
expect_code() {
  local name=$1 want=$2
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: exit $got, want $want; stderr: $(head -c 600 "$work/err")"
  else
    pass
  fi
}

# has FILE TEXT: FILE contains every line of TEXT (fixed strings). Line by
# line because grep -F takes a many-line pattern as alternatives, any of
# which would do. An empty TEXT fails: it is a lost expectation, not one met.
has() {
  _holds -F "$@"
}

# has_lines FILE TEXT: every line of TEXT is a whole line of FILE, for
# comparing a run's output with a base run's (a substring would let a
# truncated or prefixed number pass).
has_lines() {
  _holds -xF "$@"
}

_holds() {
  local flags=$1 line
  [ -n "$3" ] || return 1
  while IFS= read -r line; do
    grep -q "$flags" -- "$line" "$2" || return 1
  done <<<"$3"
}

# finish: the summary line and the script's exit code.
finish() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ] || return 1
  if [ -n "$skipped" ]; then
    echo "SKIPPED: $skipped"
    exit 77
  fi
}
