#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags an in-place write into an expanded tensor (a stride-0 dimension of
/// size > 1, from expand/expand_as/broadcast_to): PyTorch raises.
/// Docs: docs/checks/tensor-inplace-on-expanded.md
class InplaceOnExpandedCheck : public TensorCheck {
public:
  InplaceOnExpandedCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

private:
  ReportedOnce Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
