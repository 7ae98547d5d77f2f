#pragma once

#include "analysis/TensorCheck.h"
#include "analysis/LayoutAnalysis.h"
#include "analysis/LoopAnalysis.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// clone/contiguous/to/cuda/cpu of a loop-invariant tensor inside a loop
/// Docs: docs/checks/tensor-clone-in-loop.md
class CloneInLoopCheck : public TensorCheck {
public:
  CloneInLoopCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    Layouts.clear();
    Loops.clear();
    Reported.clear();
  }

private:
  LayoutCache Layouts{Model};
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<LoopAnalysis>> Loops;
  ReportedOnce Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
