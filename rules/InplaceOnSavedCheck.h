#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// In-place write on a tensor an earlier op saved for backward
/// Docs: docs/checks/tensor-inplace-on-saved.md
class InplaceOnSavedCheck : public TensorCheck {
public:
  InplaceOnSavedCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
};

} // namespace clang::tidy::tensor
