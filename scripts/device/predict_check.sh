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

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
deps="$root/.device-deps"
prefix=/tmp/dynaflow-device-deps
build="$root/build-device"
out="${OUT:-$build/predict-out}"
python="${PYTHON:-$(command -v python3 || true)}"
PACKAGES=(libsqlitecpp-dev libsqlite3-dev libsqlite3-0 libcli11-dev nlohmann-json3-dev
          libsimdjson-dev libsimdjson14 zlib1g-dev zlib1g)

die() {  # die CODE MESSAGE
  echo "predict_check: $2" >&2
  exit "$1"
}

fetch() {
  mkdir -p "$deps"
  (cd "$deps" && apt-get download "${PACKAGES[@]}")
  ls -l "$deps"
}

unpack() {
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local deb member tmp
  for deb in "$deps"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else
      tmp=$(mktemp -d)
      member=$(cd "$tmp" && ar t "$deb" | grep '^data\.tar')
      (cd "$tmp" && ar x "$deb" "$member" && tar -xf "$member" -C "$prefix")
      rm -rf "$tmp"
    fi
  done
}

build_cli() {
  local lib="$prefix/usr/lib/x86_64-linux-gnu"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DDYNAFLOW_BUILD_TESTS=OFF -DDYNAFLOW_WITH_CUDA=OFF \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake;$prefix/usr/share/cmake" \
    -DCMAKE_LIBRARY_PATH="$lib" -DCMAKE_INCLUDE_PATH="$prefix/usr/include"
  cmake --build "$build" -j"$(nproc)" --target dynaflow
}

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
    build_cli >"$out/build.log" 2>&1 || { tail -n 30 "$out/build.log" >&2; die 1 "the build failed"; }
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
