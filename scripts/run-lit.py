#!/usr/bin/env python3
"""Runs every lit suite of a build (checks, driver, runtime end-to-end, unit
tests) in one lit process and ends with the one summary line CI reads:
'N passed, N failed[, N skipped]'. Exit status 1 when anything failed."""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

LIT = "/usr/lib/llvm-19/build/utils/lit/lit.py"


def main():
    build_test = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/test")
    extra = sys.argv[2:]
    suites = [build_test, os.path.join(build_test, "unit")]
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "results.xml")
        cmd = [sys.executable, LIT, "-sv", "--xunit-xml-output", xml]
        try:
            import psutil  # noqa: F401  (lit needs it for per-test timeouts)
            # A hung test fails on its own instead of stalling CI.
            cmd.append("--timeout=%s" % os.environ.get("TT_LIT_TIMEOUT", "900"))
        except ImportError:
            pass
        cmd += extra + suites
        rc = subprocess.call(cmd)
        if not os.path.exists(xml):
            print("0 passed, 1 failed")
            return 1
        passed = failed = skipped = 0
        for case in ET.parse(xml).getroot().iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.find("skipped") is not None:
                skipped += 1
            else:
                passed += 1
    line = "%d passed, %d failed" % (passed, failed)
    if skipped:
        line += ", %d skipped" % skipped
    print(line)
    return 1 if failed or rc or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
