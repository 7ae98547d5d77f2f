#include "analysis/FrozenParameters.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/StmtCXX.h"

namespace clang::tidy::tensor {

namespace {
// `p.detach_()`, `p.requires_grad_(false)`, `p.set_requires_grad(false)`,
// `p.value().requires_grad_(false)`: the loop variable p it freezes, or null.
const VarDecl *frozenVar(const CallExpr *Call, ASTContext &Ctx) {
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  if (!M || !M->getIdentifier())
    return nullptr;
  if (M->getName() != "detach_") {
    bool V = true;
    const Expr *Arg = MC->getNumArgs() ? MC->getArg(0) : nullptr;
    if (!Arg || isa<CXXDefaultArgExpr>(Arg) || !Arg->EvaluateAsBooleanCondition(V, Ctx) || V)
      return nullptr;
  }
  const Expr *Obj = stripHandle(MC->getImplicitObjectArgument());
  const auto *Item = dyn_cast<CXXMemberCallExpr>(Obj);
  const CXXMethodDecl *ItemMD = Item ? Item->getMethodDecl() : nullptr;
  if (ItemMD && ItemMD->getIdentifier() && ItemMD->getName() == "value")
    Obj = stripHandle(Item->getImplicitObjectArgument()); // named_parameters()'s items
  const auto *DRE = dyn_cast<DeclRefExpr>(Obj);
  return DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
}

const CXXForRangeStmt *rangeForOf(const VarDecl *V, const Stmt *S) {
  if (!S)
    return nullptr;
  if (const auto *RF = dyn_cast<CXXForRangeStmt>(S); RF && RF->getLoopVariable() == V)
    return RF;
  for (const Stmt *Child : S->children())
    if (const CXXForRangeStmt *RF = rangeForOf(V, Child))
      return RF;
  return nullptr;
}

bool isPrefix(llvm::ArrayRef<const ValueDecl *> P, llvm::ArrayRef<const ValueDecl *> Of) {
  return !P.empty() && P.size() <= Of.size() && P == Of.take_front(P.size());
}
} // namespace

FrozenParameters::FrozenParameters(const CallSites &Calls) {
  for (const CallSites::Site &S : Calls.named({"detach_", "requires_grad_", "set_requires_grad"}))
    addLoopOver(S.Call, S.Caller);
}

void FrozenParameters::addLoopOver(const CallExpr *Freeze, const FunctionDecl *Caller) {
  const VarDecl *P = frozenVar(Freeze, Caller->getASTContext());
  const CXXForRangeStmt *Loop = P ? rangeForOf(P, Caller->getBody()) : nullptr;
  const auto *List =
      Loop ? dyn_cast<CXXMemberCallExpr>(stripHandle(Loop->getRangeInit())) : nullptr;
  const CXXMethodDecl *M = List ? List->getMethodDecl() : nullptr;
  if (!M || !M->getIdentifier() ||
      (M->getName() != "parameters" && M->getName() != "named_parameters"))
    return;
  auto Path = ownerPath(List->getImplicitObjectArgument());
  if (!Path.empty())
    Frozen.push_back(std::move(Path));
}

llvm::SmallVector<const ValueDecl *, 4> FrozenParameters::ownerPath(const Expr *E) {
  llvm::SmallVector<const ValueDecl *, 4> Path;
  for (E = moduleValue(E); E; E = moduleValue(E)) {
    if (const auto *ME = dyn_cast<MemberExpr>(E)) {
      Path.push_back(ME->getMemberDecl());
      E = ME->getBase();
      continue;
    }
    if (const auto *DRE = dyn_cast<DeclRefExpr>(E))
      Path.push_back(DRE->getDecl());
    else if (!isa<CXXThisExpr>(E))
      Path.clear();
    break;
  }
  std::reverse(Path.begin(), Path.end());
  return Path;
}

bool FrozenParameters::covers(const Expr *Owner) const {
  if (Frozen.empty())
    return false;
  auto Path = ownerPath(Owner);
  for (const auto &F : Frozen)
    if (isPrefix(F, Path))
      return true;
  return false;
}

} // namespace clang::tidy::tensor
