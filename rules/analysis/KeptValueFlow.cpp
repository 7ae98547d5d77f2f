#include "analysis/KeptValueFlow.h"

#include "analysis/AnalysisManager.h"
#include "analysis/AstHelpers.h"
#include "analysis/GradFacts.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

const Expr *operandOf(const Expr *E, const TensorModel &Model) {
  E = stripHandle(E);
  // A wrapper constructed from a tensor (not a tensor itself): its operand.
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E); CE && CE->getNumArgs() >= 1 &&
                                                              !Model.isTensorType(CE->getType()) &&
                                                              Model.isTensorExpr(CE->getArg(0)))
    return stripHandle(CE->getArg(0));
  return E;
}

const ValueDecl *stateRoot(const Expr *E) {
  E = stripHandle(E);
  if (const auto *D = dyn_cast_or_null<DeclRefExpr>(E))
    return isa<VarDecl, BindingDecl>(D->getDecl()) ? D->getDecl() : nullptr;
  if (const auto *M = dyn_cast_or_null<MemberExpr>(E)) {
    if (isa<CXXThisExpr>(M->getBase()->IgnoreParenImpCasts()))
      return dyn_cast<FieldDecl>(M->getMemberDecl());
    return stateRoot(M->getBase());
  }
  if (const auto *Op = dyn_cast_or_null<CXXOperatorCallExpr>(E);
      Op && (Op->getOperator() == OO_Subscript || Op->getOperator() == OO_Arrow))
    return stateRoot(Op->getArg(0));
  return nullptr;
}

bool outlivesIteration(const ValueDecl *Root, const Stmt *Loop, LoopAnalysis &LA) {
  if (isa<FieldDecl>(Root))
    return true;
  const auto *V = dyn_cast<VarDecl>(Root);
  return V && !LA.isDeclaredIn(V, Loop);
}

// ------------------------------------------------------- requires grad --

bool KeptValueFlow::holdsGraphAt(const Expr *E, const Stmt *At) const {
  const GradFacts *GF = AnalysisManager::get(Model, Ctx).gradAt(At);
  if (!GF || !GF->gradEnabledAt(At))
    return false;
  GradFact F = GF->factOf(E);
  return F.requiresGrad() == Tri::Yes && F.Kind != GradKind::Leaf;
}

// ------------------------------------------------- may be differentiated --

namespace {

// The state declarations E reads (variables, members of *this, lambda captures).
void refsOf(const Stmt *S, llvm::SmallVectorImpl<const ValueDecl *> &Out) {
  if (!S)
    return;
  if (const auto *D = dyn_cast<DeclRefExpr>(S))
    Out.push_back(D->getDecl());
  if (const auto *M = dyn_cast<MemberExpr>(S))
    if (const ValueDecl *Own = ownMember(M))
      Out.push_back(Own);
  if (const auto *L = dyn_cast<LambdaExpr>(S)) {
    for (const LambdaCapture &C : L->captures())
      if (C.capturesVariable())
        Out.push_back(C.getCapturedVar());
    refsOf(L->getBody(), Out);
    return;
  }
  // `torch::cat(probs).detach()`: what is read through detach() carries no graph.
  if (isDetachCall(S))
    return;
  for (const Stmt *C : S->children())
    refsOf(C, Out);
}

// Derivation edges (from what an expression reads to the state it is stored
// in) and sinks (expressions whose values may be differentiated).
struct FlowCollector : RecursiveASTVisitor<FlowCollector> {
  const TensorModel &Model;
  std::vector<std::pair<const Stmt *, const ValueDecl *>> Edges;
  std::vector<const Stmt *> Sinks, Returns;
  bool SawEval = false;

  explicit FlowCollector(const TensorModel &Model) : Model(Model) {}

  void store(const Stmt *From, const Expr *Into) {
    const ValueDecl *R = stateRoot(Into);
    const auto *V = dyn_cast_or_null<VarDecl>(R);
    if (!Model.mayHoldTensors(Into->getType()))
      return; // a number, a vector<double>: no graph goes there
    if (!R || V && (!V->hasLocalStorage() || V->getType()->isReferenceType()))
      Sinks.push_back(From); // stored where we cannot follow it
    else
      Edges.push_back({From, R});
  }
  bool TraverseLambdaExpr(LambdaExpr *L) {
    Sinks.push_back(L);
    return true;
  }
  bool VisitVarDecl(VarDecl *V) {
    if (V->getInit() && Model.mayHoldTensors(V->getType()))
      Edges.push_back({V->getInit(), V});
    if (const auto *DD = dyn_cast<DecompositionDecl>(V))
      for (const BindingDecl *B : DD->bindings())
        Edges.push_back({V->getInit(), B});
    return true;
  }
  bool VisitCXXForRangeStmt(CXXForRangeStmt *S) {
    Edges.push_back({S->getRangeInit(), S->getLoopVariable()});
    return true;
  }
  bool VisitReturnStmt(ReturnStmt *R) {
    if (R->getRetValue() && Model.mayHoldTensors(R->getRetValue()->getType()))
      Returns.push_back(R->getRetValue());
    return true;
  }
  bool VisitCallExpr(CallExpr *C);
};

// A tensor-holding argument given to code outside the tensor libraries.
void argumentsToUserCode(FlowCollector &F, const CallExpr *C, const FunctionDecl *Callee) {
  if (Callee && (isTensorLibraryCode(Callee) || isStdMoveLike(C)))
    return; // an indirect call is code we cannot see too
  for (const Expr *A : C->arguments())
    if (F.Model.mayHoldTensors(A->getType()))
      F.Sinks.push_back(A);
}

bool FlowCollector::VisitCallExpr(CallExpr *C) {
  const FunctionDecl *Callee = C->getDirectCallee();
  StringRef Name = Callee && Callee->getIdentifier() ? Callee->getName() : "";
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C)) {
    if (OC->isAssignmentOp() && OC->getNumArgs() == 2)
      store(OC->getArg(1), OC->getArg(0));
    return true;
  }
  if (Name == "backward" || (Name == "grad" && Callee && isTensorApi(Callee))) {
    Sinks.push_back(C);
    return true;
  }
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(C)) {
    const Expr *Obj = MC->getImplicitObjectArgument();
    SawEval |= Name == "eval" && C->getNumArgs() == 0;
    // A non-const method of a container stores its arguments (push_back).
    if (Obj && !Model.isTensorExpr(Obj) && MC->getMethodDecl() && !MC->getMethodDecl()->isConst())
      for (const Expr *A : C->arguments())
        store(A, Obj);
  }
  argumentsToUserCode(*this, C, Callee);
  return true;
}

// The bodies where the state Root lives: its function, or for a member
// every method of its class with a body in this TU.
void bodiesOf(const ValueDecl *Root, const Stmt *At, ASTContext &Ctx,
              llvm::SmallVectorImpl<const Stmt *> &Out) {
  if (const auto *F = dyn_cast<FieldDecl>(Root)) {
    if (const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent()))
      for (const CXXMethodDecl *M : RD->methods())
        if (const FunctionDecl *Def = nullptr; M->hasBody(Def))
          Out.push_back(Def->getBody());
    return;
  }
  if (const FunctionDecl *FD = enclosingFunction(At, Ctx))
    Out.push_back(FD->getBody());
}

// Root and the state made from it through F's derivation edges; a
// structured binding's names are its own (`auto [zs, logdet] = net(x)`).
llvm::DenseSet<const ValueDecl *> derivedFrom(const ValueDecl *Root, const FlowCollector &F) {
  llvm::DenseSet<const ValueDecl *> Derived{Root};
  if (const auto *DD = dyn_cast<DecompositionDecl>(Root))
    for (const BindingDecl *B : DD->bindings())
      Derived.insert(B);
  for (bool Changed = true; Changed;) {
    Changed = false;
    for (const auto &[Src, To] : F.Edges) {
      llvm::SmallVector<const ValueDecl *, 8> Refs;
      refsOf(Src, Refs);
      if (!Derived.contains(To) && llvm::any_of(Refs, [&](auto *D) { return Derived.contains(D); }))
        Changed = Derived.insert(To).second;
    }
  }
  return Derived;
}

} // namespace

// E is the state Root itself, or a braced list or tuple of values each of
// which is Root or unrelated to it.
static bool handsOver(const Expr *E, const ValueDecl *Root,
                      const llvm::DenseSet<const ValueDecl *> &Derived) {
  E = E->IgnoreImplicit()->IgnoreParens();
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E))
    return DRE->getDecl() == Root || !Derived.contains(DRE->getDecl());
  llvm::ArrayRef<const Expr *> Parts;
  if (const auto *IL = dyn_cast<InitListExpr>(E))
    Parts = llvm::ArrayRef(IL->getInits(), IL->getNumInits());
  else if (const auto *CE = dyn_cast<CXXConstructExpr>(E))
    Parts = llvm::ArrayRef(CE->getArgs(), CE->getNumArgs());
  else {
    llvm::SmallVector<const ValueDecl *, 8> Refs;
    refsOf(E, Refs);
    return llvm::none_of(Refs, [&](auto *D) { return Derived.contains(D); });
  }
  return llvm::all_of(Parts, [&](const Expr *P) { return handsOver(P, Root, Derived); });
}

// The local a call's result initialises (`auto history = train(...)`), with
// Discarded set when the result is dropped; null for any other use.
static const VarDecl *resultVariable(const CallExpr *Call, ASTContext &Ctx, bool &Discarded) {
  DynTypedNode N = DynTypedNode::create(*Call);
  for (unsigned Hops = 0; Hops < 8; ++Hops) {
    auto Parents = Ctx.getParents(N);
    if (Parents.size() != 1)
      return nullptr;
    N = Parents[0];
    if (const auto *E = N.get<Expr>();
        E && (isa<ImplicitCastExpr, ExprWithCleanups, MaterializeTemporaryExpr,
                  CXXBindTemporaryExpr>(E) ||
              (isa<CXXConstructExpr>(E) && cast<CXXConstructExpr>(E)->getNumArgs() == 1)))
      continue;
    Discarded = N.get<CompoundStmt>() != nullptr;
    const auto *V = N.get<VarDecl>();
    return V && !V->getType()->isReferenceType() ? V : nullptr;
  }
  return nullptr;
}

bool KeptValueFlow::mayBeDifferentiated(const Expr *Target, const Stmt *At,
                                        bool Consumed) const {
  return differentiable(stateRoot(Target), At, 0, nullptr, Consumed);
}

// Note [Kept state across calls]: a reference parameter's state is the
// caller's variable, and a returned value the variable its call initialises;
// both are followed into the callers the main file has (CallSites), a few
// calls deep. A function called from nowhere we see may be differentiated.
bool KeptValueFlow::differentiable(const ValueDecl *Root, const Stmt *At, unsigned Depth,
                                   const CallExpr *From, bool Consumed) const {
  const auto *V = dyn_cast_or_null<VarDecl>(Root);
  if (const auto *P = dyn_cast_or_null<ParmVarDecl>(V);
      P && P->getType()->isReferenceType() && Depth < kMaxCallerHops)
    return callersMayDifferentiate(P, Depth);
  if (!Root || V && (!V->hasLocalStorage() || V->getType()->isReferenceType() ||
                     V->getType()->isPointerType()))
    return true; // state the caller or other code can see
  llvm::SmallVector<const Stmt *, 8> Bodies;
  bodiesOf(Root, At, Ctx, Bodies);
  FlowCollector F(Model);
  for (const Stmt *B : Bodies)
    F.TraverseStmt(const_cast<Stmt *>(B));
  llvm::DenseSet<const ValueDecl *> Derived = derivedFrom(Root, F);
  auto Reaches = [&](const Stmt *S) {
    llvm::SmallVector<const ValueDecl *, 8> Refs;
    refsOf(S, Refs);
    return llvm::any_of(Refs, [&](auto *D) { return Derived.contains(D); });
  };
  // The call we came from hands the state to the callee just followed.
  auto Sink = [&](const Stmt *S) {
    return Reaches(S) && !(From && llvm::is_contained(From->arguments(), S));
  };
  if (llvm::any_of(F.Sinks, Sink))
    return true;
  // A value computed from the state (`return torch::stack(steps, 1);`) is the
  // caller's to differentiate or not: only state handed over as it is
  // (`return curve;`, `return {out, hids};`) is followed into the callers.
  return !F.SawEval && llvm::any_of(F.Returns, [&](const Stmt *R) {
    return Reaches(R) &&
           (isa<FieldDecl>(Root) || (!Consumed && !handsOver(cast<Expr>(R), Root, Derived)) ||
            callersMayUseResult(At, Depth));
  });
}

bool KeptValueFlow::callersMayDifferentiate(const ParmVarDecl *P, unsigned Depth) const {
  const auto *FD = dyn_cast<FunctionDecl>(P->getDeclContext());
  auto Sites = FD ? AnalysisManager::get(Model, Ctx).calls().of(FD) : std::nullopt;
  if (!Sites || Sites->empty())
    return true;
  unsigned I = P->getFunctionScopeIndex();
  return llvm::any_of(*Sites, [&](const CallSites::Site &S) {
    return isa<CXXOperatorCallExpr>(S.Call) || I >= S.Call->getNumArgs() ||
           differentiable(stateRoot(S.Call->getArg(I)), S.Call, Depth + 1, S.Call);
  });
}

bool KeptValueFlow::callersMayUseResult(const Stmt *At, unsigned Depth) const {
  const FunctionDecl *FD = enclosingFunction(At, Ctx);
  auto Sites = FD && Depth < kMaxCallerHops ? AnalysisManager::get(Model, Ctx).calls().of(FD)
                                            : std::nullopt;
  if (!Sites || Sites->empty())
    return true;
  return llvm::any_of(*Sites, [&](const CallSites::Site &S) {
    bool Discarded = false;
    const VarDecl *V = resultVariable(S.Call, Ctx, Discarded);
    return V ? differentiable(V, S.Call, Depth + 1) : !Discarded;
  });
}

} // namespace clang::tidy::tensor
