#pragma once

#include "analysis/LayoutCheckSupport.h"

namespace clang::tidy::tensor {

/// Flags an in-place write into an expanded tensor (a stride-0 dimension of
/// size > 1, from expand/expand_as/broadcast_to): PyTorch raises. Only the
/// first write (in source order) per expand is reported: it raises, and the
/// fix (a clone at the expand) serves the later ones too.
/// Docs: docs/checks/tensor-inplace-on-expanded.md
class InplaceOnExpandedCheck : public LayoutWriteCheck {
public:
  using LayoutWriteCheck::LayoutWriteCheck;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;

private:
  bool writtenBefore(const CallExpr *Write, const TensorFact &F, const LayoutAnalysis &LA,
                     ASTContext &Ctx) const;
};

} // namespace clang::tidy::tensor
