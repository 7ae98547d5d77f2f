#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

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
    AnalysisManager::release();
    Reported.clear();
  }

private:
  std::string message(const CXXMemberCallExpr *Call, StringRef SrcText, const LoopAnalysis::Use &U,
                      const LayoutAnalysis *Lay) const;
  ReportedOnce Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
