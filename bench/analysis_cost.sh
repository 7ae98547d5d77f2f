#!/usr/bin/env bash
# Cost of the alias analysis (tensor-alias-then-mutate + tensor-inplace-on-detached)
# relative to `clang++-19 -fsyntax-only` on the same TU, for a TU that includes
# torch/torch.h and for a tt TU. CPU time (user+sys) of each child, median of
# REPS runs, the configurations interleaved so that machine noise hits all alike.
#
#   bench/analysis_cost.sh [BUILD_DIR] [REPS] [COPIES]
#
# COPIES: how many namespaces of bench/analysis_inputs/model_code.inc the TU holds
# (1: a typical source file; more: a larger file with the same headers).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
REPS="${2:-5}"
COPIES="${3:-1}"
TIDY="$BUILD/bin/tensor-tidy"
[[ -x "$TIDY" ]] || { echo "error: $TIDY not found (build the tensor-tidy target)" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

make_tu() { # $1 = torch|tt
  {
    if [[ $1 == torch ]]; then echo '#include <torch/torch.h>'; echo 'namespace T = torch;'
    else echo '#include "tt/tt.h"'; echo 'namespace T = tt;'; fi
    echo '#include <vector>'
    for ((i = 0; i < COPIES; i++)); do
      echo "namespace copy$i {"; echo "#include \"$ROOT/bench/analysis_inputs/model_code.inc\""; echo "}"
    done
  } > "$WORK/$1.cpp"
}
make_tu torch
make_tu tt
TORCH_FLAGS="-isystem /usr/include/torch/csrc/api/include"
TT_FLAGS="-I$ROOT/runtime/include"

python3 - "$WORK" "$TIDY" "$REPS" "$TORCH_FLAGS" "$TT_FLAGS" "$COPIES" <<'PY'
import os, shlex, statistics, subprocess, sys
work, tidy, reps, torch_flags, tt_flags, copies = sys.argv[1:]
reps = int(reps)
checks = "--checks=-*,tensor-alias-then-mutate,tensor-inplace-on-detached"

def cpu(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        sys.exit("failed: " + " ".join(cmd))
    return ru.ru_utime + ru.ru_stime

print("TU        COPIES  fsyntax-only(s)  tensor-tidy 2 checks(s)  added")
for name, flags in (("torch", torch_flags), ("tt", tt_flags)):
    src = os.path.join(work, name + ".cpp")
    cc = ["-std=c++17"] + shlex.split(flags)
    base = ["clang++-19", "-fsyntax-only"] + cc + [src]
    with_checks = [tidy, src, checks, "--quiet", "--"] + cc
    cpu(base); cpu(with_checks)  # warm the page cache
    a, b = [], []
    for _ in range(reps):
        a.append(cpu(base))
        b.append(cpu(with_checks))
    ma, mb = statistics.median(a), statistics.median(b)
    print("%-9s %6s  %15.3f  %23.3f  %+5.1f%%" % (name, copies, ma, mb, 100 * (mb - ma) / ma))
PY
