#!/usr/bin/env bash
# Idempotent set-up: installs missing Debian packages, configures and builds.
# Quick when everything is already in place. Usage: scripts/setup.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${TT_BUILD_DIR:-$ROOT/build}}

PACKAGES=(cmake ninja-build g++ python3 python3-jsonschema python3-psutil
          clang-19 libclang-19-dev llvm-19-dev llvm-19-tools clang-tidy-19
          libgtest-dev libbenchmark-dev libopenblas-dev libtorch-dev python3-torch)
# Optional: tensor-clangd links clangd's libraries, which need grpc/protobuf/absl;
# its editor test drives Neovim; the sanitized subset needs clang's sanitizer
# runtime and OpenMP. Without them that target and those tests are skipped.
OPTIONAL=(libgrpc++-dev libprotobuf-dev libabsl-dev neovim libclang-rt-19-dev libomp-19-dev)
not_installed() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(not_installed "${PACKAGES[@]}")
mapfile -t missing_optional < <(not_installed "${OPTIONAL[@]}")
if ((${#missing[@]} + ${#missing_optional[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq || [ ${#missing[@]} -eq 0 ]  # optional ones may fail
fi
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ((${#missing_optional[@]})); then
  echo "setup: installing optional ${missing_optional[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${missing_optional[@]}" >/dev/null ||
    echo "setup: optional packages not installed; tensor-clangd or its editor test will be skipped" >&2
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${TT_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$BUILD"
