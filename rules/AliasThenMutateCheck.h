#pragma once

#include "analysis/TensorCheck.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

struct WriteEvent;

/// Flags an in-place write through a handle that shares storage with another
/// handle by a handle copy or a may-alias op (`contiguous`, `to`, `reshape`,
/// `flatten`, ...) while the other is read later or escapes.
/// Docs: docs/checks/tensor-alias-then-mutate.md
class AliasThenMutateCheck : public TensorCheck {
public:
  AliasThenMutateCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override;

private:
  bool refusedAsExpanded(const WriteEvent &W, ASTContext &Ctx) const;
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
