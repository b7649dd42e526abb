#!/usr/bin/env bash
# Builds everything with AddressSanitizer and UndefinedBehaviorSanitizer in
# build-asan/ (Debug, any compiler; gcc by default) and runs the whole ctest
# suite there. Exits non-zero when the build or any test fails, including on
# the first sanitizer report (UBSan does not recover).
#
#   scripts/sanitize.sh            # environment: SANITIZE_JOBS (default 2)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-asan"
jobs="${SANITIZE_JOBS:-2}"

# Configure every time (seconds when nothing changed) so that an interrupted
# or failed configure is redone; the generator is chosen only once.
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(-G Ninja)
fi
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug -DDYNAFLOW_BUILD_TESTS=ON \
  -DDYNAFLOW_WITH_TORCH=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_C_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
cmake --build "$build" --parallel "$jobs"

# Leak checking stays on; every report aborts the process so ctest sees it.
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
# No test is excluded here. The LD_PRELOAD integration tests
# (plugin/preload/preload_integration_test) skip themselves in a sanitized
# build: an ASan library cannot be preloaded into uninstrumented programs.
cd "$build"
ctest --output-on-failure -j"$jobs"
