#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

#include "llvm/ADT/DenseSet.h"

#include <optional>

namespace clang::tidy::tensor {

/// clone/contiguous/to/cuda/cpu of a loop-invariant tensor inside a loop
/// Docs: docs/checks/tensor-clone-in-loop.md
class CloneInLoopCheck : public TensorCheck {
public:
  CloneInLoopCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  /// A copy of a loop-invariant tensor on every iteration that this check
  /// reports (tensor-unnecessary-clone leaves those clones to it).
  struct LoopCopy {
    const Stmt *Loop = nullptr;
    LoopAnalysis *LA = nullptr;
    const LayoutAnalysis *Lay = nullptr;
    LoopAnalysis::Use U;
  };
  static std::optional<LoopCopy> reportedCopy(const CXXMemberCallExpr *Call,
                                              const TensorModel &Model, ASTContext &Ctx);
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
