#!/usr/bin/env python3
"""project.py <src-dir> <dst> <flag>...: a fresh copy of <src-dir> at <dst>
with a compile_commands.json compiling each .cpp with clang++-19 <flag>..."""
import json
import os
import shutil
import sys

src, dst, flags = sys.argv[1], os.path.abspath(sys.argv[2]), sys.argv[3:]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
entries = []
for d, _, files in sorted(os.walk(dst)):
    for f in sorted(files):
        if f.endswith(".cpp"):
            path = os.path.join(d, f)
            entries.append({"directory": dst, "file": path,
                            "arguments": ["clang++-19", "-std=c++17"] + flags + ["-c", path]})
with open(os.path.join(dst, "compile_commands.json"), "w") as f:
    json.dump(entries, f, indent=1)
