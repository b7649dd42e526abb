#!/usr/bin/env bash
# End-to-end tests of `dynaflow trace` and `dynaflow export` with the real
# tracer (libdynaflow_preload.so) on a machine without a GPU: exit codes and
# signals of the traced program, its output passing through, PyTorch operators
# with module paths from examples/llama_decode.py and examples/train_step.py
# on the CPU, and the Perfetto export read back by the Kineto importer.
#
# Needs DYNAFLOW_BIN and DYNAFLOW_SOURCE_DIR (ctest sets both), DYNAFLOW_PYTHON
# (the venv's python) and DYNAFLOW_TORCH_BUILT (1 when the torch extension was
# built). The torch part is skipped, saying so, only when that Python is
# missing or the extension was configured off.
set -u
. "$(dirname "$0")/lib.sh"
py=${DYNAFLOW_PYTHON:-$src/.venv/bin/python}

q() { sqlite3 "$1" "$2"; }  # q DB SQL

# same_rows A B TABLE COLUMNS: prints 1 when TABLE has the same rows (these
# columns) in the stores A and B.
same_rows() {
  q "$1" "ATTACH '$2' AS b;
    SELECT (SELECT count(*) FROM main.$3) = (SELECT count(*) FROM b.$3)
       AND NOT EXISTS (SELECT $4 FROM main.$3 EXCEPT SELECT $4 FROM b.$3)"
}

# No parts directory may be left beside an output.
no_parts_left() { ! ls -a "$work" | grep -q '\.parts-'; }

# --- programs that never touch torch or CUDA
expect_code "echo" 0 "$bin" trace -o "$work/echo.db" -- /bin/echo hi there
check "echo: output passes through" test "$(cat "$work/out")" = "hi there"
summary="dynaflow: 0 kernels, 0 operators, 0 dropped records, 1 process -> $work/echo.db"
check "echo: summary is the last line" test "$(tail -n 1 "$work/err")" = "$summary"
check "echo: says why there is no GPU activity" \
  grep -q "no GPU activity recorded (cupti " "$work/err"
check "echo: one traced process" test "$(q "$work/echo.db" 'SELECT count(*) FROM processes')" = 1
check "echo: merged meta" \
  test "$(q "$work/echo.db" "SELECT value FROM meta WHERE key = 'processes'")" = 1
check "echo: parts removed" no_parts_left

# A process that outlives CMD: waited for (3 s at most), then said.
expect_code "straggler" 0 "$bin" trace -o "$work/strag.db" -- sh -c 'sleep 6 & exit 0'
check "straggler: said" has "$work/err" "1 traced process is still running"
check "straggler: both processes merged" \
  test "$(q "$work/strag.db" 'SELECT count(*) FROM processes')" = 2

expect_code "stdin passes through" 0 sh -c "echo data | '$bin' trace -o '$work/cat.db' -- cat"
check "stdin: cat echoes it" test "$(cat "$work/out")" = "data"

expect_code "exit code" 7 "$bin" trace -o "$work/exit.db" -- sh -c 'exit 7'
check "exit code: trace written anyway" test -f "$work/exit.db"
expect_code "killed by SIGTERM" 143 "$bin" trace -o "$work/term.db" -- sh -c 'kill -TERM $$'
expect_code "killed by SIGKILL" 137 "$bin" trace -o "$work/kill.db" -- sh -c 'kill -KILL $$'
check "killed: parts removed" no_parts_left

"$bin" trace -o "$work/fwd.db" -- sleep 30 >/dev/null 2>"$work/fwd.err" &
tracer=$!
sleep 1
kill -TERM "$tracer"
wait "$tracer"
check "SIGTERM to dynaflow reaches the child" test $? -eq 143
check "SIGTERM: the child's trace is merged" test -f "$work/fwd.db"

expect_code "command not found" 127 "$bin" trace -o "$work/nf.db" -- "$work/no-such-program"
check "not found: one line" test "$(wc -l <"$work/err")" -eq 1
check "not found: says so" grep -q "no-such-program: command not found" "$work/err"
check "not found: no output, no parts" test ! -e "$work/nf.db"
check "not found: parts removed" no_parts_left
expect_code "not executable" 126 "$bin" trace -o "$work/nx.db" -- "$src/README.md"
expect_code "no command" 2 "$bin" trace -o "$work/none.db"
expect_code "bad --ops" 2 "$bin" trace --ops maybe -- true
expect_code "output dir missing" 2 "$bin" trace -o "$work/missing/t.db" -- true
expect_code "tracer missing" 1 env DYNAFLOW_PRELOAD="$work/nope.so" \
  "$bin" trace -o "$work/np.db" -- true
check "tracer missing: says where it looked" grep -q "nope.so" "$work/err"

# --- export of real Kineto traces, one file per rank, read back row for row
shared="$src/../shared/traces/kineto"
[ -d "$shared" ] || skipped="$shared absent: the real-trace checks did not run"
if [ -d "$shared" ]; then
  expect_code "import two ranks" 0 "$bin" import "$shared/hta_sampled_rank-0.json.gz" \
    "$shared/hta_sampled_rank-1.json.gz" -o "$work/ranks.db"
  expect_code "export two ranks" 0 "$bin" export "$work/ranks.db" --format perfetto \
    -o "$work/ranks.json"
  check "export: one file per rank" test -f "$work/ranks.rank0.json" -a -f "$work/ranks.rank1.json"
  expect_code "export: stdout needs one rank" 2 "$bin" export "$work/ranks.db" -o -
  expect_code "import the exports" 0 "$bin" import "$work/ranks.rank0.json" \
    "$work/ranks.rank1.json" -o "$work/ranks_back.db"
  check "export round trip: GPU activity" test "$(same_rows "$work/ranks.db" \
    "$work/ranks_back.db" gpu_activity "rank, device, stream, start_ns, end_ns, name,
                                         correlation, external_id, bytes")" = 1
  check "export round trip: operators" test "$(same_rows "$work/ranks.db" \
    "$work/ranks_back.db" operators_named "rank, pid, tid, start_ns, end_ns, name, sequence,
                          pass, input_shapes, input_types, module_path, external_id")" = 1
  check "export round trip: API calls" test "$(same_rows "$work/ranks.db" \
    "$work/ranks_back.db" api_calls_named "rank, pid, tid, kind, start_ns, end_ns, name,
                                            correlation, external_id")" = 1
fi

# --- PyTorch programs on the CPU
torch_skip=""
if [ ! -x "$py" ]; then
  torch_skip="no Python with torch at $py (bash scripts/dev.sh creates .venv)"
elif [ "${DYNAFLOW_TORCH_BUILT:-0}" != 1 ]; then
  torch_skip="the torch extension was not built (DYNAFLOW_WITH_TORCH=OFF)"
fi
if [ -n "$torch_skip" ]; then
  echo "SKIP: torch tests: $torch_skip"
else
  model=(--layers 2 --hidden 64 --heads 4 --kv-heads 2 --vocab 128 --batch 1 --device cpu)
  llama=("$py" "$src/examples/llama_decode.py" "${model[@]}" --prompt-len 8 --decode-steps 3)
  db="$work/llama.db"

  expect_code "python without torch" 0 "$bin" trace -o "$work/py.db" -- "$py" -c 'print(6 * 7)'
  check "python without torch: output" test "$(cat "$work/out")" = 42
  check "python without torch: the bootstrap stays silent" \
    test "$(grep -vc -e '^dynaflow: no GPU' -e '^dynaflow: 0 kernels' "$work/err")" -eq 0

  expect_code "trace llama_decode" 0 "$bin" trace -o "$db" -- "${llama[@]}"
  check "llama: program output" grep -q "^llama_decode: 2 layers" "$work/out"
  check "llama: summary counts operators" grep -Eq " [1-9][0-9]* operators, 0 dropped" "$work/err"
  check "llama: no GPU, operators only" \
    grep -q "no GPU activity recorded.*operators only" "$work/err"
  mlp_rows=$(q "$db" "SELECT count(*) FROM operators_named
    WHERE name IN ('aten::linear', 'aten::mm') AND module_path LIKE '%.layers.0.mlp.%'
      AND pass = 'forward'")
  check "llama: aten::linear/mm in layers.0.mlp, forward" test "$mlp_rows" -ge 6
  check "llama: prefill shapes of up_proj" test "$(q "$db" "
    SELECT input_shapes || ' ' || input_types FROM operators_named WHERE name = 'aten::linear'
      AND module_path = 'LlamaForCausalLM.model.layers.0.mlp.up_proj' ORDER BY start_ns LIMIT 1")" \
    = '[[1,8,64],[192,64],[]] ["float","float",""]'
  check "llama: attention of both layers" test "$(q "$db" "SELECT count(DISTINCT module_path)
    FROM operators_named WHERE name = 'aten::scaled_dot_product_attention'")" = 2
  check "llama: a shared module is named after its caller" test "$(q "$db" "SELECT count(*)
    FROM operators_named WHERE module_path = 'LlamaForCausalLM.model.layers.1.attn.rotary'")" -gt 0
  check "llama: paths start at the root's class" test "$(q "$db" "SELECT count(*)
    FROM operators_named WHERE module_path <> '' AND module_path NOT LIKE 'LlamaForCausalLM%'")" = 0
  check "llama: one external id per operator" test "$(q "$db" "SELECT count(DISTINCT external_id)
    = count(*) FROM operators")" = 1
  check "llama: operators outside the model have no path" test "$(q "$db" "SELECT count(*)
    FROM operators_named WHERE name = 'aten::argmax' AND module_path = ''")" -gt 0
  all_ops=$(q "$db" "SELECT count(*) FROM operators")
  expect_code "info on the traced run" 0 "$bin" info "$db"
  check "info shows CUPTI off" grep -q "^  cupti:      unavailable: " "$work/out"
  check "info shows operators on" grep -q "^  operators recorded: on" "$work/out"
  expect_code "info --format json on the traced run" 0 "$bin" info --format json "$db"
  check "info json: tracer" python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['tracer']
assert t['cupti'].startswith('unavailable: ') and t['ops'] == 'on', t
assert len(t['processes']) == 1 and t['processes'][0]['meta']['ops'] == 'on', t" "$work/out"

  expect_code "trace --ops off" 0 "$bin" trace --ops off -o "$work/off.db" -- "${llama[@]}"
  check "ops off: no operator rows" test "$(q "$work/off.db" 'SELECT count(*) FROM operators')" = 0
  check "ops off: the program ran" grep -q "^llama_decode:" "$work/out"
  check "ops off: no word on the torch extension" test "$(grep -c "torch extension" "$work/err")" -eq 0
  # The last flush runs from Python's exit, before torch, libcuda and libcupti
  # tear down, with operators off too (an H200 run under --ops off died of
  # SIGSEGV when it ran from the C exit handler, after them).
  check "ops off: the final flush ran at the program's exit" \
    test "$(q "$work/off.db" "SELECT value FROM meta WHERE key = 'final_flush'")" = program_exit
  check "ops on: the final flush ran at the program's exit" \
    test "$(q "$db" "SELECT value FROM meta WHERE key = 'final_flush'")" = program_exit

  expect_code "no torch extension" 0 env DYNAFLOW_TORCH_EXT="$work/none.so" \
    "$bin" trace -o "$work/noext.db" -- "${llama[@]}"
  check "no torch extension: the summary says why there are no operators" \
    grep -q "^dynaflow: 0 kernels, 0 operators (no torch extension at $work/none.so: " "$work/err"

  expect_code "DYNAFLOW_OPS_SAMPLE" 0 env DYNAFLOW_OPS_SAMPLE=5 \
    "$bin" trace -o "$work/sampled.db" -- "${llama[@]}"
  sampled=$(q "$work/sampled.db" "SELECT count(*) FROM operators")
  check "sampling: fewer operators ($sampled of $all_ops)" \
    test "$sampled" -gt 0 -a "$((sampled * 2))" -lt "$all_ops"

  expect_code "trace --delay beyond the run" 0 "$bin" trace --delay 600 -o "$work/late.db" -- \
    "${llama[@]}"
  check "delay: nothing recorded before it" \
    test "$(q "$work/late.db" 'SELECT count(*) FROM operators')" = 0

  # A program that preloads the tracer itself and names its model.
  built=$(dirname "$bin")/../plugin
  mkdir "$work/manual"
  expect_code "dynaflow.enable_module_paths" 0 env \
    LD_PRELOAD="$built/preload/libdynaflow_preload.so" DYNAFLOW_OUTPUT_DIR="$work/manual" \
    DYNAFLOW_TORCH_EXT="$built/torch/_dynaflow_torch.so" \
    PYTHONPATH="$src/plugin/python" "$py" -c '
import torch, dynaflow
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
dynaflow.enable_module_paths(model)
model(torch.ones(2, 4))'
  check "enable_module_paths: operators named after the model" test "$(q "$work"/manual/*.db \
    "SELECT count(*) FROM operators_named
      WHERE name = 'aten::linear' AND module_path = 'Sequential.0'")" = 1

  expect_code "unusable extension" 0 env DYNAFLOW_TORCH_EXT="$work/nope.so" \
    "$bin" trace -o "$work/noext.db" -- "${llama[@]}"
  check "unusable extension: one line" \
    test "$(grep -c "^dynaflow: cannot load $work/nope.so.*operators are not recorded" \
      "$work/err")" = 1
  check "unusable extension: the program ran" grep -q "^llama_decode:" "$work/out"

  expect_code "trace train_step" 0 "$bin" trace -o "$work/train.db" -- \
    "$py" "$src/examples/train_step.py" "${model[@]}" --seq-len 8 --steps 2
  check "train: program output" grep -q "^train_step: 2 steps" "$work/out"
  check "train: backward operators" test "$(q "$work/train.db" "SELECT count(*)
    FROM operators_named WHERE pass = 'backward' AND name LIKE 'autograd::engine::%'")" -gt 0
  check "train: forward operators with module paths" test "$(q "$work/train.db" "SELECT count(*)
    FROM operators_named WHERE pass = 'forward' AND module_path LIKE '%.layers.0.mlp%'")" -gt 0

  # multiprocessing workers started by spawn (as vLLM starts its workers): a new
  # interpreter that inherits the tracer and the bootstrap, traced under its own pid.
  cat >"$work/spawn.py" <<'PY'
import multiprocessing as mp
import torch

def work(n):
    return float(torch.nn.Linear(4, 4)(torch.ones(n, 4)).sum())

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as pool:
        print(len(pool.map(work, [1, 2, 3, 4])))
PY
  expect_code "trace multiprocessing spawn" 0 "$bin" trace -o "$work/spawn.db" -- \
    "$py" "$work/spawn.py"
  check "spawn: program output" test "$(cat "$work/out")" = 4
  check "spawn: workers' operators under their own pids" test "$(q "$work/spawn.db" "
    SELECT count(DISTINCT pid) FROM operators_named WHERE name = 'aten::linear'")" -ge 1
  check "spawn: parent and workers all traced" test "$(q "$work/spawn.db" "
    SELECT count(DISTINCT pid) FROM processes")" -ge 3
  check "spawn: every process finished its store" test "$(grep -c -e "cannot finish" \
    -e "skipped" "$work/err")" = 0

  # A crash keeps what was recorded (a sub-second program kept nothing, since
  # the writer flushes every second), with the exit status of the crash.
  for crash in "ctypes.string_at(0):139:SIGSEGV" "os.abort():134:SIGABRT"; do
    IFS=: read -r how code name <<<"$crash"
    expect_code "crash by $name" "$code" "$bin" trace -o "$work/crash.db" -- "$py" -c "
import ctypes, os, torch
x = torch.ones(4, 4)
for _ in range(200):
    x = (x + 1).relu()
$how"
    check "crash by $name: operators kept" test "$(q "$work/crash.db" \
      "SELECT count(*) FROM operators")" -ge 400
    check "crash by $name: named in the store" test "$(q "$work/crash.db" \
      "SELECT value FROM meta WHERE key = 'exit_signal'")" = "$name"
    check "crash by $name: said" grep -q "^dynaflow: process [0-9]* died of $name" "$work/err"
  done

  # A C stack overflow (repr of a deeply nested list, the recursion limit
  # raised) leaves no stack for the crash handler but the alternate one the
  # tracer gives the main thread.
  expect_code "stack overflow" 139 "$bin" trace -o "$work/overflow.db" -- "$py" -c "
import sys, torch
x = torch.ones(4, 4)
for _ in range(200):
    x = (x + 1).relu()
sys.setrecursionlimit(10**8)
nested = []
for _ in range(10**6):
    nested = [nested]
repr(nested)"
  check "stack overflow: operators kept" test "$(q "$work/overflow.db" \
    "SELECT count(*) FROM operators")" -ge 400
  check "stack overflow: named in the store" test "$(q "$work/overflow.db" \
    "SELECT value FROM meta WHERE key = 'exit_signal'")" = SIGSEGV
  # The same in a Python thread (started through the tracer's pthread_create,
  # which gives it an alternate stack too), its operators recorded in it.
  expect_code "stack overflow in a thread" 139 "$bin" trace -o "$work/thread_overflow.db" -- \
    "$py" -c "
import sys, threading, torch
def work():
    x = torch.ones(4, 4)
    for _ in range(200):
        x = (x + 1).relu()
    nested = []
    for _ in range(10**6):
        nested = [nested]
    repr(nested)
sys.setrecursionlimit(10**8)
threading.stack_size(4 * 1024 * 1024)
t = threading.Thread(target=work)
t.start()
t.join()"
  check "stack overflow in a thread: operators kept" test "$(q "$work/thread_overflow.db" \
    "SELECT count(*) FROM operators")" -ge 400

  # SIGKILL of dynaflow itself: the traced program is not left running
  # orphaned; it gets SIGTERM, and its store (in the parts folder) is finished.
  mkdir "$work/killed"
  "$bin" trace -o "$work/killed/k.db" -- "$py" -c "
import time, torch
x = torch.ones(4, 4)
for _ in range(100):
    x = (x + 1).relu()
open('$work/killed/ready', 'w').close()
time.sleep(60)" >/dev/null 2>&1 &
  tracer_pid=$!
  for _ in $(seq 100); do [ -e "$work/killed/ready" ] && break; sleep 0.2; done
  kill -KILL "$tracer_pid"
  wait "$tracer_pid" 2>/dev/null
  for _ in $(seq 50); do pgrep -f "$work/killed/ready" >/dev/null || break; sleep 0.2; done
  check "dynaflow killed: the program ended too" test -z "$(pgrep -f "$work/killed/ready")"
  check "dynaflow killed: the program's store holds its operators" test "$(q \
    "$(ls "$work"/killed/.k.db.parts-*/*.db | head -1)" "SELECT count(*) FROM operators")" -ge 200
  parts=$(ls -d "$work"/killed/.k.db.parts-*)
  expect_code "recover the parts folder: import" 0 "$bin" import "$parts" -o "$work/killed/rec.db"
  check "recover: said" grep -q "^dynaflow: recovered 1 process store from" "$work/err"
  check "recover: the operators" test "$(q "$work/killed/rec.db" \
    "SELECT count(*) FROM operators")" -ge 200
  expect_code "recover the parts folder: info" 0 "$bin" info "$parts"
  expect_code "a parts folder with other inputs" 2 "$bin" info "$parts" "$work/killed/rec.db"

  # The trace is finished from Python's exit handlers (after a device
  # synchronize, before torch and CUDA tear down), after the program's own:
  # work an exit handler of the program does is still recorded.
  expect_code "trace a program with an exit handler" 0 "$bin" trace -o "$work/atexit.db" -- \
    "$py" -c "
import atexit, torch
atexit.register(lambda: torch.ones(3).softmax(0))
torch.ones(2).relu()"
  check "exit handler's operator recorded" test "$(q "$work/atexit.db" \
    "SELECT count(*) FROM operators_named WHERE name = 'aten::softmax'")" = 1

  # Beside torch.profiler: a program that profiles a window of its own steps
  # loses none of its operators in dynaflow's trace.
  cat >"$work/profiled.py" <<'PY'
import sys
import torch

def step(x):
    return (x @ x).relu().sum()

x = torch.ones(8, 8)
prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                              schedule=torch.profiler.schedule(wait=2, warmup=1, active=3))
if sys.argv[1] == "on":
    prof.start()
for _ in range(10):
    step(x)
    if sys.argv[1] == "on":
        prof.step()
if sys.argv[1] == "on":
    prof.stop()
PY
  expect_code "trace without torch.profiler" 0 "$bin" trace -o "$work/unprofiled.db" -- \
    "$py" "$work/profiled.py" off
  expect_code "trace beside torch.profiler" 0 "$bin" trace -o "$work/profiled.db" -- \
    "$py" "$work/profiled.py" on
  relu_count='SELECT count(*) FROM operators_named WHERE name = '"'aten::relu'"
  check "beside torch.profiler: every step's operators" test \
    "$(q "$work/profiled.db" "$relu_count")" = "$(q "$work/unprofiled.db" "$relu_count")"
  check "beside torch.profiler: ten steps" test "$(q "$work/profiled.db" "$relu_count")" = 10
  # The bootstrap lent CUPTI to each of the schedule's two windows (steps 2-5,
  # 8-9) and took it back; without CUDA no GPU record was lost to it.
  meta() { q "$1" "SELECT value FROM meta WHERE key = '$2'"; }
  check "beside torch.profiler: two windows" \
    test "$(meta "$work/profiled.db" torch_profiler_windows)" = 2
  check "beside torch.profiler: nothing lent without CUPTI" \
    test -z "$(meta "$work/profiled.db" cupti_kineto_window_count)"
  check "without torch.profiler: no window" \
    test -z "$(meta "$work/unprofiled.db" torch_profiler_windows)"
  # With --ops off the tracer still records GPU activity: the watch stays.
  expect_code "trace --ops off beside torch.profiler" 0 "$bin" trace --ops off \
    -o "$work/profiled_off.db" -- "$py" "$work/profiled.py" on
  check "ops off beside torch.profiler: two windows" \
    test "$(meta "$work/profiled_off.db" torch_profiler_windows)" = 2

  # Operator ids unique across processes: DataLoader workers forked from the
  # main process once shared its ids (they continued its counter).
  cat >"$work/loader.py" <<'PY'
import torch
from torch.utils.data import DataLoader, Dataset

class D(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.randn(4, 8).relu().sum(0)

if __name__ == "__main__":
    m = torch.nn.Linear(8, 8)
    for x in DataLoader(D(), batch_size=4, num_workers=2):
        m(x)
PY
  expect_code "trace DataLoader workers" 0 "$bin" trace -o "$work/loader.db" -- \
    "$py" "$work/loader.py"
  check "loader: workers traced" test "$(q "$work/loader.db" \
    "SELECT count(DISTINCT pid) FROM operators")" = 3
  check "loader: no operator id shared by two processes" test "$(q "$work/loader.db" "
    SELECT count(*) FROM (SELECT external_id FROM operators GROUP BY rank, external_id
                          HAVING count(DISTINCT pid) > 1)")" = 0
  # What each process says of itself is its own row (process_meta); meta
  # holds what they all agree on, not values joined with ';'.
  check "loader: metadata of each process" test "$(q "$work/loader.db" \
    "SELECT count(DISTINCT pid) FROM process_meta WHERE key = 'rank'")" = 3
  check "loader: one rank trace-wide" test "$(q "$work/loader.db" \
    "SELECT value FROM meta WHERE key = 'rank'")" = 0
  check "loader: no value joined across processes" test "$(q "$work/loader.db" \
    "SELECT count(*) FROM meta WHERE value LIKE '%;%'")" = 0

  # Ranks started by torch.multiprocessing carry no RANK: the tracer takes
  # the rank torch.distributed gives them.
  expect_code "trace tensor parallel ranks" 0 "$bin" trace -o "$work/tp.db" -- \
    "$py" "$src/tests/dist/tp_mlp.py" --steps 1
  check "tensor parallel: operators of ranks 0 and 1" test "$(q "$work/tp.db" \
    "SELECT group_concat(r) FROM (SELECT DISTINCT rank AS r FROM operators
                                  WHERE name_id IN (SELECT id FROM strings
                                                    WHERE value LIKE '%allreduce%')
                                  ORDER BY r)")" = "0,1"
  check "tensor parallel: each process's rank" test "$(q "$work/tp.db" \
    "SELECT group_concat(value) FROM (SELECT DISTINCT value FROM process_meta
                                      WHERE key = 'rank' ORDER BY value)")" = "0,1"
  check "tensor parallel: no rank trace-wide" test "$(q "$work/tp.db" \
    "SELECT count(*) FROM meta WHERE key = 'rank'")" = 0

  # Perfetto export, read back by the Kineto importer: the same operators.
  expect_code "export perfetto" 0 "$bin" export "$db" --format perfetto -o "$work/llama.json"
  check "export: valid JSON with cpu_op events" python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert any(e.get('cat') == 'cpu_op' for e in j['traceEvents'])
assert j['distributedInfo']['rank'] == 0" "$work/llama.json"
  expect_code "import the export" 0 "$bin" import "$work/llama.json" -o "$work/back.db"
  # Not the pass: Kineto marks forward only by a sequence number (see perfetto_export.h).
  check "export round trip: every operator comes back" test "$(same_rows "$db" "$work/back.db" \
    operators_named "name, start_ns, end_ns, pid, tid, sequence, input_shapes, input_types,
                     module_path, external_id")" = 1
fi

finish
