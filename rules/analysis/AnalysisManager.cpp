#include "analysis/AnalysisManager.h"

#include "analysis/AstHelpers.h"
#include "analysis/SavedSearch.h"

#include "llvm/ADT/StringExtras.h"

namespace clang::tidy::tensor {

namespace {
// 255 (the largest 8-bit value: pixels to [0, 1]), 127.5 (half of it:
// pixels to [0, 2], then `sub_(1)` to [-1, 1]), or 32768 / 32767 (16-bit
// PCM samples to [-1, 1]).
bool isIntegerDataScale(const Expr *E) {
  E = scalarSource(E);
  if (const auto *I = dyn_cast_or_null<IntegerLiteral>(E))
    return llvm::is_contained({255, 32767, 32768}, I->getValue().getLimitedValue());
  const auto *F = dyn_cast_or_null<FloatingLiteral>(E);
  return F && llvm::is_contained({255.0, 127.5, 32767.0, 32768.0},
                                 F->getValueAsApproximateDouble());
}

// `x.div_(255)` / `x /= 255` (or 127.5), pixel bytes scaled in place: x.
const Expr *bytesScaled(const Stmt *S) {
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S)) {
    const CXXMethodDecl *MD = MC->getMethodDecl();
    bool Div = MD && MD->getIdentifier() && MD->getName() == "div_";
    return Div && MC->getNumArgs() >= 1 && isIntegerDataScale(MC->getArg(0))
               ? MC->getImplicitObjectArgument()
               : nullptr;
  }
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(S);
  return OC && OC->getOperator() == OO_SlashEqual && OC->getNumArgs() == 2 &&
                 isIntegerDataScale(OC->getArg(1))
             ? OC->getArg(0)
             : nullptr;
}

bool scalesAsBytes(const Stmt *S, const VarDecl *V) {
  if (!S)
    return false;
  if (const Expr *T = bytesScaled(S); T && varOf(T) == V)
    return true;
  return llvm::any_of(S->children(), [&](const Stmt *C) { return scalesAsBytes(C, V); });
}

// Conv under the views applied to it (`frames.to(kFloat).permute({0, 3, 1,
// 2})`): the outermost, whose variable a later `div_(255)` scales.
const Expr *underViews(const CallExpr *Conv, const TensorModel &Model, ASTContext &Ctx) {
  const Expr *Cur = Conv;
  for (int I = 0; I < 4; ++I) {
    const Stmt *P = parentStmt(Cur, Ctx);
    while (isa_and_nonnull<ImplicitCastExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr,
                           MemberExpr>(P))
      P = parentStmt(P, Ctx);
    const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(P);
    const sem::OpInfo *Op = MC && stripHandle(MC->getImplicitObjectArgument()) == Cur
                                ? Model.opOf(MC)
                                : nullptr;
    if (!Op || Op->storage != sem::Storage::View)
      return Cur;
    Cur = MC;
  }
  return Cur;
}

} // namespace

// Note [pixel bytes]
// `auto x = frames.to(kFloat); x.div_(255)`: real code converts 8-bit pixels
// this way (or to [-1, 1]: `div_(127.5).sub_(1)`; 16-bit audio samples:
// `div_(32768)`), and divides by 255 (127.5, 32768) only what held integers.
// Such a conversion of an input of unknown dtype copies: the data says more
// than the float32 default.
// A dtype the code shows (an assertion, a factory's) still decides.
bool AnalysisManager::convertsBytes(const CallExpr *Conv) {
  auto [It, New] = BytesConversions.try_emplace(Conv, false);
  if (New)
    It->second = scaledAsBytes(Conv);
  return It->second;
}

bool AnalysisManager::scaledAsBytes(const CallExpr *Conv) {
  const Stmt *Cur = Conv;
  for (int I = 0; I < 6 && Cur; ++I) { // `frames.to(kFloat).div_(255)`, through the member
    Cur = parentStmt(Cur, Ctx);
    if (const Expr *T = Cur ? bytesScaled(Cur) : nullptr)
      return stripHandle(T) == Conv;
  }
  const VarDecl *V = initialisedVar(underViews(Conv, Model, Ctx), Ctx);
  const FunctionDecl *FD = enclosingFunction(Conv, Ctx);
  return V && FD && FD->getBody() && scalesAsBytes(FD->getBody(), V);
}

AnalysisManager::AnalysisManager(const TensorModel &Model, ASTContext &Ctx)
    : Model(Model), Ctx(Ctx), Alias(Model, Ctx) {
  // `to(kFloat)` of a uint8 tensor copies: no alias (the defaults included).
  // `to(device)` with a device chosen at run time may return its input.
  Alias.setCopiesOracle([this](const CallExpr *Call) {
    const ConversionQuery *Q = conversionAt(Call);
    return Q && ((Q->Result == ConversionQuery::Copies && !Q->RunTimeDevice) ||
                 (Q->InputDTypeAssumed && Q->ToFloating && convertsBytes(Call)));
  });
  // A detached write changes what an op saved: the backward after it raises.
  Alias.setSavedOracle([this](const ValueDecl *V, const Expr *Write) -> const Stmt * {
    const GradFacts *G = gradAt(Write);
    if (!G || !G->cfg())
      return nullptr;
    SavedBy S = findSaver(*G, this->Model, V, Write,
                          [&](const FunctionDecl *Callee) { return gradAt(Callee->getBody()); });
    return S.Op ? findBackwardAfter(*G, this->Model, Write, S.Op) : nullptr;
  });
}

namespace {
struct Instance {
  ASTContext *Ctx = nullptr;
  std::string Types;
  std::unique_ptr<AnalysisManager> AM;
};
llvm::SmallVector<Instance, 2> &instances() {
  static llvm::SmallVector<Instance, 2> I;
  return I;
}
} // namespace

AnalysisManager &AnalysisManager::get(const TensorModel &Model, ASTContext &Ctx) {
  std::string Types = llvm::join(Model.typeNames(), ";");
  for (Instance &I : instances())
    if (I.Ctx == &Ctx && I.Types == Types)
      return *I.AM;
  instances().push_back({&Ctx, Types, std::make_unique<AnalysisManager>(Model, Ctx)});
  return *instances().back().AM;
}

void AnalysisManager::release() { instances().clear(); }

const ConversionQuery *AnalysisManager::conversionAt(const CallExpr *Call) {
  const LayoutAnalysis *L = layoutAt(Call);
  return L ? L->conversionOf(Call) : nullptr;
}

template <typename T, typename MakeFn>
T *AnalysisManager::cachedFor(const Stmt *S,
                              llvm::DenseMap<const FunctionDecl *, std::unique_ptr<T>> &Slots,
                              MakeFn Make) {
  const FunctionDecl *FD = enclosingFunction(S, Ctx);
  if (!FD || !FD->hasBody())
    return nullptr;
  if (auto It = Slots.find(FD); It != Slots.end())
    return It->second.get();
  // Make may fill other slots (a callee's analysis): insert after it.
  auto Made = Make(FD);
  return (Slots[FD] = std::move(Made)).get();
}

const LayoutAnalysis *AnalysisManager::layoutAt(const Stmt *S) {
  const FunctionDecl *FD = enclosingFunction(S, Ctx);
  if (!FD || !FD->hasBody())
    return nullptr;
  if (auto It = Layouts.find(FD); It != Layouts.end())
    return It->second;
  const LayoutAnalysis *R = baseLayout(FD);
  if (ParamFacts Params = paramFacts(FD); !Params.empty()) {
    auto Made = makeLayout(FD, std::move(Params));
    R = (InContext[FD] = std::move(Made)).get();
  }
  return Layouts[FD] = R;
}

// FD's facts without its callers' (what its callers' analyses import).
const LayoutAnalysis *AnalysisManager::baseLayout(const FunctionDecl *FD) {
  if (auto It = BaseLayouts.find(FD); It != BaseLayouts.end())
    return It->second.get();
  // makeLayout may fill other slots (a callee's analysis): insert after it.
  auto Made = makeLayout(FD, ParamFacts());
  return (BaseLayouts[FD] = std::move(Made)).get();
}

// Callees are analysed on demand, without their callers' facts; a call
// back into a function being analysed (recursion) gets nothing.
std::unique_ptr<LayoutAnalysis> AnalysisManager::makeLayout(const FunctionDecl *FD,
                                                            ParamFacts Params) {
  auto L = std::make_unique<LayoutAnalysis>(Model, Ctx);
  L->setCallees([this](const FunctionDecl *Callee) -> const LayoutAnalysis * {
    const FunctionDecl *Def = nullptr;
    if (!Callee->hasBody(Def) || !InLayout.insert(Def).second)
      return nullptr;
    const LayoutAnalysis *R = baseLayout(Def);
    InLayout.erase(Def);
    return R;
  });
  L->setDeviceVars(devicesAt(FD->getBody()));
  LayoutClasses.Sites = &calls();
  L->setClassFacts(&LayoutClasses);
  L->setParamFacts(std::move(Params));
  InLayout.insert(FD);
  L->run(FD);
  InLayout.erase(FD);
  return L;
}

// Note [call-site facts]
// Helpers take tensors by parameter and rarely say their rank, device or dtype:
// `merge_heads(const Tensor &o)` returns `o.transpose(1, 2).reshape(...)`, a
// copy at rank 4 and no copy at rank 3; `luma(rgb)` multiplies by a host
// tensor, an error when every caller passes a CUDA image; `add(frames)` copies
// into a uint8 buffer what every caller passes as uint8. Where every call in
// the main file (one at least) passes a contiguous tensor of one rank with no
// size 1, or a tensor on one device or of one dtype the code shows, by its caller's facts
// computed without this (one level of context), the parameter has that rank,
// device or dtype. The size-1 rule keeps a helper written for any batch at the
// defaults when a call passes `x.unsqueeze(0)`. Calls the index cannot see
// leave the defaults: a virtual method, a function whose address escapes, a
// module's forward (called through its holder), a caller being analysed.
ParamFacts AnalysisManager::paramFacts(const FunctionDecl *FD) {
  ParamFacts Out;
  const auto *MD = dyn_cast<CXXMethodDecl>(FD);
  std::optional<llvm::ArrayRef<CallSites::Site>> Sites = calls().of(FD);
  if ((MD && isModuleForward(MD)) || !Sites || Sites->empty())
    return Out;
  for (unsigned I = 0; I < FD->getNumParams(); ++I) {
    const ParmVarDecl *P = FD->getParamDecl(I);
    if (!Model.isTensorType(P->getType()))
      continue;
    std::optional<ParamFact> All = argumentFact(Sites->front(), FD, I);
    for (const CallSites::Site &S : Sites->drop_front()) {
      std::optional<ParamFact> A = All ? argumentFact(S, FD, I) : std::nullopt;
      if (!A) {
        All.reset();
        break;
      }
      if (A->Sizes != All->Sizes)
        All->Sizes.reset();
      meetDevice(*All, *All, *A);
      if (A->DType != All->DType) {
        All->DType = {};
        All->ElemSize = 0;
      }
      All->RankShown |= A->RankShown;
    }
    if (All && All->says())
      Out[P] = std::move(*All);
  }
  return Out;
}

// What the I-th argument of FD is at S, by its caller's facts: its rank when
// contiguous with no size 1, its device and dtype when the code shows them.
std::optional<ParamFact> AnalysisManager::argumentFact(const CallSites::Site &S,
                                                       const FunctionDecl *FD, unsigned I) {
  unsigned Shift = isa<CXXOperatorCallExpr>(S.Call) && isa<CXXMethodDecl>(FD) ? 1 : 0;
  if (InLayout.contains(S.Caller) || I + Shift >= S.Call->getNumArgs())
    return std::nullopt;
  const Expr *Arg = S.Call->getArg(I + Shift);
  const Expr *T = isa<CXXDefaultArgExpr>(Arg) ? nullptr : Model.tensorOperand(Arg);
  const TensorFact *F = T ? baseLayout(S.Caller)->factOf(T) : nullptr;
  if (!F)
    return std::nullopt;
  ParamFact A;
  A.RankShown = F->Sizes.has_value();
  if (F->Sizes && F->Contig == TensorFact::Yes &&
      llvm::none_of(*F->Sizes, [](const Mono &M) { return M.isConst(1); })) {
    A.Sizes.emplace();
    for (const Mono &M : *F->Sizes)
      A.Sizes->push_back(M.isConst() ? std::optional<std::int64_t>(M.Num) : std::nullopt);
  }
  if (!F->DeviceAssumed) {
    A.Device = F->Device;
    A.DeviceRuntime = F->DeviceRuntime;
    A.DeviceIfAvailable = F->DeviceIfAvailable;
  }
  if (!F->DTypeAssumed) {
    A.DType = F->DType;
    A.ElemSize = F->ElemSize;
  }
  return A;
}

LoopAnalysis *AnalysisManager::loopsAt(const Stmt *S) {
  return cachedFor(S, Loops, [this](const FunctionDecl *FD) {
    return std::make_unique<LoopAnalysis>(Model, Ctx, FD);
  });
}

const GradFacts *AnalysisManager::gradAt(const Stmt *S) {
  return cachedFor(S, Grads, [this](const FunctionDecl *FD) {
    auto G = std::make_unique<GradFacts>(Model, Ctx, &frozen(), &GradClasses);
    G->setCallees(calleeGrads());
    InGrad.insert(FD);
    bool Off = gradOffAtEntry(FD);
    G->run(FD, Off, Off ? GradFacts::EntryFacts{} : gradOfParams(FD));
    InGrad.erase(FD);
    return G;
  });
}

Tri AnalysisManager::calleeResultGrad(const FunctionDecl *FD, unsigned I) {
  auto Key = std::make_pair(FD, I);
  if (auto It = CalleeGrads.find(Key); It != CalleeGrads.end())
    return It->second;
  const FunctionDecl *Def = readableCallee(FD);
  bool Param = I != GradFacts::NoParam;
  // Its own set, not InGrad: a callee's facts from a given entry do not
  // depend on the callers' facts gradAt may be computing (a helper whose
  // call sites are being read, called again in a caller), only on callees.
  if (!Def || (Param && I >= Def->getNumParams()) || !InCalleeGrad.insert(Def).second)
    return Tri::Unknown; // no body, or a recursion
  CalleeGrads[Key] = Tri::Unknown;
  GradFacts G(Model, Ctx, &frozen(), &GradClasses);
  G.setCallees(calleeGrads());
  GradFacts::EntryFacts Entry;
  if (Param)
    Entry[Def->getParamDecl(I)] = {GradKind::NonLeaf, nullptr};
  G.run(Def, /*GradOffAtEntry=*/false, std::move(Entry));
  InCalleeGrad.erase(Def);
  return CalleeGrads[Key] = G.returnRequiresGrad();
}

CallSites &AnalysisManager::calls() {
  if (!Calls)
    Calls.emplace(Ctx);
  return *Calls;
}

const FrozenParameters &AnalysisManager::frozen() {
  if (!Frozen)
    Frozen.emplace(calls());
  return *Frozen;
}

// Leaf or not is left unknown (RequiresGrad): a caller's leaf and another's
// non-leaf meet here, and in-place-on-leaf needs to know. A call with grad
// mode off records nothing in FD, so only the calls with it on must agree.
GradFacts::EntryFacts AnalysisManager::gradOfParams(const FunctionDecl *FD) {
  GradFacts::EntryFacts Out;
  std::optional<llvm::ArrayRef<CallSites::Site>> Sites = calls().of(FD);
  if (!Sites)
    return Out;
  for (unsigned I = 0; I < FD->getNumParams(); ++I) {
    const ParmVarDecl *P = FD->getParamDecl(I);
    if (!Model.isTensorType(P->getType()) && !Model.isTensorStruct(P->getType()))
      continue; // a struct of tensors: `const Output &out` given a module's result
    const Expr *First = nullptr;
    bool All = llvm::all_of(*Sites, [&](const CallSites::Site &S) {
      std::optional<const Expr *> Arg = gradArgument(S, I);
      if (Arg && *Arg && !First)
        First = *Arg;
      return Arg.has_value();
    });
    if (All && First)
      Out[P] = {GradKind::RequiresGrad, First};
  }
  return Out;
}

// A caller whose facts are being computed (recursion) says nothing.
std::optional<const Expr *> AnalysisManager::gradArgument(const CallSites::Site &S, unsigned I) {
  if (isa<CXXOperatorCallExpr>(S.Call) || I >= S.Call->getNumArgs() || InGrad.contains(S.Caller))
    return std::nullopt;
  const Expr *Arg = S.Call->getArg(I);
  const GradFacts *G = isa<CXXDefaultArgExpr>(Arg) ? nullptr : gradAt(S.Call);
  if (!G)
    return std::nullopt;
  if (!G->gradEnabledAt(S.Call))
    return nullptr;
  if (G->factOf(Arg).requiresGrad() != Tri::Yes)
    return std::nullopt;
  return Arg;
}

bool AnalysisManager::gradOffAtEntry(const FunctionDecl *FD, unsigned Depth) {
  if (Depth > 2 || !InEntryQuery.insert(FD).second)
    return false; // deep, or recursive: assume grad on, as at the top level
  std::optional<llvm::ArrayRef<CallSites::Site>> Sites = calls().of(FD);
  bool Off =
      Sites && !Sites->empty() && llvm::all_of(*Sites, [&](const CallSites::Site &S) {
        return isUnderNoGrad(S.Call, S.Caller->getBody()) || gradOffAtEntry(S.Caller, Depth + 1);
      });
  InEntryQuery.erase(FD);
  return Off;
}

DeviceFacts *AnalysisManager::devicesAt(const Stmt *S) {
  return cachedFor(S, Devices, [this](const FunctionDecl *FD) {
    return std::make_unique<DeviceFacts>(Model, Ctx, FD);
  });
}

} // namespace clang::tidy::tensor
