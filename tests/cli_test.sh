#!/usr/bin/env bash
# End-to-end tests of the dynaflow command: exit codes, outputs, bad input.
# Needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both).
set -u
. "$(dirname "$0")/lib.sh"
shared="$src/../shared/traces"
[ -d "$shared" ] || skipped="$shared absent: the real-trace checks did not run"

json_get() {  # json_get FILE PYTHON_EXPR(j) -> prints the value
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}

# --- help and usage errors
expect_code "help" 0 "$bin" --help
check "help lists verbs" grep -q "advise" "$work/out"
expect_code "advise help" 0 "$bin" advise --help
check "advise help lists formats" grep -q "html" "$work/out"
for verb in trace import info advise apply export; do
  expect_code "$verb help" 0 "$bin" "$verb" --help
  check "$verb help has a worked example" grep -q "^  dynaflow $verb " "$work/out"
done
expect_code "no verb" 2 "$bin"
check "no verb prints the help" has "$work/err" "Subcommands:"
expect_code "unknown verb" 2 "$bin" adivse trace.json
check "unknown verb named, with the verbs" \
  has "$work/err" "dynaflow: unknown command 'adivse'; the commands are import, info, advise"
expect_code "unknown option" 2 "$bin" advise --no-such-flag x
expect_code "bad format" 2 "$bin" advise --format xml "$src/README.md"
expect_code "negative delay" 2 "$bin" trace --delay -1 -- true
check "negative delay explained" has "$work/err" "--delay: must be a number >= 0, not -1"
expect_code "negative top" 2 "$bin" advise --top -1 "$src/README.md"
check "negative top explained" has "$work/err" "--top: must be a number >= 0, not -1"
expect_code "zero duration" 2 "$bin" trace --duration 0 -- true
check "zero duration explained" has "$work/err" "--duration: must be a number > 0, not 0"

# --- bad input: exit 2, one line on stderr, no output file
printf '' >"$work/empty.json"
printf '{"model": "llama"}' >"$work/config.json"
printf 'garbage\x00\x01' >"$work/garbage.bin"
sqlite3 "$work/other.sqlite" 'CREATE TABLE users(id INTEGER);'
bad_inputs=("$work/empty.json" "$work/config.json" "$work/garbage.bin" "$work/other.sqlite"
            "$work/missing.json" "$work")
if [ -d "$shared" ]; then
  head -c 10000 "$shared/kineto/hta_a100_alexnet.json.gz" >"$work/truncated.json.gz"
  bad_inputs+=("$work/truncated.json.gz")
fi
for bad in "${bad_inputs[@]}"; do
  name=$(basename "$bad")
  expect_code "advise $name" 2 "$bin" advise "$bad" -o "$work/report.txt"
  check "advise $name: one line on stderr" test "$(wc -l <"$work/err")" -eq 1
  check "advise $name: no partial report" test ! -e "$work/report.txt"
  expect_code "import $name" 2 "$bin" import "$bad" -o "$work/bad.db"
  check "import $name: no partial trace.db" test ! -e "$work/bad.db"
  check "import $name: no temporary file" test -z "$(find "$work" -maxdepth 1 -name 'bad.db.tmp-*')"
  expect_code "info $name" 2 "$bin" info "$bad"
done

# --- the examples the project ships
for example in "$src"/examples/traces/*.json.gz; do
  [ -e "$example" ] || continue
  expect_code "advise $(basename "$example")" 0 "$bin" advise "$example"
  check "example report has a timeline" grep -q "GPU timeline" "$work/out"
done

# --- real traces: formats, import round trip, info
if [ -d "$shared" ]; then
  bert="$shared/kineto/tracelens_mi300_bert_small.json.gz"
  expect_code "advise json" 0 "$bin" advise "$bert" --format json -o "$work/bert.json"
  check "json schema" test "$(json_get "$work/bert.json" 'j["schema"]')" = "dynaflow.report/1"
  check "json one device" test "$(json_get "$work/bert.json" 'len(j["devices"])')" = 1
  check "json total matches TraceLens" python3 -c "
import json,sys
t=json.load(open(sys.argv[1]))['devices'][0]['timeline']
assert abs(t['total_us']/1000 - 3.49597607421875) < 1e-6, t" "$work/bert.json"

  # Outputs that are devices are written in place, never replaced by a file.
  expect_code "advise to /dev/null" 0 "$bin" advise "$bert" -o /dev/null
  check "/dev/null is still a device" test -c /dev/null
  expect_code "import to /dev/null" 2 "$bin" import "$bert" -o /dev/null
  check "/dev/null is still a device after import" test -c /dev/null

  expect_code "advise html" 0 "$bin" advise "$bert" --format html -o "$work/bert.html"
  check "html page" grep -q "<svg" "$work/bert.html"

  expect_code "import two ranks" 0 "$bin" import "$shared/kineto/hta_sampled_rank-0.json.gz" \
    "$shared/kineto/hta_sampled_rank-1.json.gz" -o "$work/ranks.db"
  check "trace.db queryable" test "$(sqlite3 "$work/ranks.db" \
    "SELECT count(DISTINCT rank) FROM gpu_activity")" = 2
  check "trace.db kernel count" test "$(sqlite3 "$work/ranks.db" \
    "SELECT count(*) FROM kernels")" -gt 2000
  expect_code "info trace.db" 0 "$bin" info "$work/ranks.db"
  check "info lists both ranks" grep -q "rank 1 device 1" "$work/out"
  expect_code "advise trace.db" 0 "$bin" advise "$work/ranks.db" --format json -o "$work/db.json"
  expect_code "advise originals" 0 "$bin" advise "$shared/kineto/hta_sampled_rank-0.json.gz" \
    "$shared/kineto/hta_sampled_rank-1.json.gz" --format json -o "$work/orig.json"
  check "trace.db gives the same devices" python3 -c "
import json,sys
a=json.load(open(sys.argv[1]))['devices']; b=json.load(open(sys.argv[2]))['devices']
assert [d['timeline'] for d in a] == [d['timeline'] for d in b]" "$work/db.json" "$work/orig.json"

  expect_code "nsys info" 0 "$bin" info "$shared/nsys/nsysai_mock_rtx3080.sqlite"
  check "nsys device name" grep -q "RTX 3080" "$work/out"
  expect_code "cpu-only trace" 0 "$bin" advise "$shared/kineto/hta_cpu_only.json.gz"
  check "cpu-only says so" grep -q "No GPU activity" "$work/out"
fi

# --- outputs that cannot be written: the path and the reason
ex="$src/examples/traces/llama_tp2_rank0.json.gz"
# advise checks its outputs before the work: bad input, exit 2, one line, no report.
expect_code "advise into a missing directory" 2 "$bin" advise "$ex" -o "$work/no/r.txt"
check "advise says why" has "$work/err" "$work/no/r.txt: cannot write: No such file or directory"
expect_code "advise --plan into a missing directory" 2 "$bin" advise "$ex" --plan "$work/no/p.json"
check "advise --plan says why" has "$work/err" "$work/no/p.json: cannot write: No such file or directory"
check "advise --plan: one line" test "$(wc -l <"$work/err")" -eq 1
check "advise --plan: no report printed" test ! -s "$work/out"
expect_code "advise -o a directory" 2 "$bin" advise "$ex" -o "$work"
check "advise -o a directory says so" has "$work/err" "$work: cannot write: is a directory"
expect_code "advise -o /dev/null" 0 "$bin" advise "$ex" -o /dev/null
expect_code "export into a missing directory" 1 "$bin" export "$ex" --format perfetto \
  -o "$work/no/t.json"
check "export says why" has "$work/err" "$work/no/t.json: cannot write: No such file or directory"
expect_code "import into a missing directory" 1 "$bin" import "$ex" -o "$work/no/t.db"
check "import names the store" has "$work/err" "$work/no/t.db: cannot create trace store"

# --- info --format json: one object with the text's facts
expect_code "info --format json" 0 "$bin" info --format json "$ex"
check "info json: devices, counts, span" python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert j['schema'] == 'dynaflow.info/1' and j['format'] == 'kineto', j
assert j['devices'] == [{'rank': 0, 'device': 0, 'name': 'NVIDIA H200', 'sm_count': 132,
                         'compute_capability': '9.0', 'memory_bytes': 150754820096}], j['devices']
assert j['counts']['kernels'] == 954 and j['counts']['memcpy'] == 15, j['counts']
assert abs(j['time_span_us'] - 239455.13) < 0.01, j['time_span_us']
assert {'name': 'kineto_flow_events', 'severity': 'info', 'count': 2184} in j['import_stats']
" "$work/out"
expect_code "info --format xml" 2 "$bin" info --format xml "$ex"

# --- "-" reads the trace from standard input (any format; spooled, then removed)
expect_code "info from stdin" 0 "$bin" info - <"$ex"
check "stdin: same counts" has "$work/out" "kernels:    954"
expect_code "advise from stdin" 0 "$bin" advise --format json - <"$ex"
expect_code "advise from a file" 0 "$bin" advise --format json "$ex"
cp "$work/out" "$work/from_file.json"
"$bin" advise --format json - <"$ex" >"$work/from_stdin.json" 2>/dev/null
check "stdin: the same devices as the file" python3 -c "
import json, sys
a, b = (json.load(open(p))['devices'] for p in sys.argv[1:])
assert a == b" "$work/from_file.json" "$work/from_stdin.json"
expect_code "import from stdin" 0 "$bin" import - -o "$work/stdin.db" <"$ex"
expect_code "stdin twice" 2 "$bin" advise - - <"$ex"
check "stdin twice says so" has "$work/err" "standard input given twice"
expect_code "junk on stdin" 2 "$bin" info - <<<"junk"
check "junk on stdin is named -" has "$work/err" "dynaflow: -: not a trace"

# --- progress on a terminal names the file and the phase (script(1) gives a
# terminal); none when stderr is not one
if command -v script >/dev/null 2>&1; then
  script -qec "'$bin' advise '$ex' -o /dev/null" /dev/null >"$work/tty" 2>&1
  check "progress names the file" has "$work/tty" "importing llama_tp2_rank0.json.gz: "
  check "progress names the phases" has "$work/tty" "simulating the candidate schedules..."
  expect_code "no progress off a terminal" 0 "$bin" advise "$ex" -o /dev/null
  check "stderr stays empty" test ! -s "$work/err"
else
  echo "cli_test: script(1) absent: progress not checked"
fi

# --- an event longer than 64 MiB (a huge string in a .gz) is refused with one
# line and exit 2 instead of exhausting memory
{ printf '{"traceEvents": [{"ph": "X", "name": "'; head -c 70000000 /dev/zero | tr '\0' x
  printf '"}]}'; } | gzip -1 >"$work/huge_string.json.gz"
expect_code "huge string" 2 "$bin" info "$work/huge_string.json.gz"
check "huge string says why" has "$work/err" "is longer than 64 MiB: refused, to bound memory"
check "huge string: one line" test "$(wc -l <"$work/err")" -eq 1
# ... a top-level value past 64 MiB is skipped, and import says so
{ printf '{"distributedInfo": {"backend": "'; head -c 70000000 /dev/zero | tr '\0' x
  printf '"}, "traceEvents": []}'; } | gzip -1 >"$work/huge_value.json.gz"
expect_code "huge top-level value" 0 "$bin" import "$work/huge_value.json.gz" -o "$work/hv.db"
check "huge top-level value: the loss is said" has "$work/err" \
  "dynaflow: warning: data lost on import: kineto_oversized_top_level_value 1"

# --- a parts folder (what a dead `dynaflow trace` leaves: one store per
# process) is read like the trace it would have written; two processes that
# recorded GPU work as one rank are warned about.
mkdir "$work/parts"
expect_code "a part" 0 "$bin" import "$ex" -o "$work/parts/100.db"
cp "$work/parts/100.db" "$work/parts/200.db"
expect_code "info of a parts folder" 0 "$bin" info --format json "$work/parts"
check "parts: recovered" has "$work/err" "dynaflow: recovered 2 process stores from"
check "parts: one rank, two GPU processes" has "$work/err" \
  "warning: several processes recorded GPU work as rank 0"
check "parts: counted in the import statistics" has "$work/out" "rank_with_several_gpu_processes"

finish
