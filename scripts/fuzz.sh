#!/usr/bin/env bash
# Builds the libFuzzer targets in build-fuzz/ (clang, ASan + UBSan, our code
# coverage-instrumented, -O1 with assertions on) and runs each for SECONDS
# (default 60), one process each.
#
#   scripts/fuzz.sh [SECONDS]
#
# Exits non-zero when a regression input under tests/fuzz/regressions/<target>/
# still crashes, or when fuzzing finds a new crash; new crash inputs are saved
# under build-fuzz/artifacts/<target>/ and the path is printed. Seeds: the
# checked-in tests/fuzz/corpus/<target>/ plus, when ../shared/traces exists,
# the small real Kineto traces (decompressed into the working corpus, never
# into the repository). The working corpus build-fuzz/corpus/<target>/ keeps
# what earlier runs found.
#
# Environment: CC/CXX (default clang/clang++), FUZZ_JOBS (cores for the
# build, default 2), FUZZ_TARGETS (default "kineto_fuzzer nsys_fuzzer").
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "usage: $0 [SECONDS]" >&2
  exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="${FUZZ_JOBS:-2}"
targets="${FUZZ_TARGETS:-kineto_fuzzer nsys_fuzzer}"
export CC="${CC:-clang}" CXX="${CXX:-clang++}"

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags+=" -fno-omit-frame-pointer -g -O1"

# Configure every time (seconds when nothing changed) so that an interrupted
# or failed configure is redone; the generator is chosen only once.
generator=()
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build/CMakeCache.txt" ]; then
  generator=(-G Ninja)
fi
cmake -S "$root" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g -DCMAKE_C_FLAGS_DEBUG=-g \
  -DDYNAFLOW_BUILD_FUZZERS=ON -DDYNAFLOW_BUILD_TESTS=OFF \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags"
# shellcheck disable=SC2086
cmake --build "$build" --parallel "$jobs" --target $targets

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

max_len_of() {
  case "$1" in
    kineto_fuzzer) echo 65536 ;;
    nsys_fuzzer) echo 4096 ;;
    *) echo 4096 ;;
  esac
}

# Small real traces as extra seeds (the large ones exceed -max_len anyway).
seed_real_traces() {
  local target="$1" corpus="$2" traces="$root/../shared/traces"
  [ "$target" = kineto_fuzzer ] && [ -d "$traces/kineto" ] || return 0
  local f out
  for f in "$traces"/kineto/*.json.gz; do
    [ -e "$f" ] || continue
    out="$corpus/real_$(basename "$f" .json.gz).json"
    [ -e "$out" ] && continue
    if [ "$(gzip -dc "$f" | head -c 65537 | wc -c)" -le 65536 ]; then
      gzip -dc "$f" >"$out"
    fi
  done
}

# The lines of a sanitizer or libFuzzer log that say what and where.
report() {
  awk '/ERROR|runtime error|^[a-z]+_fuzzer: / && !started { print; started = 1; next }
       started && /^ +#[0-9]+ 0x/ && frames < 4 { print; frames++; next }
       /^SUMMARY/ { print; exit }' "$1" >&2
}

status=0
for target in $targets; do
  bin="$build/tests/fuzz/$target"
  name="${target%_fuzzer}"
  max_len="$(max_len_of "$target")"
  dict=()
  [ -f "$root/tests/fuzz/$name.dict" ] && dict=("-dict=$root/tests/fuzz/$name.dict")

  # 1. Known crashes must stay fixed.
  regressions="$root/tests/fuzz/regressions/$name"
  if compgen -G "$regressions/*" >/dev/null; then
    echo "== $target: replaying $regressions"
    for input in "$regressions"/*; do
      if ! "$bin" -rss_limit_mb=2048 -timeout=25 "$input" >"$build/$target.replay.log" 2>&1; then
        echo "FAIL: $target crashes on regression input $input" >&2
        report "$build/$target.replay.log"
        status=1
      fi
    done
  fi

  # 2. Fuzz.
  corpus="$build/corpus/$name"
  artifacts="$build/artifacts/$name"
  mkdir -p "$corpus" "$artifacts"
  seed_real_traces "$target" "$corpus"
  seeds=()
  [ -d "$root/tests/fuzz/corpus/$name" ] && seeds=("$root/tests/fuzz/corpus/$name")
  log="$build/$target.log"
  echo "== $target: fuzzing for ${seconds}s (log: $log)"
  set +e
  "$bin" "$corpus" "${seeds[@]}" "${dict[@]}" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len="$max_len" \
    -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)" "$log" |
    awk '!seen[$0]++' || true
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "FAIL: $target crashed (exit $rc)" >&2
    report "$log"
    saved="$(grep -Eo "Test unit written to [^ ]+" "$log" | awk '{print $NF}' | tail -1)"
    echo "crash input saved to: ${saved:-$artifacts/ (see $log)}" >&2
    echo "reproduce with: $bin <input>" >&2
  fi
done
exit "$status"
