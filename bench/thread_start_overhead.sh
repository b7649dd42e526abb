#!/usr/bin/env bash
# What the tracer adds to starting a thread (issue 11: every thread started
# while tracing gets an alternate signal stack through the tracer's
# pthread_create: a mmap, two sigaltstack calls and a munmap per thread). A
# Python loop that starts and joins THREADS threads with an empty target,
# timed inside the program, run
#   untraced   plain python;
#   traced     dynaflow trace --ops off (the tracer loaded and active; nothing
#              else it does runs per thread start);
# alternating, RUNS times each; prints each variant's median microseconds per
# thread and the excess over untraced.
#
#   bench/thread_start_overhead.sh [DYNAFLOW_BIN] [PYTHON]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build/cli/dynaflow}"
PY="${2:-$ROOT/.venv/bin/python}"
RUNS="${RUNS:-7}"
THREADS="${THREADS:-2000}"
PIN=()
command -v taskset >/dev/null && PIN=(taskset -c "$(($(nproc) - 1))")
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

cat >"$TMP/threads.py" <<PY
import threading, time
def nothing():
    pass
best = []
for _ in range(5):  # the best of five passes: the least disturbed by the VM
    t = time.perf_counter()
    for _ in range($THREADS):
        th = threading.Thread(target=nothing)
        th.start()
        th.join()
    best.append((time.perf_counter() - t) / $THREADS * 1e6)
print(f"us_per_thread {min(best):.3f}")
PY
run() {  # run NAME CMD...: appends NAME's microseconds per thread
  local name=$1 us
  shift
  us=$("${PIN[@]}" "$@" 2>/dev/null | awk '/^us_per_thread/ {print $2}')
  echo "$us" >>"$TMP/$name.txt"
}
for _ in $(seq "$RUNS"); do
  run untraced "$PY" "$TMP/threads.py"
  run traced "$BIN" trace -o "$TMP/t.db" --ops off -- "$PY" "$TMP/threads.py"
done
"$PY" - "$TMP" <<'PY'
import statistics, sys
d = sys.argv[1]
med = {}
for name in ("untraced", "traced"):
    vals = [float(v) for v in open(f"{d}/{name}.txt").read().split()]
    med[name] = statistics.median(vals)
    runs = ", ".join(f"{v:.2f}" for v in vals)
    print(f"{name:9s} median {med[name]:.2f} us/thread  (+{med[name] - med['untraced']:.2f})  "
          f"runs: {runs}")
PY
