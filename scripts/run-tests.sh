#!/usr/bin/env bash
# The whole test suite: set-up if needed, then every lit and unit suite, ending
# with the line 'N passed, N failed[, N skipped]'. Extra args go to lit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TT_BUILD_DIR:-$ROOT/build}
"$ROOT/scripts/setup.sh" "$BUILD"
PY=python3; [ -x /usr/bin/python3 ] && PY=/usr/bin/python3
exec "$PY" "$ROOT/scripts/run-lit.py" "$BUILD/test" "$@"
