#include "InplaceOnLeafCheck.h"

#include "analysis/AliasCheckSupport.h"
#include "analysis/AnalysisManager.h"
#include "analysis/GradCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

InplaceOnLeafCheck::InplaceOnLeafCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void InplaceOnLeafCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(callExpr(unless(isExpansionInSystemHeader())).bind("write"), this);
}

void InplaceOnLeafCheck::onEndOfTranslationUnit() {
  AnalysisManager::release();
  Reported.clear();
}

void InplaceOnLeafCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Write = Result.Nodes.getNodeAs<CallExpr>("write");
  ASTContext &Ctx = *Result.Context;
  const Expr *Target = Model.inPlaceTarget(Write);
  if (!Target || GradFacts::runsWithoutGrad(Write))
    return;
  const FunctionDecl *FD = enclosingFunction(Write, Ctx);
  if (!FD || FD->isDependentContext() || isTensorLibraryCode(FD))
    return;
  const GradFacts *G = AnalysisManager::get(Model, Ctx).gradAt(Write);
  if (!G || !G->gradEnabledAt(Write))
    return;
  GradFact F = G->factOf(Target);
  if (!F.isGradLeafOrView())
    return;
  SourceLocation Loc = reportLoc(Write);
  if (!Reported.first(Loc))
    return;
  bool View = F.Kind == GradKind::LeafView;
  std::string Name = tensorName(Target, Ctx);
  {
    auto D = diag(Loc,
                  "in-place '%0' on %2, %select{a|a view of a}1 leaf tensor that requires "
                  "grad, while grad mode is on: PyTorch raises \"%select{a|a view of a}1 "
                  "leaf Variable that requires grad is being used in an in-place "
                  "operation.\"",
                  DiagnosticIDs::Error)
             << writeCallName(Write) << View << Name;
    auto Fix = noGradBlockFix(Write, FD->getBody(), Target, Ctx);
    if (Fix)
      D << *Fix;
    Finding R = gradFinding(getID(), HazardKind::LeafInplace, Loc, Write, Target, F,
                            Fix ? FixKind::NoGradBlock : FixKind::None, Ctx.getSourceManager());
    R.Facts.push_back(Fact::LeafRequiresGrad);
    emitFinding(std::move(R));
  }
  if (F.Source)
    diag(F.Source->getBeginLoc(), "%0 requires grad: %1", DiagnosticIDs::Note)
        << Name << describeGradSource(F.Source);
}

} // namespace clang::tidy::tensor
