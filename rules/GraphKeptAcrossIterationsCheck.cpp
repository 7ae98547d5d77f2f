#include "GraphKeptAcrossIterationsCheck.h"

#include "analysis/AstHelpers.h"
#include "analysis/Finding.h"
#include "analysis/KeptValueFlow.h"

#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

using Accumulation = GraphKeptAcrossIterationsCheck::Accumulation;

GraphKeptAcrossIterationsCheck::GraphKeptAcrossIterationsCheck(StringRef Name,
                                                               ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void GraphKeptAcrossIterationsCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxOperatorCallExpr(hasAnyOverloadedOperatorName("+=", "-=", "="),
                                         unless(isExpansionInSystemHeader()))
                         .bind("op"),
                     this);
  Finder->addMatcher(
      cxxMemberCallExpr(callee(cxxMethodDecl(hasAnyName(
                            "push_back", "emplace_back", "push_front", "emplace_front", "add_",
                            "sub_", "index_add_", "scatter_add_"))),
                        unless(isExpansionInSystemHeader()))
          .bind("call"),
      this);
}

namespace {

// --------------------------------------------------- what is accumulated --

// A class that holds tensors without being one: a container of them.
bool isTensorContainer(const Expr *E, const TensorModel &Model) {
  QualType T = E->getType().getNonReferenceType();
  return !Model.isTensorType(T) && T->getAsCXXRecordDecl() && !T->isPointerType() &&
         Model.mayHoldTensors(T);
}

// `a + b - c`: the summands, each without a scalar factor (`0.1 * loss`).
void summands(const Expr *E, const TensorModel &Model, SmallVectorImpl<const Expr *> &Out) {
  E = operandOf(E, Model);
  if (const auto *Op = dyn_cast<CXXOperatorCallExpr>(E); Op && Op->getNumArgs() == 2) {
    OverloadedOperatorKind K = Op->getOperator();
    if (K == OO_Plus || K == OO_Minus) {
      summands(Op->getArg(0), Model, Out);
      summands(Op->getArg(1), Model, Out);
      return;
    }
    if (K == OO_Star || K == OO_Slash) {
      const Expr *A = operandOf(Op->getArg(0), Model), *B = operandOf(Op->getArg(1), Model);
      bool TA = Model.isTensorExpr(A), TB = Model.isTensorExpr(B);
      if (TA != TB) {
        Out.push_back(TA ? A : B);
        return;
      }
    }
  }
  Out.push_back(E);
}

bool sameState(const Expr *A, const Expr *B) {
  const ValueDecl *RA = stateRoot(A), *RB = stateRoot(B);
  const auto *DA = dyn_cast<DeclRefExpr>(A), *DB = dyn_cast<DeclRefExpr>(B);
  const auto *MA = dyn_cast<MemberExpr>(A), *MB = dyn_cast<MemberExpr>(B);
  return RA && RA == RB && (DA && DB || MA && MB && MA->getMemberDecl() == MB->getMemberDecl());
}

// `total = total + loss`: the summand that is not the target.
std::optional<Accumulation> selfSum(const CXXOperatorCallExpr *Op, const TensorModel &Model,
                                    const Expr *Lhs) {
  SmallVector<const Expr *, 4> Parts;
  summands(Op->getArg(1), Model, Parts);
  if (Parts.size() < 2 || llvm::none_of(Parts, [&](const Expr *P) { return sameState(P, Lhs); }))
    return std::nullopt;
  for (const Expr *P : Parts)
    if (!sameState(P, Lhs) && Model.isTensorExpr(P))
      return Accumulation{Accumulation::SelfSum, Op, Lhs, P, nullptr};
  return std::nullopt;
}

// `m[k] = out` on a container (not a tensor's own operator[]).
std::optional<Accumulation> keyedStore(const CXXOperatorCallExpr *Op, const TensorModel &Model,
                                       const Expr *Lhs) {
  const auto *Sub = dyn_cast<CXXOperatorCallExpr>(Lhs);
  if (!Sub || Sub->getOperator() != OO_Subscript || Sub->getNumArgs() != 2 ||
      !isTensorContainer(Sub->getArg(0), Model))
    return std::nullopt;
  return Accumulation{Accumulation::KeyedStore, Op, stripHandle(Sub->getArg(0)),
                      operandOf(Op->getArg(1), Model), Sub->getArg(1)};
}

std::optional<Accumulation> fromOperator(const CXXOperatorCallExpr *Op, const TensorModel &Model) {
  if (Op->getNumArgs() != 2)
    return std::nullopt;
  const Expr *Lhs = stripHandle(Op->getArg(0));
  if (Op->getOperator() == OO_Equal) {
    if (isa<DeclRefExpr, MemberExpr>(Lhs) && Model.isTensorExpr(Lhs))
      return selfSum(Op, Model, Lhs);
    return keyedStore(Op, Model, Lhs);
  }
  if (!isa<DeclRefExpr, MemberExpr>(Lhs) || !Model.isTensorExpr(Lhs))
    return std::nullopt;
  return Accumulation{Accumulation::AddInto, Op, Lhs, operandOf(Op->getArg(1), Model), nullptr};
}

std::optional<Accumulation> fromMemberCall(const CXXMemberCallExpr *Call,
                                           const TensorModel &Model) {
  const Expr *Obj = stripHandle(Call->getImplicitObjectArgument());
  StringRef Name = Call->getMethodDecl()->getName();
  // `t.index_add_(0, idx, v)`, `t.scatter_add_(0, idx, v)`: v is what is added.
  unsigned ValueArg = Name == "index_add_" || Name == "scatter_add_" ? 2 : 0;
  if (!Obj || Call->getNumArgs() <= ValueArg)
    return std::nullopt;
  const Expr *Arg = operandOf(Call->getArg(ValueArg), Model);
  if (Model.isTensorExpr(Obj) && isa<DeclRefExpr, MemberExpr>(Obj) && Name.ends_with("_"))
    return Accumulation{Accumulation::AddInto, Call, Obj, Arg, nullptr};
  if (Call->getNumArgs() == 1 && isTensorContainer(Obj, Model) && Model.isTensorExpr(Arg))
    return Accumulation{Accumulation::Insert, Call, Obj, Arg, nullptr};
  return std::nullopt;
}

// ------------------------------------------------------- the diagnostic --

std::string textOf(const Expr *E, const ASTContext &Ctx) {
  return Lexer::getSourceText(CharSourceRange::getTokenRange(E->getSourceRange()),
                              Ctx.getSourceManager(), Ctx.getLangOpts())
      .str();
}

// `.detach()` after the value, in parentheses unless it is a postfix expression.
std::optional<FixItHint> detachFix(const Expr *V, ASTContext &Ctx) {
  if (V->getBeginLoc().isMacroID() || V->getEndLoc().isMacroID() || inTemplateInstantiation(V, Ctx))
    return std::nullopt;
  std::string Text = textOf(V, Ctx);
  if (Text.empty())
    return std::nullopt;
  const Expr *X = V->IgnoreImplicit(); // the temporaries around `c ? a : b`
  const auto *Op = dyn_cast<CXXOperatorCallExpr>(X);
  bool Postfix = isa<DeclRefExpr, MemberExpr, CallExpr, ParenExpr, ArraySubscriptExpr>(X) &&
                 (!Op || Op->getOperator() == OO_Call || Op->getOperator() == OO_Subscript);
  return FixItHint::CreateReplacement(V->getSourceRange(),
                                      Postfix ? Text + ".detach()" : "(" + Text + ").detach()");
}

std::string message(const Accumulation &A, const ASTContext &Ctx) {
  std::string V = textOf(A.Value, Ctx), T = stateRoot(A.Target)->getName().str();
  bool Named = !V.empty() && V.size() <= 40 && V.find('\n') == std::string::npos;
  std::string Shown = Named ? "'" + V + "'" : "the value";
  std::string How = A.Kind == Accumulation::Insert       ? "is stored in"
                    : A.Kind == Accumulation::KeyedStore ? "is stored under a new key in"
                                                         : "is accumulated into";
  return Shown + " requires grad and " + How + " '" + T +
         "', which outlives the loop iteration: every iteration's autograd graph (its nodes and "
         "the tensors they saved for backward) stays alive as long as '" +
         T + "' does, and nothing differentiates it; keep " +
         (Named ? "'" + V + ".detach()'" : "its '.detach()'") +
         ", or '.item<double>()' to keep a number";
}

SourceLocation siteLoc(const Stmt *Site) {
  if (const auto *Op = dyn_cast<CXXOperatorCallExpr>(Site))
    return Op->getOperatorLoc();
  return reportLoc(cast<Expr>(Site));
}

Finding keptFinding(StringRef Check, const Accumulation &A, bool Fixed, const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = HazardKind::GraphKept;
  F.Where = SourcePoint::at(siteLoc(A.Site), SM);
  F.Op = F.Where;
  if (const auto *Op = dyn_cast<CXXOperatorCallExpr>(A.Site))
    F.OpName = getOperatorSpelling(Op->getOperator());
  else
    F.OpName = cast<CXXMemberCallExpr>(A.Site)->getMethodDecl()->getNameAsString();
  // Where the kept value is made: its variable's declaration, else itself.
  const auto *DRE = dyn_cast<DeclRefExpr>(A.Value);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  F.Origin =
      SourcePoint::at(VD && VD->hasLocalStorage() ? VD->getLocation() : A.Value->getBeginLoc(), SM);
  F.Handles.push_back(handleOf(HandleRole::Written, stateRoot(A.Target), SM));
  if (VD)
    F.Handles.push_back(handleOf(HandleRole::Source, VD, SM));
  F.Fix = Fixed ? FixKind::DetachKept : FixKind::None;
  F.Facts = {Fact::RequiresGrad, Fact::NotDifferentiated};
  return F;
}

// `loss.backward(); ... total += loss` in one loop: the graph the value holds
// was differentiated and freed (no retain_graph), so whatever the state
// becomes, no caller can differentiate it again.
bool backwardedIn(const Expr *Value, const Stmt *Loop) {
  const auto *V = dyn_cast<DeclRefExpr>(stripHandle(Value));
  if (!V || !Loop)
    return false;
  llvm::SmallVector<const Stmt *, 32> Work{Loop};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S || isa<LambdaExpr>(S))
      continue;
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S);
        MC && MC->getMethodDecl() && MC->getMethodDecl()->getIdentifier() &&
        MC->getMethodDecl()->getName() == "backward" &&
        llvm::all_of(MC->arguments(), [](const Expr *A) { return isa<CXXDefaultArgExpr>(A); }))
      if (const auto *O = dyn_cast<DeclRefExpr>(stripHandle(MC->getImplicitObjectArgument()));
          O && O->getDecl() == V->getDecl())
        return true;
    Work.append(S->child_begin(), S->child_end());
  }
  return false;
}

} // namespace

void GraphKeptAcrossIterationsCheck::check(const MatchFinder::MatchResult &Result) {
  ASTContext &Ctx = *Result.Context;
  std::optional<Accumulation> A;
  if (const auto *Op = Result.Nodes.getNodeAs<CXXOperatorCallExpr>("op"))
    A = fromOperator(Op, Model);
  else if (const auto *Call = Result.Nodes.getNodeAs<CXXMemberCallExpr>("call"))
    A = fromMemberCall(Call, Model);
  if (!A || !stateRoot(A->Target))
    return;
  const Stmt *Loop = LoopAnalysis::innermostLoop(A->Site, Ctx);
  LoopAnalysis *LA = Loop ? AnalysisManager::get(Model, Ctx).loopsAt(A->Site) : nullptr;
  if (!LA || !outlivesIteration(stateRoot(A->Target), Loop, *LA) ||
      (A->Key && LA->isInvariant(A->Key, Loop)))
    return;
  KeptValueFlow Flow(Model, Ctx);
  if (!Flow.holdsGraphAt(A->Value, A->Site) ||
      Flow.mayBeDifferentiated(A->Target, A->Site, backwardedIn(A->Value, Loop)) ||
      !Reported.first(siteLoc(A->Site)))
    return;
  auto Fix = detachFix(A->Value, Ctx);
  auto D = diagText(siteLoc(A->Site), message(*A, Ctx));
  if (Fix)
    D << *Fix;
  emitFinding(keptFinding(getID(), *A, Fix.has_value(), *Result.SourceManager));
}

} // namespace clang::tidy::tensor
