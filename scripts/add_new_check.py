#!/usr/bin/env python3
"""Scaffolds a new check, in the spirit of clang-tidy's add_new_check.py.

  scripts/add_new_check.py tensor-foo-bar "One-line description"

creates rules/FooBarCheck.{h,cpp}, docs/checks/tensor-foo-bar.md and
test/checks/tensor-foo-bar.cpp, and registers the check in
rules/TensorTidyModule.cpp and rules/CMakeLists.txt. Refuses to overwrite.
"""
import argparse
import os
import re
import sys


def class_name(check):
    return "".join(p.capitalize() for p in check[len("tensor-"):].split("-")) + "Check"


def insert_after_last(text, pattern, line, what):
    matches = list(re.finditer(pattern, text, re.M))
    if not matches:
        sys.exit("add_new_check: cannot find where to register in %s" % what)
    end = text.index("\n", matches[-1].end()) + 1
    return text[:end] + line + "\n" + text[end:]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("check", help="check name, e.g. tensor-foo-bar")
    p.add_argument("description", help="one line: what it finds")
    p.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    a = p.parse_args()
    if not re.fullmatch(r"tensor(-[a-z0-9]+)+", a.check):
        sys.exit("add_new_check: the name must look like tensor-foo-bar (lower case, '-' separated)")
    root = os.path.abspath(a.root)
    cls = class_name(a.check)
    files = {
        os.path.join(root, "rules", cls + ".h"): HEADER,
        os.path.join(root, "rules", cls + ".cpp"): SOURCE,
        os.path.join(root, "docs", "checks", a.check + ".md"): DOC,
        os.path.join(root, "test", "checks", a.check + ".cpp"): TEST,
    }
    for f in files:
        if os.path.exists(f):
            sys.exit("add_new_check: %s already exists" % os.path.relpath(f, root))

    module = os.path.join(root, "rules", "TensorTidyModule.cpp")
    cmake = os.path.join(root, "rules", "CMakeLists.txt")
    mod = open(module).read()
    mod = insert_after_last(mod, r'^#include "\w+Check\.h"', '#include "%s.h"' % cls, module)
    mod = insert_after_last(mod, r'^\s*Factories\.registerCheck<\w+>\(\s*"[^"]+"\);',
                            '    Factories.registerCheck<%s>("%s");' % (cls, a.check), module)
    cm = open(cmake).read()
    cm = insert_after_last(cm, r"^\s+\w+Check\.cpp$", "  %s.cpp" % cls, cmake)

    subst = {"CLASS": cls, "CHECK": a.check, "DESC": a.description}
    for f, tmpl in files.items():
        os.makedirs(os.path.dirname(f), exist_ok=True)
        with open(f, "w") as out:
            out.write(re.sub(r"@(\w+)@", lambda m: subst[m.group(1)], tmpl))
    open(module, "w").write(mod)
    open(cmake, "w").write(cm)
    for f in files:
        print("created", os.path.relpath(f, root))
    print("registered %s in rules/TensorTidyModule.cpp and rules/CMakeLists.txt" % a.check)
    print("next: emit a tensor::Finding next to each diag() and add the check's row to "
          "tool/verify/Rules.cpp (--verify's evidence); measure it for clangd with "
          "bench/clangd_fast_checks.py --write (test/clangd/fast-checks-listed.test)")


HEADER = """#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// @DESC@
/// Docs: docs/checks/@CHECK@.md
class @CLASS@ : public TensorCheck {
public:
  @CLASS@(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
};

} // namespace clang::tidy::tensor
"""

SOURCE = """#include "@CLASS@.h"

#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

@CLASS@::@CLASS@(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void @CLASS@::registerMatchers(MatchFinder *Finder) {
  // FIXME: match the hazard.
}

void @CLASS@::check(const MatchFinder::MatchResult &Result) {
  // FIXME: diagnose, with a fix-it where one is safe (once per location:
  // ReportedOnce), and emit the typed finding next to the diagnostic:
  //   Finding F;
  //   F.Check = getID().str();
  //   F.Hazard = HazardKind::...; F.Where = SourcePoint::at(Loc, *Result.SourceManager); ...
  //   emitFinding(std::move(F));
  // (rules/analysis/Finding.h), then add its row to tool/verify/Rules.cpp.
}

} // namespace clang::tidy::tensor
"""

DOC = """# @CHECK@

@DESC@

## Why

## Flagged

```cpp
```

## Not flagged

```cpp
```

## Fix-its

## Options

- `TensorTypes` (default `::tt::Tensor;::at::Tensor`): the tensor handle types.

## Known limits
"""

TEST = """// RUN: %check_tensor_tidy %s @CHECK@ %t
// RUN: %check_tensor_tidy --runner=clang-tidy %s @CHECK@ %t.plugin
#include "tt/tt.h"

// FIXME: positive cases with CHECK-MESSAGES / CHECK-FIXES, and as many negative cases.
"""

if __name__ == "__main__":
    main()
