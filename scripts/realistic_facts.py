#!/usr/bin/env python3
"""Checks with PyTorch every '// FACT: <python>' line of the realistic suite.

Each FACT runs in a fresh namespace holding torch and the helpers below; it
fails when it raises (an assert included). Annotations of the checks whose
verdict rests on a layout or alias fact must have a FACT in the lines above.
Usage: realistic_facts.py [--suite DIR] [files...]. Exit 1 on any failure.
"""
import argparse
import pathlib
import re
import sys
import traceback

FACT_RE = re.compile(r"//\s*FACT:\s*(.+)$")
# One line may carry an EXPECT and a LOOKALIKE (of other checks), each with its own "-- why".
ANNOT_RE = re.compile(r"//\s*(EXPECT|LOOKALIKE):\s*([a-z\-, ]+?)"
                      r"(?=\s+--|\s*//\s*(?:EXPECT|LOOKALIKE):|\s*$)")
# Checks whose annotations must be backed by a FACT (the layout/alias ones).
NEEDS_FACT = {"tensor-alias-then-mutate", "tensor-reshape-non-contiguous",
              "tensor-inplace-on-expanded", "tensor-inplace-overlap",
              "tensor-view-non-contiguous"}
FACT_WINDOW = 15  # a FACT up to this many lines above the annotated line counts


def shares_storage(a, b):
    return a.storage().data_ptr() == b.storage().data_ptr()


def is_view_of(out, base):
    """out is a view (no copy) over base's storage."""
    return out._is_view() and shares_storage(out, base)


def is_copy_of(out, src):
    """out owns new storage: writing it cannot change src."""
    return not shares_storage(out, src)


def is_contiguous(t):
    return t.is_contiguous()


def raises(fn, msg=""):
    """fn() raises an exception whose text contains msg."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any torch error is the fact checked
        return msg in str(e)
    return False


def backward_fails(fn):
    """fn() (which should call backward) raises autograd's in-place error."""
    return raises(fn, "modified by an inplace operation")


def kept_nodes(objs):
    """Autograd nodes reachable from the tensors in objs (a tensor, a list or a
    dict of them): what keeping them keeps alive."""
    if isinstance(objs, dict):
        objs = list(objs.values())
    elif not isinstance(objs, (list, tuple)):
        objs = [objs]
    seen, stack = set(), [t.grad_fn for t in objs if getattr(t, "grad_fn", None) is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(nf for nf, _ in fn.next_functions)
    return len(seen)


def helpers():
    import torch
    return {"torch": torch, "shares_storage": shares_storage, "is_view_of": is_view_of,
            "is_copy_of": is_copy_of, "is_contiguous": is_contiguous, "raises": raises,
            "backward_fails": backward_fails, "kept_nodes": kept_nodes}


def scan(path):
    """(facts, annotations): [(line, code)], [(line, kind, [checks])]."""
    facts, annots = [], []
    for no, text in enumerate(path.read_text().splitlines(), 1):
        m = FACT_RE.search(text)
        if m:
            facts.append((no, m.group(1).strip()))
            continue
        for m in ANNOT_RE.finditer(text):
            checks = [c.strip() for c in m.group(2).split(",") if c.strip()]
            annots.append((no, m.group(1), checks))
    return facts, annots


def run_fact(code, base):
    try:
        exec(compile(code, "<FACT>", "exec"), dict(base))
        return None
    except Exception:  # noqa: BLE001
        return traceback.format_exc(limit=1).strip().splitlines()[-1]


def unbacked(facts, annots):
    """Annotated lines of NEEDS_FACT checks with no FACT in the window above."""
    lines = [no for no, _ in facts]
    out = []
    for no, kind, checks in annots:
        if NEEDS_FACT.intersection(checks) and not any(no - FACT_WINDOW <= f < no for f in lines):
            out.append((no, kind, checks))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = pathlib.Path(__file__).resolve().parent.parent
    ap.add_argument("--suite", default=str(root / "test" / "realistic"))
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    files = [pathlib.Path(f) for f in args.files] or sorted(pathlib.Path(args.suite).glob("*.cpp"))
    if not files:
        print("realistic_facts: no files", file=sys.stderr)
        return 1
    base = helpers()
    failures = total = 0
    for path in files:
        facts, annots = scan(path)
        for no, code in facts:
            total += 1
            err = run_fact(code, base)
            if err:
                failures += 1
                print(f"{path}:{no}: FACT failed: {err}\n    {code}")
        for no, kind, checks in unbacked(facts, annots):
            failures += 1
            print(f"{path}:{no}: {kind} {', '.join(checks)} has no FACT line above it")
    print(f"realistic_facts: {total} facts in {len(files)} files, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
