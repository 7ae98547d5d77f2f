#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags an in-place op or copy_ whose input partially overlaps the tensor it
/// writes (`x.add_(x.t())`, a shift within one buffer): PyTorch raises, or,
/// where it cannot tell, the result depends on the order of the writes.
/// Docs: docs/checks/tensor-inplace-overlap.md
class InplaceOverlapCheck : public TensorCheck {
public:
  InplaceOverlapCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

private:
  void report(const CallExpr *Write, StringRef Op, const Expr *Source, const TensorFact &Out,
              const OverlapQuery &Q, const ast_matchers::MatchFinder::MatchResult &Result);
  ReportedOnce Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
