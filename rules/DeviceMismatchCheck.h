#pragma once

#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// an op combining tensors on two known different devices
/// Docs: docs/checks/tensor-device-mismatch.md
class DeviceMismatchCheck : public TensorCheck {
public:
  DeviceMismatchCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
};

} // namespace clang::tidy::tensor
