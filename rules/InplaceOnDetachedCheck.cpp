#include "InplaceOnDetachedCheck.h"

#include "analysis/AliasCheckSupport.h"
#include "analysis/AnalysisManager.h"
#include "analysis/Finding.h"
#include "analysis/GradCheckSupport.h"

#include "clang/AST/ExprCXX.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {
namespace {

/// The handle detaches a parameter (a leaf that requires grad: `parameters()`,
/// a module's weight): the write most likely means to change it (an update,
/// a mutation), and an owned copy would silently drop the change.
bool detachesParameter(const AliasEdge &E, const TensorModel &Model, ASTContext &Ctx) {
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(E.Site);
  const GradFacts *G = MC ? AnalysisManager::get(Model, Ctx).gradAt(MC) : nullptr;
  GradFact F = G ? G->factOf(MC->getImplicitObjectArgument()) : GradFact{};
  return F.isGradLeafOrView() && isParameterSource(F.Source);
}

} // namespace

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
  const FunctionDecl *FD = nullptr;
  const FunctionAliasResult *R = analyseMatchedBody(Result, Model, FD);
  if (!R)
    return;
  ASTContext &Ctx = *Result.Context;
  for (const WriteEvent &W : R->Writes) {
    // `p.detach().zero_()` plainly means to write p.
    if (!W.RootDecl && IgnoreDirectChains)
      continue;
    const AffectedHandle *A =
        pickAffected(W, [](const AffectedHandle &C) { return C.CrossedDetach; });
    if (!A || !A->FirstDetach.Site)
      continue;
    if (IgnoreUnderNoGrad && isUnderNoGrad(W.Write, FD->getBody()))
      continue;
    SourceLocation Loc = reportLoc(W.Write);
    if (!Reported.first(Loc))
      continue;
    const AliasEdge &E = A->FirstDetach;
    std::string Op = "detach";
    if (const auto *Call = dyn_cast<CallExpr>(E.Site))
      if (const FunctionDecl *Callee = Call->getDirectCallee())
        Op = Callee->getNameAsString();
    std::string Handle = W.RootDecl ? declName(W.RootDecl) : std::string("the detached tensor");
    bool Param = detachesParameter(E, Model, Ctx);
    {
      auto D =
          diag(Loc, "%select{in-place '%1'|call to '%1', which writes its argument in place,}0 "
                    "on '%2' changes %3 behind autograd's back: %select{'%4()' shares "
                    "storage and the version counter with its source|'%4()' shares storage "
                    "but not even the version counter, so autograd cannot detect the "
                    "change}5")
          << (W.Via != nullptr) << writeName(W) << Handle << changedName(*A, Model) << Op
          << (E.Kind == EdgeKind::Data);
      std::optional<FixItHint> Fix =
          Param ? std::nullopt : detachCloneFix(E, Ctx);
      if (Fix)
        D << *Fix;
      emitFinding(writeFinding(getID(), HazardKind::DetachedWrite, Loc, W, *A, E,
                               Fix ? FixKind::DetachClone : FixKind::None, Ctx.getSourceManager()));
    }
    diag(E.Site->getBeginLoc(),
         "'%0' is detached here; use 'detach().clone()' for a copy the code can own%select{|, "
         "or write the parameter itself under a 'NoGradGuard' to change it}1",
         DiagnosticIDs::Note)
        << declName(A->Decl) << Param;
    diagText(exposureLoc(*A), exposureNote(*A), DiagnosticIDs::Note);
  }
}

} // namespace clang::tidy::tensor
