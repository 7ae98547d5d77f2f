#include "analysis/TensorModel.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"

namespace clang::tidy::tensor {

TensorModel::TensorModel(llvm::StringRef TensorTypes) {
  llvm::SmallVector<llvm::StringRef, 4> Parts;
  TensorTypes.split(Parts, ';', -1, /*KeepEmpty=*/false);
  for (llvm::StringRef P : Parts) {
    P = P.trim();
    if (P.consume_front("::"))
      ;
    if (!P.empty())
      Names.push_back(P.str());
  }
}

bool TensorModel::isTensorType(QualType T) const {
  if (T.isNull())
    return false;
  T = T.getNonReferenceType().getCanonicalType();
  const auto *RD = T->getAsCXXRecordDecl();
  if (!RD)
    return false;
  std::string QN = RD->getQualifiedNameAsString();
  for (const std::string &N : Names)
    if (QN == N)
      return true;
  return false;
}

bool TensorModel::isTensorExpr(const Expr *E) const { return E && isTensorType(E->getType()); }

const Expr *TensorModel::selfOf(const CallExpr *Call) {
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    return MC->getImplicitObjectArgument();
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call))
    return OC->getNumArgs() ? OC->getArg(0) : nullptr;
  return nullptr;
}

const sem::OpInfo *TensorModel::opOf(const CallExpr *Call) const {
  const auto *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier())
    return nullptr;
  const Expr *Self = selfOf(Call);
  if (!Self && Call->getNumArgs())
    Self = Call->getArg(0);
  if (!isTensorExpr(Self))
    return nullptr;
  return sem::lookup(FD->getName());
}

} // namespace clang::tidy::tensor
