// Where a module class of the user's computes, by the moves of the modules
// that hold it (Note [module device] in ModuleDevices.cpp).
#pragma once

#include "analysis/DeviceFacts.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/Expr.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <optional>

#include <utility>
#include <vector>

namespace clang::tidy::tensor {

class AnalysisManager;

class ModuleDevices {
public:
  /// The device every move in the main file of a module holding RD (RD
  /// itself, or a module registering it) names: CUDA or CUDAIfAvailable when
  /// they agree on it, else Unknown; memoised.
  DeviceKnown of(const CXXRecordDecl *RD, AnalysisManager &AM);
  /// Code outside F's class names F (`net->anchors_ = ...to(d)`), or the
  /// class moves its own members (a `to`, `cuda` or `_apply` of its own):
  /// where F lives is not its class's to decide.
  bool touchedOutside(const FieldDecl *F, ASTContext &Ctx);

private:
  void index(AnalysisManager &AM);
  /// Outer is Inner or registers a module holding it (Depth: levels so far).
  bool holds(const CXXRecordDecl *Outer, const CXXRecordDecl *Inner, unsigned Depth = 0) const;
  bool Indexed = false;
  std::vector<std::pair<const CXXRecordDecl *, const CXXMemberCallExpr *>> Moves;
  llvm::DenseMap<const CXXRecordDecl *, DeviceKnown> Memo;
  std::optional<llvm::DenseSet<const FieldDecl *>> Outside; // touchedOutside's index
};

} // namespace clang::tidy::tensor
