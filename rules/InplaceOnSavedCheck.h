#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags an in-place write to a tensor that an earlier differentiable op
/// saved for backward (its result or an input, by the op table's TT_SAVES),
/// when a backward() can run through that op afterwards: PyTorch's backward
/// raises. An error when the backward is later in the same function.
/// Docs: docs/checks/tensor-inplace-on-saved.md
class InplaceOnSavedCheck : public TensorCheck {
public:
  InplaceOnSavedCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;

private:
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
