#!/usr/bin/env python3
"""Runs tensor-* checks on one test file and matches the results, in the spirit
of clang-tidy's check_clang_tidy.py.

  check_tensor_tidy.py [options] <file> <checks> <temp> [-- <tool args> [-- <compiler args>]]

* the file is copied to <temp>.cpp with its CHECK lines blanked (line numbers kept);
* the checks run on the copy with fixes applied (tensor-tidy, or stock
  clang-tidy-19 --load=<module> with --runner=clang-tidy);
* CHECK-MESSAGES[-SUFFIX] lines are matched against the diagnostics, and any
  warning or error they do not name fails the test;
* CHECK-FIXES[-SUFFIX] lines are matched against the fixed file;
* with --compile-fixed the fixed file must still compile (clang++-19 -fsyntax-only).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys


def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensor-tidy", required=True)
    p.add_argument("--module", required=True)
    p.add_argument("--tt-include", required=True)
    p.add_argument("--runner", choices=["tensor-tidy", "clang-tidy"], default="tensor-tidy")
    p.add_argument("--clang-tidy", default="clang-tidy-19",
                   help="the clang-tidy command for --runner=clang-tidy (a sanitized build "
                        "preloads ASan's runtime)")
    p.add_argument("--check-suffix", "--check-suffixes", dest="suffixes", default="",
                   help="comma-separated suffixes: CHECK-MESSAGES-<S>, CHECK-FIXES-<S>")
    p.add_argument("--std", default="c++17")
    p.add_argument("--compile-fixed", action="store_true")
    p.add_argument("--expect-clang-tidy-error", action="store_true")
    p.add_argument("input")
    p.add_argument("checks")
    p.add_argument("temp")
    # Split on '--' ourselves: argparse swallows a leading '--', which made
    # '-- -- <compiler args>' (no tool args) lose the compiler args.
    argv = sys.argv[1:]
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    a = p.parse_args(own)

    if "--" in rest:
        i = rest.index("--")
        tool_args, cc_args = rest[:i], rest[i + 1:]
    else:
        tool_args, cc_args = rest, []
    cc_args = ["-std=" + a.std, "-I" + a.tt_include] + cc_args

    suffixes = [s.strip() for s in a.suffixes.split(",") if s.strip()] or [""]
    msg_prefixes = ["CHECK-MESSAGES" + ("-" + s if s else "") for s in suffixes]
    fix_prefixes = ["CHECK-FIXES" + ("-" + s if s else "") for s in suffixes]

    with open(a.input, encoding="utf-8") as f:
        text = f.read()
    has_msgs = any(re.search(r"\b%s:" % re.escape(pr), text) for pr in msg_prefixes)
    has_fixes = any(re.search(r"\b%s:" % re.escape(pr), text) for pr in fix_prefixes)
    # Blank CHECK comments so that fix-its and messages never match themselves.
    cleaned = re.sub(r"//\s*CHECK-[A-Z0-9\-]*:[^\r\n]*", "//", text)
    temp = a.temp + (os.path.splitext(a.input)[1] or ".cpp")
    os.makedirs(os.path.dirname(os.path.abspath(temp)), exist_ok=True)
    with open(temp, "w", encoding="utf-8") as f:
        f.write(cleaned)

    checks = "-*," + a.checks
    if a.runner == "tensor-tidy":
        cmd = [a.tensor_tidy, temp, "--fix", "--checks=" + checks] + tool_args + ["--"] + cc_args
    else:
        cmd = shlex.split(a.clang_tidy) + ["--load=" + a.module, temp, "--fix", "--checks=" + checks,
               "--quiet"] + tool_args + ["--"] + cc_args
    res = run(cmd)
    out = res.stdout
    print("Running: " + " ".join(shlex.quote(c) for c in cmd))
    print("------------------------ tool output -----------------------")
    print(out)
    print("------------------------------------------------------------")
    compile_errors = [l for l in out.splitlines()
                      if re.search(r": error: ", l) and not re.search(r"\[tensor-[\w-]+\]$", l)]
    if not a.expect_clang_tidy_error and (res.returncode not in (0, 1, 3) or compile_errors):
        # A test input that does not compile is a broken test, not a finding.
        sys.exit("the tool failed (exit %d) or the input does not compile" % res.returncode)
    filecheck = "/usr/lib/llvm-19/bin/FileCheck"

    # Keep only diagnostics (not the source excerpts) about the temp file.
    diag_lines = [l for l in out.splitlines()
                  if re.match(r"^.*:\d+:\d+: (warning|error|note): ", l)]
    msgs_file = a.temp + ".msg"
    with open(msgs_file, "w", encoding="utf-8") as f:
        f.write("\n".join(diag_lines) + "\n")

    failed = False
    if has_msgs:
        for pr in msg_prefixes:
            r = run([filecheck, "-input-file=" + msgs_file, a.input, "-check-prefix=" + pr,
                     "-implicit-check-not={{warning|error}}:"])
            if r.returncode:
                print(r.stdout)
                failed = True
    else:
        stray = [l for l in diag_lines if re.search(r": (warning|error): ", l)]
        if stray:
            print("unexpected diagnostics (the test has no CHECK-MESSAGES):\n" + "\n".join(stray))
            failed = True
    if has_fixes:
        for pr in fix_prefixes:
            r = run([filecheck, "-input-file=" + temp, a.input, "-check-prefix=" + pr,
                     "-strict-whitespace"])
            if r.returncode:
                print(r.stdout)
                failed = True
    if a.compile_fixed:
        r = run(["clang++-19", "-fsyntax-only"] + cc_args + [temp])
        if r.returncode:
            print("the fixed file does not compile:\n" + r.stdout)
            failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
