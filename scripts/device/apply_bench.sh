#!/usr/bin/env bash
# GPU benchmark of `dynaflow apply`, for the H200 machine lent through the
# device tool: builds dynaflow there against the machine's torch, then runs
# scripts/device/apply_bench.py on a Llama-8B-shaped decoder (transformers'
# LlamaForCausalLM with 8 layers, random weights, bf16, a static cache; or
# --model example, examples/llama_decode.py's): prefill at 256 to 8192 tokens
# and long-context decode, each as
# baseline eager, baseline in one CUDA graph, and the plan `dynaflow advise`
# made from a trace of it (captured in one CUDA graph too), with the
# predicted and measured speedups side by side. Targets (issue "dynaflow
# apply"): >= 1.15x over the CUDA-graph baseline where the advisor predicted a
# gain, >= 0.98x where it advised sequential.
#
#   bash scripts/device/apply_bench.sh fetch     # here, once: .device-deps/*.deb
#   run(command="bash scripts/device/apply_bench.sh", carry=[".device-deps"], timeout_s=600)
#
# Results in $OUT: summary.txt, summary.json, the plans and traces, build.log.
# A dry run without a GPU: DEVICE=cpu bash scripts/device/apply_bench.sh (tiny
# sizes, no CUDA graphs; checks the flow, measures nothing meaningful).
# Exit code: 0 when every target is met (on the CPU: when every plan split
# with the unmodified outputs), 1 when one is missed, 2 when the machine lacks
# something.
set -euo pipefail

script=apply_bench
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out="${OUT:-$build/apply-out}"
device="${DEVICE:-cuda}"

main() {
  check_machine "$device"
  mkdir -p "$out"
  unpack_carried "$device"
  echo "apply_bench: building in $build (log: $out/build.log)"
  # The torch extension records module paths: the plan's split units need them.
  if ! device_build dynaflow dynaflow_preload dynaflow_torch dynaflow_apply -- \
      -DDYNAFLOW_WITH_CUDA=ON -DDYNAFLOW_WITH_TORCH=ON -DDYNAFLOW_PYTHON="$python" \
      >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log" >&2
    die 1 "the build failed"
  fi
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$python" "$root/scripts/device/apply_bench.py" --dynaflow "$build/cli/dynaflow" \
    --runtime "$build/plugin/apply/libdynaflow_apply.so" --out "$out" --device "$device"
}

case "${1:-}" in
  fetch) fetch ;;
  "") main ;;
  *) die 2 "usage: bash scripts/device/apply_bench.sh [fetch]" ;;
esac
