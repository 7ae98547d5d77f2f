#pragma once

#include "analysis/LayoutCheckSupport.h"

namespace clang::tidy::tensor {

/// Flags an in-place write into an expanded tensor (a stride-0 dimension of
/// size > 1, from expand/expand_as/broadcast_to): PyTorch raises.
/// Docs: docs/checks/tensor-inplace-on-expanded.md
class InplaceOnExpandedCheck : public LayoutWriteCheck {
public:
  using LayoutWriteCheck::LayoutWriteCheck;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
};

} // namespace clang::tidy::tensor
