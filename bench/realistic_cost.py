#!/usr/bin/env python3
"""CPU cost of tensor-tidy (all checks) against clang++-19 -fsyntax-only on
realistic LibTorch TUs (test/realistic/), the two commands alternated per
file, CPU time (user+sys) of the children summed. Prints the ratio and the
load average. Usage: bench/realistic_cost.py BUILD_DIR [N_FILES]"""
import os
import pathlib
import resource
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCH = ["-isystem", "/usr/include/torch/csrc/api/include"]


def cpu_of(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main():
    build = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "build")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    files = sorted((ROOT / "test/realistic").glob("*.cpp"))[:n]
    load = os.getloadavg()[0]
    syntax = tidy = 0.0
    for f in files:
        syntax += cpu_of(["clang++-19", "-std=c++17", "-fsyntax-only", *TORCH, str(f)])
        tidy += cpu_of([str(build / "bin/tensor-tidy"), "--no-cache", "--quiet", "-j1",
                        "--checks=-*,tensor-*", str(f), "--", "-std=c++17", *TORCH])
    print("%d TUs: clang++-19 -fsyntax-only %.1f s CPU, tensor-tidy %.1f s CPU: %.2fx "
          "(target <= 1.10); load average %.1f at start, %.1f at end"
          % (len(files), syntax, tidy, tidy / syntax, load, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
