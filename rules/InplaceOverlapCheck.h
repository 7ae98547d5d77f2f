#pragma once

#include "analysis/LayoutCheckSupport.h"

namespace clang::tidy::tensor {

/// Flags an in-place op or copy_ whose input partially overlaps the tensor it
/// writes (`x.add_(x.t())`, a shift within one buffer): PyTorch raises, or,
/// where it cannot tell, the result depends on the order of the writes.
/// Docs: docs/checks/tensor-inplace-overlap.md
class InplaceOverlapCheck : public LayoutWriteCheck {
public:
  using LayoutWriteCheck::LayoutWriteCheck;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;

private:
  void report(const CallExpr *Write, StringRef Op, const Expr *Source, const TensorFact &Out,
              const OverlapQuery &Q, const std::string &Dim,
              const ast_matchers::MatchFinder::MatchResult &Result);
};

} // namespace clang::tidy::tensor
