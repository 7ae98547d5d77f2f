#include "analysis/DeviceFacts.h"

#include "analysis/AnalysisManager.h"
#include "analysis/AstHelpers.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/ExprCXX.h"

#include <utility>

namespace clang::tidy::tensor {

// How certainly a kind of CUDA is CUDA: 0 when it is not CUDA at all.
static int cudaRank(DeviceKnown D) {
  switch (D) {
  case DeviceKnown::CUDA: return 3;
  case DeviceKnown::CUDAIfAvailable: return 2;
  case DeviceKnown::CallerChosen: return 1;
  default: return 0;
  }
}

bool onCuda(DeviceKnown D) { return cudaRank(D) > 0; }

Fact deviceFact(DeviceKnown D, Fact IfCuda) {
  return D == DeviceKnown::CUDAIfAvailable ? Fact::DeviceCUDAIfAvailable
         : D == DeviceKnown::CallerChosen  ? Fact::DeviceChosenByCaller
                                           : IfCuda;
}

// The more certain kind of CUDA of two (operands of one op share a device).
static DeviceKnown strongestCuda(DeviceKnown A, DeviceKnown B) {
  return cudaRank(B) > cudaRank(A) ? B : A;
}

DeviceKnown meetDevices(DeviceKnown A, DeviceKnown B) {
  if (A == B)
    return A;
  if (onCuda(A) && onCuda(B))
    return cudaRank(A) < cudaRank(B) ? A : B;
  return DeviceKnown::Unknown;
}

namespace {

// Variables followed from one expression to what it was computed from: the
// expressions themselves are walked whole (they hold no cycle).
constexpr unsigned kMaxHops = 12;

// A TensorOptions made from a value of this type leaves the device default.
bool namesNoDevice(QualType T) {
  std::string N = T.getNonReferenceType().getUnqualifiedType().getAsString();
  return llvm::any_of(llvm::ArrayRef<StringRef>{"ScalarType", "TypeMeta", "Layout", "MemoryFormat"},
                      [&](StringRef W) { return StringRef(N).ends_with(W); });
}

// E calls torch::cuda::is_available() (or tt::cuda::is_available()).
bool asksAvailability(const Stmt *S) {
  if (!S)
    return false;
  if (const auto *C = dyn_cast<CallExpr>(S))
    if (const FunctionDecl *F = C->getDirectCallee();
        F && F->getIdentifier() &&
        (F->getName() == "is_available" || F->getName() == "device_count"))
      return true;
  return llvm::any_of(S->children(), [](const Stmt *C) { return asksAvailability(C); });
}

// `p.first` / `p.second` of a std::pair, or a tensor field of a plain struct
// value (`out.logits` of the struct a `forward` returns): its tensors come
// from one computation.
bool isResultElement(const MemberExpr *ME, const TensorModel &Model) {
  const auto *Field = dyn_cast<FieldDecl>(ME->getMemberDecl());
  const auto *RD = Field ? dyn_cast<CXXRecordDecl>(Field->getParent()) : nullptr;
  if (!RD || ME->isArrow())
    return false;
  if (RD->getIdentifier() && RD->getName() == "pair" && RD->isInStdNamespace())
    return true;
  return Model.isTensorStructField(Field);
}

// Every value its class gives the device field F (valuesOfField), when each
// user-written constructor gives it one (directly or by the default member
// initialiser): otherwise F is unknown. Code outside the class is taken not
// to set it, so F must be private or protected, or its class must set it in a
// constructor: a public field of a plain config struct is set by the code
// that fills the config.
bool fieldValues(const FieldDecl *F, llvm::SmallVectorImpl<const Expr *> &Out) {
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (!RD || !RD->hasDefinition() ||
      (F->getAccess() == AS_public && !RD->hasUserDeclaredConstructor()))
    return false;
  auto Initialises = [F](const CXXConstructorDecl *C) {
    return C->isImplicit() || C->isCopyOrMoveConstructor() || F->getInClassInitializer() ||
           llvm::any_of(C->inits(), [F](const CXXCtorInitializer *I) {
             return I->getMember() == F && I->isWritten();
           });
  };
  if (!llvm::all_of(RD->ctors(), Initialises))
    return false;
  Out.append(valuesOfField(F));
  return !Out.empty();
}

// S moves a tensor to the host: a `cpu()` call or a `kCPU` device.
bool movesToHost(const Stmt *S) {
  if (!S)
    return false;
  if (const auto *C = dyn_cast<CallExpr>(S))
    if (const FunctionDecl *F = C->getDirectCallee();
        F && F->getIdentifier() && F->getName() == "cpu")
      return true;
  if (const auto *D = dyn_cast<DeclRefExpr>(S))
    if (D->getDecl()->getIdentifier() && D->getDecl()->getName().ends_with("CPU"))
      return true;
  return llvm::any_of(S->children(), [](const Stmt *C) { return movesToHost(C); });
}

StringRef calleeName(const CallExpr *C) {
  const FunctionDecl *F = C->getDirectCallee();
  return F && F->getIdentifier() ? F->getName() : "";
}

} // namespace

DeviceFacts::DeviceFacts(const TensorModel &Model, ASTContext &Ctx, const FunctionDecl *FD)
    : Model(Model), Ctx(Ctx), Fn(FD), Vectors(Model, FD ? FD->getBody() : nullptr) {
  llvm::SmallVector<const Stmt *, 64> Work{FD ? FD->getBody() : nullptr};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    auto [L, R] = assignmentSides(S);
    if (const auto *D = L ? dyn_cast<DeclRefExpr>(stripHandle(L)) : nullptr)
      if (const auto *V = dyn_cast<VarDecl>(D->getDecl()))
        Assigned[V].push_back(R);
    if (const auto *ME = L ? dyn_cast<MemberExpr>(stripHandle(L)) : nullptr; ME && !ME->isArrow())
      if (const VarDecl *V = varOf(ME->getBase()))
        if (const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl()))
          FieldAssigned[{V, F}].push_back(R);
    if (const auto *CS = dyn_cast<CompoundStmt>(S))
      noteOverwrittenFields(CS);
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
}

DeviceKnown DeviceFacts::ofVar(const VarDecl *V, bool IsDevice, unsigned Depth) {
  // A tensor or device parameter starts as what its callers pass.
  const auto *P = dyn_cast<ParmVarDecl>(V);
  P = P && (IsDevice || Model.isTensorType(P->getType())) ? P : nullptr;
  if (P && !Assigned.count(P))
    return ofParam(P, IsDevice, Depth);
  // Other parameters, loop variables and globals someone else sets: not shown here.
  if ((!P && isa<ParmVarDecl>(V)) || (!P && !V->getInit()) ||
      (V->hasGlobalStorage() && !V->getType().isConstQualified()))
    return DeviceKnown::Unknown;
  if (!IsDevice && V->isLocalVarDecl() && Model.isTensorVectorType(V->getType()))
    return ofTensorVector(V, Depth);
  auto Of = [&](const Expr *E) {
    return IsDevice ? deviceNamed(E, Depth + 1) : deviceOf(E, Depth + 1);
  };
  // `torch::Tensor loss;` is undefined, with no device, until assigned: its
  // assigned values alone decide.
  auto It = Assigned.find(V);
  bool Undefined = !IsDevice && isDefaultConstructed(V->getInit()) &&
                   Model.isTensorType(V->getType()) && It != Assigned.end() && !It->second.empty();
  auto Start = [&] {
    return P ? ofParam(P, IsDevice, Depth) : Undefined ? Of(It->second.front()) : Of(V->getInit());
  };
  llvm::ArrayRef<const Expr *> Rest;
  if (It != Assigned.end())
    Rest = It->second;
  return solve(VarKey{V, IsDevice}, Start, Rest, Of);
}

DeviceKnown DeviceFacts::solve(VarKey Key, llvm::function_ref<DeviceKnown()> Start,
                               llvm::ArrayRef<const Expr *> Rest,
                               llvm::function_ref<DeviceKnown(const Expr *)> Of) {
  if (auto It = Known.find(Key); It != Known.end())
    return It->second;
  // A value that depends on itself (`x = model(x)`, `h = h + d`): its
  // initial value, as a hypothesis checked when every value is known.
  if (!InProgress.insert(Key).second) {
    auto H = Hypothesis.find(Key);
    Cut.Hyps.insert(Key);
    Cut.Hard |= H == Hypothesis.end();
    return H == Hypothesis.end() ? DeviceKnown::Unknown : H->second;
  }
  const CutState Outer = std::exchange(Cut, CutState());
  DeviceKnown D = Start();
  if (onCuda(D))
    Hypothesis[Key] = D;
  for (const Expr *R : Rest)
    D = meetDevices(D, Of(R));
  // D is the hypothesis (confirmed) or weaker (a sound answer either way).
  Hypothesis.erase(Key);
  InProgress.erase(Key);
  Cut.Hyps.erase(Key);
  if (!Cut.Hard && Cut.Hyps.empty()) // else not Key's own answer: a bound, or another's hypothesis
    Known[Key] = D;
  Cut.Hard |= Outer.Hard;
  Cut.Hyps.insert(Outer.Hyps.begin(), Outer.Hyps.end());
  return D;
}

// Note [own tensor field]
// A tensor field of a plain class (not a module: a module's move carries
// its registered members, Note [module device]), private or protected, is
// given values by its class's code alone: the default member initialiser,
// the constructors' initialisers, assignments in its methods (valuesOfField).
// Its device is the meet of theirs, a value read from the field itself
// (`p_ = torch::where(m, r, p_)`) resting on the others as a hypothesis, as
// a variable's does. It needs the whole class in view: written in the main
// file, every method defined there, and the field never bound to a
// non-const reference (`torch::load(w_, path)`, an accessor returning
// `Tensor &`) or its address taken.
DeviceKnown DeviceFacts::ofOwnField(const FieldDecl *F, unsigned Depth) {
  const VarKey Key{F, 0};
  if (auto It = Known.find(Key); It != Known.end())
    return It->second; // before the walk of the class that gathers its values
  llvm::SmallVector<const Expr *, 4> Values;
  if (!wholeClassGives(F, Values))
    return Known[Key] = DeviceKnown::Unknown;
  auto Of = [&](const Expr *E) { return deviceOf(E, Depth + 1); };
  auto Start = [&] { return Of(Values.front()); };
  return solve(Key, Start, llvm::ArrayRef(Values).drop_front(), Of);
}

bool DeviceFacts::wholeClassGives(const FieldDecl *F, llvm::SmallVectorImpl<const Expr *> &Out) {
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  const SourceManager &SM = Ctx.getSourceManager();
  if (!RD || !RD->hasDefinition() || isModuleRecord(RD) || F->getAccess() == AS_public ||
      !SM.isWrittenInMainFile(SM.getFileLoc(RD->getLocation())))
    return false;
  if (llvm::any_of(RD->methods(), [](const CXXMethodDecl *M) {
        return !M->isImplicit() && !M->isDefaulted() && !M->isDeleted() && !M->isPureVirtual() &&
               !M->getDefinition();
      }))
    return false;
  llvm::SmallVector<const Expr *, 4> Writes; // the class's assignments (a friend's too)
  if (!AnalysisManager::get(Model, Ctx).calls().addFieldWrites(F, Writes))
    return false;
  Out.append(valuesOfField(F)); // the initialisers first: the hypothesis
  Out.append(Writes);
  return !Out.empty();
}

// Note [reaching assignment]
// A variable's device is the meet of every value it is given, which loses
// `pos = pos.to(device)`: the initial host value meets the device one. A use
// has the value of the last statement before it, in a block around it, that
// assigns (or declares) the variable, when no statement in between, and no
// loop around both, assigns it another way: the assignment dominates the use
// and nothing else reaches it.
bool DeviceFacts::assignsWithin(const VarDecl *V, const Stmt *S, const Stmt *Except) const {
  auto It = Assigned.find(V);
  if (It == Assigned.end())
    return false;
  const SourceManager &SM = Ctx.getSourceManager();
  auto In = [&](SourceLocation L, const Stmt *Of) {
    return Of && !SM.isBeforeInTranslationUnit(L, Of->getBeginLoc()) &&
           !SM.isBeforeInTranslationUnit(Of->getEndLoc(), L);
  };
  return llvm::any_of(It->second, [&](const Expr *R) {
    return In(R->getBeginLoc(), S) && !In(R->getBeginLoc(), Except);
  });
}

const Expr *DeviceFacts::valueGivenBy(const Stmt *St, const VarDecl *V, bool &Found) const {
  Found = true;
  if (const auto *DS = dyn_cast<DeclStmt>(St); DS && llvm::is_contained(DS->decls(), V)) {
    return isDefaultConstructed(V->getInit()) ? nullptr : V->getInit();
  }
  if (!assignsWithin(V, St)) {
    Found = false;
    return nullptr;
  }
  const auto *E = dyn_cast<Expr>(St);
  auto [L, R] = assignmentSides(E ? E->IgnoreImplicit() : nullptr);
  const auto *D = L ? dyn_cast<DeclRefExpr>(stripHandle(L)) : nullptr;
  return D && D->getDecl() == V ? R : nullptr;
}

const Expr *DeviceFacts::reachingValue(const DeclRefExpr *Use, const VarDecl *V) const {
  if (!Assigned.count(V))
    return nullptr;
  const Stmt *Child = Use;
  DynTypedNodeList Ps = Ctx.getParents(*Use);
  while (Ps.size() == 1) {
    if (const auto *D = Ps[0].get<VarDecl>()) { // the use is in an initialiser
      Ps = Ctx.getParents(*D);
      continue;
    }
    const Stmt *P = Ps[0].get<Stmt>();
    if (!P || isa<LambdaExpr>(P))
      return nullptr;
    if (const auto *CS = dyn_cast<CompoundStmt>(P)) {
      auto Before = llvm::make_range(CS->body_begin(), llvm::find(CS->body(), Child));
      for (const Stmt *St : llvm::reverse(Before)) {
        bool Found;
        const Expr *R = valueGivenBy(St, V, Found);
        if (Found)
          return R;
      }
    } else if (isLoop(P) && assignsWithin(V, P)) {
      return nullptr; // the back edge may bring another value
    } else if (assignsWithin(V, P, Child)) {
      return nullptr; // `if (c) x = ...;` beside the use's branch, or within the expression
    }
    Child = P;
    Ps = Ctx.getParents(*P);
  }
  return nullptr;
}

// A device member (`torch::Device device_;` set to kCUDA in the constructor):
// what every value its class gives it names.
DeviceKnown DeviceFacts::ofField(const FieldDecl *F, unsigned Depth) {
  if (auto It = FieldKnown.find(F); It != FieldKnown.end())
    return It->second;
  FieldKnown[F] = DeviceKnown::Unknown;
  llvm::SmallVector<const Expr *, 4> Values;
  if (!fieldValues(F, Values))
    return DeviceKnown::Unknown;
  DeviceKnown D = deviceNamed(Values.front(), Depth + 1);
  for (const Expr *V : llvm::drop_begin(Values))
    D = meetDevices(D, deviceNamed(V, Depth + 1));
  return FieldKnown[F] = D;
}

// Note [caller's device]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A device parameter that no call in view passes (a trainer class built in
// another file, `train(model, loader, device)` called from another TU) is
// the caller's choice: CallerChosen. Code that takes its device as a
// parameter is written to run on CUDA too, so a CPU tensor it mixes with a
// tensor on that device throws in the runs it is written for, and a sync it
// makes each step costs there; the findings say "when its caller passes a
// CUDA device". A constructor is read through the constructions the main
// file writes (`Agent agent(cfg, device)`); one a library template makes
// (`make_unique<Agent>(cfg, kCPU)`, a ModuleHolder) is not seen, so with
// none seen a class the main file names anywhere stays Unknown.

// The argument each call or construction of FD in view passes for its
// parameter I (null where it cannot be read); none when FD may be called out
// of sight (CallSites::of).
static void argumentsFor(const CallSites &CS, const FunctionDecl *FD, unsigned I,
                         llvm::SmallVectorImpl<const Expr *> &Out) {
  if (const auto *Ctor = dyn_cast<CXXConstructorDecl>(FD)) {
    for (const CallSites::Construction &C : CS.constructionsOf(Ctor))
      Out.push_back(I < C.Construct->getNumArgs() ? C.Construct->getArg(I) : nullptr);
    return;
  }
  if (std::optional<llvm::ArrayRef<CallSites::Site>> Sites = CS.of(FD))
    for (const CallSites::Site &S : *Sites)
      // An operator call passes the object first: its arguments are not shifted here.
      Out.push_back(isa<CXXOperatorCallExpr>(S.Call) || I >= S.Call->getNumArgs()
                        ? nullptr
                        : S.Call->getArg(I));
}

DeviceKnown DeviceFacts::ofParam(const ParmVarDecl *P, bool IsDevice, unsigned Depth) {
  const auto *FD = dyn_cast<FunctionDecl>(P->getDeclContext());
  if (!FD || Depth > kMaxHops)
    return DeviceKnown::Unknown;
  const VarKey Key{P, IsDevice};
  if (auto It = ParamKnown.find(Key); It != ParamKnown.end())
    return It->second;
  ParamKnown[Key] = DeviceKnown::Unknown; // a chain of calls back to FD
  AnalysisManager &AM = AnalysisManager::get(Model, Ctx);
  llvm::SmallVector<const Expr *, 4> Args;
  argumentsFor(AM.calls(), FD, P->getFunctionScopeIndex(), Args);
  if (Args.empty()) { // Note [caller's device]
    const auto *Ctor = dyn_cast<CXXConstructorDecl>(FD);
    bool Unseen = !Ctor || !AM.calls().namesRecord(Ctor->getParent());
    return ParamKnown[Key] = IsDevice && Unseen ? DeviceKnown::CallerChosen : DeviceKnown::Unknown;
  }
  std::optional<DeviceKnown> D;
  for (const Expr *A : Args) {
    DeviceFacts *Caller = A ? AM.devicesAt(A) : nullptr;
    DeviceKnown K = !Caller    ? DeviceKnown::Unknown
                    : IsDevice ? Caller->deviceNamed(A, Depth + 1)
                               : Caller->deviceOf(A, Depth + 1);
    D = D ? meetDevices(*D, K) : K;
  }
  return ParamKnown[Key] = *D;
}

DeviceKnown DeviceFacts::deviceNamed(const Expr *E, unsigned Depth) {
  if (!E)
    return DeviceKnown::Unknown;
  if (Depth > kMaxHops) {
    Cut.Hard = true;
    return DeviceKnown::Unknown;
  }
  E = stripHandle(E)->IgnoreImplicit();
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    StringRef N = DRE->getDecl()->getIdentifier() ? DRE->getDecl()->getName() : "";
    if (N.ends_with("CUDA"))
      return DeviceKnown::CUDA;
    if (N.ends_with("CPU"))
      return DeviceKnown::NotCUDA;
    const auto *V = dyn_cast<VarDecl>(DRE->getDecl());
    return V ? ofVar(V, true, Depth) : DeviceKnown::Unknown;
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E))
    if (const auto *F = dyn_cast<FieldDecl>(ME->getMemberDecl()))
      return ofField(F, Depth);
  if (const auto *S = dyn_cast<StringLiteral>(E))
    return S->getString().starts_with("cuda")  ? DeviceKnown::CUDA
           : S->getString().starts_with("cpu") ? DeviceKnown::NotCUDA
                                               : DeviceKnown::Unknown;
  if (const auto *CO = dyn_cast<ConditionalOperator>(E)) {
    DeviceKnown T = deviceNamed(CO->getTrueExpr(), Depth),
                F = deviceNamed(CO->getFalseExpr(), Depth);
    if (asksAvailability(CO->getCond()) && T == DeviceKnown::CUDA && F == DeviceKnown::NotCUDA)
      return DeviceKnown::CUDAIfAvailable;
    return meetDevices(T, F);
  }
  // torch::Device(kCUDA, 0), TensorOptions(device), optional<Device>;
  // TensorOptions(kFloat) (a dtype, layout or memory format): the default device.
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E))
    return !CE->getNumArgs() || namesNoDevice(CE->getArg(0)->getType())
               ? DeviceKnown::NotCUDA
               : deviceNamed(CE->getArg(0), Depth);
  if (const auto *C = dyn_cast<CallExpr>(E)) {
    StringRef N = calleeName(C);
    const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
    if (N == "device" && C->getNumArgs() == 1) // options.device(d), torch::device(d)
      return deviceNamed(C->getArg(0), Depth);
    if (MC && isDeviceLikeType(MC->getImplicitObjectArgument()->getType()))
      return deviceNamed(MC->getImplicitObjectArgument(), Depth); // .dtype(...) on options
    if (const Expr *Of = MC && N == "options" ? MC->getImplicitObjectArgument()->IgnoreImpCasts()
                                              : nullptr;
        Of && Model.isTensorExpr(Of)) // TensorBase::options()
      return deviceOf(Of, Depth);     // x.options(): x's device
    if (!MC && isTensorApi(C->getDirectCallee()) && (N == "dtype" || N == "requires_grad"))
      return DeviceKnown::NotCUDA; // torch::dtype(kFloat): the default device
  }
  return DeviceKnown::Unknown;
}

DeviceKnown DeviceFacts::anyArgument(const CallExpr *C, unsigned Depth, bool Ours) {
  DeviceKnown Best = DeviceKnown::Unknown;
  bool HostTensor = false, AllHost = true;
  for (const Expr *A : C->arguments()) {
    // `sample_batch(data, n, device)`: a call given a device computes there.
    bool Tensor = Model.isTensorExpr(A) || Model.isTensorVectorType(A->getType());
    DeviceKnown D = Tensor                                 ? deviceOf(A, Depth)
                    : Model.isTensorListType(A->getType()) ? ofListArgument(A, Depth)
                    : isDeviceLikeType(A->getType())       ? deviceNamed(A, Depth)
                                                           : ofStructArgument(A, Depth);
    HostTensor |= Tensor && D == DeviceKnown::NotCUDA;
    // A list or struct may carry tensors this does not follow.
    AllHost &= Tensor ? D == DeviceKnown::NotCUDA
                      : !Model.isTensorListType(A->getType()) &&
                            !scalarSource(A)->getType()->isRecordType();
    Best = strongestCuda(Best, D);
  }
  // A function of ours given tensors on two devices has none of its own: it
  // may throw in there (reported there) or move one; a library op's
  // mismatch is reported at the call, and its value taken on CUDA after it.
  // A library op given only host tensors computes on the host.
  if (Ours)
    return HostTensor ? DeviceKnown::Unknown : Best;
  return HostTensor && AllHost && Best == DeviceKnown::Unknown ? DeviceKnown::NotCUDA : Best;
}

DeviceKnown DeviceFacts::ofListArgument(const Expr *A, unsigned Depth) {
  llvm::SmallVector<const Expr *, 4> Es;
  Model.tensorOperands(A, Es);
  if (Es.empty()) { // a vector converted to the list type
    const VarDecl *V = Vectors.listArgument(A);
    return V ? ofTensorVector(V, Depth) : DeviceKnown::Unknown;
  }
  DeviceKnown Best = DeviceKnown::Unknown;
  for (const Expr *E : Es)
    Best = strongestCuda(Best, deviceOf(E, Depth));
  return Best;
}

DeviceKnown DeviceFacts::ofFactory(const CallExpr *C, unsigned Depth) {
  StringRef N = calleeName(C);
  if (N.ends_with("_like") && C->getNumArgs()) {
    for (const Expr *A : llvm::drop_begin(C->arguments())) {
      // `empty_like(x, torch::kLong)`: options made from a dtype name no device.
      const auto *CE = dyn_cast<CXXConstructExpr>(stripHandle(A)->IgnoreImplicit());
      bool DTypeOnly = CE && CE->getNumArgs() && namesNoDevice(CE->getArg(0)->getType());
      if (isDeviceLikeType(A->getType()) && !isa<CXXDefaultArgExpr>(A) && !DTypeOnly)
        return DeviceKnown::Unknown; // a device of its own: rare, not followed
    }
    return deviceOf(C->getArg(0), Depth);
  }
  for (const Expr *A : C->arguments())
    if (!isa<CXXDefaultArgExpr>(A) && isDeviceLikeType(A->getType()))
      return deviceNamed(A, Depth);
  return DeviceKnown::NotCUDA;
}

DeviceKnown DeviceFacts::ofCall(const CallExpr *C, unsigned Depth) {
  StringRef N = calleeName(C);
  const auto *MC = dyn_cast<CXXMemberCallExpr>(C);
  const Expr *Obj = MC ? MC->getImplicitObjectArgument() : nullptr;
  if (Obj && Model.isTensorExpr(Obj)) {
    if (N == "cuda")
      return DeviceKnown::CUDA;
    if (N == "cpu")
      return DeviceKnown::NotCUDA;
    if (N == "to" && C->getNumArgs() && !isa<CXXDefaultArgExpr>(C->getArg(0))) {
      const Expr *A = C->getArg(0);
      if (isDeviceLikeType(A->getType())) // to(device), to(device, dtype)
        return deviceNamed(A, Depth);
      if (Model.isTensorExpr(A)) // to(other): other's device
        return deviceOf(A, Depth);
    }
    return deviceOf(Obj, Depth); // every other tensor method keeps self's device
  }
  if (Obj && llvm::is_contained({"back", "front", "at"}, N) && !Model.isTensorExpr(Obj))
    return deviceOf(Obj, Depth); // an element of a list of tensors, as `[i]`
  // A module member every constructor moves to CUDA computes on CUDA (`fc(x)`
  // and `fc->forward(x)` alike).
  if (const Expr *M = calledModule(C))
    if (DeviceKnown D = cudaModuleMember(M, Depth); D != DeviceKnown::Unknown)
      return D;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(C)) {
    // `halves[0]` of `auto halves = t.chunk(2)`: the list's device.
    if (OC->getOperator() == OO_Subscript && !Model.isTensorExpr(OC->getArg(0)))
      return deviceOf(OC->getArg(0), Depth);
    DeviceKnown D = anyArgument(OC, Depth); // operands share a device
    return D == DeviceKnown::Unknown ? ofMovedModule(C) : D; // `net(x)`
  }
  if (isStdMoveLike(C) || N == "get") // std::get<0>(t.max(1)): the tuple's tensors
    return C->getNumArgs() ? deviceOf(C->getArg(0), Depth) : DeviceKnown::Unknown;
  if (TensorModel::isFactoryCall(C))
    return ofFactory(C, Depth);
  // torch::nll_loss(out, target), model->forward(x), a function of ours: a
  // CUDA input means a CUDA computation, unless ours moves something to the host.
  const FunctionDecl *Def = C->getDirectCallee() ? C->getDirectCallee()->getDefinition() : nullptr;
  bool Ours = Def && !isTensorApi(Def);
  if (Ours && bodyMovesToHost(Def))
    return DeviceKnown::Unknown;
  // Given only numbers (`mel_filterbank(sr, n_fft)`), it makes its result.
  bool Numbers = llvm::all_of(C->arguments(), [](const Expr *A) {
    return A->getType()->isArithmeticType() || A->getType()->isEnumeralType();
  });
  DeviceKnown D =
      Ours && Numbers && readableBodyOf(C) ? ofReturns(Def, Depth) : anyArgument(C, Depth, Ours);
  return D == DeviceKnown::Unknown ? ofMovedModule(C) : D;
}

// What every return of Def gives, in Def's own facts (`mel_filterbank(sr,
// n_fft)` returning a `torch::zeros` it filled: the CPU).
DeviceKnown DeviceFacts::ofReturns(const FunctionDecl *Def, unsigned Depth) {
  llvm::SmallVector<const ReturnStmt *, 2> Returns;
  collectReturns(Def->getBody(), Returns);
  std::optional<DeviceKnown> D;
  for (const ReturnStmt *RS : Returns) {
    const Expr *V = RS->getRetValue();
    DeviceFacts *Callee = V ? AnalysisManager::get(Model, Ctx).devicesAt(V) : nullptr;
    DeviceKnown K = Callee ? Callee->deviceOf(V, Depth + 1) : DeviceKnown::Unknown;
    D = D ? meetDevices(*D, K) : K;
  }
  return D.value_or(DeviceKnown::Unknown);
}

// Moves of module member F (`F->to(d)`, `F->cuda()`, `F->cpu()`) in S.
// The module E names: a member of `this`, or a variable.
static const ValueDecl *moduleDecl(const Expr *E) {
  E = moduleValue(E);
  if (const ValueDecl *F = ownMember(E))
    return F;
  const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? E->IgnoreParenImpCasts() : nullptr);
  return DRE ? DRE->getDecl() : nullptr;
}

// The moves (`to`, `cuda`, `cpu`) in S of the module F names.
static void movesOf(const Stmt *S, const ValueDecl *F,
                    llvm::SmallVectorImpl<const CallExpr *> &Out) {
  if (!S)
    return;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S); MC && MC->getMethodDecl() &&
                                                       MC->getMethodDecl()->getIdentifier()) {
    StringRef N = MC->getMethodDecl()->getName();
    if ((N == "to" || N == "cuda" || N == "cpu") &&
        moduleDecl(MC->getImplicitObjectArgument()) == F)
      Out.push_back(MC);
  }
  for (const Stmt *Child : S->children())
    movesOf(Child, F, Out);
}

// A local module of the user's class that this function moves, and every
// move in the file sends to CUDA, computes there whatever its input, when
// the input does not tell (`net->to(device); ... net(batch.lq)`): a host
// input would throw first. A module parameter may be a host instance.
DeviceKnown DeviceFacts::ofMovedModule(const CallExpr *C) {
  const Expr *M = calledModule(C);
  const auto *V = dyn_cast_or_null<VarDecl>(M ? moduleDecl(M) : nullptr);
  const CXXRecordDecl *RD = V && V->isLocalVarDecl() ? userModuleClass(V->getType()) : nullptr;
  if (!RD || !Fn)
    return DeviceKnown::Unknown;
  if (auto It = MovedLocals.find(V); It != MovedLocals.end())
    return It->second; // one walk of the body per module, not per call
  llvm::SmallVector<const CallExpr *, 2> Moves;
  movesOf(Fn->getBody(), V, Moves);
  return MovedLocals[V] = Moves.empty() ? DeviceKnown::Unknown
                                        : AnalysisManager::get(Model, Ctx).moduleDevice(RD);
}

DeviceKnown DeviceFacts::cudaModuleMember(const Expr *E, unsigned Depth) {
  const FieldDecl *F = rootModuleMember(E);
  DeviceKnown D = F ? ofModuleMember(F, Depth) : DeviceKnown::Unknown;
  return onCuda(D) ? D : DeviceKnown::Unknown;
}

const FieldDecl *DeviceFacts::rootModuleMember(const Expr *E) {
  for (int I = 0; E && I < 8; ++I) {
    E = moduleValue(stripHandle(E));
    if (const auto *F = dyn_cast_or_null<FieldDecl>(ownMember(E)))
      return isModuleHolderType(F->getType()) ? F : nullptr;
    const auto *ME = dyn_cast<MemberExpr>(E);
    E = ME ? ME->getBase() : nullptr; // `model_->emb->weight`: down to `model_`
  }
  return nullptr;
}

DeviceKnown DeviceFacts::deviceOfMove(const CXXMemberCallExpr *MC, unsigned Depth) {
  StringRef N = MC->getMethodDecl()->getName();
  if (N == "cuda")
    return DeviceKnown::CUDA;
  if (N == "cpu")
    return DeviceKnown::NotCUDA;
  return MC->getNumArgs() && isDeviceLikeType(MC->getArg(0)->getType())
             ? deviceNamed(MC->getArg(0), Depth)
             : DeviceKnown::Unknown;
}

DeviceKnown DeviceFacts::ofModuleMember(const FieldDecl *F, unsigned Depth) {
  if (auto It = ModuleMembers.find(F); It != ModuleMembers.end())
    return It->second;
  ModuleMembers[F] = DeviceKnown::Unknown; // a move computed from itself
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (!RD || !RD->hasDefinition())
    return DeviceKnown::Unknown;
  // A module class's registered members move with it (Note [module device]),
  // after construction: its constructor runs before any move.
  if (isModuleRecord(RD)) {
    bool InCtor = isa_and_nonnull<CXXConstructorDecl>(Fn) &&
                  cast<CXXConstructorDecl>(Fn)->getParent() == RD;
    return ModuleMembers[F] = !InCtor && movesWithModule(F)
                                  ? AnalysisManager::get(Model, Ctx).moduleDevice(RD)
                                  : DeviceKnown::Unknown;
  }
  DeviceKnown D = DeviceKnown::Unknown;
  bool Any = false;
  for (const CXXMethodDecl *M : RD->methods()) {
    const FunctionDecl *Def = M->getDefinition();
    if (!Def || (M->isImplicit() && isa<CXXConstructorDecl>(M)))
      continue;
    llvm::SmallVector<const CallExpr *, 2> Moves;
    movesOf(Def->getBody(), F, Moves);
    const auto *CD = dyn_cast<CXXConstructorDecl>(M);
    bool Ctor = CD && !CD->isCopyOrMoveConstructor();
    if (Ctor && Moves.empty())
      return DeviceKnown::Unknown; // a constructor leaves it where it was made
    for (const CallExpr *Mv : Moves) {
      DeviceKnown K = deviceOfMove(cast<CXXMemberCallExpr>(Mv), Depth + 1);
      D = Any ? meetDevices(D, K) : K;
      Any = true;
    }
  }
  return ModuleMembers[F] = D == DeviceKnown::CUDA ? D : DeviceKnown::Unknown;
}

// What the one return of a function of the TU gives, through a local it
// returns (`auto fb = torch::zeros(...); ...; return fb;`); null otherwise.
static const Expr *soleReturnValue(const CallExpr *C) {
  const FunctionDecl *FD = C ? readableBodyOf(C) : nullptr;
  llvm::SmallVector<const ReturnStmt *, 2> Returns;
  if (FD)
    collectReturns(FD->getBody(), Returns);
  const Expr *R = Returns.size() == 1 ? Returns[0]->getRetValue() : nullptr;
  const VarDecl *V = R ? varOf(R) : nullptr;
  return V && V->isLocalVarDecl() && V->getInit() ? V->getInit() : R;
}

// The first tensor operand of an elementwise op or operator (`1.0 / pow(b,
// arange(n) / d)`): the result has at least that operand's rank.
static const Expr *elementwiseOperand(const CallExpr *C, const TensorModel &Model) {
  const auto *OC = dyn_cast_or_null<CXXOperatorCallExpr>(C);
  const sem::OpInfo *Op = OC ? sem::lookup(operatorOpName(OC)) : C ? Model.opOf(C) : nullptr;
  if (!Op && C && isTensorApi(C->getDirectCallee())) // torch::pow(base, t): a number first
    Op = sem::lookup(calleeName(C));
  if (!Op || Op->storage != sem::Storage::Fresh || Op->layout != sem::Layout::Same)
    return nullptr;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(C))
    return MC->getImplicitObjectArgument();
  for (const Expr *A : C->arguments())
    if (Model.isTensorExpr(A))
      return A;
  return nullptr;
}

// The factory call V is made from, through tensor methods that keep or add
// dimensions (`view`, `unsqueeze`, `to(kLong)`; not a reduction such as `sum`),
// elementwise math and a function of the TU that returns it.
static const CallExpr *factoryRoot(const Expr *V, const TensorModel &Model) {
  for (int I = 0; V && I < 8; ++I) {
    const auto *C = dyn_cast<CallExpr>(stripHandle(V));
    if (C && TensorModel::isFactoryCall(C))
      return C;
    if (const Expr *R = soleReturnValue(C)) {
      V = R;
      continue;
    }
    if (const Expr *A = elementwiseOperand(C, Model)) {
      V = A;
      continue;
    }
    const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(C);
    bool KeepsDims = MC && llvm::is_contained({"view", "reshape", "unsqueeze", "to", "contiguous",
                                                "clone", "transpose", "permute", "t", "repeat",
                                                "expand", "flatten", "narrow", "float", "double"},
                                               calleeName(MC));
    V = KeepsDims && Model.isTensorExpr(MC->getImplicitObjectArgument())
            ? MC->getImplicitObjectArgument()
            : nullptr;
  }
  return nullptr;
}

// The factory makes a tensor of rank >= 1: `tensor` of a list, `zeros({n, d})`,
// `eye(n)`, `arange(n)`; not `tensor(0.5)`, `zeros({})` or `zeros(x.sizes())`.
static bool madeWithDims(const CallExpr *Factory) {
  StringRef N = calleeName(Factory);
  if (!Factory->getNumArgs())
    return false;
  if (N == "tensor")
    return !scalarSource(Factory->getArg(0))->getType()->isArithmeticType();
  if (llvm::is_contained({"zeros", "ones", "empty", "rand", "randn", "full"}, N))
    return !bracedElements(Factory->getArg(0)).empty();
  return factoryAlwaysRanked(N);
}

bool DeviceFacts::hostMember(const Expr *E) {
  const auto *F = E ? dyn_cast_or_null<FieldDecl>(ownMember(stripHandle(E))) : nullptr;
  if (!F || !Model.isTensorType(F->getType()))
    return false;
  auto [It, New] = HostMembers.try_emplace(F, false);
  if (New)
    It->second = madeOnHost(F);
  return It->second;
}

bool DeviceFacts::madeOnHost(const FieldDecl *F) {
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  AnalysisManager &AM = AnalysisManager::get(Model, Ctx);
  if (!isModuleRecord(RD) || movesWithModule(F) || AM.moduleFieldTouchedOutside(F))
    return false;
  return allMadeOnHost(valuesOfField(F));
}

bool DeviceFacts::hostField(const Expr *E) {
  const auto *F = E ? dyn_cast_or_null<FieldDecl>(ownMember(stripHandle(E))) : nullptr;
  if (!F || !Model.isTensorType(F->getType()))
    return false;
  auto [It, New] = HostFields.try_emplace(F, false);
  llvm::SmallVector<const Expr *, 4> Values;
  if (New && wholeClassGives(F, Values))
    It->second = allMadeOnHost(Values);
  return It->second;
}

bool DeviceFacts::allMadeOnHost(llvm::ArrayRef<const Expr *> Values) {
  AnalysisManager &AM = AnalysisManager::get(Model, Ctx);
  return !Values.empty() && llvm::all_of(Values, [&](const Expr *V) {
    const CallExpr *Root = factoryRoot(V, Model);
    DeviceFacts *D = Root && madeWithDims(Root) ? AM.devicesAt(V) : nullptr;
    return D && D->deviceOf(V) == DeviceKnown::NotCUDA;
  });
}

bool DeviceFacts::bodyMovesToHost(const FunctionDecl *Def) {
  auto [It, New] = HostMovers.try_emplace(Def, false);
  if (New)
    It->second = movesToHost(Def->getBody());
  return It->second;
}

DeviceKnown DeviceFacts::ofTensorVector(const VarDecl *V, unsigned Depth) {
  llvm::SmallVector<const Expr *, 8> Values;
  if (!Vectors.valuesOf(V, Values)) // assigned or changed otherwise: tainted
    return DeviceKnown::Unknown;
  if (!VectorInProgress.insert(V).second) { // filled from itself: not V's own answer
    Cut.Hard = true;
    return DeviceKnown::Unknown;
  }
  std::optional<DeviceKnown> D;
  for (const Expr *E : Values)
    D = D ? meetDevices(*D, deviceOf(E, Depth + 1)) : deviceOf(E, Depth + 1);
  VectorInProgress.erase(V);
  return D.value_or(DeviceKnown::Unknown);
}

// The assignments `V.F = R` of S, a statement or a comma list of them, into
// Out; false when S is anything else.
static bool fieldAssignments(const Stmt *S, const VarDecl *V,
                             llvm::SmallVectorImpl<const FieldDecl *> &Out) {
  if (const auto *E = dyn_cast<Expr>(S))
    S = E->IgnoreImplicit(); // the cleanups of `in.x = b.x.to(dev);`
  if (const auto *BO = dyn_cast<BinaryOperator>(S); BO && BO->getOpcode() == BO_Comma)
    return fieldAssignments(BO->getLHS(), V, Out) && fieldAssignments(BO->getRHS(), V, Out);
  const Expr *L = assignmentSides(S).first;
  const auto *ME = L ? dyn_cast<MemberExpr>(stripHandle(L)) : nullptr;
  if (!ME || ME->isArrow() || varOf(ME->getBase()) != V || !isa<FieldDecl>(ME->getMemberDecl()))
    return false;
  Out.push_back(cast<FieldDecl>(ME->getMemberDecl()));
  return true;
}

void DeviceFacts::noteOverwrittenFields(const CompoundStmt *CS) {
  for (auto It = CS->body_begin(); It != CS->body_end(); ++It) {
    const auto *DS = dyn_cast<DeclStmt>(*It);
    const auto *V = DS && DS->isSingleDecl() ? dyn_cast<VarDecl>(DS->getSingleDecl()) : nullptr;
    if (!V || !V->getType()->isRecordType() || Model.isTensorType(V->getType()) ||
        aggregateInit(V))
      continue;
    llvm::SmallVector<const FieldDecl *, 4> Fields;
    for (auto Next = std::next(It); Next != CS->body_end(); ++Next)
      if (!fieldAssignments(*Next, V, Fields))
        break;
    for (const FieldDecl *F : Fields)
      DeadInitField.insert({V, F});
  }
}

std::optional<DeviceKnown> DeviceFacts::ofLocalField(const MemberExpr *ME, unsigned Depth) {
  const VarDecl *V = ME->isArrow() ? nullptr : varOf(ME->getBase());
  return ofLocalField(V, dyn_cast<FieldDecl>(ME->getMemberDecl()), Depth);
}

// Field F of local V: its initialiser (braced, or dead when the statements
// after the declaration overwrite it) met with every value assigned to it.
std::optional<DeviceKnown> DeviceFacts::ofLocalField(const VarDecl *V, const FieldDecl *F,
                                                     unsigned Depth) {
  const Expr *Init = aggregateFieldInit(V, F);
  const bool Dead = !Init && V && DeadInitField.count({V, F});
  if ((!Init && !Dead) || Assigned.count(V))
    return std::nullopt;
  auto It = FieldAssigned.find({V, F});
  const llvm::ArrayRef<const Expr *> Values =
      It != FieldAssigned.end() ? llvm::ArrayRef<const Expr *>(It->second) : std::nullopt;
  DeviceKnown D = Init ? deviceOf(Init, Depth + 1) : deviceOf(Values.front(), Depth + 1);
  for (const Expr *R : Init ? Values : Values.drop_front())
    D = meetDevices(D, deviceOf(R, Depth + 1));
  return D;
}

DeviceKnown DeviceFacts::ofStructArgument(const Expr *A, unsigned Depth) {
  if (!Model.isTensorStruct(A->getType()))
    return DeviceKnown::Unknown;
  const VarDecl *V = varOf(A);
  DeviceKnown Best = deviceOf(A, Depth); // a struct a call returned: that call's device
  for (const FieldDecl *F : A->getType()->getAsCXXRecordDecl()->fields())
    if (Model.isTensorType(F->getType()))
      if (std::optional<DeviceKnown> D = ofLocalField(V, F, Depth))
        Best = strongestCuda(Best, *D);
  return Best;
}

DeviceKnown DeviceFacts::deviceOf(const Expr *E, unsigned Depth) {
  if (!E)
    return DeviceKnown::Unknown;
  if (Depth > kMaxHops) {
    Cut.Hard = true;
    return DeviceKnown::Unknown;
  }
  E = stripHandle(E)->IgnoreImplicit();
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    if (const auto *BD = dyn_cast<BindingDecl>(DRE->getDecl())) // auto [a, b] = model(x)
      if (const auto *DD = dyn_cast_or_null<VarDecl>(BD->getDecomposedDecl()))
        return ofVar(DD, false, Depth);
    const auto *V = dyn_cast<VarDecl>(DRE->getDecl());
    if (const Expr *R = V ? reachingValue(DRE, V) : nullptr)
      return deviceOf(R, Depth + 1);
    return V ? ofVar(V, false, Depth) : DeviceKnown::Unknown;
  }
  if (const auto *CO = dyn_cast<ConditionalOperator>(E))
    return meetDevices(deviceOf(CO->getTrueExpr(), Depth), deviceOf(CO->getFalseExpr(), Depth));
  if (const auto *UO = dyn_cast<UnaryOperator>(E))
    return deviceOf(UO->getSubExpr(), Depth);
  if (const auto *ME = dyn_cast<MemberExpr>(E); ME && Model.isTensorExpr(ME))
    if (std::optional<DeviceKnown> D = ofLocalField(ME, Depth))
      return *D;
  if (const auto *ME = dyn_cast<MemberExpr>(E); ME && isResultElement(ME, Model))
    return deviceOf(ME->getBase(), Depth); // out.first of `auto out = model->forward(x)`
  // `model_->emb->weight`: a tensor of a module member moved to CUDA.
  if (const auto *ME = dyn_cast<MemberExpr>(E); ME && Model.isTensorExpr(ME))
    if (const FieldDecl *F = rootModuleMember(ME->getBase()); F && onCuda(ofModuleMember(F, Depth)))
      return ofModuleMember(F, Depth);
  // `W_` in a module's method: a registered parameter or buffer; in a plain
  // class's, what the class gives it (Note [own tensor field]).
  if (const auto *F = dyn_cast_or_null<FieldDecl>(ownMember(E));
      F && Model.isTensorType(F->getType()))
    return isModuleRecord(dyn_cast<CXXRecordDecl>(F->getParent())) ? ofModuleMember(F, Depth)
                                                                   : ofOwnField(F, Depth);
  if (const auto *C = dyn_cast<CallExpr>(E))
    return ofCall(C, Depth);
  return DeviceKnown::Unknown;
}

} // namespace clang::tidy::tensor
