#include "analysis/VectorElements.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/ExprCXX.h"

namespace clang::tidy::tensor {

VectorElements::VectorElements(const TensorModel &Model, const Stmt *Body) : Model(Model) {
  llvm::SmallVector<const Stmt *, 64> Work{Body};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    note(S);
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
}

const VarDecl *VectorElements::localVector(const Expr *E) const {
  const VarDecl *V = E ? varOf(E->IgnoreParenImpCasts()) : nullptr;
  return V && V->isLocalVarDecl() && !V->getType()->isReferenceType() &&
                 Model.isTensorVectorType(V->getType())
             ? V
             : nullptr;
}

const VarDecl *VectorElements::listArgument(const Expr *A) const {
  const Expr *Inner = A->IgnoreImplicit();
  if (const auto *CE = dyn_cast<CXXConstructExpr>(Inner); CE && CE->getNumArgs() >= 1)
    Inner = CE->getArg(0)->IgnoreImplicit();
  return localVector(Inner);
}

// `v.push_back(t)` records t; a method that may change the elements otherwise,
// v passed by non-const reference, or v assigned, taints v.
void VectorElements::note(const Stmt *S) {
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S)) {
    const VarDecl *V = localVector(MC->getImplicitObjectArgument());
    const CXXMethodDecl *M = MC->getMethodDecl();
    if (!V || !M || !M->getIdentifier())
      return;
    StringRef N = M->getName();
    if ((N == "push_back" || N == "emplace_back") && MC->getNumArgs() == 1)
      Pushed[V].push_back(MC->getArg(0));
    else if (!M->isConst() && !llvm::is_contained({"reserve", "clear", "at", "back", "front",
                                                   "begin", "end", "size", "empty"}, N))
      Tainted.insert(V);
    return;
  }
  if (const Expr *L = assignmentSides(S).first)
    if (const VarDecl *V = localVector(stripHandle(L)))
      Tainted.insert(V);
  const auto *C = dyn_cast<CallExpr>(S);
  const FunctionDecl *F = C ? C->getDirectCallee() : nullptr;
  for (unsigned I = 0; F && I < C->getNumArgs() && I < F->getNumParams(); ++I) {
    QualType P = F->getParamDecl(I)->getType();
    if (const VarDecl *V = localVector(C->getArg(I));
        V && P->isLValueReferenceType() && !P.getNonReferenceType().isConstQualified())
      Tainted.insert(V);
  }
}

// The tensors a vector's initialiser gives it: a braced list's elements,
// nothing for an empty vector, else the initialiser itself (`x.chunk(2)`).
static void initValues(const Expr *Init, llvm::SmallVectorImpl<const Expr *> &Out) {
  const Expr *E = Init ? Init->IgnoreImplicit() : nullptr;
  const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E);
  if (CE && (CE->getNumArgs() == 0 || isa<CXXDefaultArgExpr>(CE->getArg(0))))
    return; // std::vector<Tensor> v;
  if (CE && !CE->isElidable() && !CE->getConstructor()->isCopyOrMoveConstructor()) {
    const auto *SIL = dyn_cast<CXXStdInitializerListExpr>(CE->getArg(0)->IgnoreImplicit());
    const auto *IL = SIL ? dyn_cast<InitListExpr>(SIL->getSubExpr()->IgnoreImplicit()) : nullptr;
    if (IL)
      Out.append(IL->inits().begin(), IL->inits().end());
    else
      Out.push_back(E); // `v(n, t)`, a range: not followed (unknown)
    return;
  }
  if (E)
    Out.push_back(E);
}

bool VectorElements::valuesOf(const VarDecl *V, llvm::SmallVectorImpl<const Expr *> &Out) const {
  if (Tainted.count(V))
    return false;
  initValues(V->getInit(), Out);
  if (auto It = Pushed.find(V); It != Pushed.end())
    Out.append(It->second.begin(), It->second.end());
  return true;
}

} // namespace clang::tidy::tensor
