#!/usr/bin/env bash
# Replay accuracy (issue 10, item 7): `dynaflow advise --format json` on every real trace in
# ../shared/traces; prints each trace's replay error (simulation.replay_error_pct: the
# simulator's replay of the measured representative step from its dependency graph, against
# the measured step), or why there is none, then the median and maximum of |error| over the
# traces that have one; and the same for simulation.replay_error_without_gaps_pct, the replay
# without the measured GPU-side gaps (step_graph.h `delay_us`): what the dependency graph and
# the host explain alone. The figures are deterministic; docs/performance.md records them.
#
#   bench/replay_accuracy.sh [DYNAFLOW_BIN] [TRACES_DIR]
#     DYNAFLOW_BIN  default build/cli/dynaflow (build it first: cmake --build build --target dynaflow)
#     TRACES_DIR    default ../shared/traces beside the checkout
# Exit code: 0, or 1 when the binary or the traces are missing, or a trace fails to advise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${1:-$ROOT/build/cli/dynaflow}"
TRACES="${2:-$ROOT/../shared/traces}"
[[ -x "$BIN" ]] || { echo "replay_accuracy: no dynaflow binary at $BIN" >&2; exit 1; }
[[ -d "$TRACES" ]] || { echo "replay_accuracy: no traces at $TRACES" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
status=0
: > "$TMP/list"
while IFS= read -r f; do
  name="${f#"$TRACES"/}"
  out="$TMP/$(echo "$name" | tr '/' '_').json"
  if "$BIN" advise "$f" --format json -o "$out" 2> "$TMP/err"; then
    printf '%s\t%s\n' "$name" "$out" >> "$TMP/list"
  else
    printf '%s\tFAILED: %s\n' "$name" "$(head -c 200 "$TMP/err")" >> "$TMP/list"
    status=1
  fi
done < <(find "$TRACES" -type f \( -name '*.json.gz' -o -name '*.json' -o -name '*.sqlite' \) | sort)

python3 - "$TMP/list" <<'PY'
import json, statistics, sys
rows, errs, bare = [], [], []
for line in open(sys.argv[1]):
    name, out = line.rstrip("\n").split("\t", 1)
    if out.startswith("FAILED"):
        rows.append((name, out)); continue
    j = json.load(open(out))
    sim = j.get("simulation")
    if not j.get("devices"):
        rows.append((name, "none: no GPU activity, no step to simulate"))
    elif sim is None:
        rows.append((name, "none: no step to simulate"))
    elif sim.get("replay_unfinished"):
        rows.append((name, "none: replay did not finish: " + sim["replay_unfinished"]))
    else:
        e = sim["replay_error_pct"]
        b = sim.get("replay_error_without_gaps_pct")
        errs.append(abs(e))
        if b is not None: bare.append(abs(b))
        rows.append((name, "%+9.4f%%   %s   (%d kernels, rank %d device %d)" % (
            e, "%+9.4f%%" % b if b is not None else "     n/a ", sim["kernels_per_step"], sim["rank"], sim["device"])))
w = max(len(n) for n, _ in rows)
print("%-*s  replay error   without GPU gaps   (simulated - measured) / measured step" % (w, "trace"))
for n, v in rows:
    print("%-*s  %s" % (w, n, v))
if errs:
    print("traces with a replay: %d of %d; |error| median %.4f%%, max %.4f%% (targets: median <= 3%%, max <= 10%%)"
          % (len(errs), len(rows), statistics.median(errs), max(errs)))
if bare:
    print("without the measured GPU-side gaps: |error| median %.4f%%, max %.4f%%"
          % (statistics.median(bare), max(bare)))
PY
exit $status
