#!/usr/bin/env bash
# Every GPU check of the project in one prepared run (issue "GPU truth on the
# H200"), for the machine lent through the device tool. Builds dynaflow once
# there against that machine's torch, then runs, each under its own time
# limit so that one slow step cannot eat the others' time:
#   1. trace    scripts/device/trace_check.py: kernels and kernel time against
#               torch.profiler, overhead, a CUDA graph's replays, NVTX ranges and
#               the kernels at exit, small trace.db fixtures;
#   2. predict  scripts/device/predict_check.py: a Llama-8B-shaped decoder,
#               decode at batch 64 and 4096 context, prefill at 512 and 4096
#               tokens: the replayed sequential step and the predicted
#               nano-batch step against the measured ones;
#   3. micro    scripts/device/overlap_micro.py: a GEMM beside a bandwidth-bound
#               kernel, two bandwidth-bound kernels, two GEMMs, on two streams;
#   4. hf       tests/hf_apply_test.py on the GPU: tiny Hugging Face models
#               under a forced plan through the runtime's CUDA streams, outputs
#               against the unmodified run;
#   5. graphs   plugin/python/graphs_test.py on the GPU: apply's own CUDA
#               graphs (dynaflow/_graphs.py) captured and replayed with torch's
#               CUDA graphs, outputs against the unmodified run, and a capture
#               that fails (a host read) running eagerly;
#   6. apply    scripts/device/apply_bench.py: eager, one CUDA graph and the
#               advised plan, predicted and measured speedups side by side.
#
#   bash scripts/device/gpu_truth.sh fetch     # here, once: .device-deps (debs, wheel)
#   run(command="TRUTH_STEPS=... bash scripts/device/gpu_truth.sh", carry=[".device-deps"],
#       timeout_s=...)
#
# What the steps took on the H200 (2026-12-04; docs/performance.md): build and
# set-up 77 s, trace 194 s (--reps 2), each predict 11-13 s, micro 11 s, hf
# 31-40 s and graphs 7-10 s (both stopped early by failures), apply past 110 s
# for two prefill and two decode sizes. All of it does not fit one 10-minute
# call, and a 15-minute lease holds about two calls, each of which builds
# again on a fresh machine: choose the steps with TRUTH_STEPS (a comma list of
# the step names above), and the time limits (seconds) with TRUTH_*_S. The
# limits below are each step's measured time with a margin. Results in $OUT (at most 8 files come
# back from the device tool): summary.txt (every step's output and exit
# code), results.json (every step's JSON), build.log, work.tgz (every step's files), and the fixtures
# llama_decode_h200.db, train_step_h200.db and graph_replay_h200.db for tests/data.
#
# A dry run without a GPU: DEVICE=cpu bash scripts/device/gpu_truth.sh (CPU
# sizes; checks the flow end to end, measures nothing meaningful).
# Exit code: 0 when every step passed, 1 when one failed or ran out of time,
# 2 when the machine lacks something.
set -euo pipefail

script=gpu_truth
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out="${OUT:-$build/truth-out}"
device="${DEVICE:-cuda}"
work="$build/truth-work"

# A clean build of these targets took 136 s on the 2-core CPU VM; the machine has 16 cores.
BUILD_S=${TRUTH_BUILD_S:-100}
# 13 processes with 2 repetitions of the 4 overhead variants (accuracy, the
# graph workload, 2 small traces), 6-16 s each on the H200.
TRACE_S=${TRUTH_TRACE_S:-220}
PREDICT_S=${TRUTH_PREDICT_S:-25}  # each of three workloads
MICRO_S=${TRUTH_MICRO_S:-25}
# Ten workloads of an 8-layer Llama-8B-shaped decoder take minutes on the H200
# (one prefill row in 50 s with the trace and the plan); TRUTH_APPLY_ARGS
# (default: two prefill and two decode sizes) chooses them.
APPLY_S=${TRUTH_APPLY_S:-180}
# Two tests of about 12 Python processes each (trace, advise, every usage
# pattern unmodified and applied); one took 24 s on the 2-core CPU VM.
HF_S=${TRUTH_HF_S:-60}
# 13 tests, 8 s on the 2-core CPU VM with the test double.
GRAPHS_S=${TRUTH_GRAPHS_S:-40}
STEPS=",${TRUTH_STEPS:-trace,predict,micro,apply,hf,graphs},"

failed=0

# step NAME SECONDS CMD...: runs CMD under a time limit, its output into
# summary.txt and on stdout, and records its exit code; skipped when NAME's
# first word is not in TRUTH_STEPS.
step() {
  local name=$1 limit=$2
  shift 2
  [[ "$STEPS" == *",${name%%-*},"* ]] || return 0
  echo "== $name (limit ${limit}s): $*" | tee -a "$out/summary.txt"
  local start=$SECONDS code=0
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee -a "$out/summary.txt" || code=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  if [ "$code" -eq 124 ] || [ "$code" -eq 137 ]; then
    echo "== $name: NOT FINISHED within ${limit}s" | tee -a "$out/summary.txt"
  else
    echo "== $name: exit $code after ${took}s" | tee -a "$out/summary.txt"
  fi
  [ "$code" -eq 0 ] || failed=1
  collect  # after every step, so that a call cut short still brings back what ran
}

# The small outputs that come back: one JSON of every step's JSON, and the
# fixtures.
collect() {
  "$python" - "$work" "$out/results.json" <<'PY'
import json, os, sys
work, dest = sys.argv[1], sys.argv[2]
results = {}
for folder, _, files in sorted(os.walk(work)):
    for f in sorted(files):
        if f.endswith(".json") and ("summary" in f or "check" in f or "micro" in f):
            path = os.path.join(folder, f)
            try:
                results[os.path.relpath(path, work)] = json.load(open(path))
            except ValueError as e:
                results[os.path.relpath(path, work)] = {"unreadable": str(e)}
json.dump(results, open(dest, "w"), indent=1)
PY
  local db
  for db in llama_decode_h200.db train_step_h200.db graph_replay_h200.db; do
    [ ! -f "$work/trace/$db" ] || cp "$work/trace/$db" "$out/"
  done
  # Every step's files (traces, plans, reports) for reading afterwards, within
  # the device tool's 16 MiB a file; without the stores when that is too much.
  tar -czf "$out/work.tgz" -C "$work" . 2>/dev/null || true
  if [ "$(stat -c %s "$out/work.tgz" 2>/dev/null || echo 0)" -gt $((15 << 20)) ]; then
    tar -czf "$out/work.tgz" -C "$work" --exclude='*.db' . 2>/dev/null || true
  fi
}

main() {
  check_machine "$device"
  mkdir -p "$out" "$work"
  : >"$out/summary.txt"
  unpack_carried "$device"
  {  # what the figures were measured on
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
      --format=csv 2>&1 || true
    "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version 2>&1 | tail -n 2 || true
    "$python" -c 'import sys, torch, transformers as t
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", t.__version__)'
    echo "cpus $(nproc)"
  } | tee -a "$out/summary.txt"
  local cuda=ON  # the tracer's CUPTI parts; AUTO on a dry run (on where the toolkit is)
  [ "$device" = cuda ] || cuda=AUTO
  echo "== build (limit ${BUILD_S}s, log: build.log)" | tee -a "$out/summary.txt"
  if ! timeout "$BUILD_S" bash -c "$(declare -f device_build); prefix='$prefix' build='$build' \
      root='$root' device_build dynaflow dynaflow_preload dynaflow_torch dynaflow_apply -- \
      -DDYNAFLOW_WITH_CUDA=$cuda -DDYNAFLOW_WITH_TORCH=ON -DDYNAFLOW_PYTHON='$python'" \
      >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log" | tee -a "$out/summary.txt" >&2
    die 1 "the build failed or ran out of time"
  fi
  # The replay module needs the Python headers, which the machine may lack:
  # without it apply runs every planned call eagerly and the graphs step fails.
  timeout 60 cmake --build "$build" --target dynaflow_replay >>"$out/build.log" 2>&1 ||
    echo "gpu_truth: no replay module (build.log says why)" | tee -a "$out/summary.txt" >&2
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PYTHONUNBUFFERED=1
  # A crash prints the Python stack of every thread, and says when it happened
  # on a thread that runs no Python (the tracer's writer, CUPTI's): in the
  # first runs an --ops off trace died of SIGSEGV and a graphs test crashed
  # with nothing on stderr.
  export PYTHONFAULTHANDLER=1
  local bin="$build/cli/dynaflow" runtime="$build/plugin/apply/libdynaflow_apply.so"
  local replay="$build/plugin/torch/_dynaflow_replay.so"
  local reps=2 layers=8 iters=20 apply_sizes="--prefill 2048,8192 --decode 64,256"
  local decode=(--batch 64 --context 4096) p512=(--batch 4 --seq 128) p4096=(--batch 8 --seq 512)
  if [ "$device" != cuda ]; then
    layers=2 iters=3 apply_sizes="--prefill 32 --decode 4"
    decode=(--batch 4 --context 64) p512=(--batch 4 --seq 16) p4096=(--batch 4 --seq 32)
  fi

  step trace "$TRACE_S" "$python" "$root/scripts/device/trace_check.py" --dynaflow "$bin" \
    --out "$work/trace" --device "$device" --reps "${TRUTH_TRACE_REPS:-$reps}"
  local pc=("$python" "$root/scripts/device/predict_check.py" --dynaflow "$bin"
            --device "$device" --layers "$layers" --iters "$iters")
  step predict-decode "$PREDICT_S" "${pc[@]}" --out "$work/predict" --workload decode "${decode[@]}"
  step predict-prefill-512 "$PREDICT_S" "${pc[@]}" --out "$work/predict512" --workload prefill \
    "${p512[@]}"
  step predict-prefill-4096 "$PREDICT_S" "${pc[@]}" --out "$work/predict4096" \
    --workload prefill "${p4096[@]}"
  step micro "$MICRO_S" "$python" "$root/scripts/device/overlap_micro.py" --out "$work/micro" \
    --device "$device" --iters "$iters"
  step hf "$HF_S" env DYNAFLOW_BIN="$bin" DYNAFLOW_SOURCE_DIR="$root" DYNAFLOW_PYTHON="$python" \
    DYNAFLOW_APPLY_LIB_BUILT="$runtime" DYNAFLOW_REPLAY_EXT_BUILT="$replay" \
    DYNAFLOW_HF_DEVICE="$device" DYNAFLOW_HF_KEEP="$work/hf" \
    "$python" "$root/tests/hf_apply_test.py" HfApplyTest.test_llama HfApplyTest.test_mixtral
  # Every test must run there: a skip (no GPU seen) fails the step.
  step graphs "$GRAPHS_S" env DYNAFLOW_APPLY_LIB_BUILT="$runtime" DYNAFLOW_REPLAY_EXT_BUILT="$replay" \
    DYNAFLOW_GRAPHS_DEVICE="$device" \
    bash -c 'cd "$1/plugin/python" && ok=0 &&
             for part in "GraphsTest ExampleDecoderGraphsTest TransformersGraphsTest" ReplayModuleTest; do
               "$2" -m unittest -v $(printf "graphs_test.%s " $part) 2>&1 | tee /dev/stderr |
                 tail -n 1 | grep -qx OK || ok=1
             done; exit $ok' graphs "$root" "$python"
  # The long benchmark last: the correctness checks above come back first.
  step apply "$APPLY_S" env DYNAFLOW_REPLAY_EXT="$replay" \
    "$python" "$root/scripts/device/apply_bench.py" --dynaflow "$bin" \
    --runtime "$runtime" --out "$work/apply" --device "$device" \
    ${TRUTH_APPLY_ARGS:-$apply_sizes}
  echo "gpu_truth: $( [ "$failed" -eq 0 ] && echo "every step passed" || echo "a step failed" ) \
(summary.txt, results.json in $out)" | tee -a "$out/summary.txt"
  return "$failed"
}

case "${1:-}" in
  fetch) fetch ;;
  "") main ;;
  *) die 2 "usage: bash scripts/device/gpu_truth.sh [fetch]" ;;
esac
