#!/usr/bin/env bash
# The sanitized run (docs/robustness.md): tensor-tidy, the clang-tidy module,
# the runtime and the test programs built with ASan+UBSan (clang-19,
# -DTT_SANITIZE=ON) in their own build directory, then the lit suites and the
# realistic suite run with them. A sanitizer report fails the test that
# triggered it (the tool aborts, the worker's crash is reported, exit 3).
#
#   scripts/sanitize-check.sh [suite ...]   default: checks analysis tool verify runtime realistic
#   scripts/sanitize-check.sh --build-only  configure and build only (scripts/fuzz.sh uses it)
#
# TT_ASAN_BUILD_DIR (default build-asan), TT_JOBS (default 2) for the build;
# TT_ASAN_OPT (default '-O1 -gline-tables-only') for our code's optimisation.
# The full run is not in CI (the build alone takes ~35 minutes on 2 cores); a
# CI-sized subset is, through scripts/sanitized-subset.sh.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TT_ASAN_BUILD_DIR:-$ROOT/build-asan}
JOBS=${TT_JOBS:-2}
OPT=${TT_ASAN_OPT:--O1 -gline-tables-only}
BUILD_ONLY=0
if [ "${1:-}" = "--build-only" ]; then BUILD_ONLY=1; shift; fi
SUITES=("$@")
((${#SUITES[@]})) || SUITES=(checks analysis tool verify runtime realistic)

# The sanitizer runtimes and clang's OpenMP (the runtime uses OpenMP).
missing=()
for p in libclang-rt-19-dev libomp-19-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "sanitize-check: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  # -O1 with line tables: readable stacks, and half the compile time of -O3.
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    "-DCMAKE_CXX_FLAGS_RELEASE=${OPT} -DNDEBUG" "-DCMAKE_C_FLAGS_RELEASE=${OPT} -DNDEBUG" \
    -DTT_SANITIZE=ON -DTT_ENABLE_CUDA=OFF ${TT_CMAKE_ARGS:-} >/dev/null
elif [ -n "${TT_CMAKE_ARGS:-}" ]; then
  cmake -B "$BUILD" ${TT_CMAKE_ARGS} >/dev/null
fi
ninja -C "$BUILD" -j"$JOBS" tensor-tidy TensorTidyModule tt_runtime ${TT_EXTRA_TARGETS:-}
((BUILD_ONLY)) && exit 0

PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
DIRS=()
for s in "${SUITES[@]}"; do DIRS+=("$BUILD/test/$s"); done
# The sanitized tool is 2-3x slower: a generous per-test limit.
exec "$PY" /usr/lib/llvm-19/build/utils/lit/lit.py -sv --timeout=1800 "${DIRS[@]}"
