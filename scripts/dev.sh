#!/usr/bin/env bash
# The two entry points of a fresh machine (Debian 12), both idempotent:
#   bash scripts/dev.sh demo   install what is needed, build, advise the bundled example
#   bash scripts/dev.sh test   install what is needed, build, run every test: unit and CLI
#                              tests, the same under ASan+UBSan, and each fuzzer for a while
# FUZZ_SECONDS (default 30) bounds each fuzzer's run in `test`.
# Both also create .venv (python3 -m venv) with the torch the torch extension is
# built against and the examples and tracing tests run with.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPS=(build-essential cmake ninja-build pkg-config python3 python3-dev python3-venv sqlite3 libsqlite3-dev
      libsqlitecpp-dev libcli11-dev nlohmann-json3-dev libsimdjson-dev zlib1g-dev
      libgtest-dev libgmock-dev clang libclang-rt-14-dev chromium)

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

# transformers: the apply tests run real Hugging Face models (tiny, built from
# configs, random weights: nothing is downloaded). jsonschema: plan_schema_test
# validates plans with it beside dynaflow's own validator. HolisticTraceAnalysis:
# hta_export_test reads dynaflow's exports with it. peft and accelerate:
# tests/hf/wrapped_models.py runs a model under LoRA adapters and accelerate's
# hooks.
VENV_PACKAGES=(torch==2.11.0 numpy==2.4.6 transformers==5.23.0 jsonschema==4.26.0
               HolisticTraceAnalysis==0.5.0 pandas==3.1.1 peft==0.22.0 accelerate==1.16.0)

# Creates .venv and installs VENV_PACKAGES when missing; a package-metadata
# check (no torch import) keeps the second run quick.
setup_venv() {
  local check='import importlib.metadata as m
assert m.version("torch").split("+")[0] == "2.11.0"
assert m.version("numpy") == "2.4.6"
assert m.version("transformers") == "5.23.0"
assert m.version("jsonschema") == "4.26.0"
assert m.version("HolisticTraceAnalysis") == "0.5.0"
assert m.version("pandas") == "3.1.1"
assert m.version("peft") == "0.22.0"
assert m.version("accelerate") == "1.16.0"'
  .venv/bin/python -c "$check" 2>/dev/null && return 0
  echo "dev.sh: installing ${VENV_PACKAGES[*]} into .venv" >&2
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "${VENV_PACKAGES[@]}"
}

# The torch extension is built against .venv's torch (DYNAFLOW_PYTHON's default).
build() {
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)"
}

case "${1:-}" in
  demo)
    install_deps
    setup_venv
    build
    ./build/cli/dynaflow advise examples/traces/llama_tp2_rank0.json.gz \
      examples/traces/llama_tp2_rank1.json.gz
    ;;
  test)
    install_deps
    setup_venv
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
