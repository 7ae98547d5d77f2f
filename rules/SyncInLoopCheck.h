#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// device-to-host sync of a CUDA tensor on every loop iteration, only to accumulate or log it
/// Docs: docs/checks/tensor-sync-in-loop.md
class SyncInLoopCheck : public TensorCheck {
public:
  SyncInLoopCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
};

} // namespace clang::tidy::tensor
