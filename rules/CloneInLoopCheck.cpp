#include "CloneInLoopCheck.h"

#include "analysis/Finding.h"
#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

CloneInLoopCheck::CloneInLoopCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void CloneInLoopCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxMemberCallExpr(callee(cxxMethodDecl(
                                           hasAnyName("clone", "contiguous", "to", "cuda", "cpu"))),
                                       unless(isExpansionInSystemHeader()))
                         .bind("copy"),
                     this);
}

namespace {

// Every variable E names is declared before Loop (so the text can move there).
bool onlyOuterNames(const Stmt *S, const Stmt *Loop, LoopAnalysis &LA) {
  if (!S)
    return true;
  if (const auto *D = dyn_cast<DeclRefExpr>(S))
    if (const auto *V = dyn_cast<VarDecl>(D->getDecl()); V && LA.isDeclaredIn(V, Loop))
      return false;
  for (const Stmt *C : S->children())
    if (!onlyOuterNames(C, Loop, LA))
      return false;
  return true;
}

bool nameUsedElsewhere(const FunctionDecl *FD, const VarDecl *V) {
  struct Finder : RecursiveASTVisitor<Finder> {
    const VarDecl *V;
    bool Found = false;
    bool VisitVarDecl(VarDecl *D) {
      if (D != V && D->getIdentifier() && D->getName() == V->getName())
        Found = true;
      return !Found;
    }
  } F;
  F.V = V;
  for (const ParmVarDecl *P : FD->parameters())
    if (P->getIdentifier() && P->getName() == V->getName())
      return true;
  F.TraverseStmt(FD->getBody());
  return F.Found;
}

// ", 80 bytes each time" -> " (80 bytes each time)".
std::string wrap(const std::string &Each) {
  return Each.empty() ? "" : " (" + Each.substr(2) + ")";
}

// The typed finding of a copy of a loop-invariant Src in Loop.
Finding copyInLoopFinding(StringRef Check, const CXXMemberCallExpr *Call, const Expr *Src,
                          const Stmt *Loop, bool Written, FixKind Fix, const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = HazardKind::LoopInvariantCopy;
  F.Where = SourcePoint::at(reportLoc(Call), SM);
  F.Op = F.Where;
  F.OpName = Call->getMethodDecl()->getNameAsString();
  F.Origin = SourcePoint::at(Loop->getBeginLoc(), SM);
  if (const auto *DRE = dyn_cast<DeclRefExpr>(Src->IgnoreParenImpCasts()))
    F.Handles.push_back(handleOf(HandleRole::Source, DRE->getDecl(), SM));
  F.Fix = Fix;
  F.Facts.push_back(Fact::LoopInvariant);
  if (Written)
    F.Facts.push_back(Fact::WrittenInLoop);
  return F;
}

} // namespace

// The fix-its: use the source itself, or hoist the declaration out of the
// loop (and copy_ into it when the loop writes it).
static llvm::SmallVector<FixItHint, 3> hoistFixes(const CXXMemberCallExpr *Call, const Stmt *Loop,
                                                  LoopAnalysis &LA, const LoopAnalysis::Use &U,
                                                  StringRef SrcText, ASTContext &Ctx) {
  llvm::SmallVector<FixItHint, 3> Fixes;
  bool IsClone = Call->getMethodDecl()->getName() == "clone";
  if (Call->getBeginLoc().isMacroID() || Call->getEndLoc().isMacroID() ||
      Loop->getBeginLoc().isMacroID() || inTemplateInstantiation(Call, Ctx) || SrcText.empty())
    return Fixes;
  if (IsClone && !U.Written) {
    // The copy is only read, and its source does not change in the loop.
    Fixes.push_back(FixItHint::CreateReplacement(Call->getSourceRange(), SrcText));
    return Fixes;
  }
  if (LoopAnalysis::inClosure(Call, Loop, Ctx))
    return Fixes; // in a closure the loop runs: its captures may not reach a hoisted name
  const VarDecl *V = initialisedVar(Call, Ctx);
  const DeclStmt *DS = nullptr;
  if (V && LA.isDeclaredIn(V, Loop)) {
    DynTypedNodeList Ps = Ctx.getParents(*V);
    DS = Ps.empty() ? nullptr : Ps[0].get<DeclStmt>();
  }
  const FunctionDecl *FD = enclosingFunction(Call, Ctx);
  if (!DS || !DS->isSingleDecl() || U.Reassigned || V->getType().isConstQualified() ||
      !onlyOuterNames(Call, Loop, LA) || nameUsedElsewhere(FD, V))
    return Fixes;
  const SourceManager &SM = Ctx.getSourceManager();
  DynTypedNodeList LP = Ctx.getParents(*Loop);
  StringRef DeclText = Lexer::getSourceText(CharSourceRange::getTokenRange(DS->getSourceRange()),
                                            SM, Ctx.getLangOpts());
  if (LP.empty() || !LP[0].get<CompoundStmt>() || DeclText.empty())
    return Fixes;
  std::string Indent = Lexer::getIndentationForLine(Loop->getBeginLoc(), SM).str();
  Fixes.push_back(FixItHint::CreateInsertion(Loop->getBeginLoc(), DeclText.str() + "\n" + Indent));
  if (U.Written)
    Fixes.push_back(FixItHint::CreateReplacement(
        DS->getSourceRange(), V->getName().str() + ".copy_(" + SrcText.str() + ");"));
  else
    Fixes.push_back(FixItHint::CreateRemoval(wholeLines(DS->getBeginLoc(), DS->getEndLoc(), SM)));
  return Fixes;
}

// Whether the call copies on every iteration: a clone always does; the
// may-alias ops only when the facts at the call say they copy (contiguous()
// of a contiguous tensor, cpu() of a CPU tensor, to() of what it already is
// return the tensor itself).
static bool copiesEachTime(const CXXMemberCallExpr *Call, const LayoutAnalysis *Lay) {
  if (Call->getMethodDecl()->getName() == "clone")
    return true;
  const ConversionQuery *Q = Lay ? Lay->conversionOf(Call) : nullptr;
  return Q && Q->Result == ConversionQuery::Copies;
}

// "converts it again on every iteration (...)" for to/cpu/cuda/type_as.
static std::string conversionText(const ConversionQuery *Q, const std::string &Each,
                                  const TensorFact *Fact) {
  std::string Assumed;
  if (Q && Q->Assumed && Fact && !Fact->KindSource.Text.empty())
    Assumed = "; assuming " + Fact->KindSource.Text + " is a float32 CPU tensor, as nearly all are";
  if (Q && Q->Transfer)
    return " copies it to another device again on every iteration (a synchronising transfer" +
           Each + Assumed + "); ";
  return " converts it again on every iteration (a copy" + Each + Assumed + "); ";
}

std::string CloneInLoopCheck::message(const CXXMemberCallExpr *Call, StringRef SrcText,
                                      const LoopAnalysis::Use &U, const LayoutAnalysis *Lay) const {
  StringRef Name = Call->getMethodDecl()->getName();
  const TensorFact *Fact = Lay ? Lay->factOf(Call->getImplicitObjectArgument()) : nullptr;
  bool Named = SrcText.size() <= 40 && !SrcText.empty();
  std::string Shown = Named ? "'" + SrcText.str() + "'" : "the tensor";
  std::string Each;
  if (auto Bytes = Fact ? LayoutAnalysis::bytesOf(*Fact) : std::nullopt)
    Each = ", " + LayoutAnalysis::formatBytes(*Bytes) + " each time";
  bool IsClone = Name == "clone";
  std::string Msg = "'" + Name.str() + "' of " +
                    (Named ? "loop-invariant " + Shown : std::string("a loop-invariant tensor"));
  if (IsClone)
    Msg += " allocates and copies it on every iteration" + wrap(Each) + "; ";
  else if (Name == "contiguous")
    Msg += " copies the non-contiguous tensor on every iteration" + wrap(Each) + "; ";
  else
    Msg += conversionText(Lay ? Lay->conversionOf(Call) : nullptr, Each, Fact);
  if (IsClone && !U.Written)
    Msg += "it is never written: use " + Shown + " itself";
  else if (U.Written)
    Msg += "hoist one buffer out of the loop and 'copy_' into it";
  else
    Msg += "hoist it out of the loop";
  return Msg;
}

// `cuda()`, `cpu()`, or a conversion given a device, options or another
// tensor (whose device it takes): not a dtype-only conversion.
static bool mayMoveDevice(const CXXMemberCallExpr *Call, const TensorModel &Model) {
  StringRef Name = Call->getMethodDecl()->getName();
  return Name == "cuda" || Name == "cpu" || llvm::any_of(Call->arguments(), [&](const Expr *A) {
           return isDeviceLikeType(A->getType()) || Model.isTensorExpr(A);
         });
}

std::optional<CloneInLoopCheck::LoopCopy>
CloneInLoopCheck::reportedCopy(const CXXMemberCallExpr *Call, const TensorModel &Model,
                               ASTContext &Ctx) {
  const Expr *Src = Call->getImplicitObjectArgument();
  if (!Call->getMethodDecl() || !Src || !Model.isTensorExpr(Src) || !Model.isTensorExpr(Call))
    return std::nullopt;
  LoopCopy C;
  C.Loop = LoopAnalysis::loopRunning(Call, Ctx);
  AnalysisManager &AM = AnalysisManager::get(Model, Ctx);
  C.LA = C.Loop ? AM.loopsAt(C.Loop) : nullptr;
  if (!C.LA || LoopAnalysis::firstIterationOnly(Call, C.Loop, Ctx) ||
      !C.LA->isInvariant(Src, C.Loop) ||
      !llvm::all_of(Call->arguments(), [&](const Expr *A) { return C.LA->isInvariant(A, C.Loop); }))
    return std::nullopt;
  C.Lay = AM.layoutAt(Call);
  if (!copiesEachTime(Call, C.Lay))
    return std::nullopt;
  C.U = C.LA->usesOfTemporary(Call, C.Loop);
  // `correct = torch::zeros({}).to(device)` then `correct += ...`: an
  // accumulator started afresh each pass, whose fresh value is the point;
  // `torch::arange(n).to(kFloat)`: a construction in two steps, not a copy of
  // a tensor that lives across iterations (a possible move to a device still is).
  if (C.U.Escapes ||
      (TensorModel::isFactoryCall(Src) && (C.U.Written || !mayMoveDevice(Call, Model))))
    return std::nullopt;
  return C;
}

void CloneInLoopCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CXXMemberCallExpr>("copy");
  ASTContext &Ctx = *Result.Context;
  if (!Call)
    return;
  std::optional<LoopCopy> C = reportedCopy(Call, Model, Ctx);
  const auto *ME = dyn_cast<MemberExpr>(Call->getCallee());
  if (!C || !ME || !Reported.first(ME->getMemberLoc()))
    return;
  const Expr *Src = Call->getImplicitObjectArgument();
  StringRef SrcText = Lexer::getSourceText(CharSourceRange::getTokenRange(Src->getSourceRange()),
                                           *Result.SourceManager, getLangOpts());
  auto Fixes = hoistFixes(Call, C->Loop, *C->LA, C->U, SrcText, Ctx);
  auto D = diagText(ME->getMemberLoc(), message(Call, SrcText, C->U, C->Lay));
  for (const FixItHint &F : Fixes)
    D << F;
  FixKind Fix = Fixes.empty()       ? FixKind::None
                : Fixes.size() == 1 ? FixKind::UseSource
                : C->U.Written      ? FixKind::HoistAndCopyInto
                                    : FixKind::HoistOutOfLoop;
  emitFinding(
      copyInLoopFinding(getID(), Call, Src, C->Loop, C->U.Written, Fix, *Result.SourceManager));
}

} // namespace clang::tidy::tensor
