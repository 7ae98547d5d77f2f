#!/usr/bin/env python3
"""Benchmark of the tensor-tidy driver on a generated project (not a test).

  bench/driver_bench.py --tensor-tidy build/bin/tensor-tidy [--tus 56] [-j 2] [--repeat 1]

Generates a project of --tus translation units (some include torch/torch.h,
some the tt runtime, the rest only the standard library), writes its
compile_commands.json, and times, in one run and on the same TUs:

  syntax   clang++-19 -fsyntax-only, -j workers
  tidy     tensor-tidy, all checks, -j workers, no cache
  rct      run-clang-tidy-19 -j, bugprone-use-after-move and
           performance-unnecessary-copy-initialization
  tidy1    tensor-tidy -j1, no cache
  cold     tensor-tidy -j, empty cache; warm: the same again (cache hits)

and prints each target ratio with met/missed. Each time is the best of
--repeat runs. Needs the LLVM 19 tools and the LibTorch headers.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# /usr/include itself is searched already (as -isystem it would break #include_next).
TORCH_FLAGS = ["-isystem", "/usr/include/torch/csrc/api/include"]

TORCH_TU = """#include <torch/torch.h>
#include <vector>

namespace bench{i} {{
torch::Tensor flat(const torch::Tensor &x) {{ return x.t().contiguous().view({{-1}}); }}
torch::Tensor step(torch::Tensor w, const torch::Tensor &g, double lr) {{
  torch::NoGradGuard guard;
  w.sub_(g * lr);
  return w;
}}
std::vector<torch::Tensor> batches(const torch::Tensor &data, int64_t n) {{
  std::vector<torch::Tensor> out;
  for (int64_t k = 0; k < n; ++k)
    out.push_back(data.narrow(0, k, 1).reshape({{-1}}));
  return out;
}}
torch::Tensor hazard() {{
  auto x = torch::ones({{2, 3}});
  return x.t().view({{6}});
}}
}} // namespace bench{i}
"""

TT_TU = """#include <tt/tt.h>
#include <vector>

namespace bench{i} {{
tt::Tensor flat(const tt::Tensor &x) {{ return x.t().contiguous().view({{-1}}); }}
tt::Tensor scale(tt::Tensor x, double s) {{
  auto y = x.mul(tt::Tensor(x));
  return y;
}}
std::vector<tt::Tensor> rows(const tt::Tensor &m, int64_t n) {{
  std::vector<tt::Tensor> out;
  for (int64_t k = 0; k < n; ++k)
    out.push_back(m.select(0, k));
  return out;
}}
tt::Tensor hazard() {{
  auto x = tt::ones({{2, 3}});
  return x.t().view({{6}});
}}
}} // namespace bench{i}
"""

STD_TU = """#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace bench{i} {{
std::map<std::string, int> count(const std::vector<std::string> &words) {{
  std::map<std::string, int> m;
  for (const auto &w : words)
    ++m[w];
  return m;
}}
std::vector<int> sorted(std::vector<int> v) {{
  std::sort(v.begin(), v.end());
  return v;
}}
}} // namespace bench{i}
"""


def generate(out, tus, torch_tus, tt_tus):
    os.makedirs(os.path.join(out, "src"), exist_ok=True)
    cmds = []
    for i in range(tus):
        if i < torch_tus:
            text, flags = TORCH_TU, TORCH_FLAGS
        elif i < torch_tus + tt_tus:
            text, flags = TT_TU, ["-I" + os.path.join(ROOT, "runtime", "include")]
        else:
            text, flags = STD_TU, []
        name = "src/tu%03d.cpp" % i
        with open(os.path.join(out, name), "w") as f:
            f.write(text.format(i=i))
        cmds.append({"directory": out, "file": name,
                     "arguments": ["clang++-19", "-std=c++17"] + flags + ["-c", name, "-o", name + ".o"]})
    with open(os.path.join(out, "compile_commands.json"), "w") as f:
        json.dump(cmds, f, indent=1)
    return cmds


def timed(fn, repeat):
    best = None
    for _ in range(repeat):
        t = time.monotonic()
        fn()
        dt = time.monotonic() - t
        best = dt if best is None else min(best, dt)
    return best


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tensor-tidy", default=os.path.join(ROOT, "build", "bin", "tensor-tidy"))
    p.add_argument("--tus", type=int, default=56)
    p.add_argument("--torch-tus", type=int, default=4)
    p.add_argument("--tt-tus", type=int, default=25)
    p.add_argument("-j", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--keep", help="generate the project here and keep it")
    a = p.parse_args()

    out = a.keep or tempfile.mkdtemp(prefix="tt-driver-bench-")
    cmds = generate(out, a.tus, a.torch_tus, a.tt_tus)
    tidy = os.path.abspath(a.tensor_tidy)

    def syntax():
        def one(c):
            r = subprocess.run(["clang++-19", "-fsyntax-only"] + c["arguments"][1:-2], cwd=out,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if r.returncode:
                sys.exit("clang++-19 failed on " + c["file"])
        with concurrent.futures.ThreadPoolExecutor(a.j) as pool:
            list(pool.map(one, cmds))

    def tensor_tidy(jobs, *extra):
        r = subprocess.run([tidy, "-p", out, "-j", str(jobs), "--quiet"] + list(extra),
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode not in (0, 1):
            sys.exit("tensor-tidy failed (%d):\n%s" % (r.returncode, r.stdout[-3000:]))
        return r

    def rct():
        r = run(["run-clang-tidy-19", "-p", out, "-j", str(a.j), "-quiet",
                 "-checks=-*,bugprone-use-after-move,performance-unnecessary-copy-initialization"])
        if "error:" in r.stdout and "[clang-diagnostic-error]" in r.stdout:
            sys.exit("run-clang-tidy-19 failed:\n" + r.stdout[-3000:])

    cache = os.path.join(out, "bench-cache")
    t = {}
    # Interleaved, so that load from other work hits every side alike.
    t["syntax"] = timed(syntax, a.repeat)
    last = {}
    def tidy_json():
        last["out"] = tensor_tidy(a.j, "--no-cache", "--format=json").stdout
    t["tidy"] = timed(tidy_json, a.repeat)
    t["rct"] = timed(rct, a.repeat)
    t["tidy1"] = timed(lambda: tensor_tidy(1, "--no-cache"), a.repeat)
    cold, warm = [], []
    for _ in range(a.repeat):
        shutil.rmtree(cache, ignore_errors=True)
        cold.append(timed(lambda: tensor_tidy(a.j, "--cache-dir", cache), 1))
        warm.append(timed(lambda: tensor_tidy(a.j, "--cache-dir", cache), 1))
    t["cold"], t["warm"] = min(cold), min(warm)
    n = len(json.loads(last["out"])["diagnostics"])

    print("project: %d TUs (%d torch/torch.h, %d tt, %d std), %d findings, -j%d, best of %d"
          % (a.tus, a.torch_tus, a.tt_tus, a.tus - a.torch_tus - a.tt_tus, n, a.j, a.repeat))
    for k in ("syntax", "tidy", "rct", "tidy1", "cold", "warm"):
        print("  %-7s %8.2f s" % (k, t[k]))
    rows = [
        ("tensor-tidy / clang++-19 -fsyntax-only", t["tidy"] / t["syntax"], "<=", 1.10),
        ("tensor-tidy / run-clang-tidy-19 (2 checks)", t["tidy"] / t["rct"], "<=", 1.00),
        ("tensor-tidy -j1 / -j%d (speed-up)" % a.j, t["tidy1"] / t["tidy"], ">=", 1.80),
        ("cached re-run / cold run", t["warm"] / t["cold"], "<=", 0.05),
    ]
    missed = 0
    for name, ratio, op, target in rows:
        ok = ratio <= target if op == "<=" else ratio >= target
        missed += not ok
        print("  %-45s %6.3f  (target %s %.2f) %s" % (name, ratio, op, target, "met" if ok else "MISSED"))
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
