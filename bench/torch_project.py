#!/usr/bin/env python3
"""torch_project.py <dir> <N>: a LibTorch project of N translation units, the
first N files of test/realistic/ (each includes torch/torch.h), with its
compile_commands.json (-std=c++17 -isystem <LibTorch API headers>)."""
import json
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TORCH_API = "/usr/include/torch/csrc/api/include"


def make(dst, count):
    dst = pathlib.Path(dst).resolve()
    sources = sorted((ROOT / "test" / "realistic").glob("*.cpp"))[:count]
    if len(sources) < count:
        sys.exit(f"error: only {len(sources)} files in test/realistic")
    shutil.rmtree(dst, ignore_errors=True)
    (dst / "src").mkdir(parents=True)
    db = []
    for src in sources:
        shutil.copy(src, dst / "src" / src.name)
        db.append({"directory": str(dst), "file": f"src/{src.name}",
                   "arguments": ["clang++-19", "-std=c++17", "-isystem", TORCH_API,
                                 "-c", f"src/{src.name}", "-o", f"{src.stem}.o"]})
    (dst / "compile_commands.json").write_text(json.dumps(db, indent=1))


def main():
    make(sys.argv[1], int(sys.argv[2]))


if __name__ == "__main__":
    main()
