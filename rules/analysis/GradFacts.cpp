#include "analysis/GradFacts.h"

#include "analysis/AstHelpers.h"
#include "analysis/Dataflow.h"
#include "analysis/FrozenParameters.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/Analysis/CFG.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringSwitch.h"

namespace clang::tidy::tensor {

// --- grad mode: lexical no-grad guards -----------------------------------------------------

bool isNoGradGuardDecl(const Stmt *St) {
  const auto *DS = dyn_cast<DeclStmt>(St);
  if (!DS)
    return false;
  for (const Decl *D : DS->decls()) {
    const auto *VD = dyn_cast<VarDecl>(D);
    const auto *RD = VD ? VD->getType()->getAsCXXRecordDecl() : nullptr;
    if (!RD || !RD->getIdentifier())
      continue;
    llvm::StringRef N = RD->getName();
    if (N == "NoGradGuard" || N == "InferenceMode")
      return true;
    if (N == "AutoGradMode")
      if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(VD->getInit()))
        if (CE->getNumArgs() == 1)
          if (const auto *B = dyn_cast<CXXBoolLiteralExpr>(CE->getArg(0)->IgnoreImplicit()))
            return !B->getValue();
  }
  return false;
}

namespace {
// 1: found under a guard, 0: found without, -1: not in this subtree.
int findUnderGuard(const Stmt *Cur, const Stmt *Target, bool Active) {
  if (!Cur)
    return -1;
  if (Cur == Target)
    return Active ? 1 : 0;
  if (isa<LambdaExpr>(Cur))
    return -1;
  bool Local = Active;
  for (const Stmt *Child : Cur->children()) {
    int R = findUnderGuard(Child, Target, Local);
    if (R >= 0)
      return R;
    if (isa<CompoundStmt>(Cur) && isNoGradGuardDecl(Child))
      Local = true;
  }
  return -1;
}

// Every statement of Cur's subtree that runs under a guard (lambdas are
// bodies of their own).
void collectUnderGuard(const Stmt *Cur, bool Active, llvm::DenseSet<const Stmt *> &Out) {
  if (!Cur || isa<LambdaExpr>(Cur))
    return;
  if (Active)
    Out.insert(Cur);
  bool Local = Active;
  for (const Stmt *Child : Cur->children()) {
    collectUnderGuard(Child, Local, Out);
    if (isa<CompoundStmt>(Cur) && isNoGradGuardDecl(Child))
      Local = true;
  }
}

// --- modules ---------------------------------------------------------------------------------

// Library modules without parameters: their output requires grad iff an input does.
bool isParameterFreeModule(QualType T) {
  std::string Name = T.getNonReferenceType().getUnqualifiedType().getAsString();
  for (llvm::StringRef Part :
       {"Loss", "ReLU", "Dropout", "Flatten", "Sigmoid", "Tanh", "Softmax", "Pool", "Identity",
        "Upsample", "GELU", "ELU", "SiLU", "Mish", "Unflatten", "Hardtanh", "Softplus"})
    if (llvm::StringRef(Name).contains(Part))
      return true;
  return false;
}

bool isTrue(const Expr *E, ASTContext &Ctx) {
  bool V = true;
  return !E || isa<CXXDefaultArgExpr>(E) || !E->EvaluateAsBooleanCondition(V, Ctx) || V;
}

// `register_parameter(name, t[, requires_grad])`, requires_grad not known to be false.
bool isTrainableRegistration(const CallExpr *C, ASTContext &Ctx) {
  const FunctionDecl *F = C->getDirectCallee();
  return F && F->getIdentifier() && F->getName() == "register_parameter" &&
         (C->getNumArgs() < 3 || isTrue(C->getArg(2), Ctx));
}

// `W = register_parameter(...)` / `W(register_parameter(...))` somewhere in W's class.
bool registersTrainable(const Stmt *S, ASTContext &Ctx) {
  if (const auto *C = dyn_cast_or_null<CallExpr>(S); C && isTrainableRegistration(C, Ctx))
    return true;
  return S &&
         llvm::any_of(S->children(), [&](const Stmt *C) { return registersTrainable(C, Ctx); });
}

bool isRegisteredParameter(const FieldDecl *F) {
  return llvm::any_of(valuesOfField(F), [&](const Expr *V) {
    return registersTrainable(V, F->getASTContext());
  });
}

bool isCompoundAssign(OverloadedOperatorKind K) {
  switch (K) {
  case OO_PlusEqual:
  case OO_MinusEqual:
  case OO_StarEqual:
  case OO_SlashEqual:
    return true;
  default:
    return false;
  }
}

GradKind joinKind(GradKind A, GradKind B) {
  if (A == B || B == GradKind::Undefined)
    return A;
  if (A == GradKind::Undefined)
    return B;
  auto Requires = [](GradKind K) { return K != GradKind::Unknown && K != GradKind::NoGrad; };
  return Requires(A) && Requires(B) ? GradKind::RequiresGrad : GradKind::Unknown;
}

// `x.requires_grad_()` / `x.set_requires_grad(b)`: makes a leaf, not an op.
bool isRequiresGradSetter(const CXXMemberCallExpr *MC) {
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  return M && M->getIdentifier() &&
         (M->getName() == "requires_grad_" || M->getName() == "set_requires_grad");
}

// S reads a registered parameter of its own module (`rel_diag`).
bool isOwnParameter(const Stmt *S) {
  const auto *F = dyn_cast_or_null<FieldDecl>(ownMember(dyn_cast<Expr>(S)));
  return F && isParameterField(F);
}

// S calls a layer: a module with parameters, or a module's forward; or reads
// a parameter of its own module (`rel_diag.index_select(...)` in `score`).
bool runsALayer(const Stmt *S) {
  if (!S)
    return false;
  if (isOwnParameter(S))
    return true;
  if (isDetachCall(S))
    return false; // `codebook_.detach()`: no graph from it
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(S);
      OC && isModuleCall(OC) && !isParameterFreeModule(OC->getArg(0)->getType()))
    return true;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S))
    if (const CXXMethodDecl *M = MC->getMethodDecl();
        M && M->getIdentifier() && M->getName() == "forward" && isModuleRecord(M->getParent()))
      return true;
  return llvm::any_of(S->children(), [](const Stmt *C) { return runsALayer(C); });
}

} // namespace

bool isParameterField(const FieldDecl *F) {
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (!isModuleRecord(RD))
    return false;
  if (inNamespacePath(RD, "torch::") && F->getIdentifier())
    return F->getName() == "weight" || F->getName() == "bias";
  return isRegisteredParameter(F);
}

// S registers a parameter or a submodule, or asks for grad.
static bool mayMakeParameters(const Stmt *S) {
  if (const auto *C = dyn_cast_or_null<CallExpr>(S))
    if (const FunctionDecl *F = C->getDirectCallee(); F && F->getIdentifier() &&
        llvm::StringSwitch<bool>(F->getName())
            .Cases("register_parameter", "register_module", "requires_grad", true)
            .Cases("requires_grad_", "set_requires_grad", true)
            .Default(false))
      return true;
  return S && llvm::any_of(S->children(), mayMakeParameters);
}

bool isBufferOnlyModule(const CXXRecordDecl *RD) {
  RD = RD ? RD->getDefinition() : nullptr;
  if (!RD || !isModuleRecord(RD) || isTensorLibraryCode(RD))
    return false;
  for (const CXXBaseSpecifier &B : RD->bases()) // a user base may hold parameters
    if (!isTorchModuleBase(B.getType()->getAsCXXRecordDecl()))
      return false;
  if (llvm::any_of(RD->fields(),
                   [](const FieldDecl *F) { return isModuleHolderType(F->getType()); }))
    return false;
  return llvm::none_of(RD->methods(), [](const CXXMethodDecl *M) {
    const auto *Ctor = dyn_cast<CXXConstructorDecl>(M);
    if (Ctor && llvm::any_of(Ctor->inits(), [](const CXXCtorInitializer *I) {
          return mayMakeParameters(I->getInit());
        }))
      return true;
    const FunctionDecl *Def = nullptr;
    return M->hasBody(Def) && mayMakeParameters(Def->getBody());
  });
}

bool isUserLayerMethod(const CXXMemberCallExpr *Call) {
  const CXXMethodDecl *M = Call->getMethodDecl();
  const FunctionDecl *Def = nullptr;
  return M && isModuleRecord(M->getParent()) && !isTensorLibraryCode(M) && M->hasBody(Def) &&
         runsALayer(Def->getBody());
}

// The method returns only under a NoGradGuard of its own (`encode_codes` for a prior's data).
static bool returnsUnderNoGrad(const CXXMemberCallExpr *Call) {
  const FunctionDecl *Def = nullptr;
  if (!Call->getMethodDecl()->hasBody(Def))
    return false;
  llvm::SmallVector<const ReturnStmt *, 4> Returns;
  collectReturns(Def->getBody(), Returns);
  return !Returns.empty() && llvm::all_of(Returns, [&](const ReturnStmt *R) {
    return isUnderNoGrad(R, Def->getBody());
  });
}

bool GradClassFacts::bufferOnlyModule(const CXXRecordDecl *RD) {
  auto [It, New] = BufferOnly.try_emplace(RD, false);
  if (New)
    It->second = isBufferOnlyModule(RD);
  return It->second;
}

GradClassFacts::LayerMethod GradClassFacts::layerMethod(const CXXMemberCallExpr *Call) {
  auto [It, New] = LayerMethods.try_emplace(Call->getMethodDecl(), LayerMethod::No);
  if (New && isUserLayerMethod(Call))
    It->second = returnsUnderNoGrad(Call) ? LayerMethod::LayerUnderNoGrad : LayerMethod::Layer;
  return It->second;
}

bool GradClassFacts::parameterField(const FieldDecl *F) {
  auto [It, New] = ParameterFields.try_emplace(F, false);
  if (New)
    It->second = isParameterField(F);
  return It->second;
}

const Expr *passedTensor(const Expr *E, const TensorModel &Model) {
  if (Model.isTensorExpr(E))
    return E;
  const auto *CE = dyn_cast<CXXConstructExpr>(stripHandle(E));
  if (CE && CE->getNumArgs() >= 1 && Model.isTensorExpr(CE->getArg(0)))
    return CE->getArg(0);
  return nullptr;
}

// A vector of tensors passed whole (`torch::stack(out.kls, 1)`, `helper(kls)`),
// through the conversion to a tensor list: its elements' facts are its own.
static const Expr *passedVector(const Expr *E, const TensorModel &Model) {
  E = E->IgnoreImplicit();
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E); CE && CE->getNumArgs() == 1)
    E = CE->getArg(0)->IgnoreImplicit();
  E = E->IgnoreParenImpCasts();
  return isa<MemberExpr, DeclRefExpr>(E) && Model.isTensorVectorType(E->getType()) ? E : nullptr;
}

// --- the dataflow domain -------------------------------------------------------------------

struct GradFacts::Impl {
  using State = llvm::DenseMap<const ValueDecl *, GradFact>;

  Impl(GradFacts &G) : G(G), Model(G.Model), Ctx(G.Ctx) {}

  GradFacts &G;
  const TensorModel &Model;
  ASTContext &Ctx;
  bool Recording = false;
  // `l.mel = loss` of a local struct variable: whether every such assignment
  // the recording pass saw requires grad (for `return l;`).
  llvm::DenseMap<std::pair<const VarDecl *, const FieldDecl *>, bool> FieldYes;
  void recordFieldAssign(const CXXOperatorCallExpr *OC, const State &St);

  void transfer(const Stmt *S, State &St);
  bool join(State &Into, const State &From);
  void widen(State &) {} // finite lattice of height 3

  GradFact eval(const Expr *E, const State &St) const;
  GradFact evalCall(const CallExpr *Call, const State &St) const;
  GradFact evalMemberCall(const CXXMemberCallExpr *Call, const State &St) const;
  GradFact evalOp(const CallExpr *Call, const sem::OpInfo &Op, const State &St) const;
  GradFact combineInputs(const CallExpr *Call, const State &St) const;
  // The vectors whose values combineInputs is evaluating (`v.push_back(cat(v))`).
  mutable llvm::DenseSet<const VarDecl *> ListsInProgress;
  GradFact evalCalleeResult(const CallExpr *Call, const State &St) const;
  GradFact forwardResult(const CallExpr *Call, QualType Module, const CXXMethodDecl *Forward,
                         const State &St) const;
  Tri bundleRequiresGrad(const Expr *V, const State &St) const;
  void recordReturn(const ReturnStmt *RS, const State &St);
  GradFact evalRequiresGradCall(const CXXMemberCallExpr *Call, const State &St) const;
  bool tracked(const Expr *E) const;
  // `auto [a, b] = f(x)`: a module's results all follow it; of an op's
  // results only the first does (the others may be indices).
  bool allResultsFollow(const Expr *Init) const {
    const auto *Call = dyn_cast<CallExpr>(stripHandle(Init));
    return Call && !Model.opOf(Call);
  }
  void bindDecomposition(const DecompositionDecl *DD, State &St) const {
    GradFact F = St.lookup(DD);
    bool All = allResultsFollow(DD->getInit());
    for (const BindingDecl *B : DD->bindings())
      St[B] = All || B == DD->bindings().front() ? F : GradFact{};
  }
  // `grid += flow`, `acc.add_(x)` with grad mode on: an in-place op with an
  // operand that requires grad is recorded on its target, which then does.
  void writtenFrom(const Expr *Target, const CallExpr *Call, State &St) const {
    const auto *DRE = dyn_cast_or_null<DeclRefExpr>(stripHandle(Target));
    if (!DRE || !G.gradEnabledAt(Call) || eval(DRE, St).requiresGrad() == Tri::Yes)
      return;
    for (const Expr *A : Call->arguments())
      if (A != Target && Model.isTensorExpr(A) && eval(A, St).requiresGrad() == Tri::Yes) {
        St[DRE->getDecl()] = {GradKind::NonLeaf, Call};
        return;
      }
  }
  // `std::tie(flow, mask) = block->forward(x)`: as `auto [flow, mask] = ...`.
  static const CallExpr *tieCall(const Expr *E) {
    const auto *C = dyn_cast<CallExpr>(E->IgnoreParenImpCasts());
    const FunctionDecl *FD = C ? C->getDirectCallee() : nullptr;
    return FD && FD->getIdentifier() && FD->getName() == "tie" && FD->isInStdNamespace() ? C
                                                                                       : nullptr;
  }
  void bindTie(const CallExpr *Tie, const Expr *Value, State &St) const {
    GradFact F = eval(Value, St);
    bool All = allResultsFollow(Value);
    for (unsigned I = 0; I < Tie->getNumArgs(); ++I)
      if (const auto *DRE = dyn_cast<DeclRefExpr>(Tie->getArg(I)->IgnoreParenImpCasts()))
        St[DRE->getDecl()] = All || I == 0 ? F : GradFact{};
  }
  // `requires_grad(b)` of options: makes leaves that require grad when b.
  GradFact optionsFact(const CallExpr *Call) const {
    bool On = Call->getNumArgs() == 0 || isTrue(Call->getArg(0), Ctx);
    return On ? GradFact{GradKind::Leaf, Call} : GradFact{GradKind::NoGrad, nullptr};
  }
  // Parameters of a module the file freezes may not require grad.
  bool frozen(const Expr *Owner) const { return G.Frozen && G.Frozen->covers(Owner); }
  GradClassFacts::LayerMethod layerMethod(const CXXMemberCallExpr *Call) const {
    return G.Classes->layerMethod(Call);
  }
  bool parameterField(const FieldDecl *F) const { return G.Classes->parameterField(F); }
  bool leafField(const FieldDecl *F) const;
};

// A field its class only ever sets to leaves that require grad (`plan_ =
// torch::full(..., TensorOptions().requires_grad(true))`), as a parameter.
// Its values are read as in their own methods, not in this function (grad
// mode on, no guard of this body), so the answer is the same from every function.
bool GradFacts::Impl::leafField(const FieldDecl *F) const {
  auto &Memo = G.Classes->LeafFields;
  if (auto It = Memo.find(F); It != Memo.end())
    return It->second;
  Memo[F] = false; // a value that reads the field itself
  GradFacts Plain(Model, Ctx, G.Frozen, G.Classes);
  Impl D(Plain);
  auto Values = valuesOfField(F);
  bool Leaf = !Values.empty() && llvm::all_of(Values, [&](const Expr *V) {
    return D.eval(V, State()).Kind == GradKind::Leaf;
  });
  Memo[F] = Leaf; // eval may have grown the map
  return Leaf;
}

bool GradFacts::Impl::tracked(const Expr *E) const {
  QualType T = E->getType();
  if (Model.isTensorType(T))
    return true;
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  return RD && !RD->isLambda(); // containers, items, iterators, options
}

bool GradFacts::Impl::join(State &Into, const State &From) {
  bool Changed = false;
  for (const auto &[D, F] : From) {
    auto [It, New] = Into.try_emplace(D, F);
    if (New) {
      Changed = true;
      continue;
    }
    const GradFact &Old = It->second;
    GradFact J{joinKind(Old.Kind, F.Kind),
               Old.Source && Old.Kind != GradKind::Undefined ? Old.Source : F.Source};
    if (!(J == It->second)) {
      It->second = J;
      Changed = true;
    }
  }
  return Changed;
}

GradFact GradFacts::Impl::combineInputs(const CallExpr *Call, const State &St) const {
  if (!G.gradEnabledAt(Call))
    return {GradKind::NoGrad, nullptr};
  bool AllNo = true;
  llvm::SmallVector<const Expr *, 4> Ins;
  if (const Expr *Self = TensorModel::selfOf(Call))
    Ins.push_back(Self);
  llvm::SmallVector<const VarDecl *, 1> Lists; // `torch::cat(outs)`: what outs is given
  for (const Expr *A : Call->arguments()) {
    Ins.push_back(A);
    if (Model.isTensorExpr(A))
      continue;
    Ins.append(bracedElements(A)); // `torch::cat({a, b})`
    if (const VarDecl *V = G.Vectors ? G.Vectors->listArgument(A) : nullptr;
        V && !ListsInProgress.count(V) && G.Vectors->valuesOf(V, Ins)) {
      ListsInProgress.insert(V);
      Lists.push_back(V);
    }
  }
  auto Done = llvm::make_scope_exit([&] {
    for (const VarDecl *V : Lists)
      ListsInProgress.erase(V);
  });
  bool Any = false;
  for (const Expr *Passed : Ins) {
    const Expr *In = passedTensor(Passed, Model);
    if (!In)
      In = passedVector(Passed, Model);
    if (!In)
      continue;
    Any = true;
    GradFact F = eval(In, St);
    if (F.requiresGrad() == Tri::Yes)
      return {GradKind::NonLeaf, Call};
    AllNo &= F.requiresGrad() == Tri::No;
  }
  return {Any && AllNo ? GradKind::NoGrad : GradKind::Unknown, nullptr};
}

// A free function of the TU (not the tensor libraries') given, at argument I,
// a value that requires grad: its result does when the callee's body makes
// it so from that parameter alone (GradFacts::CalleeFn).
GradFact GradFacts::Impl::evalCalleeResult(const CallExpr *Call, const State &St) const {
  const FunctionDecl *FD = Call->getDirectCallee();
  bool Bundle = !Model.isTensorExpr(Call) && Model.isTensorStruct(Call->getType());
  // A method's operator call (a lambda's, a functor's) passes the object
  // as argument 0.
  unsigned Shift = isa<CXXOperatorCallExpr>(Call) && isa_and_nonnull<CXXMethodDecl>(FD) ? 1 : 0;
  if (!G.Callees || !FD || (!Model.isTensorExpr(Call) && !Bundle) ||
      !G.gradEnabledAt(Call) || !readableCallee(FD))
    return {};
  // `auto losses = fcos_loss(outs, ...)`: a struct of losses its body makes
  // from a module's output, whatever the arguments are.
  if (Bundle && G.Callees(FD, NoParam) == Tri::Yes)
    return {GradKind::NonLeaf, Call};
  for (unsigned I = 0; I + Shift < Call->getNumArgs() && I < FD->getNumParams(); ++I) {
    const Expr *Arg = Call->getArg(I + Shift);
    const Expr *In = passedTensor(Arg, Model);
    if (!In && Model.isTensorStruct(Arg->getType())) // a module's result struct
      In = Arg;
    if (!In)
      In = passedVector(Arg, Model);
    bool Yes = In && eval(In, St).requiresGrad() == Tri::Yes;
    if (!In) // `helper({out.recon})`
      for (const Expr *B : bracedElements(Arg))
        Yes |= eval(B, St).requiresGrad() == Tri::Yes;
    if (Yes && G.Callees(FD, I) == Tri::Yes)
      return {GradKind::NonLeaf, Call};
  }
  return {};
}

// `m->forward(x)` / `m(x)`: a layer's output; a parameter-free library
// module's follows its input, a buffer-only module's what its body makes.
GradFact GradFacts::Impl::forwardResult(const CallExpr *Call, QualType Module,
                                        const CXXMethodDecl *Forward, const State &St) const {
  if (isParameterFreeModule(Module))
    return combineInputs(Call, St);
  if (!G.gradEnabledAt(Call))
    return {GradKind::NoGrad, nullptr};
  if (Forward && G.Classes->bufferOnlyModule(Forward->getParent()))
    return evalCalleeResult(Call, St);
  return {GradKind::NonLeaf, Call};
}

void GradFacts::Impl::recordFieldAssign(const CXXOperatorCallExpr *OC, const State &St) {
  const auto *ME = dyn_cast<MemberExpr>(OC->getArg(0)->IgnoreParenImpCasts());
  const VarDecl *V = ME && !ME->isArrow() ? varOf(ME->getBase()) : nullptr;
  const auto *F = ME ? dyn_cast<FieldDecl>(ME->getMemberDecl()) : nullptr;
  if (!V || !F || !V->isLocalVarDecl() || !Model.isTensorType(F->getType()))
    return;
  bool Yes = G.gradEnabledAt(OC) && eval(OC->getArg(1), St).requiresGrad() == Tri::Yes;
  auto [It, New] = FieldYes.try_emplace({V, F}, Yes);
  if (!New)
    It->second &= Yes;
}

// `return {loss, box}` of a tensor struct: Yes when every tensor does, No
// when none does, else Unknown. `return l;` of a local struct whose every
// tensor field was assigned only values requiring grad: Yes.
Tri GradFacts::Impl::bundleRequiresGrad(const Expr *V, const State &St) const {
  if (!Model.isTensorStruct(V->getType()))
    return Tri::Unknown;
  if (const VarDecl *L = varOf(V); L && L->isLocalVarDecl()) {
    const auto *RD = L->getType()->getAsCXXRecordDecl();
    bool All = RD && llvm::all_of(RD->fields(), [&](const FieldDecl *F) {
                 auto It = FieldYes.find({L, F});
                 return !Model.isTensorType(F->getType()) || (It != FieldYes.end() && It->second);
               });
    return All ? Tri::Yes : Tri::Unknown;
  }
  const Expr *E = V->IgnoreImplicit();
  if (const auto *FC = dyn_cast<CXXFunctionalCastExpr>(E)) // `return Out{loss, h};`
    E = FC->getSubExpr()->IgnoreImplicit();
  const auto *IL = dyn_cast<InitListExpr>(E);
  if (!IL)
    return Tri::Unknown;
  bool AllYes = true, AllNo = true;
  for (const Expr *I : IL->inits()) {
    if (!Model.isTensorExpr(I))
      continue;
    Tri R = eval(I, St).requiresGrad();
    AllYes &= R == Tri::Yes;
    AllNo &= R == Tri::No;
  }
  return AllYes ? Tri::Yes : AllNo ? Tri::No : Tri::Unknown;
}

void GradFacts::Impl::recordReturn(const ReturnStmt *RS, const State &St) {
  const Expr *V = RS->getRetValue();
  if (!V || (!Model.isTensorExpr(V) && !Model.isTensorStruct(V->getType())))
    return;
  Tri R = !G.gradEnabledAt(RS)         ? Tri::No
          : Model.isTensorExpr(V) ? eval(V, St).requiresGrad()
                                  : bundleRequiresGrad(V, St);
  G.Returned = !G.AnyReturn || G.Returned == R ? R : Tri::Unknown;
  G.AnyReturn = true;
}

GradFact GradFacts::Impl::evalOp(const CallExpr *Call, const sem::OpInfo &Op,
                                 const State &St) const {
  using sem::Storage;
  const Expr *Self = TensorModel::selfOf(Call);
  if (!Self && Call->getNumArgs())
    Self = Call->getArg(0);
  switch (Op.storage) {
  case Storage::Detach:
    return {GradKind::NoGrad, nullptr};
  case Storage::InPlace:
    return Self ? eval(Self, St) : GradFact{};
  case Storage::Factory:
    break; // options decide, below
  case Storage::View: {
    GradFact S = Self ? eval(Self, St) : GradFact{};
    if (!G.gradEnabledAt(Call))
      return {GradKind::NoGrad, nullptr};
    if (S.isGradLeafOrView())
      return {GradKind::LeafView, S.Source};
    return S;
  }
  default:
    if (Op.autograd == sem::Autograd::NotDifferentiable)
      return {GradKind::NoGrad, nullptr};
    GradFact F = combineInputs(Call, St);
    // `w.to(...)`/`w.contiguous()` of a leaf may return the leaf itself.
    if (Op.storage == Storage::MayAlias && F.Kind == GradKind::NonLeaf)
      F.Kind = GradKind::RequiresGrad;
    return F;
  }
  for (const Expr *A : Call->arguments())
    if (!Model.isTensorExpr(A) && eval(A, St).Kind == GradKind::Leaf)
      return {GradKind::Leaf, Call};
  return {GradKind::NoGrad, nullptr};
}

GradFact GradFacts::Impl::evalRequiresGradCall(const CXXMemberCallExpr *Call,
                                               const State &St) const {
  GradFact S = eval(Call->getImplicitObjectArgument(), St);
  bool On = Call->getNumArgs() == 0 || isTrue(Call->getArg(0), Ctx);
  if (!On)
    return {GradKind::NoGrad, nullptr};
  if (S.Kind == GradKind::NoGrad || S.Kind == GradKind::Leaf)
    return {GradKind::Leaf, S.Kind == GradKind::Leaf ? S.Source : Call};
  return {S.Kind == GradKind::Unknown ? GradKind::RequiresGrad : S.Kind,
          S.Source ? S.Source : Call};
}

GradFact GradFacts::Impl::evalMemberCall(const CXXMemberCallExpr *Call, const State &St) const {
  const CXXMethodDecl *M = Call->getMethodDecl();
  const Expr *Obj = Call->getImplicitObjectArgument();
  if (!M || !M->getIdentifier() || !Obj)
    return {};
  llvm::StringRef N = M->getName();
  bool OnTensor = Model.isTensorExpr(Obj);
  if (!OnTensor && N == "requires_grad" && isInNamespace(M, {"tt", "c10", "at", "torch"}))
    return optionsFact(Call); // TensorOptions().requires_grad(true)
  if (OnTensor) {
    if (N == "grad" || N == "mutable_grad")
      return {GradKind::NoGrad, nullptr};
    return combineInputs(Call, St); // a tensor method the table does not list
  }
  // Containers of parameters: parameters(), named_parameters(), optimizers' groups.
  if (isInNamespace(M, {"torch"}) &&
      llvm::StringSwitch<bool>(N)
          .Cases("parameters", "named_parameters", "param_groups", "params", true)
          .Default(false))
    return frozen(Obj) ? GradFact{} : GradFact{GradKind::Leaf, Call};
  if (N == "forward" && isModuleRecord(M->getParent()))
    return forwardResult(Call, Obj->getType(), M, St);
  // `decode(z)`, or `observe(obs)` returning a struct of tensors (`out.kl`).
  if (Model.isTensorExpr(Call) || Model.isTensorStruct(Call->getType()))
    if (auto L = layerMethod(Call); L != GradClassFacts::LayerMethod::No)
      return {G.gradEnabledAt(Call) && L == GradClassFacts::LayerMethod::Layer
                  ? GradKind::NonLeaf
                  : GradKind::NoGrad,
              Call};
  // `y_norm.decode(model->forward(x))`: a method of the TU making its result
  // from an argument that requires grad.
  if (GradFact F = evalCalleeResult(Call, St); F.Kind != GradKind::Unknown)
    return F;
  // Element access on a container of parameters: begin(), value(), at()...
  return eval(Obj, St);
}

GradFact GradFacts::Impl::evalCall(const CallExpr *Call, const State &St) const {
  if (isStdMoveLike(Call))
    return eval(Call->getArg(0), St);
  const FunctionDecl *FD = Call->getDirectCallee();
  if (FD && FD->getIdentifier() && FD->getName() == "register_parameter")
    return isTrainableRegistration(Call, Ctx) ? GradFact{GradKind::Leaf, Call}
                                              : GradFact{GradKind::NoGrad, nullptr};
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
      MC && FD && FD->getIdentifier() && Model.isTensorExpr(MC->getImplicitObjectArgument()) &&
      (FD->getName() == "requires_grad_" || FD->getName() == "set_requires_grad"))
    return evalRequiresGradCall(MC, St);
  // `p.options()` carries dtype, device and layout, never requires_grad.
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
      MC && FD && FD->getIdentifier() && !Model.isTensorExpr(Call) &&
      Model.isTensorExpr(MC->getImplicitObjectArgument()->IgnoreParenImpCasts()) &&
      TensorModel::isMetadataMethod(FD->getName())) // declared on TensorBase: look through the cast
    return {GradKind::NoGrad, nullptr};
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    OverloadedOperatorKind K = OC->getOperator();
    if (isModuleCall(OC))
      return forwardResult(Call, OC->getArg(0)->getType(), holderForward(Call), St);
    bool Access = K == OO_Arrow || K == OO_Subscript || (K == OO_Star && OC->getNumArgs() == 1);
    if (Access && !Model.isTensorExpr(OC->getArg(0))) {
      // `*it`, `it->`, `params[i]`: elements of a container of parameters,
      // or of the tensors an op returned (`chunk`, `split`).
      return eval(OC->getArg(0), St);
    }
    if (isCompoundAssign(K) && Model.isTensorExpr(OC->getArg(0)))
      return eval(OC->getArg(0), St);            // returns self
    if (K == OO_Subscript && OC->getNumArgs()) { // integer index: a view
      GradFact S = eval(OC->getArg(0), St);
      return S.isGradLeafOrView() ? GradFact{GradKind::LeafView, S.Source} : S;
    }
  }
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  if (const sem::OpInfo *Op = Model.opOf(Call); Op && !isRequiresGradSetter(MC))
    return evalOp(Call, *Op, St); // requires_grad_ is a table row too, not differentiable
  if (MC)
    return evalMemberCall(MC, St);
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    // Comparisons (`w == 0`) and bitwise ops are not differentiable.
    const sem::OpInfo *Op = sem::lookup(operatorOpName(OC));
    if (Op && Op->autograd == sem::Autograd::NotDifferentiable)
      return {GradKind::NoGrad, nullptr};
    if (OC->getOperator() == OO_Call) // a lambda or functor: what its body makes
      return evalCalleeResult(Call, St);
    return combineInputs(Call, St); // tensor arithmetic: `a * b`, `-a`
  }
  if (GradFact F = evalCalleeResult(Call, St); F.Kind != GradKind::Unknown)
    return F;
  if (FD && isInNamespace(FD, {"tt", "at", "c10", "torch"})) {
    if (FD->getName() == "requires_grad")
      return optionsFact(Call);
    bool HasTensorArg = false; // a tensor or a list of them (`torch::einsum(eq, {q, k})`)
    for (const Expr *A : Call->arguments())
      HasTensorArg |= Model.isTensorExpr(A) || Model.isTensorListType(A->getType());
    if (!HasTensorArg && Model.isTensorExpr(Call)) { // a factory the table does not list
      for (const Expr *A : Call->arguments())
        if (eval(A, St).Kind == GradKind::Leaf)
          return {GradKind::Leaf, Call};
      return {GradKind::NoGrad, nullptr};
    }
    if (HasTensorArg && Model.isTensorExpr(Call))
      return combineInputs(Call, St);
  }
  return {};
}

GradFact GradFacts::Impl::eval(const Expr *E, const State &St) const {
  E = stripHandle(E);
  if (!E)
    return {};
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    auto It = St.find(DRE->getDecl());
    return It == St.end() ? GradFact{} : It->second;
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl());
    if (F && parameterField(F))
      return frozen(ME->getBase()) ? GradFact{} : GradFact{GradKind::Leaf, ME};
    if (F && Model.isTensorType(F->getType()) && leafField(F))
      return {GradKind::Leaf, ME};
    // `out.cls + out.box` of a local struct whose fields were assigned values
    // requiring grad (seen so far by the recording pass).
    if (const VarDecl *L = F && !ME->isArrow() ? varOf(ME->getBase()) : nullptr)
      if (auto It = FieldYes.find({L, F}); It != FieldYes.end() && It->second)
        return {GradKind::NonLeaf, ME};
    // A tensor field of a module's result (the struct a `forward` returns)
    // follows it, as `auto [a, b] = net(x)` does; so does one of a struct
    // parameter every call gives such a result (gradOfParams). So do the
    // elements of a vector field (`out.aux_masks[i]`: per-layer outputs).
    if (F && !ME->isArrow() &&
        (Model.isTensorType(F->getType()) || Model.isTensorVectorType(F->getType()))) {
      GradFact Base = eval(ME->getBase(), St);
      if (Base.Kind == GradKind::NonLeaf || Base.Kind == GradKind::NoGrad ||
          Base.Kind == GradKind::RequiresGrad)
        return Base;
    }
    return {};
  }
  if (const auto *Call = dyn_cast<CallExpr>(E))
    return evalCall(Call, St);
  if (const auto *CO = dyn_cast<ConditionalOperator>(E)) { // `last ? y : y.narrow(...)`
    GradFact T = eval(CO->getTrueExpr(), St), F = eval(CO->getFalseExpr(), St);
    return {joinKind(T.Kind, F.Kind), T.Source ? T.Source : F.Source};
  }
  if (isDefaultConstructed(E) && Model.isTensorExpr(E))
    return {GradKind::Undefined, nullptr}; // `torch::Tensor mask;`
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E)) // TensorOptions(...) and friends
    for (const Expr *A : CE->arguments())
      if (eval(A, St).Kind == GradKind::Leaf && !Model.isTensorExpr(CE))
        return {GradKind::Leaf, CE};
  return {};
}

void GradFacts::Impl::transfer(const Stmt *S, State &St) {
  if (Recording)
    if (const auto *E = dyn_cast<Expr>(S); E && tracked(E))
      G.Facts[E] = eval(E, St);
  if (const auto *RS = dyn_cast<ReturnStmt>(S); RS && Recording)
    recordReturn(RS, St);
  if (const auto *DS = dyn_cast<DeclStmt>(S)) {
    for (const Decl *D : DS->decls())
      if (const auto *VD = dyn_cast<VarDecl>(D); VD && VD->getInit()) {
        St[VD] = eval(VD->getInit(), St);
        if (const auto *DD = dyn_cast<DecompositionDecl>(VD))
          bindDecomposition(DD, St);
      }
    return;
  }
  const auto *Call = dyn_cast<CallExpr>(S);
  if (const auto *OC = dyn_cast_or_null<CXXOperatorCallExpr>(Call)) {
    if (isCompoundAssign(OC->getOperator()) && OC->getNumArgs() == 2)
      writtenFrom(OC->getArg(0), OC, St);
    if (OC->getOperator() != OO_Equal || OC->getNumArgs() != 2)
      return;
    if (const auto *DRE = dyn_cast<DeclRefExpr>(OC->getArg(0)->IgnoreParenImpCasts()))
      St[DRE->getDecl()] = eval(OC->getArg(1), St);
    else if (const auto *Tie = tieCall(OC->getArg(0)))
      bindTie(Tie, OC->getArg(1), St);
    else if (Recording)
      recordFieldAssign(OC, St);
    return;
  }
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(Call);
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  const auto *DRE = M && M->getIdentifier()
                        ? dyn_cast<DeclRefExpr>(stripHandle(MC->getImplicitObjectArgument()))
                        : nullptr;
  if (!DRE)
    return;
  if (const sem::OpInfo *Op = Model.opOf(MC); Op && Op->storage == sem::Storage::InPlace)
    writtenFrom(DRE, MC, St);
  // `w.requires_grad_()` changes w itself.
  if (M->getName() == "requires_grad_" || M->getName() == "set_requires_grad")
    St[DRE->getDecl()] = evalRequiresGradCall(MC, St);
  else if (M->getName() == "detach_" && Model.isTensorExpr(MC->getImplicitObjectArgument()))
    St[DRE->getDecl()] = {GradKind::NoGrad, nullptr}; // now a leaf that does not require grad
  // After `loss.backward()` returns, loss requires grad: PyTorch throws "does
  // not require grad" otherwise (a sum started from zeros({}) in a loop).
  if (M->getName() == "backward" && Model.isTensorExpr(MC->getImplicitObjectArgument()))
    if (GradFact &F = St[DRE->getDecl()]; F.requiresGrad() != Tri::Yes)
      F = {GradKind::RequiresGrad, MC};
}

// --- GradFacts -----------------------------------------------------------------------------

GradFacts::GradFacts(const TensorModel &Model, ASTContext &Ctx, const FrozenParameters *Frozen,
                     GradClassFacts *Classes)
    : Model(Model), Ctx(Ctx), Frozen(Frozen),
      OwnClasses(Classes ? nullptr : std::make_unique<GradClassFacts>()),
      Classes(Classes ? Classes : OwnClasses.get()) {}
GradFacts::~GradFacts() = default;

void GradFacts::run(const FunctionDecl *FD, bool OffAtEntry, EntryFacts Entry) {
  Stmt *Body = FD->getBody();
  if (!Body)
    return;
  GradOffAtEntry = OffAtEntry;
  collectUnderGuard(Body, false, NoGradStmts);
  Vectors = std::make_unique<VectorElements>(Model, Body);
  CFG::BuildOptions Opts;
  Opts.AddImplicitDtors = false;
  Opts.AddTemporaryDtors = false;
  Opts.AddLifetime = false;
  Opts.setAllAlwaysAdd();
  Cfg = CFG::buildCFG(FD, Body, &Ctx, Opts);
  if (!Cfg)
    return;
  Impl D(*this);
  ForwardDataflow<Impl> Flow(*Cfg, D);
  if (!Flow.solve(std::move(Entry))) {
    Cfg.reset();
    return;
  }
  D.Recording = true;
  Flow.replay([this](const CFGBlock &B, unsigned I, const Stmt *S, const Impl::State &) {
    Positions[S] = {&B, I};
  });
}

GradFact GradFacts::factOf(const Expr *E) const {
  for (const Expr *X : {E, E->IgnoreParenImpCasts(), stripHandle(E)}) {
    auto It = Facts.find(X);
    if (It != Facts.end())
      return It->second;
  }
  return {};
}

bool GradFacts::runsWithoutGrad(const CallExpr *Call) {
  const FunctionDecl *FD = Call->getDirectCallee();
  return FD && inNamespacePath(FD, "torch::nn::init::");
}

bool isUnderNoGrad(const Stmt *S, const Stmt *Body) { return findUnderGuard(Body, S, false) == 1; }

} // namespace clang::tidy::tensor
