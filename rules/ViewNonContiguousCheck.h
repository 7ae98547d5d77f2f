#pragma once

#include "ClangTidyCheck.h"
#include "analysis/TensorModel.h"

namespace clang::tidy::tensor {

/// Flags `view()` on a tensor that is certainly non-contiguous, which throws at
/// run time. Docs: docs/checks/tensor-view-non-contiguous.md
class ViewNonContiguousCheck : public ClangTidyCheck {
public:
  ViewNonContiguousCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }

private:
  const std::string TensorTypes;
  const TensorModel Model;
};

} // namespace clang::tidy::tensor
