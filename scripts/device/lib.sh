# Shared by the device scripts (sourced): the Debian packages the build needs
# beyond the device machine's CUDA image, and the wheel of the transformers
# version the tests pin (scripts/dev.sh; the machine's own is older), carried in
# .device-deps because the machine has no package registry, and the CMake
# configure that uses them.
# The caller sets `script` (its name, for messages).
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
deps="$root/.device-deps"
prefix=/tmp/dynaflow-device-deps
build="$root/build-device"
python="${PYTHON:-$(command -v python3 || true)}"

PACKAGES=(libsqlitecpp-dev libsqlite3-dev libsqlite3-0 libcli11-dev nlohmann-json3-dev
          libsimdjson-dev libsimdjson14 zlib1g-dev zlib1g)

die() {  # die CODE MESSAGE
  echo "$script: $2" >&2
  exit "$1"
}

# Here, once: downloads the packages into .device-deps (git-ignored, so the
# device tool carries it only when named in `carry`).
fetch() {
  mkdir -p "$deps"
  (cd "$deps" && apt-get download "${PACKAGES[@]}")
  local pin
  pin=$(grep -o 'transformers==[0-9.]*' "$root/scripts/dev.sh")
  "$python" -m pip download -q --no-deps --only-binary=:all: -d "$deps" "$pin"
  ls -l "$deps"
}

# Unpacks every carried package under $prefix (never into /): dpkg-deb where
# there is one, else ar and tar (tar detects the data member's compression).
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

# device_build TARGETS -- CMAKE_ARGS...: configures $build in Release with the
# unpacked packages first on every search path (what was carried is what is
# used) and builds TARGETS.
device_build() {
  local targets=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  local lib="$prefix/usr/lib/x86_64-linux-gnu"
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDYNAFLOW_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$lib/cmake;$prefix/usr/share/cmake" \
    -DCMAKE_LIBRARY_PATH="$lib" -DCMAKE_INCLUDE_PATH="$prefix/usr/include" "$@"
  cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
}

# Unpacks the carried packages when there are any, and puts the carried wheels
# first on PYTHONPATH; dies when a GPU run needs the packages and they are
# missing.
unpack_carried() {
  if compgen -G "$deps/*.deb" >/dev/null; then
    unpack
  elif [ "${1:-cuda}" = cuda ]; then
    die 2 "no $deps/*.deb: run 'bash scripts/device/$script.sh fetch' here and carry .device-deps"
  fi
  if compgen -G "$deps/*.whl" >/dev/null; then
    local site="$prefix/site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$deps"/*.whl || die 2 "the carried wheels did not install"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  fi
}

# check_machine DEVICE: what building and running the torch parts need, and
# for DEVICE=cuda a GPU that torch sees and nvcc; dies with code 2 otherwise.
check_machine() {
  [ -n "$python" ] || die 2 "no python3"
  "$python" -c 'import torch' 2>/dev/null || die 2 "$python cannot import torch"
  command -v cmake >/dev/null || die 2 "no cmake"
  command -v ninja >/dev/null || die 2 "no ninja"
  if [ "$1" = cuda ]; then
    "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' ||
      die 2 "torch sees no GPU (DEVICE=cpu for a dry run)"
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die 2 "no nvcc"
  fi
}
