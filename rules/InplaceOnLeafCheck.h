#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags an in-place write on a leaf tensor that requires grad (a parameter,
/// a `requires_grad(true)` factory, `requires_grad_()`) or on a view of one,
/// while grad mode is on: PyTorch refuses it.
/// Docs: docs/checks/tensor-inplace-on-leaf.md
class InplaceOnLeafCheck : public TensorCheck {
public:
  InplaceOnLeafCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;

private:
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
