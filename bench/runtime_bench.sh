#!/usr/bin/env bash
# Builds and runs the runtime benchmarks (tt vs LibTorch 1.13 and memcpy, tt vs
# tt without trace support) and prints the ratio table of docs/benchmarks.md.
#   bench/runtime_bench.sh [--markdown] [--reps=N] [--threads=1,2] [Google Benchmark flags]
# BUILD=<dir> picks the build directory (default build-bench).
# Exit status: 0 every target met, 1 a target missed (listed last), 2 setup failed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-bench}
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTT_BUILD_BENCH=ON \
  -DTT_BUILD_TIDY=OFF -DTT_BUILD_TESTS=OFF -DTT_ENABLE_CUDA=OFF >/dev/null
ninja -C "$BUILD" -j2 runtime_bench >/dev/null
exec "$BUILD/bin/runtime_bench" --benchmark_enable_random_interleaving=true "$@"
