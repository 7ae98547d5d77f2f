#pragma once

#include "ClangTidyCheck.h"
#include "analysis/TensorModel.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// Flags an in-place write through a handle that shares storage with another
/// handle by a handle copy or a may-alias op (`contiguous`, `to`, `reshape`,
/// `flatten`, ...) while the other is read later or escapes.
/// Docs: docs/checks/tensor-alias-then-mutate.md
class AliasThenMutateCheck : public ClangTidyCheck {
public:
  AliasThenMutateCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }

private:
  const std::string TensorTypes;
  const TensorModel Model;
  llvm::DenseSet<SourceLocation> Reported;
};

} // namespace clang::tidy::tensor
