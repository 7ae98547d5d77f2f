#!/usr/bin/env bash
# Idempotent set-up: installs missing Debian packages, configures and builds.
# Quick when everything is already in place. Usage: scripts/setup.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-${TT_BUILD_DIR:-$ROOT/build}}

PACKAGES=(cmake ninja-build g++ python3 python3-jsonschema python3-psutil
          clang-19 libclang-19-dev llvm-19-dev llvm-19-tools clang-tidy-19
          libgtest-dev libbenchmark-dev libopenblas-dev libtorch-dev python3-torch)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${TT_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$BUILD"
