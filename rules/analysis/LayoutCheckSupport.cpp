#include "analysis/LayoutCheckSupport.h"

#include "analysis/AstHelpers.h"
#include "clang/AST/Expr.h"
#include "clang/AST/ExprCXX.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Lex/Lexer.h"

namespace clang::tidy::tensor {

Finding layoutFinding(StringRef Check, HazardKind Hazard, const Expr *Call, const ViewQuery &Q,
                      FixKind Fix, const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = Hazard;
  F.Where = SourcePoint::at(reportLoc(Call), SM);
  F.Op = F.Where;
  if (const auto *C = dyn_cast<CallExpr>(Call))
    if (const FunctionDecl *FD = C->getDirectCallee())
      F.OpName = FD->getNameAsString();
  F.Origin = SourcePoint::at(Q.Input.OriginLoc, SM);
  F.Fix = Fix;
  if (Q.Input.Sizes)
    F.Facts.push_back(Fact::LayoutKnown);
  F.Facts.push_back(Q.Certain ? Fact::LayoutCertain : Fact::LayoutUnproven);
  if (Q.Input.Assumed)
    F.Facts.push_back(Fact::AssumedContiguous);
  return F;
}

std::optional<OriginNote> originNote(const ViewQuery &Q, const Expr *Call,
                                     const SourceManager &SM) {
  SourceLocation OL = Q.Input.OriginLoc;
  if (OL.isInvalid() || SM.isPointWithin(OL, Call->getBeginLoc(), Call->getEndLoc()))
    return std::nullopt;
  return OriginNote{OL, Q.Input.Origin};
}

using namespace ast_matchers;

void registerWriteMatchers(MatchFinder *Finder, MatchFinder::MatchCallback *CB) {
  auto Named = functionDecl(matchesName("[a-z0-9]_$"));
  Finder->addMatcher(
      callExpr(unless(isExpansionInSystemHeader()), unless(cxxOperatorCallExpr()), callee(Named))
          .bind("write"),
      CB);
  Finder->addMatcher(cxxOperatorCallExpr(unless(isExpansionInSystemHeader()),
                                         hasAnyOverloadedOperatorName("+=", "-=", "*=", "/=", "="))
                         .bind("write"),
                     CB);
}

std::string writeOpName(const CallExpr *Call, const TensorModel &Model) {
  if (!Model.inPlaceTarget(Call))
    return "";
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    if (OC->getOperator() == OO_Equal)
      return Model.isTensorExpr(OC->getArg(1)) ? "copy_" : "fill_";
    return operatorOpName(OC).str();
  }
  const FunctionDecl *FD = Call->getDirectCallee();
  return FD && FD->getIdentifier() ? FD->getName().str() : "";
}

const TensorFact *expandedWriteTarget(const CallExpr *Write, const TensorModel &Model,
                                      ASTContext &Ctx) {
  // fill_/zero_ and metadata ops run; masked_fill_/index_put_ only warn.
  std::string Op = writeOpName(Write, Model);
  if (Op.empty() || sem::expandedWrite(Op) != sem::ExpandedWrite::Raises)
    return nullptr;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, Ctx).layoutAt(Write);
  const TensorFact *F = LA ? LA->factOf(Model.inPlaceTarget(Write)) : nullptr;
  return F && F->Broadcast ? F : nullptr;
}

std::optional<FixItHint> cloneAfter(const Expr *E, ASTContext &Ctx) {
  SourceLocation End = E->getEndLoc();
  if (End.isInvalid() || End.isMacroID() || E->getBeginLoc().isMacroID() ||
      inTemplateInstantiation(E, Ctx))
    return std::nullopt;
  SourceLocation After =
      Lexer::getLocForEndOfToken(End, 0, Ctx.getSourceManager(), Ctx.getLangOpts());
  if (After.isInvalid())
    return std::nullopt;
  return FixItHint::CreateInsertion(After, ".clone()");
}

Finding writeLayoutFinding(StringRef Check, HazardKind Hazard, const CallExpr *Write,
                           SourceLocation Loc, const TensorFact &F, FixKind Fix,
                           const SourceManager &SM) {
  Finding R;
  R.Check = Check.str();
  R.Hazard = Hazard;
  R.Where = SourcePoint::at(Loc, SM);
  R.Op = SourcePoint::at(reportLoc(Write), SM);
  if (const FunctionDecl *FD = Write->getDirectCallee())
    R.OpName = FD->getNameAsString();
  if (F.ExpandCall)
    R.Origin = SourcePoint::at(F.ExpandCall->getExprLoc(), SM);
  R.Fix = Fix;
  if (F.Sizes)
    R.Facts.push_back(Fact::LayoutKnown);
  if (F.Assumed)
    R.Facts.push_back(Fact::AssumedContiguous);
  if (F.BroadcastAssumed)
    R.Facts.push_back(Fact::ExpandAssumed);
  return R;
}

} // namespace clang::tidy::tensor
