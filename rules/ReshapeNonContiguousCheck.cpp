#include "ReshapeNonContiguousCheck.h"

#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

ReshapeNonContiguousCheck::ReshapeNonContiguousCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void ReshapeNonContiguousCheck::registerMatchers(MatchFinder *Finder) {
  // Member calls and the free functions (torch::reshape(x, ...), torch::flatten(x)).
  Finder->addMatcher(callExpr(callee(functionDecl(hasAnyName("reshape", "reshape_as", "flatten"))),
                              unless(isExpansionInSystemHeader()))
                         .bind("call"),
                     this);
}

void ReshapeNonContiguousCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CallExpr>("call");
  if (!Call || !Model.opOf(Call))
    return;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Call);
  const ViewQuery *Q = LA ? LA->queryOf(Call) : nullptr;
  if (!Q || Q->Result != ViewQuery::NotViewable)
    return;
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  const auto *ME = MC ? dyn_cast<MemberExpr>(MC->getCallee()) : nullptr;
  SourceLocation Loc = ME ? ME->getMemberLoc() : Call->getExprLoc();
  if (!Reported.first(Loc))
    return;

  std::string Name = Call->getDirectCallee()->getName().str();
  std::string What = Q->Input.Origin.empty()
                         ? std::string("its non-contiguous input")
                         : "the non-contiguous result of '" + Q->Input.Origin + "'";
  std::string Size;
  if (Q->Bytes)
    Size = " (" + LayoutAnalysis::formatBytes(*Q->Bytes) + ")";
  std::string Msg = "'" + Name + "' silently copies " + What + Size + ": ";
  if (Q->Certain)
    Msg += "the new shape cannot be a view of its strides";
  else
    Msg += "the new shape cannot be a view unless the dimensions it merges have size 1" +
           LayoutAnalysis::assumption(*Q);
  Msg += "; make the copy explicit with '.contiguous()";
  Msg += Name == "reshape" ? ".view(...)'" : "." + Name + "(...)'";
  {
    auto D = diagText(Loc, Msg);
    bool Fixable =
        ME && !Loc.isMacroID() && !ME->isArrow() && !inTemplateInstantiation(Call, *Result.Context);
    if (Fixable)
      D << FixItHint::CreateReplacement(
          ME->getMemberLoc(), Name == "reshape" ? "contiguous().view" : "contiguous()." + Name);
    emitFinding(layoutFinding(getID(), HazardKind::ImplicitCopy, Call, *Q,
                              Fixable ? FixKind::ContiguousFirst : FixKind::None,
                              *Result.SourceManager));
  }
  if (auto N = originNote(*Q, Call, *Result.SourceManager))
    diag(N->Loc, OriginNote::Format, DiagnosticIDs::Note) << N->Origin;
}

} // namespace clang::tidy::tensor
