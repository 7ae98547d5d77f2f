#!/usr/bin/env python3
"""tensor-clangd in an editor's loop, measured through an LSP client on a
torch/torch.h TU (bench/clangd_common.py's project), all in one run with the
configurations interleaved:

  cold      wall time of `clang++-19 -fsyntax-only` on the TU (the baseline)
  first     didOpen -> first publishDiagnostics (preamble built, checks run)
  recheck   didChange -> publishDiagnostics of that version (preamble reused),
            the median over EDITS edits of the main file
  rss       the server's VmRSS with the TU open, after the edits

for tensor-clangd and, when installed, Debian's clangd-19 (with its defaults;
tensor-clangd adds the tensor-* checks). Both run with --background-index=false;
the servers' order alternates between reps. Targets (issue 16): recheck <= 0.15x
cold, first <= 1.15x clangd-19's.

  bench/clangd_latency.py [--build build] [--reps 3] [--edits 5] [--copies 4]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from clangd_common import LspClient, make_project


def cold_syntax_only(args):
    cmd = [args[0], "-fsyntax-only"] + [a for a in args[1:] if a != "-c"]
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def rss_mib(pid):
    for line in open("/proc/%d/status" % pid):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def session(server, work, src, edits):
    """One server lifetime: (first, [recheck...], rss MiB, tensor diagnostics)."""
    client = LspClient([server, "--background-index=false", "--log=error"], work)
    try:
        client.initialize(work)
        uri = "file://" + src
        text = open(src).read()
        start = time.monotonic()
        client.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "cpp", "version": 1, "text": text}})
        arrived, diags = client.wait_diagnostics(uri, 1)
        first = arrived - start
        found = sum(1 for d in diags if str(d.get("code", "")).startswith("tensor-"))
        rechecks = []
        for version in range(2, edits + 2):
            text += "int edited_%d() { return %d; }\n" % (version, version)
            start = time.monotonic()
            client.notify("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"text": text}]})
            arrived, _ = client.wait_diagnostics(uri, version)
            rechecks.append(arrived - start)
        return first, rechecks, rss_mib(client.proc.pid), found
    finally:
        client.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--edits", type=int, default=5)
    ap.add_argument("--copies", type=int, default=4)
    opts = ap.parse_args()
    servers = {"tensor-clangd": os.path.abspath(os.path.join(opts.build, "bin", "tensor-clangd"))}
    if not os.access(servers["tensor-clangd"], os.X_OK):
        sys.exit("error: %s not found (build the tensor-clangd target)" % servers["tensor-clangd"])
    if shutil.which("clangd-19"):
        servers["clangd-19"] = shutil.which("clangd-19")
    else:
        print("clangd-19 not installed (apt-get install clangd-19): no comparison", file=sys.stderr)
    cold, results = [], {name: {"first": [], "recheck": [], "rss": [], "found": 0}
                         for name in servers}
    load = []
    with tempfile.TemporaryDirectory() as work:
        src, args = make_project(work, opts.copies)
        cold_syntax_only(args)  # warm the page cache
        for rep in range(opts.reps):
            load.append(open("/proc/loadavg").read().split()[0])
            cold.append(cold_syntax_only(args))
            order = list(servers.items())
            for name, server in (order if rep % 2 == 0 else order[::-1]):
                first, rechecks, rss, found = session(server, work, src, opts.edits)
                r = results[name]
                r["first"].append(first)
                r["recheck"].append(statistics.median(rechecks))
                r["rss"].append(rss)
                r["found"] = found
    report(opts, load, cold, results)


def verdict(ok):
    return "met" if ok else "MISSED"


def report(opts, load, cold, results):
    base = statistics.median(cold)
    runs = lambda xs, fmt: " ".join(fmt % x for x in xs)
    print("TU: torch/torch.h + %d copies of model_code.inc; %d reps, %d edits each; "
          "1-min load average at each rep: %s" % (opts.copies, opts.reps, opts.edits, " ".join(load)))
    print("cold clang++-19 -fsyntax-only: %.2f s (median; runs: %s)" % (base, runs(cold, "%.2f")))
    for name, r in results.items():
        first, recheck = statistics.median(r["first"]), statistics.median(r["recheck"])
        print("%s: first diagnostics %.2f s (runs: %s); re-check %.3f s (runs: %s) = %.3fx cold "
              "(target <= 0.15x: %s); RSS %.0f MiB; %d tensor-* diagnostics" % (
                  name, first, runs(r["first"], "%.2f"), recheck, runs(r["recheck"], "%.3f"),
                  recheck / base, verdict(recheck / base <= 0.15), statistics.median(r["rss"]),
                  r["found"]))
    if "clangd-19" in results:
        ratio = statistics.median(results["tensor-clangd"]["first"]) / statistics.median(
            results["clangd-19"]["first"])
        print("first diagnostics, tensor-clangd / clangd-19: %.2fx (target <= 1.15x: %s)" % (
            ratio, verdict(ratio <= 1.15)))

if __name__ == "__main__":
    main()
