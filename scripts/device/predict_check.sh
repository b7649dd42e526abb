#!/usr/bin/env bash
# GPU check of the simulator (issue: advise, item 8), for the H200 machine lent
# through the device tool. It builds the dynaflow CLI there (no CUDA parts are
# needed to advise), then runs scripts/device/predict_check.py: a large-batch
# decode step measured under sequential execution and under a two-stream
# nano-batch overlap, each compared with what `dynaflow advise` predicts from
# a torch.profiler trace of the sequential step. Target: |error| <= 10%.
#
# The machine has no package registry: the build's libraries travel as Debian
# 12 packages fetched here once (the same set as trace_check.sh):
#   bash scripts/device/predict_check.sh fetch     # here: .device-deps/*.deb
# and run there with the device tool:
#   run(command="bash scripts/device/predict_check.sh", carry=[".device-deps"], timeout_s=600)
# Results go to $OUT (the device tool's; build-device/predict-out elsewhere):
# predict_check.json, the trace, report.json, plan.json, build.log.
#
# Exit code: 0 when both predictions are within 10%, 1 when one is not or the
# build fails, 2 when the machine lacks something (no GPU: the check is pending).
set -euo pipefail

script=predict_check
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out="${OUT:-$build/predict-out}"

main() {
  [ -n "$python" ] || die 2 "no python3"
  "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null ||
    die 2 "torch sees no GPU here: the check is pending"
  mkdir -p "$out"
  local bin="${DYNAFLOW_BIN:-}"
  if [ -z "$bin" ]; then
    command -v cmake >/dev/null && command -v ninja >/dev/null || die 2 "no cmake or ninja"
    if compgen -G "$deps/*.deb" >/dev/null; then unpack; fi
    echo "predict_check: building the CLI in $build (log: $out/build.log)"
    device_build dynaflow -- -DDYNAFLOW_WITH_CUDA=OFF >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log" >&2; die 1 "the build failed"; }
    bin="$build/cli/dynaflow"
  fi
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  "$python" "$root/scripts/device/predict_check.py" --dynaflow "$bin" --out "$out"
}

case "${1:-}" in
  fetch) fetch ;;
  "") main ;;
  *) die 2 "usage: bash scripts/device/predict_check.sh [fetch]" ;;
esac
