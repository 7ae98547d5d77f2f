// Note [vector elements]: the tensors a function's local `std::vector<Tensor>`
// variables hold, for the facts of a list argument built from one
// (`outs.push_back(head(f)); ... torch::cat(outs)`): the elements of its
// initialiser and every push_back / emplace_back, flow-insensitively. A vector
// changed any other way (another mutating method, passed by non-const
// reference, assigned) holds what the analysis does not see: no values.
#pragma once

#include "analysis/TensorModel.h"

#include "clang/AST/Decl.h"
#include "clang/AST/Stmt.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

namespace clang::tidy::tensor {

class VectorElements {
public:
  VectorElements(const TensorModel &Model, const Stmt *Body);

  /// The local vector of tensors E names (not a reference), or null.
  const VarDecl *localVector(const Expr *E) const;
  /// The local vector a list argument is converted from (`torch::stack(v)`), or null.
  const VarDecl *listArgument(const Expr *A) const;
  /// V's values into Out; false when V is changed in a way not followed.
  bool valuesOf(const VarDecl *V, llvm::SmallVectorImpl<const Expr *> &Out) const;

private:
  void note(const Stmt *S);

  const TensorModel &Model;
  llvm::DenseMap<const VarDecl *, llvm::SmallVector<const Expr *, 4>> Pushed;
  llvm::DenseSet<const VarDecl *> Tainted;
};

} // namespace clang::tidy::tensor
