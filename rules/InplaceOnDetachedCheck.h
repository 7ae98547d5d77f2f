#pragma once

#include "ClangTidyCheck.h"
#include "analysis/TensorModel.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// Flags an in-place write through a handle holding `detach()` (or LibTorch's
/// `data()` / `variable_data()`) of a tensor that is used later or escapes.
/// Docs: docs/checks/tensor-inplace-on-detached.md
class InplaceOnDetachedCheck : public ClangTidyCheck {
public:
  InplaceOnDetachedCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }

private:
  const std::string TensorTypes;
  const bool IgnoreDirectChains;
  const bool IgnoreUnderNoGrad;
  const TensorModel Model;
  llvm::DenseSet<SourceLocation> Reported;
};

} // namespace clang::tidy::tensor
