#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// reshape/flatten of a non-contiguous tensor that cannot be a view: a silent full copy
/// Docs: docs/checks/tensor-reshape-non-contiguous.md
class ReshapeNonContiguousCheck : public TensorCheck {
public:
  ReshapeNonContiguousCheck(StringRef Name, ClangTidyContext *Context);
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
