#!/usr/bin/env python3
"""same_diagnostics.py <tensor-tidy.json> <nvim_lsp.lua output>: the tensor-*
diagnostics the CLI reported and those tensor-clangd published must be the same:
check, severity, message (clangd capitalises it and appends ' (fix[es] available)'),
the CLI's point inside the LSP range, and the same notes (but clang's "expanded
from macro" notes, which clangd leaves out). Prints the differences and exits 1,
or prints one summary line."""
import json
import re
import sys

MACRO_NOTE = re.compile(r"expanded from macro '.*'$")
FIXES = re.compile(r" \(fix(es)? available\)$")
LINE = re.compile(r"^(DIAG|NOTE) \S+?:(\d+):(\d+)-(\d+):(\d+) (?:(\w+) \[(\S+)\] )?(.*)$")


def text(message):
    message = FIXES.sub("", message)
    return message[:1].lower() + message[1:]


def lsp_diagnostics(path):
    diags = []
    for line in open(path):
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        kind, l1, c1, l2, c2, severity, code, message = m.groups()
        span = ((int(l1), int(c1)), (int(l2), int(c2)))
        if kind == "DIAG":
            diags.append({"check": code, "level": severity, "message": text(message),
                          "span": span, "notes": []})
        elif diags:
            diags[-1]["notes"].append({"span": span, "message": text(message)})
    return [d for d in diags if d["check"].startswith("tensor-")]


def contains(span, line, column):
    return span[0] <= (line, column) <= span[1]


def compared_notes(cli):
    return [n for n in cli.get("notes", []) if not MACRO_NOTE.match(n["message"])]


def same(cli, lsp):
    if (cli["check"], cli["level"], text(cli["message"])) != (
            lsp["check"], lsp["level"], lsp["message"]):
        return False
    if not contains(lsp["span"], cli["line"], cli["column"]):
        return False
    notes = compared_notes(cli)
    return len(notes) == len(lsp["notes"]) and all(
        text(n["message"]) == m["message"] and contains(m["span"], n["line"], n["column"])
        for n, m in zip(notes, lsp["notes"]))


def main():
    cli = [d for d in json.load(open(sys.argv[1]))["diagnostics"]
           if d["check"].startswith("tensor-")]
    lsp = lsp_diagnostics(sys.argv[2])
    unmatched = list(lsp)
    missing = []
    for d in cli:
        match = next((m for m in unmatched if same(d, m)), None)
        if match is None:
            missing.append(d)
        else:
            unmatched.remove(match)
    for d in missing:
        print("only in the CLI: %d:%d [%s] %s" % (d["line"], d["column"], d["check"], d["message"]))
    for d in unmatched:
        print("only in tensor-clangd: %s [%s] %s" % (d["span"], d["check"], d["message"]))
    if missing or unmatched or not cli:
        return 1
    print("same %d diagnostics (%d notes) from %d checks" % (
        len(cli), sum(len(compared_notes(d)) for d in cli), len({d["check"] for d in cli})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
