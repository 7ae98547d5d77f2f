#!/usr/bin/env python3
"""mkpch.py <dir> <runtime-include> [fixture]: a fresh copy of Inputs/<fixture>
(default: pch) at <dir> with its compile_commands.json pointing there and at
the runtime's headers."""
import os
import shutil
import sys

fixture = sys.argv[3] if len(sys.argv) > 3 else "pch"
src = os.path.join(os.path.dirname(os.path.abspath(__file__)), fixture)
dst = os.path.abspath(sys.argv[1])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.json.in"))
with open(os.path.join(src, "compile_commands.json.in")) as f:
    text = f.read().replace("@ROOT@", dst).replace("@RT@", os.path.abspath(sys.argv[2]))
with open(os.path.join(dst, "compile_commands.json"), "w") as f:
    f.write(text)
