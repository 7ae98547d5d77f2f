#!/usr/bin/env bash
# One run on a machine with an NVIDIA GPU (made for an H200, sm_90), under
# 8 minutes: build the runtime and the CUDA tests for sm_90 only, run the CUDA
# unit tests (kernels, allocator, backend consistency CPU vs CUDA), then the
# CUDA benchmarks. Results go to $OUT (if set) or the build dir:
#   gpu-check.log         everything printed
#   cuda_tests.xml        GoogleTest results
#   cuda_bench.txt        the benchmark table (docs/benchmarks.md format)
# Usage: scripts/gpu-check.sh [build-dir]   (default: build-gpu)
# Exit status: 0 when tests pass and every benchmark target is met.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
RESULTS=${OUT:-$BUILD}
mkdir -p "$BUILD" "$RESULTS"
LOG=$RESULTS/gpu-check.log
exec > >(tee "$LOG") 2>&1
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start ))s] $*"; }

step "machine"
nvidia-smi -L || echo "nvidia-smi: not found or failed (the tests will say why they skip)"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then echo "gpu-check: no nvcc found"; exit 2; fi
"$NVCC" --version | tail -1
JOBS=$(nproc)

step "configure (sm_90 only, runtime + tests, no LLVM checks)"
timeout 45 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTT_BUILD_TIDY=OFF -DTT_ENABLE_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCMAKE_CUDA_ARCHITECTURES=90-real >/dev/null || { echo "configure failed"; exit 2; }

step "build"
timeout 210 ninja -C "$BUILD" -j"$JOBS" tt_runtime tt_cuda_tests || { echo "build failed"; exit 2; }

step "CUDA unit tests (kernels, allocator, CPU-vs-CUDA consistency)"
timeout 90 "$BUILD/test/unit/tt_cuda_tests" --gtest_output=xml:"$RESULTS/cuda_tests.xml"
tests_rc=$?
skipped=$(grep -c '<skipped' "$RESULTS/cuda_tests.xml" 2>/dev/null || echo 0)
echo "tt_cuda_tests: exit $tests_rc, $skipped skipped"

step "CUDA benchmarks"
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
timeout 45 g++ -O2 -std=c++17 "$ROOT/bench/cuda_bench.cpp" -o "$BUILD/tt_cuda_bench" \
  -I"$ROOT/runtime/include" -I"$CUDA_HOME/include" -L"$BUILD/lib" -ltt_runtime \
  -L"$CUDA_HOME/lib64" -lcudart -Wl,-rpath,"$BUILD/lib:$CUDA_HOME/lib64" ||
  { echo "bench build failed"; exit 2; }
timeout 75 "$BUILD/tt_cuda_bench" "$RESULTS/cuda_bench.txt"
bench_rc=$?

step "done in $(( $(date +%s) - start ))s: tests exit $tests_rc, benchmarks exit $bench_rc"
echo "results: $RESULTS"
[ "$tests_rc" -eq 0 ] && [ "$skipped" -eq 0 ] && [ "$bench_rc" -eq 0 ]
