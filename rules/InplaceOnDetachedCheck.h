#pragma once

#include "analysis/TensorCheck.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// Flags an in-place write through a handle holding `detach()` (or LibTorch's
/// `data()` / `variable_data()`) of a tensor that is used later or escapes.
/// Docs: docs/checks/tensor-inplace-on-detached.md
class InplaceOnDetachedCheck : public TensorCheck {
public:
  InplaceOnDetachedCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;

private:
  const bool IgnoreDirectChains;
  const bool IgnoreUnderNoGrad;
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
