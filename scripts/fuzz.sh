#!/usr/bin/env bash
# libFuzzer runs (docs/robustness.md): the fuzz targets (fuzz/) built on the
# sanitized build (scripts/sanitize-check.sh's, with -DTT_BUILD_FUZZ=ON), each
# run for a fixed budget from its seed corpus fuzz/corpus/<target>. The
# working corpus grows in <build>/fuzz-corpus/<target>; a crashing input is
# kept in <build>/fuzz-crashes/<target>/ and fails the run.
#
#   scripts/fuzz.sh [seconds-per-target (default 60)] [target ...]   targets: config compdb trace
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TT_ASAN_BUILD_DIR:-$ROOT/build-asan}
BUDGET=${1:-60}
shift || true
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=(config compdb trace)

EXTRA=""
for t in "${TARGETS[@]}"; do EXTRA+=" fuzz-$t"; done
TT_CMAKE_ARGS="-DTT_BUILD_FUZZ=ON" TT_EXTRA_TARGETS="$EXTRA" "$ROOT/scripts/sanitize-check.sh" --build-only

failed=0
for t in "${TARGETS[@]}"; do
  work=$BUILD/fuzz-corpus/$t crashes=$BUILD/fuzz-crashes/$t
  mkdir -p "$work" "$crashes"
  log=$BUILD/fuzz-$t.log
  set +e
  "$BUILD/bin/fuzz-$t" -max_total_time="$BUDGET" -max_len=4096 -timeout=10 -rss_limit_mb=3072 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$work" "$ROOT/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -aE '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  found=$(find "$crashes" -type f | wc -l)
  echo "fuzz-$t: ${BUDGET} s, ${execs:-0} execs, cov ${cov:-?}, ft ${ft:-?}, corpus ${corp:-?}, crashing inputs $found (exit $rc)"
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    failed=1
    grep -a -m1 -A30 -E "ERROR: (AddressSanitizer|libFuzzer|UndefinedBehaviorSanitizer)|runtime error:" "$log" || tail -30 "$log"
  fi
done
exit $failed
