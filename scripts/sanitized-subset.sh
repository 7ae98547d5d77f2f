#!/usr/bin/env bash
# The CI-sized sanitized run (docs/robustness.md), for scripts/run-tests.sh:
# builds tensor-tidy, the clang-tidy module and the runtime with ASan+UBSan in
# <build-dir> (our code at -O0: ~3 minutes on 2 cores, against ~35 for the full
# -O1 build) and prints, one per line, the tests to run with them: every
# check's tt test (the findings, the negatives, the fixed file compiled, the
# -run programs, themselves sanitized), the NOLINT test and the driver's
# crash-report test. The LibTorch variants (10+ s of parsing each) stay in the
# full run, scripts/sanitize-check.sh.
#   scripts/sanitized-subset.sh <build-dir>
# Prints nothing, and says why on stderr, when clang's sanitizer runtime or
# OpenMP is not installed (setup.sh installs it where it can). A failed build fails.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:?usage: sanitized-subset.sh <build-dir>}
# Both optional in setup.sh; sanitize-check.sh would try to install a missing one.
for p in libclang-rt-19-dev libomp-19-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    echo "sanitized subset skipped: $p is not installed" >&2
    exit 0
  fi
done
mkdir -p "$BUILD"
echo "sanitized subset: building in $BUILD (log: $BUILD/build.log)" >&2
if ! TT_ASAN_BUILD_DIR="$BUILD" TT_ASAN_OPT="-O0" \
    "$ROOT/scripts/sanitize-check.sh" --build-only >"$BUILD/build.log" 2>&1; then
  tail -20 "$BUILD/build.log" >&2
  echo "sanitized subset: the build failed" >&2
  exit 1
fi
for t in "$ROOT"/test/checks/*.cpp; do
  case "$t" in *-torch.cpp) continue ;; esac
  echo "$BUILD/test/checks/$(basename "$t")"
done
echo "$BUILD/test/tool/driver-crash-report.test"
