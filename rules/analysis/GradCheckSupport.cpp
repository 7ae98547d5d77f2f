#include "analysis/GradCheckSupport.h"

#include "analysis/AliasCheckSupport.h"
#include "analysis/AnalysisManager.h"
#include "analysis/AstHelpers.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/ExprCXX.h"
#include "clang/Lex/Lexer.h"

namespace clang::tidy::tensor {

void registerWriteMatcher(ast_matchers::MatchFinder *Finder,
                          ast_matchers::MatchFinder::MatchCallback *CB) {
  using namespace ast_matchers;
  Finder->addMatcher(callExpr(unless(isExpansionInSystemHeader())).bind("write"), CB);
}

std::optional<GradWrite> matchedGradWrite(const ast_matchers::MatchFinder::MatchResult &Result,
                                          const TensorModel &Model) {
  GradWrite W;
  W.Write = Result.Nodes.getNodeAs<CallExpr>("write");
  ASTContext &Ctx = *Result.Context;
  W.Target = W.Write ? Model.inPlaceTarget(W.Write) : nullptr;
  if (!W.Target || GradFacts::runsWithoutGrad(W.Write))
    return std::nullopt;
  W.FD = enclosingFunction(W.Write, Ctx);
  if (!W.FD || W.FD->isDependentContext() || isTensorLibraryCode(W.FD))
    return std::nullopt;
  W.G = AnalysisManager::get(Model, Ctx).gradAt(W.Write);
  if (!W.G)
    return std::nullopt;
  return W;
}

std::string tensorName(const Expr *E, ASTContext &Ctx) {
  std::string T = text(stripHandle(E), Ctx);
  return T.empty() || T.size() > 40 ? "the tensor" : "'" + T + "'";
}

std::string writeCallName(const CallExpr *Write) {
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Write))
    return getOperatorSpelling(OC->getOperator());
  if (const FunctionDecl *FD = Write->getDirectCallee())
    return FD->getNameAsString();
  return "write";
}

namespace {
std::string sourceCallee(const Stmt *Source) {
  const auto *Call = dyn_cast_or_null<CallExpr>(Source);
  const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
  return FD && FD->getIdentifier() ? FD->getName().str() : "";
}
bool isParameterList(llvm::StringRef N) {
  return N == "parameters" || N == "named_parameters" || N == "param_groups" || N == "params";
}
} // namespace

bool isParameterSource(const Stmt *Source) {
  std::string N = sourceCallee(Source);
  return isa_and_nonnull<MemberExpr>(Source) || isParameterList(N) || N == "register_parameter";
}

std::string describeGradSource(const Stmt *Source) {
  if (isa<MemberExpr>(Source))
    return "it is a parameter of the module";
  std::string N = sourceCallee(Source);
  if (isParameterList(N))
    return "it is a parameter, from '" + N + "()'";
  if (N == "register_parameter")
    return "it is registered with 'register_parameter'";
  if (N == "requires_grad_" || N == "set_requires_grad")
    return "it is given '" + N + "()' here";
  return "it is made with 'requires_grad(true)' here";
}

std::optional<llvm::SmallVector<FixItHint, 2>>
noGradBlockFix(const CallExpr *Write, const Stmt *Body, const Expr *Target, ASTContext &Ctx) {
  if (!isFullStatement(Write, Body) || inMacro(Write->getSourceRange()) ||
      inTemplateInstantiation(Write, Ctx))
    return std::nullopt;
  const SourceManager &SM = Ctx.getSourceManager();
  SourceLocation AfterSemi =
      Lexer::findLocationAfterToken(Write->getEndLoc(), tok::semi, SM, Ctx.getLangOpts(), false);
  if (AfterSemi.isInvalid())
    return std::nullopt;
  const auto *RD = Target->getType().getNonReferenceType()->getAsCXXRecordDecl();
  llvm::StringRef NS = RD && isInNamespace(RD, {"tt"}) ? "tt" : "torch";
  llvm::SmallVector<FixItHint, 2> Fix;
  Fix.push_back(FixItHint::CreateInsertion(Write->getBeginLoc(),
                                           "{ " + NS.str() + "::NoGradGuard no_grad; "));
  Fix.push_back(FixItHint::CreateInsertion(AfterSemi, " }"));
  return Fix;
}

Finding gradFinding(StringRef Check, HazardKind Hazard, SourceLocation Loc, const CallExpr *Write,
                    const Expr *Target, const GradFact &F, FixKind Fix, const SourceManager &SM) {
  Finding R;
  R.Check = Check.str();
  R.Hazard = Hazard;
  R.Where = SourcePoint::at(Loc, SM);
  R.Op = SourcePoint::at(Write->getBeginLoc(), SM);
  R.OpName = writeCallName(Write);
  if (F.Source)
    R.Origin = SourcePoint::at(F.Source->getBeginLoc(), SM);
  if (const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(Target)))
    R.Handles.push_back(handleOf(HandleRole::Written, DRE->getDecl(), SM));
  R.Fix = Fix;
  return R;
}

} // namespace clang::tidy::tensor
