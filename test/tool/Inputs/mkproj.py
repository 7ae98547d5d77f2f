#!/usr/bin/env python3
"""mkproj.py <dir> [variant]: a fresh copy of Inputs/driver at <dir> with its
compile_commands.json (compile_commands.<variant>.json.in) pointing there."""
import os
import shutil
import sys

src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "driver")
dst = os.path.abspath(sys.argv[1])
variant = sys.argv[2] + "." if len(sys.argv) > 2 else ""
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.json.in"))
with open(os.path.join(src, "compile_commands.%sjson.in" % variant)) as f:
    text = f.read().replace("@ROOT@", dst)
with open(os.path.join(dst, "compile_commands.json"), "w") as f:
    f.write(text)
