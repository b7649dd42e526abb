#!/usr/bin/env bash
# GPU check of `dynaflow trace`, for the H200 machine lent through the device
# tool: builds dynaflow there against that machine's own torch, then, well
# inside 10 minutes, runs scripts/device/trace_check.py:
#   (a) the kernels dynaflow records for examples/llama_decode.py on the GPU
#       against torch.profiler's on the same workload: count and total kernel
#       time within 2%;
#   (b) overhead: the workload untraced, traced with operators, traced with
#       --ops off and under torch.profiler (medians of 5 interleaved runs);
#   (c) small trace.db files of llama_decode and train_step, for tests/data;
#   (d) the traced run's integrity (CUPTI on, nothing dropped, well-formed
#       kernels, an H200, >= 95% linked) and the overhead targets;
#   (e) a CUDA graph replayed N times gives N x its kernels, linked to the
#       capture-time operators; NVTX ranges recorded; the last step's kernels
#       kept at exit.
# It prints a summary table last and exits 1 when any check fails.
#
# What the machine must have (the device tool's CUDA image does): an NVIDIA GPU
# and driver, the CUDA toolkit (nvcc, CUPTI headers), CMake >= 3.25, ninja, a
# C++20 g++, and python3 with torch 2.11 built for CUDA (PYTHON overrides which
# python). It has no package registry, so the libraries the build needs beyond
# that travel with the working tree as Debian 12 packages, fetched here once:
#
#   bash scripts/device/trace_check.sh fetch      # here: .device-deps/*.deb (git-ignored)
#
# and run there with the device tool:
#   run(command="bash scripts/device/trace_check.sh", carry=[".device-deps"],
#       timeout_s=600)
# The packages are unpacked under /tmp (never into /); the build goes to
# build-device/. Results go to $OUT (the device tool's; build-device/check-out
# elsewhere): summary.txt, summary.json, trace_check.log, build.log and
# llama_decode_h200.db, train_step_h200.db (to commit under tests/data).
#
# Exit code: 0 when every check passes, 1 when one fails, 2 when the machine
# lacks something the check needs.
#
# A dry run on a machine without a GPU: DEVICE=cpu bash scripts/device/trace_check.sh
# (the same build and steps at CPU sizes; (a) has no kernels and is skipped).
set -euo pipefail

script=trace_check
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out="${OUT:-$build/check-out}"
device="${DEVICE:-cuda}"

main() {
  check_machine "$device"
  mkdir -p "$out"
  unpack_carried "$device"
  echo "trace_check: building in $build (log: $out/build.log)"
  if ! device_build dynaflow dynaflow_preload dynaflow_torch -- -DDYNAFLOW_WITH_CUDA=ON \
      -DDYNAFLOW_WITH_TORCH=ON -DDYNAFLOW_PYTHON="$python" >"$out/build.log" 2>&1; then
    tail -n 40 "$out/build.log" >&2
    die 1 "the build failed"
  fi
  local reps=5
  [ "$device" = cuda ] || reps=2
  "$python" "$root/scripts/device/trace_check.py" --dynaflow "$build/cli/dynaflow" \
    --out "$out" --device "$device" --reps "$reps"
}

case "${1:-}" in
  fetch) fetch ;;
  "") main ;;
  *) die 2 "usage: bash scripts/device/trace_check.sh [fetch]" ;;
esac
