#include "InplaceOnExpandedCheck.h"

#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

// The op that made the tensor expanded, for messages.
static std::string expandName(const TensorFact &F) {
  if (const FunctionDecl *FD = F.ExpandCall ? F.ExpandCall->getDirectCallee() : nullptr)
    return FD->getNameAsString();
  return "expand";
}

// A raising write that comes before Write in its function, in source order,
// on a tensor of the same expand.
static bool earlierWrite(const Stmt *S, const CallExpr *Write, const TensorFact &F,
                         const LayoutAnalysis &LA, const TensorModel &Model,
                         const SourceManager &SM) {
  if (!S)
    return false;
  if (const auto *W = dyn_cast<CallExpr>(S); W && W != Write &&
                                             SM.isBeforeInTranslationUnit(W->getBeginLoc(),
                                                                          Write->getBeginLoc())) {
    std::string Op = writeOpName(W, Model);
    const TensorFact *G = Op.empty() ? nullptr : LA.factOf(Model.inPlaceTarget(W));
    if (G && G->Broadcast && G->ExpandCall == F.ExpandCall &&
        sem::expandedWrite(Op) == sem::ExpandedWrite::Raises)
      return true;
  }
  for (const Stmt *C : S->children())
    if (earlierWrite(C, Write, F, LA, Model, SM))
      return true;
  return false;
}

bool InplaceOnExpandedCheck::writtenBefore(const CallExpr *Write, const TensorFact &F,
                                           const LayoutAnalysis &LA, ASTContext &Ctx) const {
  const FunctionDecl *FD = enclosingFunction(Write, Ctx);
  return FD && earlierWrite(FD->getBody(), Write, F, LA, Model, Ctx.getSourceManager());
}

void InplaceOnExpandedCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Write = Result.Nodes.getNodeAs<CallExpr>("write");
  const TensorFact *F = Write ? expandedWriteTarget(Write, Model, *Result.Context) : nullptr;
  if (!F)
    return;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Write);
  std::string Op = writeOpName(Write, Model);
  SourceLocation Loc = reportLoc(Write);
  if (F->ExpandCall && writtenBefore(Write, *F, *LA, *Result.Context))
    return;
  if (!Reported.first(Loc))
    return;
  std::string Expand = expandName(*F);
  std::string Msg = "in-place '" + Op + "' on a tensor expanded by '" + Expand +
                    "' throws at run time: its elements along a stride-0 dimension share "
                    "one memory location ('unsupported operation: more than one element of "
                    "the written-to tensor refers to a single memory location. Please clone() "
                    "the tensor before performing the operation.')";
  if (F->BroadcastAssumed)
    Msg += "; assuming '" + Expand + "' broadcasts a dimension to a size > 1, as nearly all do";
  std::optional<FixItHint> Fix;
  if (F->ExpandCall)
    Fix = cloneAfter(F->ExpandCall, *Result.Context);
  {
    auto D = diagText(Loc, Msg,
                      F->BroadcastAssumed ? DiagnosticIDs::Warning : DiagnosticIDs::Error);
    if (Fix)
      D << *Fix;
    emitFinding(writeLayoutFinding(getID(), HazardKind::ExpandedWrite, Write, Loc, *F,
                                   Fix ? FixKind::CloneAtExpand : FixKind::None,
                                   *Result.SourceManager));
  }
  if (F->ExpandCall && !Result.SourceManager->isPointWithin(
                           F->ExpandCall->getExprLoc(), Write->getBeginLoc(), Write->getEndLoc()))
    diag(F->ExpandCall->getExprLoc(),
         "expanded here; '.clone()' gives the tensor memory of its own", DiagnosticIDs::Note);
}

} // namespace clang::tidy::tensor
