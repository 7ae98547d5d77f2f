#!/usr/bin/env python3
"""Whole-project speed (issue 17): a LibTorch project of N TUs (bench/torch_project.py),
each configuration run once, cold (no result cache, no PCH from an earlier run):

  tensor-tidy -p -jJ            shared preamble built in the run (the default)
  tensor-tidy -p -jJ --no-pch   every TU parses torch/torch.h itself
  tensor-tidy -p -j1            for the -jJ speed-up
  clang++-19 -fsyntax-only      every TU, J at a time (the parse alone)
  run-clang-tidy-19 -jJ         bugprone-use-after-move,performance-unnecessary-copy-initialization

Wall time, peak RSS of the largest process (a worker, for tensor-tidy), and the
load average (1 min) before each run. Prints a table; --json writes the figures.

  bench/project_speed.py [--tensor-tidy PATH] [-n 40] [-j 2] [--work DIR] [--json FILE]
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch_project  # noqa: E402


def measure(cmd, cwd):
    """(wall seconds, peak RSS MiB of the process tree's largest process, exit code)."""
    start = time.monotonic()
    p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    return time.monotonic() - start, ru.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def syntax_only(project, jobs):
    """clang++-19 -fsyntax-only over every TU of the database, `jobs` at a time."""
    db = json.loads((project / "compile_commands.json").read_text())
    cmds = [[e["arguments"][0], "-fsyntax-only",
             *[a for a in e["arguments"][1:] if a not in ("-c",)][:-2]] for e in db]
    start, running, peak, failed = time.monotonic(), [], 0.0, 0
    while cmds or running:
        while cmds and len(running) < jobs:
            running.append(subprocess.Popen(cmds.pop(0), cwd=project, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL))
        pid, status, ru = os.wait4(-1, 0)
        running = [p for p in running if p.pid != pid]
        peak = max(peak, ru.ru_maxrss / 1024)
        failed += os.waitstatus_to_exitcode(status) != 0
    return time.monotonic() - start, peak, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensor-tidy", default=str(HERE.parent / "build" / "bin" / "tensor-tidy"))
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--work", default=str(HERE.parent / "build" / "bench-project"))
    ap.add_argument("--json")
    ap.add_argument("--skip", default="", help="comma-separated configurations to leave out")
    args = ap.parse_args()
    project = pathlib.Path(args.work)
    torch_project.make(project, args.n)
    tt, j = args.tensor_tidy, f"-j{args.j}"
    checks = "-*,bugprone-use-after-move,performance-unnecessary-copy-initialization"
    configs = {
        "tensor-tidy": [tt, "-p", ".", j, "--quiet", "--cache-dir=cache-pch", "-o", "out-pch.txt"],
        "tensor-tidy --no-pch": [tt, "-p", ".", j, "--quiet", "--no-cache", "-o", "out.txt"],
        "clang++ -fsyntax-only": None,
        "run-clang-tidy-19": ["run-clang-tidy-19", "-p", ".", "-j", str(args.j), "-quiet",
                              f"-checks={checks}"],
        "tensor-tidy -j1": [tt, "-p", ".", "-j1", "--quiet", "--cache-dir=cache-j1", "-o",
                            "out-j1.txt"],
    }
    rows = {}
    for name, cmd in configs.items():
        if name in args.skip.split(","):
            continue
        for d in ("cache-pch", "cache-j1"):
            shutil.rmtree(project / d, ignore_errors=True)
        load = os.getloadavg()[0]
        wall, rss, rc = syntax_only(project, args.j) if cmd is None else measure(cmd, project)
        rows[name] = {"wall_s": round(wall, 1), "peak_rss_mib": round(rss), "exit": rc,
                      "load1_before": round(load, 2)}
        print(f"{name:24} {wall:8.1f} s  peak {rss:6.0f} MiB  exit {rc}  load {load:.2f}",
              flush=True)
    base = rows.get("clang++ -fsyntax-only", {}).get("wall_s")
    ratios = {}
    if base and "tensor-tidy" in rows:
        ratios["tensor-tidy / fsyntax-only"] = rows["tensor-tidy"]["wall_s"] / base
    if "run-clang-tidy-19" in rows and "tensor-tidy" in rows:
        ratios["tensor-tidy / run-clang-tidy"] = (rows["tensor-tidy"]["wall_s"] /
                                                  rows["run-clang-tidy-19"]["wall_s"])
    if "tensor-tidy -j1" in rows and "tensor-tidy" in rows:
        ratios["-j1 / -jJ speed-up"] = rows["tensor-tidy -j1"]["wall_s"] / rows["tensor-tidy"]["wall_s"]
    for k, v in ratios.items():
        print(f"{k:32} {v:.2f}")
    outs = [project / o for o in ("out-pch.txt", "out.txt", "out-j1.txt") if (project / o).exists()]
    same = len({o.read_bytes() for o in outs}) == 1 if outs else None
    print(f"diagnostics identical across the tensor-tidy runs ({len(outs)}): {same}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"tus": args.n, "jobs": args.j, "runs": rows, "identical": same,
             "ratios": {k: round(v, 3) for k, v in ratios.items()}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
