#!/usr/bin/env python3
"""explain_all.py <tensor-tidy> <installed docs> <source docs>: every page in
the source tree is installed, and --explain prints each one."""
import os
import subprocess
import sys

exe, installed, source = sys.argv[1:4]
pages = sorted(f for f in os.listdir(source) if f.endswith(".md")) if os.path.isdir(source) else []
for page in pages:
    check = page[:-3]
    if not os.path.isfile(os.path.join(installed, page)):
        sys.exit("%s is not installed" % page)
    out = subprocess.run([exe, "--explain", check], capture_output=True, text=True)
    want = open(os.path.join(source, page), encoding="utf-8").read()
    if out.returncode != 0 or out.stdout != want:
        sys.exit("--explain %s: exit %d, %s" % (check, out.returncode, out.stderr.strip()))
print("%d page(s)" % len(pages))
