#include "AliasThenMutateCheck.h"

#include "analysis/AliasCheckSupport.h"
#include "analysis/AnalysisManager.h"
#include "analysis/Finding.h"
#include "analysis/GradFacts.h"
#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

AliasThenMutateCheck::AliasThenMutateCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void AliasThenMutateCheck::registerMatchers(MatchFinder *Finder) {
  registerBodyMatchers(Finder, this);
}

void AliasThenMutateCheck::onEndOfTranslationUnit() {
  AnalysisManager::release();
  Reported.clear();
}

// A plain handle to a module's parameter: `auto w = fc->weight; w.zero_();`
// under no-grad is how a parameter is initialised. (`p.to(kFloat)` may be
// meant as a copy: still reported.)
static bool initialisesParameter(const AffectedHandle &A) {
  const auto *F = dyn_cast_or_null<FieldDecl>(A.Decl);
  return F && !A.Owner && A.FirstAlias.Kind != EdgeKind::MayAlias && isParameterField(F);
}

// `f(x.to(device))` with f writing its argument: the copy on the device is
// what f is given to write; only a CPU-only run writes x. A direct write
// (`t = x.to(device); t.sub_(m)`) is still reported.
static bool viaCallOnRunTimeDevice(const WriteEvent &W, const AffectedHandle &A,
                                   AnalysisManager &AM) {
  const auto *Call = dyn_cast_or_null<CallExpr>(A.FirstAlias.Site);
  const ConversionQuery *Q =
      W.Via && A.FirstAlias.Kind == EdgeKind::MayAlias && Call ? AM.conversionAt(Call) : nullptr;
  return Q && Q->RunTimeDevice;
}

// `Orig.copy_(Alias)` in S: the code writes the alias's values back into
// the original (`p32 = p.to(kFloat); p32.sub_(u); p.copy_(p32);`, a master
// copy's update): a write through the alias is meant to reach Orig.
static bool writesBack(const Stmt *S, const ValueDecl *Orig, const ValueDecl *Alias) {
  if (!S)
    return false;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S);
      MC && MC->getMethodDecl() && MC->getMethodDecl()->getIdentifier() &&
      MC->getMethodDecl()->getName() == "copy_" && MC->getNumArgs() >= 1 &&
      varOf(MC->getImplicitObjectArgument()) == Orig && varOf(MC->getArg(0)) == Alias)
    return true;
  return llvm::any_of(S->children(), [&](const Stmt *C) { return writesBack(C, Orig, Alias); });
}

// A parameter of a function named with a trailing underscore (`rotate_z_`),
// PyTorch's mark of an in-place op: writing it is what the function is for.
static bool writesOwnParameter(const AffectedHandle &A, const FunctionDecl *FD) {
  const auto *P = dyn_cast_or_null<ParmVarDecl>(A.Decl);
  return P && !A.Owner && P->getDeclContext() == FD && FD->getIdentifier() &&
         FD->getName().ends_with("_");
}

// The handle the write also changes: a later read first, then an escape.
static const AffectedHandle *pick(const WriteEvent &W, AnalysisManager &AM,
                                  const FunctionDecl *FD) {
  return pickAffected(W, [&](const AffectedHandle &A) {
    return A.CrossedAlias && !A.CrossedDetach && !initialisesParameter(A) &&
           !writesOwnParameter(A, FD) &&
           !viaCallOnRunTimeDevice(W, A, AM) && !writesBack(FD->getBody(), A.Decl, W.RootDecl);
  });
}

// A write PyTorch refuses on an expanded tensor changes nothing: it is
// tensor-inplace-on-expanded's finding.
bool AliasThenMutateCheck::refusedAsExpanded(const WriteEvent &W, ASTContext &Ctx) const {
  const auto *Call = W.Via ? nullptr : dyn_cast<CallExpr>(W.Write);
  return Call && expandedWriteTarget(Call, Model, Ctx);
}

void AliasThenMutateCheck::check(const MatchFinder::MatchResult &Result) {
  const FunctionDecl *FD = nullptr;
  const FunctionAliasResult *R = analyseMatchedBody(Result, Model, FD);
  if (!R)
    return;
  ASTContext &Ctx = *Result.Context;

  // Writes through handles (not temporaries) that change another handle,
  // counted per alias creation: several writes get one clone() there.
  llvm::SmallVector<std::pair<const WriteEvent *, const AffectedHandle *>, 4> Found;
  llvm::DenseMap<const Expr *, unsigned> PerSite;
  // `x.sub_(m).div_(s)`: the chain writes one tensor; its first write is the report.
  llvm::DenseSet<const Expr *> Writes;
  for (const WriteEvent &W : R->Writes)
    Writes.insert(W.Write);
  for (const WriteEvent &W : R->Writes) {
    if (!W.RootDecl || (W.Target && Writes.contains(stripHandle(W.Target))))
      continue;
    // The callee writes only a copy of the handle it is given: its own
    // finding, where the copy is made, is the one to mend.
    if (W.Via && W.ViaCopyOnly)
      continue;
    // The layout lookup last: only for a write about to be reported.
    if (const AffectedHandle *A = pick(W, AnalysisManager::get(Model, Ctx), FD);
        A && !refusedAsExpanded(W, Ctx)) {
      Found.push_back({&W, A});
      ++PerSite[A->FirstAlias.Site];
    }
  }
  llvm::sort(Found, [](const auto &L, const auto &Rr) {
    return L.first->Write->getBeginLoc() < Rr.first->Write->getBeginLoc();
  });
  llvm::DenseSet<const Expr *> CloneOffered;
  for (const auto &[W, A] : Found) {
    SourceLocation Loc = reportLoc(W->Write);
    if (!Reported.first(Loc))
      continue;
    const AliasEdge &E = A->FirstAlias;
    std::string Op;
    if (E.Kind == EdgeKind::MayAlias)
      if (const auto *Call = dyn_cast_or_null<CallExpr>(E.Site))
        if (const FunctionDecl *Callee = Call->getDirectCallee())
          Op = Callee->getNameAsString();
    {
      auto D =
          diag(Loc, "%select{in-place '%1'|call to '%1', which writes its argument in place,}0 "
                    "on '%2' %select{also changes|may also change}3 %4%select{, "
                    "which shares its storage: copying a tensor handle does not copy data|: "
                    "'%5' returns its input, not a copy, when it can}3")
          << (W->Via != nullptr) << writeName(*W) << declName(W->RootDecl)
          << (E.Kind == EdgeKind::MayAlias) << changedName(*A, Model) << Op;
      std::optional<llvm::SmallVector<FixItHint, 2>> Fix;
      FixKind Kind = FixKind::OutOfPlace;
      if (PerSite[E.Site] == 1 && isFullStatement(W->Write, FD->getBody()))
        Fix = outOfPlaceFix(*W, Ctx);
      if (!Fix && CloneOffered.insert(E.Site).second)
        Fix = cloneFix(E, Ctx), Kind = FixKind::CloneAtAlias;
      if (Fix)
        for (const FixItHint &H : *Fix)
          D << H;
      emitFinding(writeFinding(getID(), HazardKind::SharedStorageWrite, Loc, *W, *A, E,
                               Fix ? Kind : FixKind::None, Ctx.getSourceManager()));
    }
    if (E.Site)
      diag(E.Site->getBeginLoc(),
           E.Kind == EdgeKind::MayAlias
               ? "'%0' may return its input here; use '.clone()' for an independent copy"
               : "the handle is copied here, sharing storage; use '.clone()' to copy the data",
           DiagnosticIDs::Note)
          << Op;
    diagText(exposureLoc(*A), exposureNote(*A), DiagnosticIDs::Note);
  }
}

} // namespace clang::tidy::tensor
