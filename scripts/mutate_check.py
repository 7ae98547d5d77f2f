#!/usr/bin/env python3
"""Statement-level mutation testing of the checks (docs/robustness.md).

Parses each seed file with libclang (python3-clang-19), makes mutants by
deleting, duplicating and swapping statements, renaming tensor handles, and
wrapping statements in loops, branches and lambdas, then runs tensor-tidy
once over all mutants (--format=json, a per-TU --timeout). Every mutant must
be analysed or fail to parse cleanly: a worker that crashes or times out is
a failure, and its mutant is kept under <out>/failures/.

  mutate_check.py --tensor-tidy=PATH [--count=N] [--seed=S] [--out=DIR] [files...]

Default seeds: examples/*.cpp and the tt (non-torch) tests of test/checks.
Exit: 0 no crash or hang, 1 some, 2 could not run (no libclang bindings: says so).
"""
import argparse
import json
import pathlib
import random
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCH_FLAGS = ["-isystem", "/usr/include/torch/csrc/api/include"]


def load_cindex():
    try:
        import clang.cindex as ci
    except ImportError:
        return None
    for lib in ("/usr/lib/llvm-19/lib/libclang-19.so.1", "/usr/lib/llvm-19/lib/libclang.so"):
        if pathlib.Path(lib).exists():
            try:
                ci.Config.set_library_file(lib)
            except Exception:  # already set
                pass
            break
    return ci


def compile_flags(path):
    flags = ["-std=c++17", "-I" + str(ROOT / "runtime" / "include")]
    if "torch/torch.h" in path.read_text(errors="replace"):
        flags += TORCH_FLAGS
    return flags


class Seed:
    """Statements (grouped by block) and tensor handles of one file, as byte ranges."""

    def __init__(self, ci, path):
        self.path = path
        self.text = path.read_bytes()
        tu = ci.Index.create().parse(str(path), args=compile_flags(path))
        self.blocks, self.handles, self.refs = [], set(), []
        self._walk(ci, tu.cursor, str(path))

    def _walk(self, ci, cur, main):
        K = ci.CursorKind
        for c in cur.get_children():
            loc = c.location
            if loc.file is None or loc.file.name != main:
                continue
            if c.kind == K.COMPOUND_STMT:
                stmts = [self._range(s) for s in c.get_children()]
                stmts = [r for r in stmts if r and r[1] > r[0]]
                if stmts:
                    self.blocks.append(stmts)
            if c.kind in (K.VAR_DECL, K.PARM_DECL) and "Tensor" in c.type.spelling and c.spelling:
                self.handles.add(c.spelling)
            if c.kind == K.DECL_REF_EXPR and "Tensor" in c.type.spelling and c.spelling:
                r = self._range(c)
                if r and self.text[r[0]:r[1]].decode(errors="replace") == c.spelling:
                    self.refs.append(r)
            self._walk(ci, c, main)

    def _range(self, c):
        s, e = c.extent.start, c.extent.end
        if s.file is None or e.file is None or s.file.name != e.file.name:
            return None
        end = e.offset
        # A statement's extent stops before its ';'.
        while end < len(self.text) and self.text[end:end + 1] in (b" ", b"\t"):
            end += 1
        if self.text[end:end + 1] == b";":
            end += 1
        else:
            end = e.offset
        return (s.offset, end)


WRAPS = [
    (b"for (int tt_mut_i = 0; tt_mut_i < 3; ++tt_mut_i) { ", b" }"),
    (b"if (sizeof(int) == 4) { ", b" }"),
    (b"[&] { ", b" }();"),
    (b"while (false) { ", b" }"),
]


def pick_edit(rng, seed):
    """One edit of the seed's text: (start, end, replacement, description)."""
    t = seed.text
    ops = []
    if seed.blocks:
        ops += ["delete", "duplicate", "swap", "wrap"]
    if seed.refs and len(seed.handles) > 1:
        ops.append("rename")
    if not ops:
        return None
    op = rng.choice(ops)
    if op == "rename":
        s, e = rng.choice(seed.refs)
        old = t[s:e].decode(errors="replace")
        new = rng.choice(sorted(seed.handles - {old}))
        return s, e, new.encode(), f"rename {old}->{new}@{s}"
    block = rng.choice(seed.blocks)
    i = rng.randrange(len(block))
    s, e = block[i]
    if op == "delete" or (op == "swap" and len(block) < 2):
        return s, e, b"", f"delete@{s}"
    if op == "duplicate":
        return s, e, t[s:e] + b" " + t[s:e], f"duplicate@{s}"
    if op == "wrap":
        e2 = block[rng.randrange(i, min(len(block), i + 3))][1]
        pre, post = rng.choice(WRAPS)
        return s, e2, pre + t[s:e2] + post, f"wrap '{pre[:5].decode()}'@{s}"
    j = rng.choice([k for k in range(len(block)) if k != i])
    (s1, e1), (s2, e2) = sorted([block[i], block[j]])
    return s1, e2, t[s2:e2] + t[e1:s2] + t[s1:e1], f"swap@{s1},{s2}"


def make_mutants(rng, seed, count, out):
    """count mutants, each with 1-3 non-overlapping edits of the seed."""
    made = []
    for n in range(count):
        edits = []
        for _ in range(rng.randint(1, 3)):
            ed = pick_edit(rng, seed)
            if ed and all(ed[1] <= o[0] or ed[0] >= o[1] for o in edits):
                edits.append(ed)
        text = seed.text
        for s, e, repl, _ in sorted(edits, key=lambda x: -x[0]):
            text = text[:s] + repl + text[e:]
        path = out / f"{seed.path.stem}.m{n}.cpp"
        path.write_bytes(text)
        made.append((path, ", ".join(d for *_, d in edits) or "unchanged"))
    return made


def run_tool(tool, mutants, flags, timeout, jobs):
    cmd = [tool, "--format=json", "--no-cache", "--quiet", f"--timeout={timeout}", f"-j{jobs}",
           "--checks=-*,tensor-*", *[str(p) for p, _ in mutants], "--", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 1, 3):
        raise SystemExit(f"mutate_check: tensor-tidy exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tensor-tidy", required=True)
    p.add_argument("--count", type=int, default=20, help="mutants per seed file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default="mutants")
    p.add_argument("--timeout", type=int, default=120, help="per TU, seconds")
    p.add_argument("-j", type=int, default=2)
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    ci = load_cindex()
    if ci is None:
        print("mutate_check: no libclang Python bindings (apt-get install python3-clang-19)")
        return 2
    files = [pathlib.Path(f) for f in a.files] or sorted(
        list((ROOT / "examples").glob("*.cpp")) +
        [f for f in (ROOT / "test" / "checks").glob("*.cpp") if "torch" not in f.name])
    out = pathlib.Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rng = random.Random(a.seed)
    groups = {}
    for f in files:
        seed = Seed(ci, f)
        for m in make_mutants(rng, seed, a.count, out):
            groups.setdefault(tuple(compile_flags(f)), []).append(m)
    failures, total, unparsed = [], 0, 0
    for flags, mutants in groups.items():
        report = run_tool(a.tensor_tidy, mutants, list(flags), a.timeout, a.j)
        what = {str(p.resolve()): w for p, w in mutants}
        total += len(mutants)
        for f in report["failures"]:
            if f["kind"] == "parse-error":
                unparsed += 1
                continue
            failures.append(f)
            keep = out / "failures"
            keep.mkdir(exist_ok=True)
            shutil.copy(f["file"], keep)
            print(f"mutate_check: {f['kind']}: {f['file']} ({what.get(f['file'], '?')}): {f['reason']}")
            for line in f.get("crashReport", [])[:30]:
                print("    " + line)
    print(f"mutate_check: {total} mutants of {len(files)} files, {unparsed} did not parse, "
          f"{len(failures)} crashed or timed out")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
