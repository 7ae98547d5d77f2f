#include "InplaceOnSavedCheck.h"

#include "analysis/AliasCheckSupport.h"
#include "analysis/AnalysisManager.h"
#include "analysis/GradCheckSupport.h"
#include "analysis/SavedSearch.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

InplaceOnSavedCheck::InplaceOnSavedCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void InplaceOnSavedCheck::registerMatchers(MatchFinder *Finder) {
  registerWriteMatcher(Finder, this);
}

void InplaceOnSavedCheck::onEndOfTranslationUnit() {
  AnalysisManager::release();
  Reported.clear();
}

namespace {
// Without a backward in the function, the graph matters where its result
// leaves: a module's forward, or a function returning a tensor, a plain
// struct of them (`RoiLosses{cls, box, mask}`) or a pair or tuple of them.
bool graphLeaves(const FunctionDecl *FD, const TensorModel &Model) {
  return (FD->getIdentifier() && FD->getName() == "forward") ||
         Model.isTensorBundle(FD->getReturnType());
}

std::string opLabel(const CallExpr *Op) {
  if (const Expr *M = calledModule(Op)) { // `fc2(x)`: the module, not its operator()
    if (const auto *ME = dyn_cast<MemberExpr>(M))
      return ME->getMemberDecl()->getNameAsString();
    const auto *DRE = dyn_cast<DeclRefExpr>(M);
    return DRE ? DRE->getDecl()->getNameAsString() : "the module";
  }
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Op))
    return std::string("operator") + getOperatorSpelling(OC->getOperator());
  if (const CXXMethodDecl *Fwd = customFunctionForward(Op)) // SafeLog::apply
    return Fwd->getParent()->getNameAsString() + "::apply";
  const FunctionDecl *FD = Op->getDirectCallee();
  return FD ? FD->getNameAsString() : "the op";
}
} // namespace

void InplaceOnSavedCheck::check(const MatchFinder::MatchResult &Result) {
  std::optional<GradWrite> GW = matchedGradWrite(Result, Model);
  if (!GW)
    return;
  const auto [Write, Target, FD, G] = *GW;
  ASTContext &Ctx = *Result.Context;
  const auto *Root = dyn_cast<DeclRefExpr>(stripHandle(Model.viewRoot(Target)));
  if (!Root || !G->cfg() || G->factOf(Target).isGradLeafOrView())
    return; // a leaf: tensor-inplace-on-leaf
  AnalysisManager &AM = AnalysisManager::get(Model, Ctx);
  SavedBy S = findSaver(*G, Model, Root->getDecl(), Write,
                        [&](const FunctionDecl *Callee) { return AM.gradAt(Callee->getBody()); });
  if (!S.Op)
    return;
  const CallExpr *Bwd = findBackwardAfter(*G, Model, Write, S.Op);
  if (!Bwd && !graphLeaves(FD, Model))
    return;
  SourceLocation Loc = reportLoc(Write);
  if (!Reported.first(Loc))
    return;
  std::string Name = tensorName(Root, Ctx);
  {
    auto D =
        diag(Loc,
             "in-place '%0' on %1, which '%2' saved for backward (its %select{input|result}3): "
             "backward() %select{through '%2' raises|raises}4 \"one of the variables needed "
             "for gradient computation has been modified by an inplace operation\"",
             Bwd ? DiagnosticIDs::Error : DiagnosticIDs::Warning)
        << writeCallName(Write) << Name << opLabel(S.Op) << S.Result << (Bwd != nullptr);
    WriteEvent W;
    W.Write = Write;
    W.Target = Target;
    W.Root = Root;
    W.RootDecl = Root->getDecl();
    W.Direct = stripHandle(Target) == Root;
    auto Fix = outOfPlaceFix(W, Ctx);
    if (Fix)
      D << *Fix;
    Finding R = gradFinding(getID(), HazardKind::SavedInplace, Loc, Write, Target, G->factOf(Root),
                            Fix ? FixKind::OutOfPlace : FixKind::None, Ctx.getSourceManager());
    R.Origin = SourcePoint::at(S.Op->getBeginLoc(), Ctx.getSourceManager());
    R.Facts.push_back(Fact::SavedForBackward);
    if (Bwd)
      R.Facts.push_back(Fact::BackwardInFunction);
    emitFinding(std::move(R));
  }
  diag(S.Op->getBeginLoc(), "'%0' saves %select{its input %1|its result}2 for backward here",
       DiagnosticIDs::Note)
      << opLabel(S.Op) << Name << S.Result;
  if (Bwd)
    diag(Bwd->getBeginLoc(), "backward() runs here", DiagnosticIDs::Note);
}

} // namespace clang::tidy::tensor
