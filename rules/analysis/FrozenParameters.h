// Modules whose parameters the main file freezes: a loop over their
// `parameters()` that gives each one `detach_()`, `requires_grad_(false)` or
// `set_requires_grad(false)` (a target network, a frozen backbone). Their
// parameters, and their submodules', may not require grad, so the autograd
// facts leave them unknown instead of taking them for leaves that do
// (docs/design.md, "Frozen parameters").
#pragma once

#include "analysis/CallSites.h"

#include "clang/AST/Expr.h"
#include "llvm/ADT/SmallVector.h"

#include <vector>

namespace clang::tidy::tensor {

class FrozenParameters {
public:
  explicit FrozenParameters(const CallSites &Calls);

  /// Owner (the module of `owner->parameters()` or of `owner->weight`) is a
  /// frozen module or a submodule of one: `net_tar->q` when the file
  /// freezes `net_tar`'s parameters.
  bool covers(const Expr *Owner) const;

  /// The declarations naming a module value from its root: {net_tar, q} for
  /// `net_tar->q` and `this->net_tar->q`; empty when E is not such a chain.
  static llvm::SmallVector<const ValueDecl *, 4> ownerPath(const Expr *E);

private:
  void addLoopOver(const CallExpr *Freeze, const FunctionDecl *Caller);

  std::vector<llvm::SmallVector<const ValueDecl *, 4>> Frozen;
};

} // namespace clang::tidy::tensor
