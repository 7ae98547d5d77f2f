#!/usr/bin/env python3
"""project.py <dst> <src>... -- <flag>...: a fresh directory <dst> holding each
<src> (a file, or a directory's contents; <file>@<subdir> puts a copy of the
file in <dst>/<subdir>), with a compile_commands.json that compiles every .cpp
in it with clang++-19 -std=c++17 <flag>..."""
import json
import os
import shutil
import sys

args = sys.argv[1:]
split = args.index("--")
dst, sources, flags = os.path.abspath(args[0]), args[1:split], args[split + 1:]
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
for src in sources:
    src, _, subdir = src.partition("@")
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        os.makedirs(os.path.join(dst, subdir), exist_ok=True)
        shutil.copy(src, os.path.join(dst, subdir))
entries = []
for d, _, files in sorted(os.walk(dst)):
    for f in sorted(files):
        if f.endswith(".cpp"):
            path = os.path.join(d, f)
            entries.append({"directory": dst, "file": path,
                            "arguments": ["clang++-19", "-std=c++17"] + flags + ["-c", path]})
with open(os.path.join(dst, "compile_commands.json"), "w") as f:
    json.dump(entries, f, indent=1)
