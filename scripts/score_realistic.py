#!/usr/bin/env python3
"""Scores tensor-tidy on the realistic suite: per-check precision and recall.

Runs the tool once over every test/realistic/*.cpp (--format=json), matches
findings to '// EXPECT: <check>' annotations by (file, line, check) and counts
the rest as false alarms ('// LOOKALIKE: <check>' lines are counted apart).
Exit: 0 ok, 1 a check below its floor (--floors), 2 the tool failed.
"""
import argparse
import json
import pathlib
import subprocess
import sys

from realistic_facts import scan

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHECKS = ["tensor-alias-then-mutate", "tensor-reshape-non-contiguous",
          "tensor-view-non-contiguous", "tensor-inplace-on-detached", "tensor-clone-in-loop",
          "tensor-inplace-on-expanded", "tensor-inplace-overlap",
          "tensor-copy-narrowing", "tensor-device-mismatch",
          "tensor-inplace-on-leaf", "tensor-inplace-on-saved",
          "tensor-graph-kept-across-iterations",
          "tensor-unnecessary-clone", "tensor-sync-in-loop"]
TORCH_FLAGS = "-isystem /usr/include/torch/csrc/api/include"


class ToolFailure(Exception):
    pass


def annotations(files):
    """{(file, line, check)} expected and look-alike keys of the suite."""
    expected, lookalike = set(), set()
    for path in files:
        _, annots = scan(path)
        for no, kind, checks in annots:
            target = expected if kind == "EXPECT" else lookalike
            target.update((str(path), no, c) for c in checks)
    return expected, lookalike


def run_tool(tool, files, jobs, flags, cache_dir=None):
    cache = [f"--cache-dir={cache_dir}"] if cache_dir else ["--no-cache"]
    cmd = [tool, "--format=json", *cache, "--quiet", f"-j{jobs}", "--checks=-*,tensor-*",
           *map(str, files), "--", "-std=c++17", *flags.split()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise ToolFailure(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    report = json.loads(proc.stdout)
    if report.get("failures"):
        raise ToolFailure("; ".join(f"{f['file']}: {f['reason']}" for f in report["failures"]))
    return report["diagnostics"]


def findings(diags, suite_files):
    """{(file, line, check): message} for findings in suite files (one per key)."""
    known = {str(p.resolve()): str(p) for p in suite_files}
    out = {}
    for d in diags:
        file = known.get(str(pathlib.Path(d["file"]).resolve()))
        if file:
            out.setdefault((file, d["line"], d["check"]), d["message"])
    return out


def ratio(num, den):
    return round(num / den, 3) if den else 1.0


def score(expected, lookalike, found):
    rows = {}
    for check in CHECKS + ["all"]:
        mine = lambda keys: {k for k in keys if check in ("all", k[2])}  # noqa: E731
        exp, got, look = mine(expected), mine(found), mine(lookalike)
        tp, fa = exp & got, got - exp
        rows[check] = {"expected": len(exp), "found": len(tp), "missed": len(exp - got),
                       "false_alarms": len(fa), "on_lookalikes": len(fa & look),
                       "precision": ratio(len(tp), len(got)), "recall": ratio(len(tp), len(exp))}
    return rows


def print_table(rows):
    head = ["check", "expected", "found", "missed", "false alarms", "on look-alikes",
            "precision", "recall"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for check, r in rows.items():
        cells = [check, r["expected"], r["found"], r["missed"], r["false_alarms"],
                 r["on_lookalikes"], f"{r['precision']:.2f}", f"{r['recall']:.2f}"]
        print("| " + " | ".join(map(str, cells)) + " |")


def print_details(expected, found):
    for key in sorted(expected - found.keys()):
        print(f"MISS {key[0]}:{key[1]}: {key[2]}")
    for key in sorted(found.keys() - expected):
        print(f"FALSE ALARM {key[0]}:{key[1]}: {key[2]}: {found[key]}")


def below_floors(rows, floors):
    bad = []
    for check, floor in floors.items():
        for metric in ("precision", "recall"):
            if check in rows and rows[check][metric] < floor.get(metric, 0):
                bad.append(f"{check} {metric} {rows[check][metric]:.3f} < floor {floor[metric]}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensor-tidy", default=str(ROOT / "build" / "bin" / "tensor-tidy"))
    ap.add_argument("--suite", default=str(ROOT / "test" / "realistic"))
    ap.add_argument("--torch-flags", default=TORCH_FLAGS, help="include flags for LibTorch")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--cache-dir", help="tensor-tidy's result cache (keyed by the tool build): fast re-runs")
    ap.add_argument("--details", action="store_true", help="list every miss and false alarm")
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--floors", help="JSON {check: {precision, recall}}: exit 1 below them")
    args = ap.parse_args()
    files = sorted(pathlib.Path(args.suite).glob("*.cpp"))
    expected, lookalike = annotations(files)
    try:
        found = findings(run_tool(args.tensor_tidy, files, args.j, args.torch_flags, args.cache_dir), files)
    except (ToolFailure, OSError, json.JSONDecodeError) as e:
        print(f"score_realistic: tensor-tidy failed: {e}", file=sys.stderr)
        return 2
    rows = score(expected, lookalike, found)
    print(f"{len(files)} files, {len(expected)} expected findings, {len(lookalike)} look-alikes")
    print_table(rows)
    if args.details:
        print_details(expected, found)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    bad = below_floors(rows, json.loads(pathlib.Path(args.floors).read_text())) if args.floors else []
    for line in bad:
        print(f"BELOW FLOOR: {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
