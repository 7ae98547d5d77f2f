"""Fixture for corpus-script.test: a mirror of a two-file project, manifests,
triage files and a fake tensor-tidy, all under the directory given; or, with
--expect-rc N CMD..., a check of CMD's exit status."""
import json
import os
import stat
import subprocess
import sys

if sys.argv[1] == "--expect-rc":
    # lit's shell has no $?: run the command, pass its output on, exit 0 only on that status.
    r = subprocess.run(sys.argv[3:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(r.stdout)
    sys.exit(0 if r.returncode == int(sys.argv[2]) else 1)

root = os.path.abspath(sys.argv[1])
work = os.path.join(root, "work")
os.makedirs(os.path.join(work, "src"))
os.makedirs(os.path.join(work, "include"))
files = {"src/a.cpp": '#include "a.h"\nint f() {\n  return A;\n}\n',
         "src/b.cpp": "int g( {\n",  # does not compile
         "include/a.h": "#define A 1\n", "data.csv": "1,2\n"}
for name, text in files.items():
    with open(os.path.join(work, name), "w") as f:
        f.write(text)
git = ["git", "-C", work, "-c", "user.name=t", "-c", "user.email=t@t"]
subprocess.run(git[:3] + ["init", "-q"], check=True)
subprocess.run(git + ["add", "."], check=True)
subprocess.run(git + ["commit", "-qm", "x"], check=True)
commit = subprocess.check_output(git[:3] + ["rev-parse", "HEAD"], text=True).strip()
subprocess.run(["git", "clone", "-q", "--bare", work,
                os.path.join(root, "mirrors", "acme+demo", "repo")], check=True)

demo = {"repository": "acme/demo", "commit": commit, "std": "c++14", "include_dirs": ["include"],
        "defines": ["FOO=1"], "forced_includes": ["cstddef"], "files": ["src/a.cpp", "src/b.cpp"]}
missing = {"repository": "acme/gone", "commit": "0" * 40, "files": ["x.cpp"]}
for name, projects in (("manifest.json", [demo]), ("manifest-missing.json", [demo, missing]),
                       ("manifest-badfile.json", [dict(demo, files=["src/nope.cpp"])])):
    with open(os.path.join(root, name), "w") as f:
        json.dump({"projects": projects}, f)

entry = {"project": "acme/demo", "file": "src/a.cpp", "line": 3, "check": "tensor-clone-in-loop"}
for name, extra in (("triage-ok.json", {"verdict": "true-positive", "reason": "r"}),
                    ("triage-bad.json", {"verdict": "maybe", "reason": "r"})):
    with open(os.path.join(root, name), "w") as f:
        json.dump({"findings": [dict(entry, **extra)]}, f)
with open(os.path.join(root, "heldout.txt"), "w") as f:
    f.write("# held out\nACME/Demo\n")
with open(os.path.join(root, "triage-empty.json"), "w") as f:
    json.dump({"findings": []}, f)

# The fake tool: one finding in a.cpp; with FAKE_FAILURES=1 both TUs fail, and
# a run on one file (the classification) exits 3 as a crash would.
fake = '''#!/usr/bin/env python3
import json, os, sys
a = sys.argv[1:]
if "-o" not in a:
    sys.exit(3)
src = os.path.join(os.path.realpath(a[a.index("-p") + 1]), "src", "acme+demo", "src")
report = {"diagnostics": [{"check": "tensor-clone-in-loop", "file": os.path.join(src, "a.cpp"),
                           "line": 3, "column": 10, "level": "warning", "message": "m"}],
          "failures": [], "version": "0"}
if os.environ.get("FAKE_FAILURES"):
    report["failures"] = [{"file": os.path.join(src, f), "reason": "?"} for f in ("a.cpp", "b.cpp")]
with open(a[a.index("-o") + 1], "w") as f:
    json.dump(report, f)
stats = [x.split("=", 1)[1] for x in a if x.startswith("--tu-stats=")]
if stats:
    with open(stats[0], "w") as f:
        json.dump({"files": [{"file": os.path.join(src, n), "outcome": "analysed", "cached": False,
                              "seconds": 1.0, "peak_rss_kib": k}
                             for n, k in (("a.cpp", 204800), ("b.cpp", 102400))]}, f)
'''
tool = os.path.join(root, "tidy")
with open(tool, "w") as f:
    f.write(fake)
os.chmod(tool, os.stat(tool).st_mode | stat.S_IXUSR)
