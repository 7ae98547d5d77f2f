#include "CloneInLoopCheck.h"

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
  Finder->addMatcher(
      cxxMemberCallExpr(callee(cxxMethodDecl(hasAnyName("clone", "contiguous", "to", "cuda", "cpu"))),
                        unless(isExpansionInSystemHeader()))
          .bind("copy"),
      this);
}

namespace {

// The local variable a value initialises, looking through implicit nodes.
const VarDecl *initialisedVar(const Expr *E, ASTContext &Ctx) {
  const Stmt *Cur = E;
  for (int I = 0; I < 8; ++I) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    if (Ps.empty())
      return nullptr;
    if (const auto *V = Ps[0].get<VarDecl>())
      return V;
    const auto *P = Ps[0].get<Stmt>();
    if (!P || !isa<ImplicitCastExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr,
                   ExprWithCleanups, CXXConstructExpr, ParenExpr>(P))
      return nullptr;
    if (const auto *CE = dyn_cast<CXXConstructExpr>(P); CE && CE->getNumArgs() != 1)
      return nullptr;
    Cur = P;
  }
  return nullptr;
}

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

void CloneInLoopCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CXXMemberCallExpr>("copy");
  ASTContext &Ctx = *Result.Context;
  const SourceManager &SM = *Result.SourceManager;
  if (!Call || !Call->getMethodDecl())
    return;
  const Expr *Src = Call->getImplicitObjectArgument();
  if (!Src || !Model.isTensorExpr(Src) || !Model.isTensorExpr(Call))
    return;
  const Stmt *Loop = LoopAnalysis::innermostLoop(Call, Ctx);
  const FunctionDecl *FD = Loop ? enclosingFunction(Call, Ctx) : nullptr;
  if (!FD || !FD->hasBody())
    return;
  auto &LAp = Loops[FD];
  if (!LAp)
    LAp = std::make_unique<LoopAnalysis>(Model, Ctx, FD);
  LoopAnalysis &LA = *LAp;
  if (!LA.isInvariant(Src, Loop))
    return;
  for (const Expr *A : Call->arguments())
    if (!LA.isInvariant(A, Loop))
      return;

  StringRef Name = Call->getMethodDecl()->getName();
  const LayoutAnalysis *Lay = Layouts.forExpr(Call, Ctx);
  const TensorFact *Fact = Lay ? Lay->factOf(Src) : nullptr;
  // contiguous() of a contiguous tensor returns it: no copy.
  if (Name == "contiguous" && (!Fact || Fact->Contig != TensorFact::No))
    return;

  LoopAnalysis::Use U = LA.usesOfTemporary(Call, Loop);
  if (U.Escapes)
    return;
  const auto *ME = dyn_cast<MemberExpr>(Call->getCallee());
  if (!ME || !Reported.first(ME->getMemberLoc()))
    return;

  const LangOptions &LO = getLangOpts();
  CharSourceRange SrcRange = CharSourceRange::getTokenRange(Src->getSourceRange());
  StringRef SrcText = Lexer::getSourceText(SrcRange, SM, LO);
  bool Named = SrcText.size() <= 40 && !SrcText.empty();
  std::string Shown = Named ? "'" + SrcText.str() + "'" : "the tensor";
  std::string Each;
  if (Fact && Fact->Sizes && Fact->ElemSize &&
      llvm::all_of(*Fact->Sizes, [](const Mono &M) { return M.isConst(); })) {
    std::int64_t N = Fact->ElemSize;
    for (const Mono &M : *Fact->Sizes)
      N *= M.Num;
    Each = " (" + LayoutAnalysis::formatBytes(N) + " each time)";
  }
  bool IsClone = Name == "clone";
  std::string Msg = "'" + Name.str() + "' of " +
                    (Named ? "loop-invariant " + Shown : std::string("a loop-invariant tensor"));
  if (IsClone)
    Msg += " allocates and copies it on every iteration" + Each + "; ";
  else if (Name == "contiguous")
    Msg += " copies the non-contiguous tensor on every iteration" + Each + "; ";
  else
    Msg += " converts it again on every iteration (a copy" + Each +
           ", and a synchronising transfer for another device, whenever it changes dtype or "
           "device); ";
  if (IsClone && !U.Written)
    Msg += "it is never written: use " + Shown + " itself";
  else if (U.Written)
    Msg += "hoist one buffer out of the loop and 'copy_' into it";
  else
    Msg += "hoist it out of the loop";

  // Fix-its.
  llvm::SmallVector<FixItHint, 3> Fixes;
  bool Macro = Call->getBeginLoc().isMacroID() || Call->getEndLoc().isMacroID() ||
               Loop->getBeginLoc().isMacroID() || inTemplateInstantiation(Call, Ctx);
  const VarDecl *V = initialisedVar(Call, Ctx);
  const DeclStmt *DS = nullptr;
  if (V && LA.isDeclaredIn(V, Loop)) {
    DynTypedNodeList Ps = Ctx.getParents(*V);
    DS = Ps.empty() ? nullptr : Ps[0].get<DeclStmt>();
    if (DS && !DS->isSingleDecl())
      DS = nullptr;
  }
  if (!Macro && IsClone && !U.Written && !SrcText.empty()) {
    // The copy is only read, and its source does not change in the loop.
    Fixes.push_back(FixItHint::CreateReplacement(Call->getSourceRange(), SrcText));
  } else if (!Macro && DS && !U.Reassigned && !V->getType().isConstQualified() &&
             onlyOuterNames(Call, Loop, LA) && !nameUsedElsewhere(FD, V) && !SrcText.empty()) {
    DynTypedNodeList LP = Ctx.getParents(*Loop);
    bool InBlock = !LP.empty() && LP[0].get<CompoundStmt>();
    StringRef DeclText = Lexer::getSourceText(
        CharSourceRange::getTokenRange(DS->getSourceRange()), SM, LO);
    if (InBlock && !DeclText.empty()) {
      std::string Indent = Lexer::getIndentationForLine(Loop->getBeginLoc(), SM).str();
      Fixes.push_back(
          FixItHint::CreateInsertion(Loop->getBeginLoc(), DeclText.str() + "\n" + Indent));
      if (U.Written) {
        Fixes.push_back(FixItHint::CreateReplacement(
            DS->getSourceRange(), V->getName().str() + ".copy_(" + SrcText.str() + ");"));
      } else {
        // Remove the whole line when the declaration is alone on it.
        SourceLocation B = DS->getBeginLoc(), E = DS->getEndLoc();
        std::pair<FileID, unsigned> BI = SM.getDecomposedLoc(B), EI = SM.getDecomposedLoc(E);
        StringRef Buf = SM.getBufferData(BI.first);
        unsigned LineStart = Buf.rfind('\n', BI.second) + 1;
        unsigned LineEnd = Buf.find('\n', EI.second);
        if (Buf.slice(LineStart, BI.second).trim().empty() && LineEnd != StringRef::npos &&
            Buf.slice(EI.second + 1, LineEnd).trim().empty())
          Fixes.push_back(FixItHint::CreateRemoval(CharSourceRange::getCharRange(
              B.getLocWithOffset(-(int)(BI.second - LineStart)),
              E.getLocWithOffset(LineEnd - EI.second + 1))));
        else
          Fixes.push_back(FixItHint::CreateRemoval(DS->getSourceRange()));
      }
    }
  }
  auto D = diag(ME->getMemberLoc(), Msg);
  for (const FixItHint &F : Fixes)
    D << F;
  emitFinding(copyInLoopFinding(getID(), Call, Src, Loop, U.Written,
                                Fixes.empty()   ? FixKind::None
                                : Fixes.size() == 1 ? FixKind::UseSource
                                : U.Written     ? FixKind::HoistAndCopyInto
                                                : FixKind::HoistOutOfLoop,
                                SM));
}

} // namespace clang::tidy::tensor
