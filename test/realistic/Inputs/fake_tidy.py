#!/usr/bin/env python3
"""Stands in for tensor-tidy in the scorer's self-test: reports one finding of
<check> on every line of the named files marked '// FAKE: <check>'. With
FAKE_EXIT set, exits with that status instead (a crash or a parse failure)."""
import json
import os
import re
import sys

if os.environ.get("FAKE_EXIT"):
    sys.exit(int(os.environ["FAKE_EXIT"]))
args = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
diags = []
for f in (a for a in args if not a.startswith("-")):
    for no, text in enumerate(open(f).read().splitlines(), 1):
        for check in re.findall(r"FAKE: ([a-z\-]+)", text):
            diags.append({"check": check, "level": "warning", "message": "fake", "file": f,
                          "line": no, "column": 1, "offset": 0, "notes": [], "fixes": []})
print(json.dumps({"tool": "tensor-tidy", "diagnostics": diags, "failures": [], "summary": {}}))
