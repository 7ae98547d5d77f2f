#include "UnnecessaryCloneCheck.h"

#include "CloneInLoopCheck.h"
#include "analysis/Finding.h"

#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"
#include "llvm/ADT/StringSwitch.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

UnnecessaryCloneCheck::UnnecessaryCloneCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void UnnecessaryCloneCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxMemberCallExpr(callee(cxxMethodDecl(hasName("clone"))),
                                       unless(isExpansionInSystemHeader()))
                         .bind("clone"),
                     this);
}

namespace {

StringRef textOf(SourceRange R, ASTContext &Ctx) {
  return Lexer::getSourceText(CharSourceRange::getTokenRange(R), Ctx.getSourceManager(),
                              Ctx.getLangOpts());
}

// Uses that reach the storage or the autograd identity of a handle without an
// in-place op the analyses see: raw pointers and accessors (written through),
// the gradient flag and the .grad of this very tensor.
bool isIdentityUse(StringRef Name) {
  return llvm::StringSwitch<bool>(Name)
      .Cases("data_ptr", "mutable_data_ptr", "accessor", "packed_accessor32", true)
      .Cases("packed_accessor64", "generic_packed_accessor", "unsafeGetTensorImpl", true)
      .Cases("storage", "set_", "set_data", "requires_grad_", "set_requires_grad", true)
      .Cases("retain_grad", "grad", "mutable_grad", "is_leaf", "_version", true)
      .Default(false);
}

// Some statement of Region calls an identity method on a handle named in Vars.
bool identityUsed(llvm::ArrayRef<const Stmt *> Region, llvm::ArrayRef<const ValueDecl *> Vars) {
  llvm::SmallVector<const Stmt *, 32> Work(Region.begin(), Region.end());
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S))
      if (const auto *MD = MC->getMethodDecl();
          MD && MD->getIdentifier() && isIdentityUse(MD->getName()))
        if (const auto *D =
                dyn_cast_or_null<DeclRefExpr>(stripHandle(MC->getImplicitObjectArgument()));
            D && llvm::is_contained(Vars, D->getDecl()))
          return true;
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
  return false;
}

// The block statement V = Src.clone() declares V in, and what follows it.
std::optional<UnnecessaryCloneCheck::CloneDecl> cloneDecl(const CXXMemberCallExpr *Call,
                                                          ASTContext &Ctx) {
  UnnecessaryCloneCheck::CloneDecl C;
  C.Call = Call;
  C.V = initialisedVar(Call, Ctx);
  if (!C.V || !C.V->isLocalVarDecl() || C.V->isStaticLocal() || C.V->getType()->isReferenceType())
    return std::nullopt;
  DynTypedNodeList Ps = Ctx.getParents(*C.V);
  C.DS = Ps.empty() ? nullptr : Ps[0].get<DeclStmt>();
  DynTypedNodeList Bs = C.DS ? Ctx.getParents(*C.DS) : DynTypedNodeList(DynTypedNode());
  const auto *Block = C.DS ? Bs[0].get<CompoundStmt>() : nullptr;
  if (!Block || !C.DS->isSingleDecl())
    return std::nullopt;
  bool After = false;
  for (const Stmt *S : Block->body()) {
    if (After)
      C.Rest.push_back(S);
    After |= S == C.DS;
  }
  return C;
}

// `V.op_(args)` / `V op= rhs` as a whole statement: the in-place call, the
// out-of-place op of the table that computes the same, and its arguments.
struct InPlaceUse {
  const Expr *Call = nullptr;
  std::string OutOfPlace;
  SourceRange Args;
  llvm::SmallVector<const Expr *, 2> ArgExprs;
  bool Chained = false; // more in-place calls follow in the statement
};

// `x.sub_(m).div_(s)`: the innermost of a chain of in-place method calls.
const Expr *firstOfInPlaceChain(const Expr *E, bool &Chained) {
  while (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
    const CXXMethodDecl *MD = MC->getMethodDecl();
    const Expr *Obj = MC->getImplicitObjectArgument()->IgnoreImplicit();
    if (!MD || !MD->getIdentifier() || !MD->getName().ends_with("_") ||
        !isa<CXXMemberCallExpr>(Obj))
      break;
    E = Obj;
    Chained = true;
  }
  return E;
}

std::string outOfPlaceOf(StringRef InPlace) {
  std::string Out = llvm::StringSwitch<std::string>(InPlace)
                        .Case("+=", "add")
                        .Case("-=", "sub")
                        .Case("*=", "mul")
                        .Case("/=", "div")
                        .Default(InPlace.ends_with("_") ? InPlace.drop_back().str() : "");
  const sem::OpInfo *In = sem::lookup(InPlace.ends_with("_") ? InPlace : StringRef(Out + "_"));
  const sem::OpInfo *Op = Out.empty() ? nullptr : sem::lookup(Out);
  // copy_, fill_, zero_ have no out-of-place twin in the table.
  bool Twin =
      Op && Op->storage == sem::Storage::Fresh && (!In || In->storage == sem::Storage::InPlace);
  return Twin ? Out : "";
}

std::optional<InPlaceUse> inPlaceStatement(const Stmt *S, const VarDecl *V) {
  const auto *E = dyn_cast_or_null<Expr>(S);
  if (!E)
    return std::nullopt;
  E = E->IgnoreImplicit();
  auto Names = [&](const Expr *X) {
    const auto *D = dyn_cast_or_null<DeclRefExpr>(stripHandle(X));
    return D && D->getDecl() == V;
  };
  InPlaceUse U;
  E = firstOfInPlaceChain(E, U.Chained);
  U.Call = E;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
    const CXXMethodDecl *MD = MC->getMethodDecl();
    if (!MD || !MD->getIdentifier() || !Names(MC->getImplicitObjectArgument()) ||
        !isa<MemberExpr>(MC->getCallee()) || cast<MemberExpr>(MC->getCallee())->isArrow())
      return std::nullopt;
    U.OutOfPlace = outOfPlaceOf(MD->getName());
    unsigned N = 0;
    for (const Expr *A : MC->arguments())
      if (!isa<CXXDefaultArgExpr>(A)) {
        ++N;
        U.ArgExprs.push_back(A);
      }
    if (N)
      U.Args = SourceRange(MC->getArg(0)->getBeginLoc(), MC->getArg(N - 1)->getEndLoc());
  } else if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E);
             OC && OC->getNumArgs() == 2 && Names(OC->getArg(0))) {
    U.OutOfPlace = outOfPlaceOf(getOperatorSpelling(OC->getOperator()));
    U.Args = OC->getArg(1)->getSourceRange();
    U.ArgExprs.push_back(OC->getArg(1));
  }
  if (U.OutOfPlace.empty())
    return std::nullopt;
  return U;
}

// The in-place op's arguments name V itself: they would change meaning.
bool mentions(const Stmt *S, const VarDecl *V) {
  if (!S)
    return false;
  if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V)
    return true;
  return llvm::any_of(S->children(), [&](const Stmt *C) { return mentions(C, V); });
}

void collectRefs(const Stmt *S, const VarDecl *V, llvm::SmallVectorImpl<const DeclRefExpr *> &Out) {
  if (!S)
    return;
  if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V)
    Out.push_back(D);
  for (const Stmt *C : S->children())
    collectRefs(C, V, Out);
}

// The in-place op's argument text with V named as Src (`r.sub_(r.mean(-1))`
// on `r = ref.clone()` -> `ref.mean(-1)`): V holds Src's values there. Empty
// when a use of V is in a macro.
std::string argsOnSource(const InPlaceUse &U, const VarDecl *V, StringRef Src, ASTContext &Ctx) {
  const SourceManager &SM = Ctx.getSourceManager();
  std::string Text = textOf(U.Args, Ctx).str();
  llvm::SmallVector<const DeclRefExpr *, 4> Refs;
  for (const Expr *A : U.ArgExprs)
    collectRefs(A, V, Refs);
  unsigned Begin = SM.getFileOffset(U.Args.getBegin());
  llvm::sort(Refs, [&](const DeclRefExpr *A, const DeclRefExpr *B) {
    return SM.getFileOffset(A->getLocation()) > SM.getFileOffset(B->getLocation());
  });
  for (const DeclRefExpr *D : Refs) {
    unsigned Off = SM.getFileOffset(D->getLocation());
    if (D->getLocation().isMacroID() || Off < Begin || Off - Begin >= Text.size())
      return "";
    Text.replace(Off - Begin, V->getName().size(), Src.str());
  }
  return Text;
}

// The handle a source names: a variable, or a field of a variable or of `this`.
const ValueDecl *namedSource(const Expr *Src) {
  Src = stripHandle(Src);
  if (const auto *D = dyn_cast<DeclRefExpr>(Src))
    return dyn_cast<VarDecl>(D->getDecl());
  if (const auto *ME = dyn_cast<MemberExpr>(Src); ME && !ME->isArrow())
    return dyn_cast<FieldDecl>(ME->getMemberDecl());
  return dyn_cast_or_null<FieldDecl>(ownMember(Src));
}

Finding cloneFinding(StringRef Check, const UnnecessaryCloneCheck::CloneDecl &C, FixKind Fix,
                     Fact Why, const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = HazardKind::UnneededCopy;
  F.Where = SourcePoint::at(reportLoc(C.Call), SM);
  F.Op = F.Where;
  F.OpName = "clone";
  F.Origin = SourcePoint::at(C.DS->getBeginLoc(), SM);
  if (const auto *D = dyn_cast<DeclRefExpr>(stripHandle(C.Call->getImplicitObjectArgument())))
    F.Handles.push_back(handleOf(HandleRole::Source, D->getDecl(), SM));
  F.Handles.push_back(handleOf(HandleRole::Written, C.V, SM));
  F.Fix = Fix;
  F.Facts.push_back(Why);
  return F;
}

} // namespace

void UnnecessaryCloneCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CXXMemberCallExpr>("clone");
  ASTContext &Ctx = *Result.Context;
  if (!Call || !Model.isTensorExpr(Call) || !Call->getImplicitObjectArgument() ||
      !Model.isTensorExpr(Call->getImplicitObjectArgument()) ||
      !isa<MemberExpr>(Call->getCallee()) || cast<MemberExpr>(Call->getCallee())->isArrow())
    return;
  // clone(memory_format) changes the layout: not a plain copy.
  if (llvm::any_of(Call->arguments(), [](const Expr *A) { return !isa<CXXDefaultArgExpr>(A); }))
    return;
  // A loop-invariant clone in a loop belongs to tensor-clone-in-loop.
  if (CloneInLoopCheck::reportedCopy(Call, Model, Ctx) || reportChained(Call, Ctx))
    return;
  std::optional<CloneDecl> C = cloneDecl(Call, Ctx);
  if (C && !C->Rest.empty())
    if (std::optional<InPlaceUse> U = inPlaceStatement(C->Rest.front(), C->V);
        U && (namedSource(Call->getImplicitObjectArgument()) ||
              llvm::none_of(U->ArgExprs, [&](const Expr *A) { return mentions(A, C->V); })) &&
        !Call->getBeginLoc().isMacroID() && !promotesInteger(Call, U->OutOfPlace, Ctx)) {
      if (Reported.first(reportLoc(Call)))
        reportInPlaceFirst(*C, C->Rest.front(), Ctx);
      return;
    }
  if (freshSourceOp(Call)) {
    if (!Call->getBeginLoc().isMacroID() && Reported.first(reportLoc(Call)))
      reportFreshSource(Call, Ctx);
    return;
  }
  if (C && Reported.first(reportLoc(Call)))
    reportUnneeded(*C, Ctx);
}

// An integer copy stays integer in place; the out-of-place op may promote,
// unless its result has self's dtype whatever the rest (`masked_fill`).
bool UnnecessaryCloneCheck::promotesInteger(const CXXMemberCallExpr *Clone, StringRef OutOfPlace,
                                            ASTContext &Ctx) {
  if (sem::resultDType(OutOfPlace) == sem::ResultDType::Own)
    return false;
  const LayoutAnalysis *Lay = AnalysisManager::get(Model, Ctx).layoutAt(Clone);
  const TensorFact *Kind = Lay ? Lay->factOf(Clone->getImplicitObjectArgument()) : nullptr;
  return Kind && !Kind->DTypeAssumed && !Kind->DType.empty() &&
         !llvm::is_contained({"Float", "Double", "Half", "BFloat16"}, Kind->DType);
}

// `x.clone().add_(y)`: an in-place op with an out-of-place twin rewrites the
// copy no variable holds, at once.
bool UnnecessaryCloneCheck::reportChained(const CXXMemberCallExpr *Clone, ASTContext &Ctx) {
  const Stmt *P = parentStmt(Clone, Ctx);
  while (isa_and_nonnull<ImplicitCastExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr>(P))
    P = parentStmt(P, Ctx);
  const auto *ME = dyn_cast_or_null<MemberExpr>(P);
  const auto *Use = ME ? dyn_cast_or_null<CXXMemberCallExpr>(parentStmt(ME, Ctx)) : nullptr;
  const CXXMethodDecl *MD = Use ? Use->getMethodDecl() : nullptr;
  if (!MD || !MD->getIdentifier() || outOfPlaceOf(MD->getName()).empty())
    return false;
  if (!Clone->getBeginLoc().isMacroID() && !inTemplateInstantiation(Clone, Ctx) &&
      !promotesInteger(Clone, outOfPlaceOf(MD->getName()), Ctx) && Reported.first(reportLoc(Clone)))
    reportOnTemporary(Clone, Use, Ctx);
  return true;
}

// `t.argmax(0).clone()`: the op of the table whose fresh result is copied, a
// tensor nothing else holds; or `flat_params(m).clone()`, a function of the
// TU each of whose returns is such an op's result (`return torch::cat(v);`).
const sem::OpInfo *UnnecessaryCloneCheck::freshSourceOp(const CXXMemberCallExpr *Clone) const {
  const auto *Src = dyn_cast<CallExpr>(stripHandle(Clone->getImplicitObjectArgument()));
  const FunctionDecl *Get = Src ? Src->getDirectCallee() : nullptr;
  if (Get && Get->getIdentifier() && Get->getName() == "get" && Get->isInStdNamespace() &&
      Src->getNumArgs() == 1) // std::get<0>(torch::sort(x, 0)): one of its fresh results
    Src = dyn_cast<CallExpr>(stripHandle(Src->getArg(0)));
  if (const sem::OpInfo *Op = Src ? Model.opOf(Src) : nullptr)
    return Op->storage == sem::Storage::Fresh ? Op : nullptr;
  const FunctionDecl *FD = Src ? readableBodyOf(Src) : nullptr;
  llvm::SmallVector<const ReturnStmt *, 2> Returns;
  if (FD)
    collectReturns(FD->getBody(), Returns);
  const sem::OpInfo *Found = nullptr;
  for (const ReturnStmt *RS : Returns) {
    const auto *R = dyn_cast_or_null<CallExpr>(
        RS->getRetValue() ? stripHandle(RS->getRetValue()) : nullptr);
    const sem::OpInfo *Op = R ? Model.opOf(R) : nullptr;
    if (!Op || Op->storage != sem::Storage::Fresh)
      return nullptr;
    Found = Op;
  }
  return Found;
}

Finding UnnecessaryCloneCheck::temporaryFinding(const CXXMemberCallExpr *Clone, FixKind Fix,
                                                Fact Why, const SourceManager &SM) const {
  Finding F;
  F.Check = getID().str();
  F.Hazard = HazardKind::UnneededCopy;
  F.Where = SourcePoint::at(reportLoc(Clone), SM);
  F.Op = F.Where;
  F.OpName = "clone";
  F.Origin = F.Where;
  F.Fix = Fix;
  F.Facts.push_back(Why);
  return F;
}

// The message of forms (b) and (c): the copy is rewritten in place at once.
TensorDiag UnnecessaryCloneCheck::diagInPlaceAtOnce(SourceLocation Loc, StringRef Src,
                                                    StringRef Op, const std::string &Use) {
  return diag(Loc, "'clone' copies '%0', then '%1' rewrites the copy in place at once: two "
                   "passes over the data where the out-of-place op makes the same tensor in "
                   "one; use '%2'")
         << (Src.size() <= 40 ? Src.str() : std::string("the tensor")) << Op.str() << Use;
}

void UnnecessaryCloneCheck::reportOnTemporary(const CXXMemberCallExpr *Clone,
                                              const CXXMemberCallExpr *InPlace, ASTContext &Ctx) {
  StringRef Src = textOf(Clone->getImplicitObjectArgument()->getSourceRange(), Ctx);
  StringRef Op = InPlace->getMethodDecl()->getName();
  std::string Out = outOfPlaceOf(Op);
  const auto *ME = cast<MemberExpr>(InPlace->getCallee());
  auto D = diagInPlaceAtOnce(reportLoc(Clone), Src, Op,
                             Src.size() <= 40 ? Src.str() + "." + Out + "(...)" : Out);
  bool Fixable = !Src.empty() && !ME->getMemberLoc().isMacroID();
  if (Fixable)
    D << FixItHint::CreateReplacement(
        CharSourceRange::getTokenRange(Clone->getBeginLoc(), ME->getMemberLoc()),
        Src.str() + "." + Out);
  emitFinding(temporaryFinding(Clone, Fixable ? FixKind::OutOfPlaceOnSource : FixKind::None,
                               Fact::FirstUseInPlace, Ctx.getSourceManager()));
}

void UnnecessaryCloneCheck::reportFreshSource(const CXXMemberCallExpr *Clone, ASTContext &Ctx) {
  const Expr *Obj = Clone->getImplicitObjectArgument();
  StringRef Src = textOf(Obj->getSourceRange(), Ctx);
  const sem::OpInfo *Op = freshSourceOp(Clone);
  // Through a function of the file: its name, and the op it returns.
  const auto *SrcCall = cast<CallExpr>(stripHandle(Obj));
  const FunctionDecl *Helper = Model.opOf(SrcCall) ? nullptr : readableBodyOf(SrcCall);
  std::string What = "'" + std::string(Op->name) + "'";
  if (Helper)
    What = "'" + Helper->getNameAsString() + "' (a new tensor from " + What + ")";
  auto D = diag(reportLoc(Clone),
                "'clone' copies the fresh result of %0, which nothing else holds: the copy "
                "(an allocation and a pass over memory) buys nothing; drop '.clone()'")
           << What;
  bool Fixable = !Src.empty();
  if (Fixable)
    D << FixItHint::CreateReplacement(Clone->getSourceRange(), Src.str());
  emitFinding(temporaryFinding(Clone, Fixable ? FixKind::UseSource : FixKind::None,
                               Fact::FreshSource, Ctx.getSourceManager()));
}

void UnnecessaryCloneCheck::reportInPlaceFirst(const CloneDecl &C, const Stmt *First,
                                               ASTContext &Ctx) {
  std::optional<InPlaceUse> U = inPlaceStatement(First, C.V);
  const SourceManager &SM = Ctx.getSourceManager();
  StringRef Src = textOf(C.Call->getImplicitObjectArgument()->getSourceRange(), Ctx);
  // Arguments naming the copy name the source instead (a named source only).
  std::string Args = U->Args.isValid() ? argsOnSource(*U, C.V, Src, Ctx) : "";
  std::string Repl = Src.str() + "." + U->OutOfPlace + "(" + Args + ")";
  StringRef Op = isa<CXXMemberCallExpr>(U->Call)
                     ? cast<CXXMemberCallExpr>(U->Call)->getMethodDecl()->getName()
                     : getOperatorSpelling(cast<CXXOperatorCallExpr>(U->Call)->getOperator());
  auto D = diagInPlaceAtOnce(reportLoc(C.Call), Src, Op, Repl.size() <= 60 ? Repl : U->OutOfPlace);
  SourceLocation Semi =
      Lexer::findLocationAfterToken(U->Call->getEndLoc(), tok::semi, SM, Ctx.getLangOpts(), false);
  bool Fixable = !Src.empty() && !U->Chained && (U->Args.isInvalid() || !Args.empty()) &&
                 Semi.isValid() && !First->getBeginLoc().isMacroID() &&
                 !inTemplateInstantiation(C.Call, Ctx);
  if (Fixable)
    D << FixItHint::CreateReplacement(C.Call->getSourceRange(), Repl)
      << FixItHint::CreateRemoval(wholeLines(First->getBeginLoc(), Semi.getLocWithOffset(-1), SM));
  emitFinding(cloneFinding(getID(), C, Fixable ? FixKind::OutOfPlaceOnSource : FixKind::None,
                           Fact::FirstUseInPlace, SM));
}

// Some op of Region whose result requires grad may save V for backward: a
// table op that saves an input, or a tensor-library function the table does
// not list (`torch::dot`).
bool mayBeSaved(const TensorModel &Model, ASTContext &Ctx, llvm::ArrayRef<const Stmt *> Region,
                const VarDecl *V) {
  auto Names = [&](const Expr *E) {
    const auto *D = E ? dyn_cast<DeclRefExpr>(stripHandle(E)) : nullptr;
    return D && D->getDecl() == V;
  };
  llvm::SmallVector<const Stmt *, 32> Work(Region.begin(), Region.end());
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    Work.append(S->child_begin(), S->child_end());
    const auto *Call = dyn_cast<CallExpr>(S);
    const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
    if (!FD || !isTensorApi(FD) || !(Names(TensorModel::selfOf(Call)) ||
                                     llvm::any_of(Call->arguments(), Names)))
      continue;
    const sem::OpInfo *Op = Model.opOf(Call);
    sem::Saves Sv = Op ? sem::savesOf(Op->name) : sem::Saves::Inputs;
    const GradFacts *G = AnalysisManager::get(Model, Ctx).gradAt(Call);
    if (Sv != sem::Saves::Nothing && Sv != sem::Saves::Result && G &&
        G->factOf(Call).requiresGrad() == Tri::Yes)
      return true;
  }
  return false;
}

void UnnecessaryCloneCheck::reportUnneeded(const CloneDecl &C, ASTContext &Ctx) {
  const Expr *Src = C.Call->getImplicitObjectArgument();
  // A view of a named tensor (`p.select(2, 2)`) holds p's storage: p decides.
  const Expr *Root = Model.viewRoot(Src);
  const ValueDecl *Named = namedSource(Root);
  LoopAnalysis *LA = AnalysisManager::get(Model, Ctx).loopsAt(C.Call);
  DynTypedNodeList Bs = Ctx.getParents(*C.DS);
  const Stmt *Block = Bs.empty() ? nullptr : Bs[0].get<CompoundStmt>();
  if (!Named || !LA || !Block)
    return;
  LoopAnalysis::Use U = LA->usesOfTemporary(C.Call, Block);
  if (U.Escapes || U.Written || LA->mayChangeIn(Root, C.Rest))
    return;
  const ValueDecl *Vars[] = {C.V, Named};
  if (identityUsed(C.Rest, Vars))
    return;
  // A member's copy saved for backward outlives the block in the graph, and
  // the member may be rewritten before backward runs (a spectral norm's `u_`,
  // updated in place by the next forward).
  if (isa<FieldDecl>(Named) && mayBeSaved(Model, Ctx, C.Rest, C.V))
    return;
  const SourceManager &SM = Ctx.getSourceManager();
  StringRef SrcText = textOf(Src->getSourceRange(), Ctx);
  auto D = diag(reportLoc(C.Call),
                "'clone' copies '%0' for nothing: neither '%1' nor '%0' is written while '%1' "
                "lives, and '%1' does not leave the block; use '%0' itself")
           << SrcText << C.V->getName();
  bool Fixable = !SrcText.empty() && !C.Call->getBeginLoc().isMacroID() &&
                 !inTemplateInstantiation(C.Call, Ctx);
  if (Fixable)
    D << FixItHint::CreateReplacement(C.Call->getSourceRange(), SrcText);
  emitFinding(cloneFinding(getID(), C, Fixable ? FixKind::UseSource : FixKind::None,
                           Fact::CopyOnlyRead, SM));
}

} // namespace clang::tidy::tensor
