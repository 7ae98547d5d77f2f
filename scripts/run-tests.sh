#!/usr/bin/env bash
# The whole test suite: set-up if needed, then every lit and unit suite and a
# sanitized subset (scripts/sanitized-subset.sh; TT_SANITIZED_SUBSET=0 leaves
# it out), ending with the line 'N passed, N failed[, N skipped]'. Extra args
# go to lit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TT_BUILD_DIR:-$ROOT/build}
"$ROOT/scripts/setup.sh" "$BUILD"
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
SANITIZED=()
if [ "${TT_SANITIZED_SUBSET:-1}" != 0 ]; then
  LIST="$BUILD/sanitized-tests.txt"
  "$ROOT/scripts/sanitized-subset.sh" "$BUILD/sanitized" >"$LIST" || { echo "0 passed, 1 failed"; exit 1; }
  mapfile -t SANITIZED <"$LIST"
fi
exec "$PY" "$ROOT/scripts/run-lit.py" "$BUILD/test" "$@" "${SANITIZED[@]}"
