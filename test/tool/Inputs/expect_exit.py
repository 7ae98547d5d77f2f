#!/usr/bin/env python3
"""expect_exit.py <code> <command...>: runs the command (output passed
through) and fails unless it exits with exactly <code>."""
import subprocess
import sys

want = int(sys.argv[1])
try:
    got = subprocess.run(sys.argv[2:], timeout=300).returncode
except subprocess.TimeoutExpired:
    sys.exit("expect_exit: %s hung" % sys.argv[2])
if got != want:
    sys.exit("expect_exit: exit code %d, expected %d" % (got, want))
