#!/usr/bin/env bash
# What the tracer adds per torch operator on the CPU (issue 11, item 6): a
# Python loop of tiny operators (torch.add on a 1-element tensor; each is one
# top-level aten operator) timed inside the program, run
#   untraced        plain python;
#   inactive        dynaflow trace --delay 3600: the tracer loaded, its window
#                   never opens (the recording callback switched off);
#   ops off         dynaflow trace --ops off: GPU activity only, no operators;
#   traced          dynaflow trace: every operator recorded, shapes and all;
#   sampled         dynaflow trace with DYNAFLOW_OPS_SAMPLE=$SAMPLE: one
#                   top-level operator in SAMPLE recorded;
#   sampled_base    as sampled, with the torch extension BASE_EXT (another
#                   build's _dynaflow_torch.so, for an A/B in one run; only
#                   when BASE_EXT is set);
# alternating, RUNS times each; prints each variant's median microseconds per
# operator and its excess over untraced.
#
#   [BASE_EXT=other/_dynaflow_torch.so] bench/tracer_op_overhead.sh [DYNAFLOW_BIN] [PYTHON]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build/cli/dynaflow}"
PY="${2:-$ROOT/.venv/bin/python}"
RUNS="${RUNS:-5}"
OPS="${OPS:-100000}"
SAMPLE="${SAMPLE:-10}"
BASE_EXT="${BASE_EXT:-}"
# One core for every run, where taskset exists: fewer migrations, less noise.
PIN=()
command -v taskset >/dev/null && PIN=(taskset -c "$(($(nproc) - 1))")
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

cat >"$TMP/loop.py" <<PY
import time, torch
torch.set_num_threads(1)
x = torch.ones(1)
for _ in range(5000):
    torch.add(x, 1)
best = []
for _ in range(5):  # the best of five passes: the least disturbed by the VM
    t = time.perf_counter()
    for _ in range($OPS):
        torch.add(x, 1)
    best.append((time.perf_counter() - t) / $OPS * 1e6)
print(f"us_per_op {min(best):.4f}")
PY
run() {  # run NAME CMD...: appends NAME's microseconds per operator
  local name=$1 us
  shift
  us=$("${PIN[@]}" "$@" 2>/dev/null | awk '/^us_per_op/ {print $2}')
  echo "$us" >>"$TMP/$name.txt"
}
for _ in $(seq "$RUNS"); do
  run untraced "$PY" "$TMP/loop.py"
  run inactive "$BIN" trace -o "$TMP/i.db" --delay 3600 -- "$PY" "$TMP/loop.py"
  run ops_off "$BIN" trace -o "$TMP/o.db" --ops off -- "$PY" "$TMP/loop.py"
  run traced "$BIN" trace -o "$TMP/t.db" -- "$PY" "$TMP/loop.py"
  run sampled env DYNAFLOW_OPS_SAMPLE="$SAMPLE" "$BIN" trace -o "$TMP/s.db" -- "$PY" "$TMP/loop.py"
  if [ -n "$BASE_EXT" ]; then
    run sampled_base env DYNAFLOW_OPS_SAMPLE="$SAMPLE" DYNAFLOW_TORCH_EXT="$BASE_EXT" \
      "$BIN" trace -o "$TMP/b.db" -- "$PY" "$TMP/loop.py"
  fi
done
"$PY" - "$TMP" <<'PY'
import statistics, sys
d = sys.argv[1]
med = {}
for name in ("untraced", "inactive", "ops_off", "traced", "sampled", "sampled_base"):
    try:
        vals = [float(v) for v in open(f"{d}/{name}.txt").read().split()]
    except FileNotFoundError:  # sampled_base without BASE_EXT
        continue
    med[name] = statistics.median(vals)
    runs = ", ".join(f"{v:.3f}" for v in vals)
    print(f"{name:12s} median {med[name]:.3f} us/op  (+{med[name] - med['untraced']:.3f})  runs: {runs}")
PY
