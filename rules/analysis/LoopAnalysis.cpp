#include "analysis/LoopAnalysis.h"
#include "analysis/LayoutAnalysis.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/StmtCXX.h"
#include "clang/Basic/SourceManager.h"
#include "llvm/ADT/StringSwitch.h"

namespace clang::tidy::tensor {

namespace {

// Methods that copy data into a container or keep the argument.
bool isStoreName(llvm::StringRef N) {
  return llvm::StringSwitch<bool>(N)
      .Cases("push_back", "emplace_back", "push_front", "emplace_front", "push", "emplace", true)
      .Cases("insert", "insert_or_assign", "try_emplace", "append", "assign", "set", true)
      .Cases("store", "save", "put", "add", "record", "register_buffer", "register_parameter", true)
      .Default(false);
}

const sem::OpInfo *tensorOp(const TensorModel &M, const CallExpr *C) {
  const sem::OpInfo *Op = M.opOf(C);
  if (Op)
    return Op;
  // LibTorch declares some methods on TensorBase: look through the cast.
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(C))
    if (const Expr *O = MC->getImplicitObjectArgument();
        O && M.isTensorExpr(O->IgnoreParenImpCasts()) && MC->getMethodDecl() &&
        MC->getMethodDecl()->getIdentifier())
      return sem::lookup(MC->getMethodDecl()->getName());
  return nullptr;
}

// A function of the tensor libraries that allocates its result (torch::cat,
// tt::matmul), unlike std::move, a module's forward, or one returning a reference.
bool libraryAllocates(const FunctionDecl *F) {
  return isTensorLibraryCode(F) && F->getIdentifier() && F->getName() != "move" &&
         F->getName() != "forward" && !F->getReturnType()->isReferenceType();
}

bool aliasing(const sem::OpInfo *Op) {
  return Op && (Op->storage == sem::Storage::View || Op->storage == sem::Storage::MayAlias ||
                Op->storage == sem::Storage::Detach || Op->storage == sem::Storage::InPlace);
}


} // namespace

LoopAnalysis::LoopAnalysis(const TensorModel &Model, ASTContext &Ctx, const FunctionDecl *FD)
    : Model(Model), Ctx(Ctx), FD(FD) {
  // One pass over the body: handle aliases (union-find), storage that may be
  // shared with the outside world, variables pinned by address or reference
  // capture.
  for (const ParmVarDecl *P : FD->parameters())
    ForeignVars.insert(P);
  llvm::SmallVector<const Stmt *, 64> Work;
  if (FD->getBody())
    Work.push_back(FD->getBody());
  auto Bind = [&](const VarDecl *V, const Expr *Init) {
    llvm::SmallVector<const VarDecl *, 4> B;
    basesOf(Init, B);
    for (const VarDecl *X : B)
      unite(V, X);
    if (Model.isTensorType(V->getType()) && rootsForeign(Init)) {
      ForeignVars.insert(V);
      if (fromCallerTensors(Init))
        CallerDerived.insert(V);
    }
  };
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    if (const auto *C = dyn_cast<CallExpr>(S))
      noteObjectUses(C);
    if (const auto *DS = dyn_cast<DeclStmt>(S)) {
      for (const Decl *D : DS->decls())
        if (const auto *V = dyn_cast<VarDecl>(D)) {
          if (V->hasGlobalStorage())
            ForeignVars.insert(V);
          if (V->getInit())
            Bind(V, V->getInit());
          if (V->getInit() && !Model.isTensorType(V->getType()) &&
              Model.mayHoldTensors(V->getType())) {
            handOver(V->getInit());
            if (!isDefaultConstructed(V->getInit()))
              ExposedObjects.insert(V); // may hold what it was made from
          }
          if (V->getType()->isReferenceType() && !V->getInit())
            ForeignVars.insert(V);
        }
    } else if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(S)) {
      if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2) {
        if (const auto *L = dyn_cast<DeclRefExpr>(stripHandle(OC->getArg(0))))
          if (const auto *V = dyn_cast<VarDecl>(L->getDecl()))
            Bind(V, OC->getArg(1));
        // `norm.stats = model->weight`: the object holds storage others reach.
        const auto *ME = dyn_cast<MemberExpr>(stripHandle(OC->getArg(0)));
        const auto *D = ME && !ME->isArrow()
                            ? dyn_cast<DeclRefExpr>(ME->getBase()->IgnoreParenImpCasts())
                            : nullptr;
        if (const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
            V && !isFreshValue(OC->getArg(1), 0))
          ExposedObjects.insert(V);
      }
    } else if (const auto *UO = dyn_cast<UnaryOperator>(S)) {
      if (UO->getOpcode() == UO_AddrOf)
        if (const auto *D = dyn_cast<DeclRefExpr>(stripHandle(UO->getSubExpr())))
          if (const auto *V = dyn_cast<VarDecl>(D->getDecl()))
            AddressTaken.insert(V);
    } else if (const auto *L = dyn_cast<LambdaExpr>(S)) {
      for (const LambdaCapture &C : L->captures())
        if (C.capturesVariable() && C.getCaptureKind() == LCK_ByRef)
          if (const auto *V = dyn_cast<VarDecl>(C.getCapturedVar()))
            RefCaptures[V].push_back(L);
    } else if (const auto *RF = dyn_cast<CXXForRangeStmt>(S)) {
      if (const VarDecl *LV = RF->getLoopVariable())
        ForeignVars.insert(LV);
    }
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
  // The caller's tensors (and handles made from them) are the caller's data:
  // Note [Opaque calls] in docs/design.md.
  for (const VarDecl *V : ForeignVars)
    if (!isCallerTensor(V) && !CallerDerived.count(V))
      Foreign.insert(root(V));
}

// The tensor variables Init names go into an object that may keep them
// (`LBFGS opt({w}, ...)`): a call of that object's may write them. A function
// of the TU returning the object keeps only the arguments its body keeps.
void LoopAnalysis::handOver(const Stmt *Init) {
  if (!Init || isa<LambdaExpr>(Init)) // a closure: collect() reads its body
    return;
  const auto *E = dyn_cast<Expr>(Init);
  const auto *C = dyn_cast_or_null<CallExpr>(E ? stripHandle(E) : nullptr);
  const FunctionDecl *Callee = C ? C->getDirectCallee() : nullptr;
  if (Callee && !isa<CXXOperatorCallExpr>(C) && !isTensorLibraryCode(Callee)) {
    for (unsigned I = 0; I < C->getNumArgs(); ++I)
      if (mayKeepArg(Callee, I))
        handOver(C->getArg(I));
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(C))
      handOver(MC->getImplicitObjectArgument());
    return;
  }
  if (const auto *D = dyn_cast<DeclRefExpr>(Init))
    if (const auto *V = dyn_cast<VarDecl>(D->getDecl()); V && Model.isTensorType(V->getType())) {
      ForeignVars.insert(V);
      HandedOver.insert(V);
    }
  for (const Stmt *C : Init->children())
    handOver(C);
}

// A local object named as an argument may be kept or written by the callee;
// one whose method is given tensors it may keep holds storage others reach.
void LoopAnalysis::noteObjectUses(const CallExpr *C) {
  auto LocalObject = [&](const Expr *E) -> const VarDecl * {
    const auto *D = E ? dyn_cast<DeclRefExpr>(E->IgnoreParenImpCasts()) : nullptr;
    const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
    return V && !Model.isTensorType(V->getType()) ? V : nullptr;
  };
  for (const Expr *A : C->arguments())
    if (const VarDecl *V = LocalObject(A))
      ExposedObjects.insert(V);
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  const VarDecl *Obj = MC ? LocalObject(MC->getImplicitObjectArgument()) : nullptr;
  if (!Obj || !MC->getMethodDecl() || MC->getMethodDecl()->isConst())
    return; // a const method stores nothing in its object
  for (unsigned I = 0; I < C->getNumArgs(); ++I)
    if (Model.mayHoldTensors(C->getArg(I)->getType()) && mayKeepArg(MC->getMethodDecl(), I))
      ExposedObjects.insert(Obj);
}

bool LoopAnalysis::privateObject(const VarDecl *V) const {
  return !Model.isTensorType(V->getType()) && V->isLocalVarDecl() && !V->isStaticLocal() &&
         !V->getType()->isReferenceType() && !V->getType()->isPointerType() && !pinned(V) &&
         !ExposedObjects.count(V) && !ForeignVars.count(V) && !HandedOver.count(V);
}

// A tensor the caller passed, or a plain struct of them (`const Batch &b`).
bool LoopAnalysis::isCallerTensor(const VarDecl *V) const {
  return isa<ParmVarDecl>(V) &&
         (Model.isTensorType(V->getType()) || Model.isTensorStruct(V->getType()));
}

bool LoopAnalysis::fromCallerTensors(const Expr *E) const {
  llvm::SmallVector<const VarDecl *, 4> B;
  basesOf(E, B);
  return !B.empty() && llvm::all_of(B, [&](const VarDecl *V) {
    return isCallerTensor(V) || CallerDerived.count(V);
  });
}

const VarDecl *LoopAnalysis::root(const VarDecl *V) {
  auto It = Parent.find(V);
  if (It == Parent.end() || It->second == V)
    return V;
  const VarDecl *R = root(It->second);
  Parent[V] = R;
  return R;
}

void LoopAnalysis::unite(const VarDecl *A, const VarDecl *B) {
  const VarDecl *RA = root(A), *RB = root(B);
  if (RA != RB)
    Parent[RA] = RB;
}

void LoopAnalysis::basesOf(const Expr *E, llvm::SmallVectorImpl<const VarDecl *> &Out) const {
  E = stripHandle(E);
  if (!E)
    return;
  if (const auto *D = dyn_cast<DeclRefExpr>(E)) {
    if (const auto *V = dyn_cast<VarDecl>(D->getDecl()))
      Out.push_back(V);
    return;
  }
  if (const auto *CO = dyn_cast<AbstractConditionalOperator>(E)) {
    basesOf(CO->getTrueExpr(), Out);
    basesOf(CO->getFalseExpr(), Out);
    return;
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    basesOf(ME->getBase(), Out);
    return;
  }
  if (const auto *AS = dyn_cast<ArraySubscriptExpr>(E)) {
    basesOf(AS->getBase(), Out);
    return;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(E)) {
    if (UO->getOpcode() == UO_Deref || UO->getOpcode() == UO_AddrOf)
      basesOf(UO->getSubExpr(), Out);
    return;
  }
  if (const auto *BO = dyn_cast<BinaryOperator>(E)) {
    if (BO->isAssignmentOp() || BO->getOpcode() == BO_Comma)
      basesOf(BO->getLHS(), Out);
    return;
  }
  if (const auto *C = dyn_cast<CallExpr>(E))
    callBasesOf(C, Out);
}

void LoopAnalysis::callBasesOf(const CallExpr *C,
                               llvm::SmallVectorImpl<const VarDecl *> &Out) const {
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C)) {
    switch (OC->getOperator()) {
    case OO_Subscript:
    case OO_Arrow:
    case OO_Star:
      if (OC->getNumArgs() == 1 || OC->getOperator() != OO_Star)
        basesOf(OC->getArg(0), Out);
      return;
    case OO_Equal:
    case OO_PlusEqual:
    case OO_MinusEqual:
    case OO_StarEqual:
    case OO_SlashEqual:
      basesOf(OC->getArg(0), Out);
      return;
    default:
      if (Model.isTensorExpr(C))
        return; // math operators allocate
      break;
    }
  }
  const FunctionDecl *F = C->getDirectCallee();
  if (const sem::OpInfo *Op = tensorOp(Model, C)) {
    if (aliasing(Op) || (!Op && TensorModel::isInPlaceCall(C))) {
      if (const Expr *Self = TensorModel::selfOf(C))
        basesOf(Self, Out);
      else if (C->getNumArgs())
        basesOf(C->getArg(0), Out);
    }
    return;
  }
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(C)) {
    // A method of the TU returning a fresh tensor (`loader.positive_weights()`
    // returning `torch::tensor({...})`) holds none of its object's storage.
    if (const FunctionDecl *Body = F ? readableCallee(F) : nullptr;
        Body && !C->getType()->isReferenceType() && returnsFresh(Body))
      return;
    // A tensor method outside the table, or an accessor returning a handle
    // or reference into its object (`vec.back()`, `model->weight()`).
    if (TensorModel::isInPlaceCall(C) || !Model.isTensorExpr(MC->getImplicitObjectArgument()))
      if (C->getType()->isReferenceType() || C->getCallReturnType(Ctx)->isReferenceType() ||
          Model.isTensorExpr(C))
        basesOf(MC->getImplicitObjectArgument(), Out);
    return;
  }
  if (F && libraryAllocates(F))
    return; // torch::cat, tt::matmul...
  if (const FunctionDecl *Body = F ? readableCallee(F) : nullptr; Body && returnsFresh(Body))
    return; // `gram(feat)` returning `bmm(f, f.t()) / n`
  // An unknown function may return (a view of) any tensor it was given; one
  // of the TU only those its body keeps.
  unsigned Shift = isa<CXXOperatorCallExpr>(C) && isa_and_nonnull<CXXMethodDecl>(F) ? 1 : 0;
  for (unsigned I = 0; I < C->getNumArgs(); ++I) {
    const Expr *A = C->getArg(I);
    if ((Model.isTensorExpr(A) || Model.isTensorStruct(A->getType()) ||
         A->getType()->isReferenceType()) &&
        (!F || I < Shift || mayKeepArg(F, I - Shift)))
      basesOf(A, Out);
  }
}

bool LoopAnalysis::rootsForeign(const Expr *E) const {
  E = stripHandle(E);
  if (!E)
    return false;
  if (const auto *D = dyn_cast<DeclRefExpr>(E)) {
    const auto *V = dyn_cast<VarDecl>(D->getDecl());
    return V && (ForeignVars.count(V) || V->hasGlobalStorage());
  }
  if (const auto *CO = dyn_cast<AbstractConditionalOperator>(E))
    return rootsForeign(CO->getTrueExpr()) || rootsForeign(CO->getFalseExpr());
  if (isa<MemberExpr>(E))
    return true;
  const auto *C = dyn_cast<CallExpr>(E);
  if (!C)
    return false;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
      OC && Model.isTensorExpr(E) && isComputingOperator(OC))
    return false;
  // `centers(g)[0]`: a view of its object.
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
      OC && OC->getOperator() == OO_Subscript && Model.isTensorExpr(OC->getArg(0)))
    return rootsForeign(OC->getArg(0));
  if (const sem::OpInfo *Op = tensorOp(Model, C)) {
    if (!aliasing(Op))
      return false;
    const Expr *Self = TensorModel::selfOf(C);
    return rootsForeign(Self ? Self : (C->getNumArgs() ? C->getArg(0) : nullptr));
  }
  const FunctionDecl *F = C->getDirectCallee();
  if (F && libraryAllocates(F) && !isa<CXXMethodDecl>(F))
    return false; // torch::zeros, torch::cat...
  if (const FunctionDecl *Body = F ? readableCallee(F) : nullptr; Body && returnsFresh(Body))
    return false;
  return true;
}

const Stmt *LoopAnalysis::innermostLoop(const Stmt *S, ASTContext &Ctx) {
  const Stmt *Child = S;
  DynTypedNodeList Parents = Ctx.getParents(*S);
  while (!Parents.empty()) {
    const DynTypedNode &N = Parents[0];
    if (N.get<LambdaExpr>() || N.get<Decl>() && !N.get<VarDecl>() && !N.get<DecompositionDecl>())
      return nullptr;
    if (const auto *P = N.get<Stmt>()) {
      if (isLoop(P) && Child) {
        bool Once = false; // parts evaluated once: for-init, range init
        if (const auto *F = dyn_cast<ForStmt>(P))
          Once = Child == F->getInit();
        else if (const auto *RF = dyn_cast<CXXForRangeStmt>(P))
          Once = Child == RF->getInit() || Child == RF->getRangeStmt() ||
                 Child == RF->getRangeInit() || Child == RF->getBeginStmt() ||
                 Child == RF->getEndStmt();
        if (!Once)
          return P;
      }
      Child = P;
    } else {
      Child = nullptr;
    }
    Parents = Ctx.getParents(N);
  }
  return nullptr;
}

namespace {

// E is V, or a conversion of V (a std::function built from the closure).
bool namesVar(const Expr *E, const VarDecl *V) {
  E = E ? stripHandle(E) : nullptr;
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E); CE && CE->getNumArgs() == 1)
    return namesVar(CE->getArg(0), V);
  const auto *D = dyn_cast_or_null<DeclRefExpr>(E);
  return D && D->getDecl() == V;
}

// S calls the closure V, or hands it to a call that does not store it.
bool runsClosure(const Stmt *S, const VarDecl *V) {
  if (!S)
    return false;
  if (const auto *C = dyn_cast<CallExpr>(S)) {
    const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
    if (OC && OC->getOperator() == OO_Call && namesVar(OC->getArg(0), V))
      return true;
    const FunctionDecl *F = C->getDirectCallee();
    if (F && !(F->getIdentifier() && isStoreName(F->getName())) &&
        llvm::any_of(C->arguments(), [&](const Expr *A) { return namesVar(A, V); }))
      return true;
  }
  return llvm::any_of(S->children(), [&](const Stmt *C) { return runsClosure(C, V); });
}

// What becomes of a closure object: handed straight to a call that does not
// keep it (or called on the spot), kept (by a storing call, or one we cannot
// see), or named by a variable.
enum class ClosureFate { Run, Kept, Named };
ClosureFate fateOf(const LambdaExpr *L, ASTContext &Ctx) {
  DynTypedNodeList Ps = Ctx.getParents(*L);
  while (!Ps.empty() && Ps[0].get<Expr>() && !Ps[0].get<CallExpr>())
    Ps = Ctx.getParents(Ps[0]); // casts, temporaries, a std::function's construction
  if (const auto *C = Ps.empty() ? nullptr : Ps[0].get<CallExpr>()) {
    const auto *F = C->getDirectCallee();
    return F && !(F->getIdentifier() && isStoreName(F->getName())) ? ClosureFate::Run
                                                                   : ClosureFate::Kept;
  }
  return initialisedVar(L, Ctx) ? ClosureFate::Named : ClosureFate::Run;
}

// The closure L is run by Loop: handed straight to a call, or held by a
// variable that a later statement of the loop's body calls or hands to a call.
bool runsIn(const LambdaExpr *L, const Stmt *Loop, ASTContext &Ctx) {
  ClosureFate Fate = fateOf(L, Ctx);
  if (Fate != ClosureFate::Named)
    return Fate == ClosureFate::Run;
  const VarDecl *V = initialisedVar(L, Ctx);
  const auto *CS = dyn_cast_or_null<CompoundStmt>(loopBody(Loop));
  bool After = false;
  for (const Stmt *St : CS ? CS->body() : llvm::ArrayRef<Stmt *>()) {
    if (After && runsClosure(St, V))
      return true;
    const auto *DS = dyn_cast<DeclStmt>(St);
    After = After || (DS && llvm::is_contained(DS->decls(), V));
  }
  return false;
}

} // namespace

bool LoopAnalysis::inClosure(const Stmt *S, const Stmt *Loop, ASTContext &Ctx) {
  return enclosingFunction(S, Ctx) != enclosingFunction(Loop, Ctx);
}

// `V == c` (or `c == V`) with V the for-loop's counter declared `V = c`.
static bool testsInitialCounter(const Expr *Cond, const ForStmt *For) {
  const auto *DS = dyn_cast_or_null<DeclStmt>(For->getInit());
  const auto *V = DS && DS->isSingleDecl() ? dyn_cast<VarDecl>(DS->getSingleDecl()) : nullptr;
  const auto *BO = dyn_cast_or_null<BinaryOperator>(Cond ? Cond->IgnoreParenImpCasts() : nullptr);
  if (!V || !V->getInit() || !BO || BO->getOpcode() != BO_EQ)
    return false;
  const ASTContext &Ctx = V->getASTContext();
  std::optional<llvm::APSInt> Init = V->getInit()->getIntegerConstantExpr(Ctx);
  auto Side = [&](const Expr *A, const Expr *B) {
    std::optional<llvm::APSInt> C = B->getIntegerConstantExpr(Ctx);
    return varOf(A) == V && Init && C && llvm::APSInt::isSameValue(*Init, *C);
  };
  return Side(BO->getLHS(), BO->getRHS()) || Side(BO->getRHS(), BO->getLHS());
}

bool LoopAnalysis::firstIterationOnly(const Stmt *S, const Stmt *Loop, ASTContext &Ctx) {
  const auto *For = dyn_cast<ForStmt>(Loop);
  for (const Stmt *Cur = S; For && Cur && Cur != Loop;) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    const Stmt *P = Ps.empty() ? nullptr : Ps[0].get<Stmt>();
    if (const auto *CO = dyn_cast_or_null<ConditionalOperator>(P);
        CO && CO->getTrueExpr() == Cur && testsInitialCounter(CO->getCond(), For))
      return true;
    if (const auto *If = dyn_cast_or_null<IfStmt>(P);
        If && If->getThen() == Cur && testsInitialCounter(If->getCond(), For))
      return true;
    Cur = P;
  }
  return false;
}

const Stmt *LoopAnalysis::loopRunning(const Stmt *S, ASTContext &Ctx) {
  if (const Stmt *Loop = innermostLoop(S, Ctx))
    return Loop;
  const LambdaExpr *L = lambdaAround(S, Ctx);
  const Stmt *Loop = L ? innermostLoop(L, Ctx) : nullptr;
  return Loop && runsIn(L, Loop, Ctx) ? Loop : nullptr;
}

bool LoopAnalysis::returnsFresh(const FunctionDecl *F, unsigned Depth) const {
  if (Depth > 2 || !F->getBody() || F->getReturnType()->isReferenceType() ||
      !Model.isTensorType(F->getReturnType()))
    return false;
  if (auto It = FreshReturns.find(F); It != FreshReturns.end())
    return It->second; // every call of a helper asks again: once per function
  llvm::SmallVector<const ReturnStmt *, 4> Rs;
  collectReturns(F->getBody(), Rs);
  bool Fresh = !Rs.empty() && llvm::all_of(Rs, [&](const ReturnStmt *R) {
    return R->getRetValue() && isFreshValue(R->getRetValue(), Depth);
  });
  if (Depth == 0) // an answer cut short by the depth bound is not F's own
    FreshReturns[F] = Fresh;
  return Fresh;
}

// E is storage an op has just allocated: tensor arithmetic, a table op
// that neither views nor may alias, a library function, a fresh TU function;
// a view, conversion or in-place write of such storage (`(w / w.sum()).to(kFloat)`);
// a local never assigned after its fresh initializer (`auto out = zeros(...);
// ...; return out;`).
bool LoopAnalysis::isFreshValue(const Expr *E, unsigned Depth) const {
  E = stripHandle(E);
  if (const auto *D = dyn_cast_or_null<DeclRefExpr>(E))
    return isFreshLocal(dyn_cast<VarDecl>(D->getDecl()), Depth);
  const auto *C = dyn_cast_or_null<CallExpr>(E);
  if (!C)
    return false;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C))
    return isComputingOperator(OC) && Model.isTensorExpr(C);
  if (const sem::OpInfo *Op = tensorOp(Model, C)) {
    if (aliasing(Op)) {
      const Expr *Self = TensorModel::selfOf(C);
      return isFreshValue(Self ? Self : (C->getNumArgs() ? C->getArg(0) : nullptr), Depth);
    }
    return Op->storage == sem::Storage::Copy || Op->storage == sem::Storage::Fresh ||
           Op->storage == sem::Storage::Factory;
  }
  const FunctionDecl *F = C->getDirectCallee();
  if (!F || isa<CXXMethodDecl>(F))
    return false;
  if (isTensorLibraryCode(F))
    return libraryAllocates(F);
  const FunctionDecl *Body = readableCallee(F);
  return Body && returnsFresh(Body, Depth + 1);
}

bool LoopAnalysis::isFreshLocal(const VarDecl *V, unsigned Depth) const {
  const Expr *Init = Fixed.initializerOf(V);
  return Init && isFreshValue(Init, Depth);
}

bool LoopAnalysis::isDeclaredIn(const VarDecl *V, const Stmt *Loop) const {
  if (const auto *RF = dyn_cast<CXXForRangeStmt>(Loop))
    if (RF->getLoopVariable() == V)
      return true;
  const SourceManager &SM = Ctx.getSourceManager();
  SourceLocation L = SM.getExpansionLoc(V->getLocation());
  SourceRange R = Loop->getSourceRange();
  return SM.isPointWithin(L, SM.getExpansionLoc(R.getBegin()), SM.getExpansionLoc(R.getEnd()));
}

void LoopAnalysis::markWritten(const Expr *E, LoopFacts &F) {
  E = stripHandle(E);
  if (!E)
    return;
  // Fields written through `this` (or a local object).
  for (const Expr *X = E; X;) {
    X = stripHandle(X);
    if (const auto *ME = dyn_cast_or_null<MemberExpr>(X)) {
      if (const auto *FDl = dyn_cast<FieldDecl>(ME->getMemberDecl()))
        F.WrittenFields.insert(FDl);
      X = ME->getBase();
    } else if (const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(X)) {
      X = MC->getImplicitObjectArgument();
    } else if (const auto *OC = dyn_cast_or_null<CXXOperatorCallExpr>(X);
               OC && OC->getNumArgs() >= 1 &&
               (OC->getOperator() == OO_Subscript || OC->getOperator() == OO_Arrow)) {
      X = OC->getArg(0);
    } else {
      break;
    }
  }
  llvm::SmallVector<const VarDecl *, 4> B;
  basesOf(E, B);
  for (const VarDecl *V : B)
    F.Written.insert(V);
}

void LoopAnalysis::collect(const Stmt *S, LoopFacts &F) {
  if (!S)
    return;
  if (const auto *BO = dyn_cast<BinaryOperator>(S)) {
    if (BO->isAssignmentOp())
      markWritten(BO->getLHS(), F);
  } else if (const auto *UO = dyn_cast<UnaryOperator>(S)) {
    if (UO->isIncrementDecrementOp() || UO->getOpcode() == UO_AddrOf)
      markWritten(UO->getSubExpr(), F);
  } else if (const auto *DS = dyn_cast<DeclStmt>(S)) {
    // A reference bound in the loop may write what it binds.
    for (const Decl *D : DS->decls())
      if (const auto *V = dyn_cast<VarDecl>(D);
          V && V->getType()->isReferenceType() && V->getInit() &&
          !V->getType().getNonReferenceType().isConstQualified())
        markWritten(V->getInit(), F);
  } else if (const auto *C = dyn_cast<CallExpr>(S)) {
    collectCall(C, F);
  }
  for (const Stmt *Ch : S->children())
    collect(Ch, F);
}

// A call: what it writes through its object (an in-place op, a non-const
// method) and its arguments, and whether it runs code we cannot see.
void LoopAnalysis::collectCall(const CallExpr *C, LoopFacts &F) {
  const FunctionDecl *Callee = C->getDirectCallee();
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
  const Expr *Obj = MC ? MC->getImplicitObjectArgument() : nullptr;
  if (OC && OC->getNumArgs() >= 1 && isa_and_nonnull<CXXMethodDecl>(Callee))
    Obj = OC->getArg(0);
  bool TensorObj = Obj && Model.isTensorExpr(Obj->IgnoreParenImpCasts());
  const auto *Rebound = OC && OC->getOperator() == OO_Equal && TensorObj
                           ? dyn_cast<DeclRefExpr>(stripHandle(OC->getArg(0)))
                           : nullptr;
  if (const auto *V = Rebound ? dyn_cast<VarDecl>(Rebound->getDecl()) : nullptr) {
    F.Rebound.insert(V); // `w = x.to(dev)`: w varies; x's storage, which w may share, does not
  } else if (OC && OC->isAssignmentOp()) {
    markWritten(OC->getArg(0), F);
  } else if (TensorObj) {
    if (TensorModel::isInPlaceCall(C)) {
      markWritten(Obj, F);
      llvm::SmallVector<const VarDecl *, 2> B;
      basesOf(Obj, B);
      if ((B.empty() && rootsForeign(Obj)) ||
          llvm::any_of(B, [&](const VarDecl *V) { return ForeignVars.count(V); }))
        F.Opaque = true; // writes storage that others may see
    }
  } else if (Obj && Callee && isModuleCall(C)) {
    markWritten(Obj, F); // `fc(x)`: the module's forward, as `fc->forward(x)`
  } else if (Obj && Callee) {
    collectMethodCall(dyn_cast<CXXMethodDecl>(Callee), Obj, F);
  } else if (!Callee) {
    F.Opaque = true; // through a pointer, std::function...
  }
  // A free function can write only what it is given (handled below) and
  // globals, which are never invariant here: not opaque.
  if (Callee)
    collectArgs(C, Callee, F);
}

// A method called on an object that is not a tensor.
void LoopAnalysis::collectMethodCall(const CXXMethodDecl *MD, const Expr *Obj, LoopFacts &F) {
  bool This = isa<CXXThisExpr>(Obj->IgnoreParenImpCasts());
  // `net_->` only gives the pointer: what is done through it is collected
  // on its own (`net_->bias` read, `net_->reset()` called).
  bool Mutating = MD && !MD->isConst() && !MD->isStatic() &&
                  MD->getOverloadedOperator() != OO_Arrow;
  if (Mutating && !(This && collectOwnMethod(MD, F))) {
    markWritten(Obj, F);
    if (This)
      F.ThisMutated = true;
    // Another object's method whose body writes only that object and what
    // it is given (`net->option_probs(q, eps)`) is not opaque.
    bool Transparent = !This && transparentMethod(MD);
    if (!Transparent && !isStandardLibrary(MD->getParent()))
      if (!MD->getParent()->isLambda() && !isModuleForward(MD))
        F.Opaque = true;
  }
  if (MD && MD->getParent()->isLambda())
    F.Opaque = true;
}

// Parameter I of Callee was a forwarding reference (`Args&&...`) in its
// template: `TensorOptions().device(device)` binds `Device &` but only reads it.
static bool isForwardedParam(const FunctionDecl *Callee, unsigned I) {
  const FunctionDecl *P = Callee->getTemplateInstantiationPattern();
  for (unsigned J = 0; P && J < P->getNumParams(); ++J) {
    const ParmVarDecl *PD = P->getParamDecl(J);
    if (J != I && !(PD->isParameterPack() && I >= J))
      continue;
    QualType T = PD->getType();
    if (const auto *PE = T->getAs<PackExpansionType>())
      T = PE->getPattern();
    const auto *RR = T->getAs<RValueReferenceType>();
    return RR && RR->getPointeeType()->getAs<TemplateTypeParmType>() &&
           !RR->getPointeeType().isConstQualified();
  }
  return false;
}

// Arguments: non-const references and pointers may be written; a tensor
// handed to code we cannot see may be written in place.
void LoopAnalysis::collectArgs(const CallExpr *C, const FunctionDecl *Callee, LoopFacts &F) {
  unsigned Shift = isa<CXXOperatorCallExpr>(C) && isa<CXXMethodDecl>(Callee) ? 1 : 0;
  bool Lib = isTensorLibraryCode(Callee) && !TensorModel::isInPlaceCall(C);
  for (unsigned I = Shift; I < C->getNumArgs(); ++I) {
    const Expr *A = C->getArg(I);
    QualType PT;
    if (I - Shift < Callee->getNumParams())
      PT = Callee->getParamDecl(I - Shift)->getType();
    bool W = false;
    // An options setter's `T&&` (`.weight(w.to(dev))`) takes the handle over.
    bool Moved = isOptionsSetter(Callee);
    if (!PT.isNull() && !Moved && (PT->isPointerType() || PT->isReferenceType()))
      W = !PT->getPointeeType().isConstQualified() || PT->isRValueReferenceType();
    if (Lib && isForwardedParam(Callee, I - Shift))
      W = false; // the library forwards it to a constructor
    if (Lib && PT->isRValueReferenceType() && Model.isTensorType(PT.getNonReferenceType()))
      W = false; // `w = x.to(dev)`: the handle is moved from, its storage untouched
    if (Model.isTensorExpr(A) && !Lib && mayWriteArg(Callee, I - Shift))
      W = true;
    if (isa<CXXThisExpr>(A->IgnoreParenImpCasts()))
      F.ThisMutated = true;
    if (W)
      markWritten(A, F);
  }
}

// MD's body (in the TU) calls nothing opaque, directly or through the
// methods it calls: what it writes is its object's fields (markWritten of
// the object covers them) and the arguments mayWriteArg reports.
bool LoopAnalysis::transparentMethod(const CXXMethodDecl *MD) {
  const FunctionDecl *Def = readableCallee(MD);
  if (!Def || !Def->getBody() || Ctx.getSourceManager().isInSystemHeader(Def->getLocation()))
    return false;
  auto [It, New] = Transparent.try_emplace(Def, false); // a recursion: not transparent
  if (!New)
    return It->second;
  LoopFacts G;
  collect(Def->getBody(), G);
  return Transparent[Def] = !G.Opaque;
}

// A method of this object called in the loop, with its body in the TU: what
// the body writes is written in the loop (`rollout(s0, samples, g)` writes no
// field, so `device_` stays invariant). False when the body cannot be read.
bool LoopAnalysis::collectOwnMethod(const CXXMethodDecl *MD, LoopFacts &F) {
  const FunctionDecl *Def = readableCallee(MD);
  if (!Def || !Def->getBody() || isTensorLibraryCode(Def) ||
      Ctx.getSourceManager().isInSystemHeader(Def->getLocation()))
    return false;
  if (F.OwnMethodsRead.contains(Def))
    return true; // recursion, or read already
  if (F.OwnMethodsRead.size() >= kMaxOwnMethods)
    return false;
  F.OwnMethodsRead.insert(Def);
  collect(Def->getBody(), F);
  return true;
}

// E names (a handle of) a variable of Alias, also inside a braced or
// constructed value: `{a, b}`, `Out{a}`.
bool LoopAnalysis::namesAny(const Expr *E, const llvm::DenseSet<const VarDecl *> &Alias) const {
  E = stripHandle(E);
  if (!E)
    return false;
  if (const auto *IL = dyn_cast<InitListExpr>(E))
    return llvm::any_of(IL->inits(), [&](const Expr *X) { return namesAny(X, Alias); });
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E))
    return llvm::any_of(CE->arguments(), [&](const Expr *X) { return namesAny(X, Alias); });
  llvm::SmallVector<const VarDecl *, 4> B;
  basesOf(E, B);
  return llvm::any_of(B, [&](const VarDecl *V) { return Alias.count(V) > 0; });
}

// Whether E's value may share storage with a tensor it reads: false for the
// result of a table op that allocates it (`pad.logical_not().sum(1)`).
static bool mayShareStorage(const TensorModel &Model, const Expr *E) {
  const auto *Call = dyn_cast_or_null<CallExpr>(stripHandle(E));
  if (!Call)
    return true;
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
  const sem::OpInfo *Op = OC ? sem::lookup(operatorOpName(OC)) : tensorOp(Model, Call);
  return !Op || aliasing(Op);
}

// A local handle of Def (not a reference, not static): assigning it keeps nothing.
static const VarDecl *localHandle(const Expr *L) {
  const auto *D = dyn_cast_or_null<DeclRefExpr>(L ? stripHandle(L) : nullptr);
  const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
  return V && V->isLocalVarDecl() && !V->isStaticLocal() && !V->getType()->isReferenceType()
             ? V
             : nullptr;
}

// Whether Callee may keep its I-th argument beyond the call: return it (or a
// handle or view of it), store it (an assignment, a container), capture it.
// True when its body is not the user's code in the TU.
bool LoopAnalysis::mayKeepArg(const FunctionDecl *Callee, unsigned I) const {
  const FunctionDecl *Def = readableCallee(Callee);
  if (!Def || isa<CXXConstructorDecl>(Def) || I >= Def->getNumParams() || !Def->getBody() ||
      Ctx.getSourceManager().isInSystemHeader(Def->getLocation()))
    return true;
  auto [It, New] = KeptParams.try_emplace({Def, I}, true);
  if (New)
    It->second = bodyKeepsParam(Def, I);
  return It->second;
}

// mayKeepArg for a body of the TU: a walk of it, following local handles.
bool LoopAnalysis::bodyKeepsParam(const FunctionDecl *Def, unsigned I) const {
  llvm::DenseSet<const VarDecl *> Alias{Def->getParamDecl(I)};
  llvm::SmallVector<const Stmt *, 32> Work{Def->getBody()};
  while (!Work.empty()) { // pre-order: declarations come before their uses
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    if (const auto *DS = dyn_cast<DeclStmt>(S)) {
      for (const Decl *D : DS->decls())
        if (const auto *V = dyn_cast<VarDecl>(D); V && V->getInit() &&
                                                  namesAny(V->getInit(), Alias) &&
                                                  mayShareStorage(Model, V->getInit()))
          Alias.insert(V);
    } else if (const auto *RS = dyn_cast<ReturnStmt>(S);
               RS && namesAny(RS->getRetValue(), Alias) &&
               mayShareStorage(Model, RS->getRetValue())) {
      return true;
    } else if (auto [L, R] = assignmentSides(S);
               R && namesAny(R, Alias) && mayShareStorage(Model, R)) {
      const VarDecl *V = localHandle(L); // `pad = pad.narrow(...)`: another local alias
      if (!V)
        return true;
      Alias.insert(V);
    } else if (const auto *C = dyn_cast<CallExpr>(S);
               C && C->getDirectCallee() && C->getDirectCallee()->getIdentifier() &&
               isStoreName(C->getDirectCallee()->getName())) {
      if (llvm::any_of(C->arguments(), [&](const Expr *A) { return namesAny(A, Alias); }))
        return true;
    } else if (isa<LambdaExpr>(S)) {
      return true;
    }
    llvm::SmallVector<const Stmt *, 8> Kids(S->children());
    for (auto It = Kids.rbegin(); It != Kids.rend(); ++It)
      Work.push_back(*It);
  }
  return false;
}

// Note [rebinding in a callee]: the handles of a callee's body that may share
// its parameter's storage, in source order. `Tensor out = pts;` joins it;
// `out = out * s;` as a statement of the body itself (run once, before every
// later statement) leaves it, so `out.add_(b)` after it writes the product,
// not the caller's tensor. A rebinding inside a branch or loop leaves the
// handle in: it may still alias on the other path.
struct LoopAnalysis::ArgAliases {
  const LoopAnalysis &LA;
  llvm::DenseSet<const VarDecl *> Vars;
  llvm::SmallPtrSet<const Stmt *, 16> TopLevel;
  bool touches(const Expr *E) const {
    llvm::SmallVector<const VarDecl *, 4> B;
    LA.basesOf(E, B);
    return llvm::any_of(B, [&](const VarDecl *V) { return Vars.count(V) > 0; });
  }
};

void LoopAnalysis::trackRebinding(const CXXOperatorCallExpr *OC, ArgAliases &A) const {
  const auto *L = dyn_cast<DeclRefExpr>(stripHandle(OC->getArg(0)));
  const auto *V = L ? dyn_cast<VarDecl>(L->getDecl()) : nullptr;
  if (!V)
    return;
  if (A.touches(OC->getArg(1)) && mayShareStorage(Model, OC->getArg(1)))
    A.Vars.insert(V);
  else if (A.TopLevel.count(OC))
    A.Vars.erase(V);
}

// Whether the call C, in a callee whose parameter's aliases are A, writes one.
bool LoopAnalysis::callWritesAlias(const CallExpr *C, ArgAliases &A, unsigned Depth) const {
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
  if (MC && TensorModel::isInPlaceCall(C) && A.touches(MC->getImplicitObjectArgument()))
    return true;
  if (OC && OC->isAssignmentOp() && OC->getNumArgs() == 2) {
    if (OC->getOperator() == OO_Equal && isa<DeclRefExpr>(stripHandle(OC->getArg(0)))) {
      trackRebinding(OC, A); // rebinding a handle is not a write
      return false;
    }
    return A.touches(OC->getArg(0)); // `t += 1`, `t[0] = x`
  }
  const FunctionDecl *F = C->getDirectCallee();
  if (OC && isa_and_nonnull<CXXMethodDecl>(F)) // `a + b` on tensors reads both
    return false;
  for (unsigned J = 0; J < C->getNumArgs(); ++J)
    if (A.touches(C->getArg(J)) && Model.isTensorExpr(C->getArg(J)) &&
        mayWriteArg(F, J, Depth + 1))
      return true;
  return false;
}

// Helpers call helpers (a module's forward, its blocks', a kNN's distance):
// followed six deep, each (function, parameter) once.
bool LoopAnalysis::mayWriteArg(const FunctionDecl *Callee, unsigned I, unsigned Depth) const {
  if (!Callee || Depth > 6)
    return true;
  if (isTensorLibraryCode(Callee)) // `torch::relu_(t)` writes t; `a.add_(b)` reads b
    return Callee->getIdentifier() && sem::isInPlaceName(Callee->getName()) && I == 0 &&
           !isa<CXXMethodDecl>(Callee);
  const FunctionDecl *Def = nullptr;
  if (!Callee->hasBody(Def) || !Def || I >= Def->getNumParams())
    return true;
  if (!WrittenParams.try_emplace({Def, I}, true).second) // true while in progress
    return WrittenParams.lookup({Def, I});
  bool W = bodyWritesParam(Def, I, Depth); // may grow the map: no iterator kept
  WrittenParams[{Def, I}] = W;
  return W;
}

bool LoopAnalysis::bodyWritesParam(const FunctionDecl *Def, unsigned I, unsigned Depth) const {
  ArgAliases A{*this, {Def->getParamDecl(I)}, {}};
  if (const auto *Body = dyn_cast<CompoundStmt>(Def->getBody()))
    for (const Stmt *S : Body->body())
      if (const auto *E = dyn_cast<Expr>(S))
        A.TopLevel.insert(E->IgnoreImplicit());
  llvm::SmallVector<const Stmt *, 32> Work{Def->getBody()};
  // Pre-order walk: declarations and rebindings come before later uses.
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    bool Writes = false;
    if (const auto *DS = dyn_cast<DeclStmt>(S)) {
      for (const Decl *D : DS->decls())
        if (const auto *V = dyn_cast<VarDecl>(D);
            V && V->getInit() && A.touches(V->getInit()) && mayShareStorage(Model, V->getInit()))
          A.Vars.insert(V);
    } else if (const auto *L = dyn_cast<LambdaExpr>(S)) {
      Writes = llvm::any_of(L->captures(), [&](const LambdaCapture &C) {
        return C.capturesVariable() && A.Vars.count(dyn_cast<VarDecl>(C.getCapturedVar()));
      });
    } else if (const auto *UO = dyn_cast<UnaryOperator>(S)) {
      Writes = UO->getOpcode() == UO_AddrOf && A.touches(UO->getSubExpr());
    } else if (const auto *C = dyn_cast<CallExpr>(S)) {
      Writes = callWritesAlias(C, A, Depth);
    }
    if (Writes)
      return true;
    llvm::SmallVector<const Stmt *, 8> Kids(S->children());
    for (auto It = Kids.rbegin(); It != Kids.rend(); ++It)
      Work.push_back(*It);
  }
  return false;
}

const LoopAnalysis::LoopFacts &LoopAnalysis::factsOf(const Stmt *Loop) {
  auto &Slot = Loops[Loop];
  if (Slot)
    return *Slot;
  Slot = std::make_unique<LoopFacts>();
  if (const auto *F = dyn_cast<ForStmt>(Loop)) {
    collect(F->getCond(), *Slot);
    collect(F->getInc(), *Slot);
    collect(F->getBody(), *Slot);
  } else if (const auto *RF = dyn_cast<CXXForRangeStmt>(Loop)) {
    collect(RF->getLoopVarStmt(), *Slot);
    collect(RF->getBody(), *Slot);
  } else {
    for (const Stmt *C : Loop->children())
      collect(C, *Slot);
  }
  return *Slot;
}

bool LoopAnalysis::classWritten(const VarDecl *V, const LoopFacts &F) {
  const VarDecl *R = root(V);
  for (const VarDecl *W : F.Written)
    if (root(W) == R)
      return true;
  return false;
}

bool LoopAnalysis::isInvariant(const Expr *E, const Stmt *Loop, unsigned Depth) {
  if (!E || Depth > 8)
    return false;
  E = stripHandle(E);
  if (isa<IntegerLiteral, FloatingLiteral, CXXBoolLiteralExpr, StringLiteral, CharacterLiteral,
          CXXNullPtrLiteralExpr, CXXDefaultArgExpr>(E))
    return true;
  if (!E->isValueDependent() && !E->isTypeDependent() &&
      E->getType()->isIntegralOrEnumerationType() && E->isEvaluatable(Ctx))
    return true;
  const LoopFacts &F = factsOf(Loop);
  if (const auto *D = dyn_cast<DeclRefExpr>(E))
    return isInvariantVar(D, Loop, F, Depth);
  if (const auto *ME = dyn_cast<MemberExpr>(E))
    return isInvariantMember(ME, Loop, F, Depth);
  if (const auto *UO = dyn_cast<UnaryOperator>(E))
    return !UO->isIncrementDecrementOp() && isInvariant(UO->getSubExpr(), Loop, Depth + 1);
  if (const auto *BO = dyn_cast<BinaryOperator>(E))
    return !BO->isAssignmentOp() && isInvariant(BO->getLHS(), Loop, Depth + 1) &&
           isInvariant(BO->getRHS(), Loop, Depth + 1);
  // Values built from invariant parts: {2, 3}, TensorOptions(dev), Device("cuda").
  if (const auto *IL = dyn_cast<InitListExpr>(E))
    return llvm::all_of(IL->inits(),
                        [&](const Expr *I) { return isInvariant(I, Loop, Depth + 1); });
  if (const auto *SIL = dyn_cast<CXXStdInitializerListExpr>(E))
    return isInvariant(SIL->getSubExpr(), Loop, Depth + 1);
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E))
    return !Model.isTensorExpr(CE) && llvm::all_of(CE->arguments(), [&](const Expr *A) {
      return isInvariant(A, Loop, Depth + 1);
    });
  if (const auto *C = dyn_cast<CallExpr>(E))
    return isInvariantCall(C, Loop, Depth);
  return false;
}

bool LoopAnalysis::isInvariantVar(const DeclRefExpr *D, const Stmt *Loop, const LoopFacts &F,
                                  unsigned Depth) {
  const ValueDecl *VD = D->getDecl();
  // A structured binding (`auto [a, logp] = policy(obs);`) is a part of
  // its decomposed variable: it varies when that does.
  if (const auto *BD = dyn_cast<BindingDecl>(VD))
    VD = BD->getDecomposedDecl();
  const auto *V = dyn_cast_or_null<VarDecl>(VD);
  if (!V)
    return VD != nullptr; // functions, enumerators
  if (V->getType().isConstQualified() && !Model.isTensorType(V->getType()) &&
      !V->getType()->isReferenceType() && (V->hasGlobalStorage() || V->isConstexpr()))
    return true;
  if (pinnedIn(V, Loop) || classWritten(V, F) || F.Rebound.count(V))
    return false;
  if (isDeclaredIn(V, Loop)) {
    if (const auto *RF = dyn_cast<CXXForRangeStmt>(Loop); RF && RF->getLoopVariable() == V)
      return false;
    return V->getInit() && !V->isStaticLocal() && isInvariant(V->getInit(), Loop, Depth + 1);
  }
  return keptOutside(V, F);
}

bool LoopAnalysis::pinned(const VarDecl *V) const {
  return AddressTaken.count(V) || RefCaptures.count(V);
}

bool LoopAnalysis::pinnedIn(const VarDecl *V, const Stmt *Loop) const {
  if (AddressTaken.count(V))
    return true;
  auto It = RefCaptures.find(V);
  if (It == RefCaptures.end())
    return false;
  // A lambda in Loop: collect() reads its body with the loop's. One written
  // after the loop runs during it only from a later iteration of a loop
  // around both.
  const SourceManager &SM = Ctx.getSourceManager();
  auto Within = [&](const LambdaExpr *L, const Stmt *S) {
    return SM.isPointWithin(L->getBeginLoc(), S->getBeginLoc(), S->getEndLoc());
  };
  // A closure run where it is written, and not kept, is gone by any later loop.
  const Stmt *Outer = innermostLoop(Loop, Ctx);
  return llvm::any_of(It->second, [&](const LambdaExpr *L) {
    if (Within(L, Loop) || fateOf(L, Ctx) == ClosureFate::Run)
      return false;
    return SM.isBeforeInTranslationUnit(L->getBeginLoc(), Loop->getBeginLoc()) ||
           (Outer && Within(L, Outer));
  });
}

bool LoopAnalysis::keptOutside(const VarDecl *V, const LoopFacts &F) {
  if (V->hasGlobalStorage() && !V->getType().isConstQualified())
    return false;
  if (privateObject(V)) // handles made from its fields are its own storage
    return true;
  // Storage reachable from outside (a container of tensors, a module, a
  // handle aliasing a member): an opaque call (opt.step()) may write it.
  // A tensor the caller passed in is taken as the caller's data, which an
  // opaque call is not given (Note [Opaque calls] in docs/design.md).
  bool CallerTensor = isCallerTensor(V) && !HandedOver.count(V);
  if (F.Opaque && !CallerTensor && (Foreign.count(root(V)) || isa<ParmVarDecl>(V)) &&
      Model.mayHoldTensors(V->getType()))
    return false;
  return true;
}

bool LoopAnalysis::fieldWritten(const FieldDecl *Fl, const LoopFacts &F) const {
  return !Fl || F.WrittenFields.count(Fl) || (Model.isTensorType(Fl->getType()) && F.Opaque);
}

bool LoopAnalysis::mayChangeIn(const Expr *E, llvm::ArrayRef<const Stmt *> Region) {
  LoopFacts F;
  for (const Stmt *S : Region)
    collect(S, F);
  auto VarChanged = [&](const Expr *X) {
    const auto *D = dyn_cast<DeclRefExpr>(stripHandle(X));
    const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
    return !V || pinned(V) || classWritten(V, F) || F.Rebound.count(V) || !keptOutside(V, F);
  };
  E = stripHandle(E);
  const auto *ME = dyn_cast<MemberExpr>(E);
  if (!ME)
    return VarChanged(E);
  // A field of `this` or of a local object: the object, or the field, changes.
  const Expr *Base = ME->getBase()->IgnoreParenImpCasts();
  bool BaseChanged = isa<CXXThisExpr>(Base) ? F.ThisMutated : ME->isArrow() || VarChanged(Base);
  return BaseChanged || fieldWritten(dyn_cast<FieldDecl>(ME->getMemberDecl()), F);
}

bool LoopAnalysis::isInvariantMember(const MemberExpr *ME, const Stmt *Loop, const LoopFacts &F,
                                     unsigned Depth) {
  const auto *Fl = dyn_cast<FieldDecl>(ME->getMemberDecl());
  const Expr *Base = ME->getBase()->IgnoreParenImpCasts();
  // A field of the caller's struct of tensors (`batch.x`) is the caller's
  // data: an opaque call does not reach it (Note [Opaque calls]).
  const auto *D = ME->isArrow() ? nullptr : dyn_cast<DeclRefExpr>(Base);
  const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
  bool CallerField = V && isCallerTensor(V) && !HandedOver.count(V);
  // A field of a local object no opaque call reaches (`norm.stats`) changes
  // only where the loop writes it.
  bool OwnField = V && privateObject(V);
  if (CallerField || OwnField ? !Fl || F.WrittenFields.count(Fl) : fieldWritten(Fl, F))
    return false;
  if (isa<CXXThisExpr>(Base))
    return !F.ThisMutated;
  if (ME->isArrow())
    return false;
  return isInvariant(Base, Loop, Depth + 1);
}

bool LoopAnalysis::isInvariantCall(const CallExpr *C, const Stmt *Loop, unsigned Depth) {
  auto ArgsInvariant = [&] {
    for (const Expr *A : C->arguments())
      if (!isInvariant(A, Loop, Depth + 1))
        return false;
    return true;
  };
  if (TensorModel::isInPlaceCall(C))
    return false;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C)) {
    return (OC->getOperator() == OO_Subscript || isComputingOperator(OC)) && ArgsInvariant();
  }
  const FunctionDecl *Callee = C->getDirectCallee();
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  if (MC && Model.isTensorExpr(MC->getImplicitObjectArgument()->IgnoreParenImpCasts())) {
    const sem::OpInfo *Op = tensorOp(Model, C);
    bool Pure =
        (Op && Op->storage != sem::Storage::InPlace && Op->storage != sem::Storage::Factory) ||
        (Callee && Callee->getIdentifier() && TensorModel::isMetadataMethod(Callee->getName()));
    return Pure && isInvariant(MC->getImplicitObjectArgument(), Loop, Depth + 1) && ArgsInvariant();
  }
  // Library value constructors and tensor ops in tt/torch/at (kCUDA,
  // torch::Device("cuda"), torch::matmul(a, b)...), but not random factories.
  if (Callee && isTensorLibraryCode(Callee) && !isa<CXXMethodDecl>(Callee) &&
      Callee->getIdentifier()) {
    llvm::StringRef N = Callee->getName();
    if (N.starts_with("rand") || N == "normal" || N == "bernoulli" || N == "multinomial" ||
        N == "empty" || N == "empty_like")
      return false;
    return ArgsInvariant();
  }
  return false;
}

void LoopAnalysis::useOfValue(const Expr *E, const Stmt *Loop, Use &U,
                              llvm::SmallVectorImpl<const VarDecl *> &Work) {
  // Climb from a use of the value to what consumes it.
  const Stmt *Cur = E;
  for (unsigned Guard = 0; Guard < 32; ++Guard) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    if (Ps.empty())
      return;
    const DynTypedNode &N = Ps[0];
    if (const auto *V = N.get<VarDecl>()) {
      useByVariable(V, Loop, U, Work);
      return;
    }
    const auto *P = N.get<Stmt>();
    if (!P)
      return;
    if (const auto *ME = dyn_cast<MemberExpr>(P)) {
      // `v.op(...)`: the consumer is the call whose callee this is.
      DynTypedNodeList MPs = Ctx.getParents(*ME);
      const auto *MC = MPs.empty() ? nullptr : MPs[0].get<CXXMemberCallExpr>();
      if (!MC || MC->getCallee()->IgnoreParenImpCasts() != ME)
        return; // a field or a bound member
      P = MC;
    }
    if (const auto *C = dyn_cast<CallExpr>(P))
      Cur = climbCall(C, cast<Expr>(Cur), Loop, U, Work);
    else
      Cur = climbExpr(P, Cur, U);
    if (!Cur)
      return;
  }
}

// The value initialises V.
void LoopAnalysis::useByVariable(const VarDecl *V, const Stmt *Loop, Use &U,
                                 llvm::SmallVectorImpl<const VarDecl *> &Work) {
  if (V->isStaticLocal() || !isDeclaredIn(V, Loop) ||
      (V->getType()->isReferenceType() && !V->getType().getNonReferenceType().isConstQualified()))
    U.Escapes = true;
  else if (Model.isTensorType(V->getType()))
    Work.push_back(V);
  else if (!V->getType()->isReferenceType() && !V->getType()->isArithmeticType())
    U.Escapes = true; // held by another object (struct, container)
}

// Cur is used by P, not a call: what to climb to next, or nullptr.
const Stmt *LoopAnalysis::climbExpr(const Stmt *P, const Stmt *Cur, Use &U) {
  if (isa<ImplicitCastExpr, ParenExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr,
          ExprWithCleanups, CXXFunctionalCastExpr>(P))
    return P;
  if (const auto *CE = dyn_cast<CXXConstructExpr>(P)) {
    if ((CE->getNumArgs() == 1 && CE->getConstructor()->isCopyOrMoveConstructor() &&
         Model.isTensorExpr(CE)) ||
        isTensorLibraryCode(CE->getConstructor()))
      // A handle copy, or a library wrapper around an argument
      // (tt::detail::LocatedTensor, at::TensorList...): its consumer decides.
      return P;
    U.Escapes = true; // kept by an object we do not model
    return nullptr;
  }
  if (isa<InitListExpr, CXXStdInitializerListExpr>(P))
    return P; // `torch::cat({a, b})` reads; `std::vector<Tensor>{a}` keeps (below)
  if (isa<ReturnStmt, CoreturnStmt, CXXThrowExpr, LambdaExpr, ParenListExpr>(P)) {
    U.Escapes = true;
    return nullptr;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(P)) {
    if (UO->getOpcode() == UO_AddrOf)
      U.Escapes = true;
    return nullptr;
  }
  if (const auto *CO = dyn_cast<AbstractConditionalOperator>(P))
    return CO->getCond() != Cur ? P : nullptr;
  return nullptr;
}

// Cur is used by the call C: what to climb to next, or nullptr.
const Stmt *LoopAnalysis::climbCall(const CallExpr *C, const Expr *Cur, const Stmt *Loop, Use &U,
                                    llvm::SmallVectorImpl<const VarDecl *> &Work) {
  const FunctionDecl *Callee = C->getDirectCallee();
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
  bool IsObject = (MC && stripHandle(MC->getImplicitObjectArgument()) == stripHandle(Cur)) ||
                  (OC && OC->getNumArgs() && stripHandle(OC->getArg(0)) == stripHandle(Cur) &&
                   isa_and_nonnull<CXXMethodDecl>(Callee));
  if (OC && OC->getOperator() == OO_Equal && OC->getNumArgs() == 2) {
    if (stripHandle(OC->getArg(1)) == stripHandle(Cur)) {
      // Stored into the assigned handle.
      const Expr *L = stripHandle(OC->getArg(0));
      const auto *D = dyn_cast<DeclRefExpr>(L);
      const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
      if (!V || !isDeclaredIn(V, Loop) || V->isStaticLocal())
        U.Escapes = true;
      else
        Work.push_back(V);
      return nullptr;
    }
    U.Written = true; // `copy[i] = x` writes it (rvalue assignment into storage)
    return nullptr;
  }
  if (IsObject && Model.isTensorExpr(Cur)) {
    if (OC && OC->isAssignmentOp()) {
      U.Written = true;
      return nullptr;
    }
    if (TensorModel::isInPlaceCall(C)) {
      U.Written = true;
      return C; // returns self
    }
    const sem::OpInfo *Op = tensorOp(Model, C);
    if (aliasing(Op) || (OC && OC->getOperator() == OO_Subscript))
      return C;     // a view of it: follow the view
    return nullptr; // consumed by a read-only op
  }
  if (!Callee) {
    U.Escapes = true;
    return nullptr;
  }
  if (Callee->getIdentifier() && (isStoreName(Callee->getName()) || isStdMoveLike(C))) {
    U.Escapes = true;
    return nullptr;
  }
  return useAsArgument(C, Callee, Cur, U) ? C : nullptr;
}

// Cur is an argument of C (a call of Callee, not its object); true when the
// result is a view of it to follow.
bool LoopAnalysis::useAsArgument(const CallExpr *C, const FunctionDecl *Callee, const Expr *Cur,
                                 Use &U) {
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(C);
  // By rvalue reference it is kept; code we cannot see may write it in place.
  for (unsigned I = 0; I < C->getNumArgs(); ++I) {
    if (stripHandle(C->getArg(I)) != stripHandle(Cur))
      continue;
    unsigned Shift = OC && isa<CXXMethodDecl>(Callee) ? 1 : 0;
    if (I >= Shift && I - Shift < Callee->getNumParams()) {
      QualType PT = Callee->getParamDecl(I - Shift)->getType();
      if (isOptionsSetter(Callee)) // takes the handle over; the options only read it
        continue;
      if (PT->isRValueReferenceType())
        U.Escapes = true;
      if (PT->isReferenceType() && !PT->getPointeeType().isConstQualified())
        U.Written = true;
    }
  }
  bool Lib = isTensorLibraryCode(Callee);
  for (unsigned I = 0; I < C->getNumArgs(); ++I)
    if (stripHandle(C->getArg(I)) == stripHandle(Cur) && !Lib) {
      unsigned Shift = OC && isa<CXXMethodDecl>(Callee) ? 1 : 0;
      if (I < Shift || mayWriteArg(Callee, I - Shift))
        U.Written = true;
    }
  if (isa<CXXConstructorDecl>(Callee) && !Model.isTensorExpr(C))
    U.Escapes = true;
  if (Lib && Model.isTensorExpr(C) && !TensorModel::isInPlaceCall(C)) {
    const sem::OpInfo *Op = sem::lookup(Callee->getIdentifier() ? Callee->getName() : "");
    if (aliasing(Op))
      return true;
  }
  return false;
}

LoopAnalysis::Use LoopAnalysis::usesOfTemporary(const Expr *E, const Stmt *Loop) {
  Use U;
  llvm::SmallVector<const VarDecl *, 4> Work;
  useOfValue(E, Loop, U, Work);
  // The temporary was bound to a handle after all: follow it.
  llvm::DenseSet<const VarDecl *> Seen;
  while (!Work.empty() && !U.Escapes) {
    const VarDecl *V = Work.pop_back_val();
    if (!Seen.insert(V).second)
      continue;
    Use W = usesOf(V, Loop);
    U.Escapes |= W.Escapes;
    U.Written |= W.Written;
    U.Reassigned |= W.Reassigned;
  }
  return U;
}

LoopAnalysis::Use LoopAnalysis::usesOf(const VarDecl *V0, const Stmt *Loop) {
  Use U;
  if (pinned(V0))
    U.Escapes = true;
  llvm::SmallVector<const VarDecl *, 4> Work{V0};
  llvm::DenseSet<const VarDecl *> Seen;
  while (!Work.empty() && !U.Escapes) {
    const VarDecl *V = Work.pop_back_val();
    if (!Seen.insert(V).second)
      continue;
    if (pinned(V) || V->isStaticLocal()) {
      U.Escapes = true;
      break;
    }
    // Every use of V in the loop.
    llvm::SmallVector<const Stmt *, 32> Todo{Loop};
    while (!Todo.empty()) {
      const Stmt *S = Todo.pop_back_val();
      if (!S)
        continue;
      if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V) {
        if (D->refersToEnclosingVariableOrCapture()) {
          U.Escapes = true;
          continue;
        }
        // `V = ...` rebinds the handle.
        DynTypedNodeList Ps = Ctx.getParents(*D);
        if (!Ps.empty())
          if (const auto *OC = Ps[0].get<CXXOperatorCallExpr>();
              OC && OC->getOperator() == OO_Equal && OC->getNumArgs() == 2 &&
              stripHandle(OC->getArg(0)) == D) {
            U.Reassigned = true;
            continue;
          }
        useOfValue(D, Loop, U, Work);
        continue;
      }
      for (const Stmt *C : S->children())
        Todo.push_back(C);
    }
  }
  return U;
}

} // namespace clang::tidy::tensor
