#!/usr/bin/env bash
# The two entry points of a fresh machine (Debian 12), both idempotent:
#   bash scripts/dev.sh demo   install what is needed, build, advise the bundled example
#   bash scripts/dev.sh test   install what is needed, build, run every test: unit and CLI
#                              tests, the same under ASan+UBSan, and each fuzzer for a while
# FUZZ_SECONDS (default 30) bounds each fuzzer's run in `test`.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPS=(build-essential cmake ninja-build pkg-config python3 sqlite3 libsqlite3-dev
      libsqlitecpp-dev libcli11-dev nlohmann-json3-dev libsimdjson-dev zlib1g-dev
      libgtest-dev libgmock-dev clang libclang-rt-14-dev)

install_deps() {
  local missing=()
  for pkg in "${DEPS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "dev.sh: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
}

case "${1:-}" in
  demo)
    install_deps
    build
    ./build/cli/dynaflow advise examples/traces/llama_tp2_rank0.json.gz \
      examples/traces/llama_tp2_rank1.json.gz
    ;;
  test)
    install_deps
    build
    ctest --test-dir build --output-on-failure -j"$(nproc)"
    bash scripts/sanitize.sh
    bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test" >&2
    exit 2
    ;;
esac
