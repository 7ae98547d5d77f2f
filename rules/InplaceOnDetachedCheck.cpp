#include "InplaceOnDetachedCheck.h"

#include "analysis/AnalysisManager.h"
#include "analysis/AliasCheckSupport.h"

#include "clang/AST/ExprCXX.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

InplaceOnDetachedCheck::InplaceOnDetachedCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context), IgnoreDirectChains(boolOption("IgnoreDirectChains", true)),
      IgnoreUnderNoGrad(boolOption("IgnoreUnderNoGrad", true)) {}

void InplaceOnDetachedCheck::storeOptions(ClangTidyOptions::OptionMap &Opts) {
  TensorCheck::storeOptions(Opts);
  storeBool(Opts, "IgnoreDirectChains", IgnoreDirectChains);
  storeBool(Opts, "IgnoreUnderNoGrad", IgnoreUnderNoGrad);
}

void InplaceOnDetachedCheck::registerMatchers(MatchFinder *Finder) {
  registerBodyMatchers(Finder, this);
}

void InplaceOnDetachedCheck::onEndOfTranslationUnit() {
  AnalysisManager::release();
  Reported.clear();
}

void InplaceOnDetachedCheck::check(const MatchFinder::MatchResult &Result) {
  const FunctionDecl *FD = matchedBody(Result);
  if (!FD)
    return;
  ASTContext &Ctx = *Result.Context;
  const FunctionAliasResult *R = AnalysisManager::get(Model, Ctx).alias().analyze(FD);
  if (!R)
    return;
  for (const WriteEvent &W : R->Writes) {
    // `p.detach().zero_()` plainly means to write p.
    if (!W.RootDecl && IgnoreDirectChains)
      continue;
    const AffectedHandle *A = nullptr;
    for (const AffectedHandle &C : W.Affected)
      if (C.CrossedDetach && (!A || (A->Why != Exposure::ReadLater && C.Why == Exposure::ReadLater)))
        A = &C;
    if (!A || !A->FirstDetach.Site)
      continue;
    if (IgnoreUnderNoGrad && isUnderNoGrad(W.Write, FD->getBody()))
      continue;
    SourceLocation Loc = W.Write->getExprLoc();
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(W.Write))
      if (const auto *ME = dyn_cast<MemberExpr>(MC->getCallee()->IgnoreParenImpCasts()))
        Loc = ME->getMemberLoc();
    if (!Reported.insert(Loc).second)
      continue;
    const AliasEdge &E = A->FirstDetach;
    std::string Op = "detach";
    if (const auto *Call = dyn_cast<CallExpr>(E.Site))
      if (const FunctionDecl *Callee = Call->getDirectCallee())
        Op = Callee->getNameAsString();
    std::string Handle = W.RootDecl ? declName(W.RootDecl) : std::string("the detached tensor");
    {
      auto D = diag(Loc, "%select{in-place '%1'|call to '%1', which writes its argument in place,}0 "
                         "on '%2' changes '%3' behind autograd's back: %select{'%4()' shares "
                         "storage and the version counter with its source|'%4()' shares storage "
                         "but not even the version counter, so autograd cannot detect the "
                         "change}5")
               << (W.Via != nullptr) << writeName(W) << Handle << declName(A->Decl) << Op
               << (E.Kind == EdgeKind::Data);
      if (std::optional<FixItHint> Fix = detachCloneFix(E, Ctx))
        D << *Fix;
    }
    diag(E.Site->getBeginLoc(), "'%0' is detached here; use 'detach().clone()' for a copy the "
                                "code can own",
         DiagnosticIDs::Note)
        << declName(A->Decl);
    diag(exposureLoc(*A), exposureNote(*A), DiagnosticIDs::Note);
  }
}

} // namespace clang::tidy::tensor
