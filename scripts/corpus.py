#!/usr/bin/env python3
"""The real-code corpus: public LibTorch projects the checks must not crash on
or raise false alarms in (docs/corpus.md).

  corpus.py build [--out DIR]   sources of test/corpus/manifest.json from the
                                fetched mirrors, and DIR/compile_commands.json
  corpus.py run   [--out DIR]   tensor-tidy over DIR; DIR/results.json
  corpus.py check [--out DIR]   results against test/corpus/triage.json

The sources stay out of the repository: each project must have been brought
to /work/.mirror/<owner>+<name>/repo (the fetch tool) before `build`.

Exit codes:
  0  done (check: no crash, no parse failure, every finding triaged)
  1  check: a crash, timeout or parse failure, or an untriaged finding
  2  usage or input error (bad manifest or triage, no build, tool missing)
  3  build: projects missing from the mirrors (the others were built)
"""
import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "test", "corpus", "manifest.json")
TRIAGE = os.path.join(ROOT, "test", "corpus", "triage.json")
MIRRORS = "/work/.mirror"
HELDOUT = os.path.join(os.path.dirname(ROOT), "shared", "heldout-repos.txt")
CXX = "clang++-19"
# As test/CMakeLists.txt computes %torch_include: -isystem /usr/include would
# reorder the search path and break libstdc++'s #include_next.
TORCH_API_INCLUDE = "/usr/include/torch/csrc/api/include"
# Text files a TU may include; the mirrors may lack large blobs (data, LFS).
SOURCE_EXTS = (".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp", ".hxx",
               ".inl", ".ipp", ".tcc", ".cuh", ".def", ".inc")
VERDICTS = ("true-positive", "false-alarm", "debatable")


class InputError(Exception):
    """Bad input: reported on one line, exit 2."""


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise InputError("cannot read %s '%s': %s" % (what, path, e.strerror))
    except ValueError as e:
        raise InputError("%s '%s' is not valid JSON: %s" % (what, path, e))


def slug(repository):
    return repository.replace("/", "+")


def git(mirror, *args, **kw):
    return subprocess.run(["git", "--git-dir", mirror] + list(args),
                          check=True, stdout=subprocess.PIPE, **kw).stdout


# --- build ------------------------------------------------------------------

def heldout_repositories(path):
    """Repositories kept for independent measurement: never in the corpus."""
    if not os.path.isfile(path):
        return set()
    with open(path) as f:
        return {l.strip().lower() for l in f if l.strip() and not l.startswith("#")}


def validate_manifest(manifest, heldout):
    projects = manifest.get("projects")
    if not isinstance(projects, list) or not projects:
        raise InputError("manifest has no 'projects' list")
    for p in projects:
        for key in ("repository", "commit", "files"):
            if key not in p:
                raise InputError("manifest project %s lacks '%s'"
                                 % (p.get("repository", "?"), key))
        if p["repository"].lower() in heldout:
            raise InputError("%s is held out for independent measurement; take it out of the manifest"
                             % p["repository"])
    return projects


def source_paths(mirror, commit):
    out = git(mirror, "ls-tree", "-r", "-z", "--name-only", commit)
    names = [n.decode() for n in out.split(b"\0") if n]
    return [n for n in names if n.lower().endswith(SOURCE_EXTS)]


def extract(mirror, commit, paths, dest):
    """git archive of only these paths (a whole-tree archive fails on a
    missing blob), in chunks to stay under the argument limit."""
    for i in range(0, len(paths), 500):
        with tempfile.TemporaryFile() as tar:
            # git names every missing blob of the tree, ours or not: its words
            # are shown only when the archive fails.
            r = subprocess.run(["git", "--git-dir", mirror, "archive", "--format=tar",
                                commit, "--"] + paths[i:i + 500], stdout=tar,
                               stderr=subprocess.PIPE, text=True)
            if r.returncode:
                raise InputError("git archive of %s failed: %s" % (mirror, r.stderr.strip()))
            tar.seek(0)
            with tarfile.open(fileobj=tar) as t:
                t.extractall(dest)


def python_include():
    """Debian's Python headers (torch/extension.h needs them and pybind11)."""
    found = sorted(glob.glob("/usr/include/python3*/Python.h"))
    if not found:
        raise InputError("a project needs Python.h: install python3-dev and pybind11-dev")
    return os.path.dirname(found[-1])


def compile_args(project, src_dir, file):
    args = [CXX, "-std=" + project.get("std", "c++17")]
    if os.path.exists(os.path.join(TORCH_API_INCLUDE, "torch", "torch.h")):
        args += ["-isystem", TORCH_API_INCLUDE]
    if project.get("python_headers"):
        args += ["-isystem", python_include()]
    args += ["-I" + os.path.join(src_dir, d) for d in project.get("include_dirs", [])]
    args += ["-D" + d for d in project.get("defines", [])]
    # Headers the sources use without including them (MSVC pulls them in).
    for h in project.get("forced_includes", []):
        args += ["-include", h]
    return args + ["-c", os.path.join(src_dir, file)]


def build_project(project, src_dir, mirrors):
    mirror = os.path.join(mirrors, slug(project["repository"]), "repo")
    if not os.path.isdir(mirror):
        return None
    commit = project["commit"]
    try:
        git(mirror, "cat-file", "-e", commit + "^{commit}", stderr=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        raise InputError("commit %s of %s is not in its mirror '%s'"
                         % (commit, project["repository"], mirror))
    shutil.rmtree(src_dir, ignore_errors=True)
    os.makedirs(src_dir)
    extract(mirror, commit, source_paths(mirror, commit), src_dir)
    entries = []
    for f in project["files"]:
        if not os.path.isfile(os.path.join(src_dir, f)):
            raise InputError("%s: '%s' is not in commit %s" % (project["repository"], f, commit))
        entries.append({"directory": src_dir, "file": os.path.join(src_dir, f),
                        "arguments": compile_args(project, src_dir, f)})
    return entries


def cmd_build(opts):
    projects = validate_manifest(load_json(opts.manifest, "manifest"),
                                 heldout_repositories(opts.heldout))
    out = os.path.abspath(opts.out)
    entries, missing, index = [], [], {}
    for p in projects:
        src_dir = os.path.join(out, "src", slug(p["repository"]))
        built = build_project(p, src_dir, opts.mirrors)
        if built is None:
            missing.append(p["repository"])
            continue
        entries += built
        index[p["repository"]] = src_dir
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "compile_commands.json"), "w") as f:
        json.dump(entries, f, indent=1)
    with open(os.path.join(out, "projects.json"), "w") as f:
        json.dump(index, f, indent=1)
    print("corpus: %d projects, %d TUs in %s" % (len(index), len(entries), out), flush=True)
    if missing:
        print("corpus: missing from %s (fetch github:<repo> first): %s"
              % (opts.mirrors, ", ".join(missing)), file=sys.stderr)
        return 3
    return 0


# --- run --------------------------------------------------------------------

def locate(path, index):
    """(project, path inside it) of a file in the built tree, or (None, path)."""
    path = os.path.realpath(path)
    for repo, src_dir in index.items():
        src_dir = os.path.realpath(src_dir)
        if path.startswith(src_dir + os.sep):
            return repo, os.path.relpath(path, src_dir)
    return None, path


def tool_cmd(opts, out, extra):
    # No cache by default: the run time is part of what the corpus measures.
    cache = ["--cache-dir=" + opts.cache_dir] if opts.cache_dir else ["--no-cache"]
    return [opts.tool, "-p", out, "--format=json", "--quiet"] + cache + [
            "--header-filter=" + os.path.join(os.path.realpath(out), "src") + "/.*"] + extra


def classify_failure(opts, out, entry):
    """Why a TU failed, without reading the tool's words: a TU clang cannot
    compile is a 'parse-error' (the manifest's fault); one that outlives the
    timeout alone is a 'timeout'; otherwise the analysis 'crash'ed."""
    args = entry["arguments"][:-2] + ["-fsyntax-only", entry["file"]]
    if subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        return "parse-error"
    try:
        rc = subprocess.run(tool_cmd(opts, out, [entry["file"]]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=opts.timeout).returncode
    except subprocess.TimeoutExpired:
        return "timeout"
    return "crash" if rc == 3 else "flaky"


def children_cpu():
    """CPU seconds of waited-for descendants (the workers too): on a shared
    machine a steadier measure of cost than wall time."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def memory(stats_path, index):
    """Peak resident memory per TU (the tool's --tu-stats): the largest, the
    median, and each TU's figure in MiB."""
    files = load_json(stats_path, "per-TU stats")["files"]
    per_tu = []
    for f in files:
        project, rel = locate(f["file"], index)
        per_tu.append({"project": project, "file": rel, "outcome": f["outcome"],
                       "seconds": round(f["seconds"], 1),
                       "peak_rss_mib": round(f["peak_rss_kib"] / 1024.0, 1)})
    peaks = sorted(t["peak_rss_mib"] for t in per_tu) or [0]
    return {"max_mib": peaks[-1], "median_mib": peaks[len(peaks) // 2], "per_tu": per_tu}


def finding(d, index):
    project, rel = locate(d["file"], index)
    return {"project": project, "file": rel, "line": d["line"], "column": d["column"],
            "check": d["check"], "level": d["level"], "message": d["message"]}


def cmd_run(opts):
    out = os.path.abspath(opts.out)
    db = load_json(os.path.join(out, "compile_commands.json"), "compilation database")
    index = load_json(os.path.join(out, "projects.json"), "project index")
    if not (os.path.isfile(opts.tool) and os.access(opts.tool, os.X_OK)):
        raise InputError("no tensor-tidy at '%s' (build it, or pass --tool)" % opts.tool)
    raw = os.path.join(out, "tensor-tidy.json")
    stats = os.path.join(out, "tu-stats.json")
    start, cpu0 = time.monotonic(), children_cpu()
    rc = subprocess.run(tool_cmd(opts, out, ["-j", str(opts.jobs), "--timeout=%d" % opts.timeout,
                                             "-o", raw, "--tu-stats=" + stats])).returncode
    wall, cpu = time.monotonic() - start, children_cpu() - cpu0
    if rc not in (0, 1, 3):
        raise InputError("tensor-tidy exited %d on '%s'" % (rc, out))
    report = load_json(raw, "tensor-tidy report")
    by_file = {os.path.realpath(e["file"]): e for e in db}
    failures = []
    for f in report["failures"]:
        project, rel = locate(f["file"], index)
        kind = classify_failure(opts, out, by_file[os.path.realpath(f["file"])])
        failures.append({"project": project, "file": rel, "kind": kind})
    results = {"tool": opts.tool, "version": report.get("version"), "tus": len(db),
               "projects": len(index), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
               "jobs": opts.jobs,
               "memory": memory(stats, index),
               "failures": failures,
               "findings": [finding(d, index) for d in report["diagnostics"]]}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("corpus: %d TUs of %d projects in %.0f s (-j%d, %.0f s CPU): %d findings, %d failures;"
          " peak memory per TU: max %.0f MiB, median %.0f MiB"
          % (len(db), len(index), wall, opts.jobs, cpu, len(results["findings"]), len(failures),
             results["memory"]["max_mib"], results["memory"]["median_mib"]))
    return 0


# --- check ------------------------------------------------------------------

def key(item):
    return (item["project"], item["file"], int(item["line"]), item["check"])


def load_triage(path):
    triage = {}
    for t in load_json(path, "triage").get("findings", []):
        if t.get("verdict") not in VERDICTS or not t.get("reason"):
            raise InputError("triage entry %s:%s:%s needs a verdict (%s) and a reason"
                             % (t.get("project"), t.get("file"), t.get("line"), ", ".join(VERDICTS)))
        if key(t) in triage:
            raise InputError("triage entry %s:%s:%s %s is listed twice" % key(t))
        triage[key(t)] = t
    return triage


def cmd_check(opts):
    results = load_json(os.path.join(os.path.abspath(opts.out), "results.json"),
                        "results (run `corpus.py run` first)")
    triage = load_triage(opts.triage)
    bad = 0
    for f in results["failures"]:
        print("corpus: %s: %s/%s" % (f["kind"], f["project"], f["file"]))
        bad += 1
    counts = {}
    seen = set()
    for f in results["findings"]:
        t = triage.get(key(f))
        seen.add(key(f))
        if t is None:
            print("corpus: untriaged: %s/%s:%d: [%s] %s"
                  % (f["project"], f["file"], f["line"], f["check"], f["message"]))
            bad += 1
            continue
        counts[t["verdict"]] = counts.get(t["verdict"], 0) + 1
    for k in sorted(set(triage) - seen):
        print("corpus: note: no longer reported: %s/%s:%d [%s]" % k)
    print("corpus: %d findings (%s), %d failures, %d untriaged"
          % (len(results["findings"]),
             ", ".join("%d %s" % (counts.get(v, 0), v) for v in VERDICTS),
             len(results["failures"]), bad - len(results["failures"])))
    return 1 if bad else 0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("build", "run", "check"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "corpus"),
                    help="scratch directory (default: build/corpus)")
    ap.add_argument("--manifest", default=MANIFEST)
    ap.add_argument("--mirrors", default=MIRRORS)
    ap.add_argument("--heldout", default=HELDOUT, help="repositories the manifest must not use")
    ap.add_argument("--triage", default=TRIAGE)
    ap.add_argument("--tool", default=os.path.join(ROOT, "build", "bin", "tensor-tidy"))
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per TU")
    ap.add_argument("--cache-dir", help="reuse tensor-tidy's result cache here (run time then means little)")
    return ap.parse_args(argv)


def main(argv):
    opts = parse_args(argv)
    try:
        return {"build": cmd_build, "run": cmd_run, "check": cmd_check}[opts.command](opts)
    except InputError as e:
        print("corpus: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
