#include "analysis/KeptValueFlow.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

const Expr *operandOf(const Expr *E, const TensorModel &Model) {
  E = stripHandle(E);
  // A wrapper constructed from a tensor (not a tensor itself): its operand.
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E);
      CE && CE->getNumArgs() >= 1 && !Model.isTensorType(CE->getType()) &&
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
// Until the shared autograd facts land: a value requires grad when it is a
// module's output or computed from one by differentiable ops, with grad mode
// on. Everything else (parameters of the function, members, containers) is
// unknown, and unknown is not reported.

namespace {

enum class Grad { No, Unknown, Yes };

Grad join(Grad A, Grad B) {
  if (A == Grad::Yes || B == Grad::Yes)
    return Grad::Yes;
  return A == Grad::Unknown || B == Grad::Unknown ? Grad::Unknown : Grad::No;
}

bool derivesFrom(const CXXRecordDecl *RD, StringRef Qualified, unsigned Depth = 0) {
  if (!RD || !RD->hasDefinition() || Depth > 8)
    return false;
  if (RD->getQualifiedNameAsString() == Qualified)
    return true;
  for (const CXXBaseSpecifier &B : RD->bases())
    if (derivesFrom(B.getType()->getAsCXXRecordDecl(), Qualified, Depth + 1))
      return true;
  return false;
}

// A torch::nn::Module, a pointer to one, or a ModuleHolder (`Linear`).
bool isModule(QualType T) {
  T = T.getNonReferenceType();
  if (T->isPointerType())
    T = T->getPointeeType();
  const CXXRecordDecl *RD = T->getAsCXXRecordDecl();
  return derivesFrom(RD, "torch::nn::Module") || derivesFrom(RD, "torch::nn::ModuleHolder");
}

// A call of a module: `fc(x)`, `model->forward(x)`.
bool isModuleCall(const Stmt *S) {
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(S))
    return OC->getOperator() == OO_Call && isModule(OC->getArg(0)->getType());
  const auto *MC = dyn_cast<CXXMemberCallExpr>(S);
  const Expr *Obj = MC ? MC->getImplicitObjectArgument() : nullptr;
  return Obj && MC->getMethodDecl() && MC->getMethodDecl()->getName() == "forward" &&
         isModule(Obj->getType());
}

bool containsModuleCall(const Stmt *S) {
  if (!S || isModuleCall(S))
    return S != nullptr;
  return llvm::any_of(S->children(), [](const Stmt *C) { return containsModuleCall(C); });
}

// A method of the user's module that runs one of its layers (`decode`,
// `encode`): its tensor result comes from them.
bool isLayerRunningMethod(const CXXMemberCallExpr *MC) {
  const CXXMethodDecl *M = MC->getMethodDecl();
  const Expr *Obj = MC->getImplicitObjectArgument();
  const FunctionDecl *Def = nullptr;
  return M && Obj && isModule(Obj->getType()) && !isTensorLibraryCode(M) && M->hasBody(Def) &&
         containsModuleCall(Def->getBody());
}

// `requires_grad()`, `requires_grad(true)`, `.requires_grad(true)`: options
// or a call that makes a leaf that requires grad.
bool asksForGrad(const Stmt *S) {
  const auto *C = dyn_cast<CallExpr>(S);
  const FunctionDecl *FD = C ? C->getDirectCallee() : nullptr;
  if (FD && FD->getIdentifier() &&
      (FD->getName() == "requires_grad" || FD->getName() == "requires_grad_")) {
    const auto *B = C->getNumArgs() ? dyn_cast<CXXBoolLiteralExpr>(
                                          C->getArg(C->getNumArgs() - 1)->IgnoreParenImpCasts())
                                    : nullptr;
    if (C->getNumArgs() == 0 || (B && B->getValue()) || isa<CXXDefaultArgExpr>(C->getArg(0)))
      return true;
  }
  return llvm::any_of(S->children(), [](const Stmt *Ch) { return Ch && asksForGrad(Ch); });
}

class GradOf {
public:
  explicit GradOf(const TensorModel &Model) : Model(Model) {}

  Grad of(const Expr *E, unsigned Depth = 0) const {
    E = operandOf(E, Model);
    if (!E || Depth > 12)
      return Grad::Unknown;
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E))
      return member(MC, Depth);
    if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E))
      return op(OC, Depth);
    if (const auto *C = dyn_cast<CallExpr>(E))
      return call(C, Depth);
    if (const auto *D = dyn_cast<DeclRefExpr>(E))
      return var(D->getDecl(), Depth);
    return Grad::Unknown;
  }

private:
  // Differentiable ops pass requires-grad on from their tensor operands.
  Grad operands(const CallExpr *C, const Expr *Self, unsigned Depth) const {
    if (const sem::OpInfo *Op = Model.opOf(C))
      if (Op->storage == sem::Storage::Detach || Op->autograd == sem::Autograd::NotDifferentiable)
        return Grad::No;
    if (!Model.mayHoldTensors(C->getType())) // item(), size(), a bool
      return Grad::No;
    Grad G = Self ? of(Self, Depth + 1) : Grad::No;
    bool Inputs = Self != nullptr;
    for (const Expr *A : C->arguments())
      if (Model.isTensorExpr(operandOf(A, Model))) {
        G = join(G, of(A, Depth + 1));
        Inputs = true;
      }
    // A factory (no tensor input): a leaf, requiring grad when asked to.
    return Inputs ? G : asksForGrad(C) ? Grad::Yes : Grad::No;
  }

  Grad member(const CXXMemberCallExpr *MC, unsigned Depth) const {
    const Expr *Obj = MC->getImplicitObjectArgument();
    StringRef Name = MC->getMethodDecl() ? MC->getMethodDecl()->getName() : "";
    if (isModuleCall(MC) || (Model.isTensorExpr(MC) && isLayerRunningMethod(MC)))
      return Grad::Yes;
    if (!Obj || !Model.isTensorExpr(Obj))
      return Grad::Unknown;
    if (Name == "requires_grad_")
      return asksForGrad(MC) ? Grad::Yes : of(Obj, Depth + 1);
    return operands(MC, Obj, Depth);
  }

  Grad op(const CXXOperatorCallExpr *OC, unsigned Depth) const {
    if (isModuleCall(OC))
      return Grad::Yes;
    switch (OC->getOperator()) {
    case OO_Plus:
    case OO_Minus:
    case OO_Star:
    case OO_Slash:
      return operands(OC, nullptr, Depth);
    default:
      return Grad::Unknown;
    }
  }

  Grad call(const CallExpr *C, unsigned Depth) const {
    const FunctionDecl *FD = C->getDirectCallee();
    if (!FD || !isTensorApi(FD) || !Model.isTensorExpr(C))
      return Grad::Unknown;
    return operands(C, nullptr, Depth);
  }

  Grad var(const ValueDecl *D, unsigned Depth) const {
    if (const auto *B = dyn_cast<BindingDecl>(D))
      return binding(B, Depth);
    const auto *V = dyn_cast<VarDecl>(D);
    if (!V || isa<ParmVarDecl>(V) || !V->hasLocalStorage() || !V->getInit() ||
        V->getType()->isReferenceType())
      return Grad::Unknown;
    return of(V->getInit(), Depth + 1);
  }

  // `auto [values, indices] = x.max(1)`: the first result of an op follows
  // its inputs (the others may be indices); a module's results all do.
  Grad binding(const BindingDecl *B, unsigned Depth) const {
    const auto *DD = dyn_cast_or_null<DecompositionDecl>(B->getDecomposedDecl());
    const Expr *Init = DD && DD->getInit() ? operandOf(DD->getInit(), Model) : nullptr;
    if (!Init)
      return Grad::Unknown;
    if (isModuleCall(Init))
      return Grad::Yes;
    return DD->bindings().front() == B ? of(Init, Depth + 1) : Grad::Unknown;
  }

  const TensorModel &Model;
};

// A guard that turns grad mode off for the rest of its scope.
bool isNoGradGuard(const VarDecl *V) {
  const CXXRecordDecl *RD = V->getType()->getAsCXXRecordDecl();
  if (!RD || !RD->getIdentifier())
    return false;
  StringRef N = RD->getName();
  if (N == "NoGradGuard" || N == "InferenceMode" || N == "AutoNonVariableTypeMode")
    return true;
  const auto *CE = dyn_cast_or_null<CXXConstructExpr>(V->getInit());
  if (N != "AutoGradMode" || !CE || CE->getNumArgs() < 1)
    return false;
  const auto *B = dyn_cast<CXXBoolLiteralExpr>(CE->getArg(0)->IgnoreParenImpCasts());
  return B && !B->getValue();
}

// A guard declared before S in one of the blocks around it.
bool gradDisabledAt(const Stmt *S, ASTContext &Ctx) {
  const Stmt *Child = S;
  for (DynTypedNodeList Ps = Ctx.getParents(*S); !Ps.empty(); Ps = Ctx.getParents(Ps[0])) {
    if (Ps[0].get<LambdaExpr>() || Ps[0].get<FunctionDecl>())
      return false;
    const auto *P = Ps[0].get<Stmt>();
    if (const auto *CS = dyn_cast_or_null<CompoundStmt>(P))
      for (const Stmt *B : CS->body()) {
        if (B == Child)
          break;
        if (const auto *DS = dyn_cast<DeclStmt>(B))
          for (const Decl *D : DS->decls())
            if (const auto *V = dyn_cast<VarDecl>(D); V && isNoGradGuard(V))
              return true;
      }
    Child = P;
  }
  return false;
}

} // namespace

bool KeptValueFlow::requiresGradAt(const Expr *E, const Stmt *At) const {
  return GradOf(Model).of(E) == Grad::Yes && !gradDisabledAt(At, Ctx);
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
    if (isa<CXXThisExpr>(M->getBase()->IgnoreParenImpCasts()))
      Out.push_back(M->getMemberDecl());
  if (const auto *L = dyn_cast<LambdaExpr>(S)) {
    for (const LambdaCapture &C : L->captures())
      if (C.capturesVariable())
        Out.push_back(C.getCapturedVar());
    refsOf(L->getBody(), Out);
    return;
  }
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

} // namespace

bool KeptValueFlow::mayBeDifferentiated(const Expr *Target, const Stmt *At) const {
  const ValueDecl *Root = stateRoot(Target);
  const auto *V = dyn_cast_or_null<VarDecl>(Root);
  if (!Root || V && (!V->hasLocalStorage() || V->getType()->isReferenceType() ||
                     V->getType()->isPointerType()))
    return true; // state the caller or other code can see
  llvm::SmallVector<const Stmt *, 8> Bodies;
  bodiesOf(Root, At, Ctx, Bodies);
  FlowCollector F(Model);
  for (const Stmt *B : Bodies)
    F.TraverseStmt(const_cast<Stmt *>(B));
  llvm::DenseSet<const ValueDecl *> Derived{Root};
  for (bool Changed = true; Changed;) {
    Changed = false;
    for (const auto &[From, To] : F.Edges) {
      llvm::SmallVector<const ValueDecl *, 8> Refs;
      refsOf(From, Refs);
      if (!Derived.contains(To) && llvm::any_of(Refs, [&](auto *D) { return Derived.contains(D); }))
        Changed = Derived.insert(To).second;
    }
  }
  auto Reaches = [&](const Stmt *S) {
    llvm::SmallVector<const ValueDecl *, 8> Refs;
    refsOf(S, Refs);
    return llvm::any_of(Refs, [&](auto *D) { return Derived.contains(D); });
  };
  return llvm::any_of(F.Sinks, Reaches) || (!F.SawEval && llvm::any_of(F.Returns, Reaches));
}

} // namespace clang::tidy::tensor
