#!/usr/bin/env bash
# `dynaflow export --format perfetto` loses nothing the store keeps: for real
# Kineto traces, import -> export -> import gives the same trace.db rows
# (names resolved, so string ids may differ) and the same `advise --format
# json` timeline numbers; so does a small inline trace with a capture-time
# operator ("Graph capture": 1, operators.in_graph_capture). Exit 77
# (skipped) without ../shared/traces, after the inline trace.
set -u
. "$(dirname "$0")/lib.sh"

traces=${DYNAFLOW_TRACES:-$src/../shared/traces}/kineto

# rows DB: every stored row of the records, in a stable order.
rows() {
  sqlite3 -batch "$1" <<'SQL'
.mode list
SELECT 'device', rank, device, name, sm_count, cc_major, cc_minor, memory_bytes FROM devices
  ORDER BY rank, device;
SELECT 'process', rank, pid, name FROM processes ORDER BY rank, pid;
SELECT 'thread', rank, pid, tid, name FROM threads ORDER BY rank, pid, tid;
SELECT 'gpu', * FROM gpu_activity ORDER BY 2, 3, 4, 5, 6, 7, 8, 10;
SELECT 'kernel', k.start_ns, k.grid_x, k.grid_y, k.grid_z, k.block_x, k.block_y, k.block_z,
       k.registers, k.shared_memory FROM kernels k ORDER BY 2, 3, 4, 5, 6, 7, 8, 9, 10;
SELECT 'memcpy', start_ns, copy_kind, bytes FROM memcpy ORDER BY 2, 3, 4;
SELECT 'api', * FROM api_calls_named ORDER BY 2, 3, 4, 5, 6, 7, 9, 10;
SELECT 'op', * FROM operators_named ORDER BY 2, 3, 4, 5, 6, 8, 14, 9, 10, 11, 12;
SELECT 'range', * FROM ranges_named ORDER BY 2, 3, 4, 5, 6, 7, 8, 10;
SQL
}

# events EXPORT...: an export's lines, sorted, without the commas between events.
events() {
  sed 's/,$//' "$@" | sort
}

# timeline ADVISE_JSON: each device's timeline numbers, one line per device.
timeline() {
  python3 - "$1" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for d in report["devices"]:
    print(d["rank"], d["device"], json.dumps(d["timeline"], sort_keys=True))
PY
}

# roundtrip NAME FILE...: one trace (one file per rank) through the export.
roundtrip() {
  local name=$1
  shift
  local dir=$work/$name
  mkdir -p "$dir"
  for f in "$@"; do
    if [ ! -f "$f" ]; then
      echo "SKIP: $f is missing"
      return
    fi
  done
  expect_code "$name: import" 0 "$bin" import "$@" -o "$dir/a.db" || return
  expect_code "$name: export" 0 "$bin" export "$dir/a.db" --format perfetto \
    -o "$dir/e.json"
  # One rank writes e.json, several write e.rank0.json, e.rank1.json...
  local exported
  exported=$(ls "$dir"/e.json "$dir"/e.rank*.json 2>/dev/null)
  expect_code "$name: import the export" 0 "$bin" import $exported -o "$dir/b.db"
  rows "$dir/a.db" >"$dir/a.rows"
  rows "$dir/b.db" >"$dir/b.rows"
  if cmp -s "$dir/a.rows" "$dir/b.rows"; then
    pass
  else
    fail "$name: store rows differ after the round trip: $(diff "$dir/a.rows" "$dir/b.rows" |
      head -c 800)"
  fi
  # The store keeps what the file carried beyond the analysis (store version
  # 3): exporting the store writes the events that exporting the file writes
  # (in another order: the store groups kernels, copies and memsets).
  expect_code "$name: export the file" 0 "$bin" export "$@" --format perfetto -o "$dir/f.json"
  local from_file
  from_file=$(ls "$dir"/f.json "$dir"/f.rank*.json 2>/dev/null)
  if [ "$(events $exported)" = "$(events $from_file)" ]; then
    pass
  else
    fail "$name: the export of the store differs from the file's: $(diff <(events $exported) \
      <(events $from_file) | head -c 800)"
  fi
  expect_code "$name: advise original" 0 "$bin" advise "$dir/a.db" --format json -o "$dir/a.json"
  expect_code "$name: advise export" 0 "$bin" advise $exported --format json -o "$dir/b.json"
  if [ "$(timeline "$dir/a.json")" = "$(timeline "$dir/b.json")" ] &&
    [ -n "$(timeline "$dir/a.json")" ]; then
    pass
  else
    fail "$name: advise timelines differ: $(timeline "$dir/a.json") vs $(timeline "$dir/b.json")"
  fi
  echo "$name: $(wc -l <"$dir/a.rows") rows equal; $(timeline "$dir/b.json" | head -c 300)"
}

# A CUDA graph captured by aten::mm (its launch ran nothing) and replayed
# under aten::add.
cat >"$work/graph_capture.json" <<'JSON'
{"schemaVersion": 1, "traceEvents": [
 {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
  "args": {"External id": 1, "Graph capture": 1}},
 {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 30, "dur": 5,
  "args": {"External id": 2}},
 {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 32, "dur": 20,
  "args": {"device": 0, "stream": 7, "correlation": 5, "External id": 1}}
]}
JSON
roundtrip graph_capture "$work/graph_capture.json"
for db in a b; do
  flagged=$(sqlite3 -batch "$work/graph_capture/$db.db" \
    "SELECT group_concat(name || '=' || in_graph_capture) FROM
       (SELECT name, in_graph_capture FROM operators_named ORDER BY start_ns)")
  if [ "$flagged" = "aten::mm=1,aten::add=0" ]; then
    pass
  else
    fail "graph_capture: $db.db operators: $flagged"
  fi
done

if [ ! -d "$traces" ]; then
  echo "SKIP: $traces is missing (../shared/traces)"
  skipped="$traces is missing (../shared/traces)"
  finish
  exit
fi

roundtrip nccl_2ranks "$traces/hta_a100_nccl_2ranks.json.gz"
roundtrip event_sync "$traces/hta_event_sync_multi_stream.json.gz"
roundtrip b200_eager "$traces/tracelens_b200_eager.json.gz"
roundtrip sampled_ranks "$traces/hta_sampled_rank-0.json.gz" "$traces/hta_sampled_rank-1.json.gz"
roundtrip legacy_resnet "$traces/kineto_legacy_v100_resnet50.json.gz"
roundtrip mi250 "$traces/hta_mi250_minitoy.json.gz"
roundtrip v100_ns "$traces/hta_v100_ns_resolution_rank0.json.gz"

finish
