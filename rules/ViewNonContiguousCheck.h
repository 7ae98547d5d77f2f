#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// Flags `view()`/`view_as()` on a non-contiguous tensor whose layout cannot be
/// viewed with the new shape: a run-time error.
/// Docs: docs/checks/tensor-view-non-contiguous.md
class ViewNonContiguousCheck : public TensorCheck {
public:
  ViewNonContiguousCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

private:
  DiagnosticIDs::Level severity(const ViewQuery &Q) const;
  // Layouts that throw for every size > 1 (run-time sizes): error or warning.
  const bool UnprovenAsError;
  ReportedOnce Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
