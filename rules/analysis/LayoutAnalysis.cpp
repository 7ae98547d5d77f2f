#include "analysis/LayoutImpl.h"

#include "analysis/AstHelpers.h"
#include "analysis/CallSites.h"
#include "analysis/Dataflow.h"
#include "analysis/RnnModules.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/Basic/SourceManager.h"
#include "clang/Lex/Lexer.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSwitch.h"

#include <cinttypes>
#include <cstdio>

namespace clang::tidy::tensor {

bool TensorFact::operator==(const TensorFact &O) const {
  return Contig == O.Contig && Assumed == O.Assumed && DTypeAssumed == O.DTypeAssumed &&
         IntegerNamed == O.IntegerNamed &&
         DeviceAssumed == O.DeviceAssumed && AssumedSource == O.AssumedSource &&
         KindSource == O.KindSource && Sizes == O.Sizes && Strides == O.Strides &&
         HasDims == O.HasDims && ElemSize == O.ElemSize && DType == O.DType && Device == O.Device &&
         DeviceRuntime == O.DeviceRuntime && DeviceIfAvailable == O.DeviceIfAvailable &&
         Throws == O.Throws && FloatingOp == O.FloatingOp &&
         WholeValues == O.WholeValues && SwapA == O.SwapA && Matrix == O.Matrix &&
         SwapB == O.SwapB && UnitDims == O.UnitDims && NarrowDim == O.NarrowDim &&
         NarrowLen == O.NarrowLen && NarrowMayBeWhole == O.NarrowMayBeWhole &&
         MinChunks == O.MinChunks && Src == O.Src &&
         Origin == O.Origin && OriginLoc == O.OriginLoc && Broadcast == O.Broadcast &&
         BroadcastAssumed == O.BroadcastAssumed && ExpandCall == O.ExpandCall && Root == O.Root &&
         SliceDim == O.SliceDim && Lo == O.Lo && Hi == O.Hi;
}

namespace layout {

//===----------------------------------------------------------------------===//
// Reading arguments
//===----------------------------------------------------------------------===//

bool isIntExpr(const Expr *X) {
  return X->getType()->isIntegerType() && !X->getType()->isEnumeralType();
}

// The elements of an int list argument: `{2, 3}`, `-1`, an IntArrayRef or
// std::vector built from either.
bool intList(const Expr *E, llvm::SmallVectorImpl<const Expr *> &Out) {
  if (!E)
    return false;
  E = E->IgnoreParenImpCasts();
  if (const auto *M = dyn_cast<MaterializeTemporaryExpr>(E))
    return intList(M->getSubExpr(), Out);
  if (const auto *B = dyn_cast<CXXBindTemporaryExpr>(E))
    return intList(B->getSubExpr(), Out);
  if (const auto *IL = dyn_cast<CXXStdInitializerListExpr>(E))
    return intList(IL->getSubExpr(), Out);
  if (const auto *IL = dyn_cast<InitListExpr>(E)) {
    if (IL->getNumInits() == 1 && !isIntExpr(IL->getInit(0)))
      return intList(IL->getInit(0), Out);
    for (const Expr *I : IL->inits()) {
      if (!isIntExpr(I))
        return false;
      Out.push_back(I);
    }
    return true;
  }
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E)) {
    if (CE->getNumArgs() == 1 || (CE->getNumArgs() == 2 && isa<CXXDefaultArgExpr>(CE->getArg(1))))
      return intList(CE->getArg(0), Out);
    return false;
  }
  if (isIntExpr(E)) {
    Out.push_back(E);
    return true;
  }
  return false;
}

std::optional<std::int64_t> constInt(const Expr *E, const ASTContext &Ctx) {
  // Through std::optional<int64_t> / Scalar built from an integer.
  for (int I = 0; E && I < 4; ++I) {
    E = E->IgnoreImplicit();
    const auto *CE = dyn_cast<CXXConstructExpr>(E);
    if (!CE || CE->getNumArgs() != 1)
      break;
    E = CE->getArg(0);
  }
  if (!E || E->isValueDependent() || E->isTypeDependent() || !E->getType()->isIntegerType())
    return std::nullopt;
  Expr::EvalResult R;
  if (E->EvaluateAsInt(R, Ctx))
    return R.Val.getInt().getSExtValue();
  return std::nullopt;
}

// A dtype constant's canonical name and element size: kHalf, torch::kFloat64,
// ScalarType::Long all name one.
DTypeName dtypeNamed(llvm::StringRef N) {
  N.consume_front("k");
  return llvm::StringSwitch<DTypeName>(N)
      .Cases("Float", "Float32", "F32", {"Float", 4})
      .Cases("Int", "Int32", {"Int", 4})
      .Case("ComplexHalf", {"ComplexHalf", 4})
      .Cases("Double", "Float64", "F64", {"Double", 8})
      .Cases("Long", "Int64", {"Long", 8})
      .Case("ComplexFloat", {"ComplexFloat", 8})
      .Cases("Half", "Float16", "F16", {"Half", 2})
      .Case("BFloat16", {"BFloat16", 2})
      .Cases("Short", "Int16", {"Short", 2})
      .Case("Bool", {"Bool", 1})
      .Cases("Byte", "UInt8", {"Byte", 1})
      .Cases("Char", "Int8", {"Char", 1})
      .Case("ComplexDouble", {"ComplexDouble", 16})
      .Default({});
}

// The first dtype named anywhere in S (TensorOptions().dtype(kInt)...).
DTypeName dtypeIn(const Stmt *S) {
  if (!S)
    return {};
  if (const auto *DRE = dyn_cast<DeclRefExpr>(S)) {
    const ValueDecl *D = DRE->getDecl();
    if (!D->getIdentifier() || (!isa<EnumConstantDecl>(D) && !D->getName().starts_with("k")))
      return {};
    return dtypeNamed(D->getName());
  }
  for (const Stmt *C : S->children())
    if (DTypeName T = dtypeIn(C); T.Size)
      return T;
  return {};
}

// The first dtype a call's arguments name (`zeros({n}, torch::kLong)`).
DTypeName dtypeInArgs(llvm::ArrayRef<const Expr *> Args) {
  for (const Expr *A : Args)
    if (DTypeName T = dtypeIn(A); T.Size)
      return T;
  return {};
}

// The device an argument names: kCPU / "cpu" is the CPU; any other device
// expression (kCUDA, a torch::Device variable) an accelerator, since code
// that moves tensors to a device it computes targets one. Origin->Runtime is set when
// the device is a run-time value rather than a constant (it may be the CPU);
// Origin->IfAvailable too when that value is `is_available() ? kCUDA : kCPU`.
TensorFact::DeviceKind deviceOf(const Expr *A, DeviceOrigin *Origin, DeviceFacts *Vars) {
  // Through the implicit conversions to TensorOptions / optional<Device>.
  for (int I = 0; A && I < 6; ++I) {
    A = stripHandle(A)->IgnoreImplicit();
    std::string T = A->getType().getNonReferenceType().getUnqualifiedType().getAsString();
    if (T.find("Device") != std::string::npos && T.find("optional") == std::string::npos)
      break;
    const auto *CE = dyn_cast<CXXConstructExpr>(A);
    A = CE && CE->getNumArgs() >= 1 ? CE->getArg(0) : nullptr;
  }
  if (!A)
    return TensorFact::AnyDevice;
  if (Vars && Vars->deviceNamed(A) == DeviceKnown::CUDAIfAvailable) {
    if (Origin)
      *Origin = {true, true};
    return TensorFact::Accelerator;
  }
  if (const auto *DRE = dyn_cast<DeclRefExpr>(A)) {
    const ValueDecl *D = DRE->getDecl();
    if (D->getIdentifier() && D->getName().ends_with("CPU"))
      return TensorFact::CPU;
    const auto *VD = dyn_cast<VarDecl>(D);
    // `torch::Device device(torch::kCUDA);`: what every value it is given names.
    if (DeviceKnown K = VD && Vars ? Vars->deviceNamed(DRE) : DeviceKnown::Unknown;
        K == DeviceKnown::CUDA || K == DeviceKnown::NotCUDA)
      return K == DeviceKnown::CUDA ? TensorFact::Accelerator : TensorFact::CPU;
    if (Origin && !isa<EnumConstantDecl>(D) && !(VD && VD->isConstexpr()))
      Origin->Runtime = true;
    return TensorFact::Accelerator;
  }
  // `device_` set to kCUDA by its class's constructor.
  if (DeviceKnown K = isa<MemberExpr>(A) && Vars ? Vars->deviceNamed(A) : DeviceKnown::Unknown;
      K == DeviceKnown::CUDA || K == DeviceKnown::NotCUDA)
    return K == DeviceKnown::CUDA ? TensorFact::Accelerator : TensorFact::CPU;
  if (const auto *CE = dyn_cast<CXXConstructExpr>(A); CE && CE->getNumArgs() >= 1)
    return deviceOf(CE->getArg(0), Origin, Vars) == TensorFact::CPU ? TensorFact::CPU
                                                                     : TensorFact::Accelerator;
  if (const auto *S = dyn_cast<StringLiteral>(A))
    return S->getString().starts_with("cpu") ? TensorFact::CPU : TensorFact::Accelerator;
  if (Origin)
    Origin->Runtime = true;
  return TensorFact::Accelerator;
}

//===----------------------------------------------------------------------===//
// Facts
//===----------------------------------------------------------------------===//

TensorFact unknownFact() { return TensorFact(); }

// The input a module call runs on: `m(x)` or `m->forward(x)`.
static const Expr *moduleInput(const CallExpr *Call) {
  unsigned First = isModuleCall(Call) ? 1 : 0;
  return Call->getNumArgs() > First ? Call->getArg(First) : nullptr;
}

namespace {
const CallExpr *moduleCallIn(const Expr *E) {
  const auto *Call = dyn_cast_or_null<CallExpr>(E ? E->IgnoreImplicit() : nullptr);
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E ? E->IgnoreImplicit() : nullptr);
      CE && CE->getNumArgs() == 1) // the copy or move of the result
    Call = dyn_cast<CallExpr>(CE->getArg(0)->IgnoreImplicit());
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(Call);
  if (Call && (isModuleCall(Call) || (MC && isModuleForward(MC->getMethodDecl()))))
    return Call;
  return nullptr;
}

} // namespace

// A tensor the function did not make: taken as a contiguous float32 CPU
// tensor, as nearly all are.
TensorFact assumedInput(const void *Src, std::string Source, llvm::StringRef Name) {
  TensorFact F;
  F.IntegerNamed = namesIntegerData(Name);
  F.Contig = TensorFact::Yes;
  F.DType = "Float";
  F.ElemSize = 4;
  F.Device = TensorFact::CPU;
  F.DTypeAssumed = F.DeviceAssumed = true;
  F.Assumed = true;
  F.KindSource.Text = Source;
  F.AssumedSource = std::move(Source);
  F.Src = Src;
  F.Root = Src;
  return F;
}

// The result of an op that allocates: contiguous, as PyTorch makes it.
TensorFact freshContiguous(const void *Src) {
  TensorFact F;
  F.Contig = TensorFact::Yes;
  F.Src = Src;
  F.Root = Src;
  return F;
}

TensorFact join(const TensorFact &A, const TensorFact &B) {
  if (A == B || B.Throws)
    return A;
  if (A.Throws)
    return B;
  TensorFact R;
  if (A.Contig == B.Contig)
    R.Contig = A.Contig;
  R.Assumed = A.Assumed || B.Assumed;
  R.DTypeAssumed = A.DTypeAssumed || B.DTypeAssumed;
  R.IntegerNamed = A.IntegerNamed && B.IntegerNamed;
  R.DeviceAssumed = A.DeviceAssumed || B.DeviceAssumed;
  R.AssumedSource = A.AssumedSource.empty() ? B.AssumedSource : A.AssumedSource;
  R.KindSource = A.KindSource.Text.empty() ? B.KindSource : A.KindSource;
  if (A.ElemSize == B.ElemSize)
    R.ElemSize = A.ElemSize;
  if (A.DType == B.DType)
    R.DType = A.DType;
  meetDevice(R, A, B);
  R.FloatingOp = A.FloatingOp && B.FloatingOp;
  R.WholeValues = A.WholeValues && B.WholeValues;
  R.HasDims = A.HasDims && B.HasDims;
  if (A.Sizes == B.Sizes && A.Strides == B.Strides) {
    R.Sizes = A.Sizes;
    R.Strides = A.Strides;
  }
  if (R.Contig == TensorFact::No && A.Origin == B.Origin)
    R.Origin = A.Origin;
  if (A.MinChunks == B.MinChunks)
    R.MinChunks = A.MinChunks;
  // Expansion and storage are must-facts: kept only where both paths agree.
  if (A.Broadcast && B.Broadcast && A.ExpandCall == B.ExpandCall) {
    R.Broadcast = true;
    R.BroadcastAssumed = A.BroadcastAssumed || B.BroadcastAssumed;
    R.ExpandCall = A.ExpandCall;
  }
  // A whole view keeps its storage where the paths disagree only on sizes (a
  // run-time size named afresh on a loop's back edge); a slice needs both.
  bool SameLayout = (A.Sizes == B.Sizes && A.Strides == B.Strides) ||
                    (A.SliceDim < 0 && A.Contig == B.Contig && A.Contig != TensorFact::Unknown);
  if (A.Root == B.Root && A.SliceDim == B.SliceDim && A.Lo == B.Lo && A.Hi == B.Hi &&
      A.SwapA == B.SwapA && A.SwapB == B.SwapB && SameLayout) {
    R.Root = A.Root;
    R.SliceDim = A.SliceDim;
    R.Lo = A.Lo;
    R.Hi = A.Hi;
  }
  return R;
}

TensorFact::ContigKind toContig(Contig C) {
  return C == Contig::Yes  ? TensorFact::Yes
         : C == Contig::No ? TensorFact::No
                           : TensorFact::Unknown;
}

std::optional<std::int64_t> normDim(std::optional<std::int64_t> D, size_t Rank) {
  if (!D)
    return std::nullopt;
  std::int64_t R = (std::int64_t)Rank;
  std::int64_t V = *D < 0 ? *D + R : *D;
  if (V < 0 || V >= R)
    return std::nullopt;
  return V;
}

} // namespace layout

using namespace layout;

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

std::string LayoutAnalysis::Impl::describe(const Expr *E) const {
  const SourceManager &SM = Ctx.getSourceManager();
  StringRef Text = Lexer::getSourceText(CharSourceRange::getTokenRange(E->getSourceRange()), SM,
                                        Ctx.getLangOpts());
  if (!Text.empty() && Text.size() <= 40 && !Text.contains('\n'))
    return Text.str();
  if (const auto *Call = dyn_cast<CallExpr>(E))
    if (const FunctionDecl *FD = Call->getDirectCallee(); FD && FD->getIdentifier())
      return FD->getName().str() + "(...)";
  return "the expression";
}

TensorFact LayoutAnalysis::Impl::evalVar(const VarDecl *VD, const Expr *Ref, State &S) {
  if (Untracked.count(VD))
    return unknownFact();
  auto It = S.T.find(VD);
  if (It != S.T.end())
    return It->second;
  // Globals, statics and variables of an enclosing function (in a lambda)
  // are inputs like parameters; a local the flow forgot is unknown.
  if (VD->hasLocalStorage() && VD->getDeclContext() == Fn)
    return unknownFact();
  return assumedInput(VD, "'" + VD->getName().str() + "'", VD->getName());
}

// The arguments of Call before FD's first parameter: `m(x)` passes the
// object as argument 0 of a member operator call.
static unsigned objectArgs(const CallExpr *Call, const FunctionDecl *FD) {
  return isa<CXXOperatorCallExpr>(Call) && isa<CXXMethodDecl>(FD) ? 1 : 0;
}

// The argument Call passes for P, when P is one of FD's parameters.
static const Expr *argumentOf(const CallExpr *Call, const FunctionDecl *FD, const void *P) {
  unsigned Shift = objectArgs(Call, FD);
  for (unsigned J = 0; J < FD->getNumParams() && J + Shift < Call->getNumArgs(); ++J)
    if (FD->getParamDecl(J) == P)
      return Call->getArg(J + Shift);
  return nullptr;
}


TensorFact LayoutAnalysis::Impl::evalTensor(const Expr *E, State &S) {
  E = stripHandle(E);
  if (!E)
    return unknownFact();
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
      return evalVar(VD, DRE, S);
    // `auto [out, state] = lstm->forward(x)`: a result of a call, as assumedResult.
    if (const auto *BD = dyn_cast<BindingDecl>(DRE->getDecl()); BD && Model.isTensorExpr(E)) {
      if (const CallExpr *Rnn = rnnOutputCall(DRE))
        return rnnOutput(DRE, Rnn, S);
      const auto *DD = dyn_cast_or_null<DecompositionDecl>(BD->getDecomposedDecl());
      if (DD && DD->getInit())
        if (auto F = valuesOrIndices(DD->getInit(), llvm::find(DD->bindings(), BD) -
                                                        DD->bindings().begin(), S))
          return *F;
      TensorFact F = assumedInput(BD, "'" + BD->getNameAsString() + "'", BD->getName());
      // `auto [a, logp] = actor->forward(obs)`: on the module's input's device.
      if (const CallExpr *Module = DD ? moduleCallIn(DD->getInit()) : nullptr)
        return onInputDevice(F, Model.tensorOperand(moduleInput(Module)), S);
      return F;
    }
    return unknownFact();
  }
  if (const auto *CO = dyn_cast<ConditionalOperator>(E))
    return layout::join(evalTensor(CO->getTrueExpr(), S), evalTensor(CO->getFalseExpr(), S));
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    if (!Model.isTensorExpr(E))
      return unknownFact();
    if (const FieldDecl *Own = thisMember(ME))
      if (auto It = S.M.find(Own); It != S.M.end())
        return It->second;
    if (auto K = localField(ME))
      if (auto It = S.L.find(*K); It != S.L.end())
        return It->second;
    const ValueDecl *Field = ME->getMemberDecl();
    TensorFact F = assumedInput(E, "member '" + Field->getNameAsString() + "'", Field->getName());
    if (const auto *FD = dyn_cast<FieldDecl>(Field))
      if (DTypeName DT = fieldDType(FD); DT.Size) {
        F.DType = DT.Name;
        F.ElemSize = DT.Size;
        F.DTypeAssumed = false;
      }
    if (const void *Id = memberStorage(ME))
      F.Src = F.Root = Id;
    // `out.hidden` of `auto out = lm->forward(x)`: what forward returns there.
    if (const auto *FD = dyn_cast<FieldDecl>(Field); FD && !ME->isArrow())
      if (std::optional<TensorFact> R = structField(ME->getBase(), FD, S))
        F = *R;
    // `out.logits` of `auto out = net->forward(x)`: on the module's input's device.
    if (const CallExpr *Module = structResultOf(ME))
      return onInputDevice(F, Model.tensorOperand(moduleInput(Module)), S);
    return onCertainCUDA(F, ME); // `kp.coords` of `auto kp = decode(hm)`, hm on CUDA
  }
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E))
    return evalOperator(OC, S);
  if (const auto *Call = dyn_cast<CallExpr>(E))
    return evalCall(Call, S);
  return unknownFact();
}

// The tensor member of `this` that E names (`particles_`, `this->h_`).
const FieldDecl *LayoutAnalysis::Impl::thisMember(const Expr *E) const {
  const auto *F = dyn_cast_or_null<FieldDecl>(ownMember(E ? stripHandle(E) : nullptr));
  return F && Model.isTensorType(F->getType()) ? F : nullptr;
}

// The tensor field of a local struct variable that E names (`data.ts`), when
// the variable is tracked: a local of this body, not a reference, its address
// never taken (prescan).
std::optional<std::pair<const VarDecl *, const FieldDecl *>>
LayoutAnalysis::Impl::localField(const Expr *E) const {
  const auto *ME = dyn_cast_or_null<MemberExpr>(E ? stripHandle(E) : nullptr);
  const auto *F = ME ? dyn_cast<FieldDecl>(ME->getMemberDecl()) : nullptr;
  const VarDecl *V = ME && !ME->isArrow() ? varOf(ME->getBase()) : nullptr;
  if (!F || !V || !Model.isTensorType(F->getType()) || !V->isLocalVarDecl() ||
      V->getType()->isReferenceType() || Untracked.count(V))
    return std::nullopt;
  return std::make_pair(V, F);
}

void LayoutAnalysis::Impl::forgetFields(State &S, const VarDecl *V) {
  llvm::SmallVector<std::pair<const VarDecl *, const FieldDecl *>, 4> Drop;
  for (const auto &[K, F] : S.L)
    if (K.first == V)
      Drop.push_back(K);
  for (const auto &K : Drop)
    S.L.erase(K);
}

// `Batch b{x.to(device), y.to(device)}`: an aggregate's tensor fields take
// their initialisers' facts, field by field (a struct with bases is left).
void LayoutAnalysis::Impl::initFields(const VarDecl *V, State &S) {
  if (!aggregateInit(V) || Untracked.count(V))
    return;
  for (const FieldDecl *F : V->getType()->getAsCXXRecordDecl()->fields())
    if (const Expr *Init = aggregateFieldInit(V, F);
        Init && Model.isTensorType(F->getType()) && Model.isTensorExpr(Init))
      S.L[{V, F}] = evalTensor(Init, S);
}

// A call that may assign members of `this`: anything but tensor library
// code and the standard library (a method of the class, a helper given *this).
bool LayoutAnalysis::Impl::mayAssignMembers(const CallExpr *Call) const {
  const FunctionDecl *FD = Call->getDirectCallee();
  return !FD || !(isTensorLibraryCode(FD) || FD->isInStdNamespace());
}

// A member of this object, or of a struct variable (`cache.conv` of
// `InferenceCache &cache`), is one storage wherever it is named: its
// identity, or null for other members.
const void *LayoutAnalysis::Impl::memberStorage(const MemberExpr *ME) {
  const Expr *Base = ME->getBase()->IgnoreParenImpCasts();
  if (isa<CXXThisExpr>(Base))
    return ME->getMemberDecl();
  const auto *DRE = dyn_cast<DeclRefExpr>(Base);
  if (!DRE || ME->isArrow())
    return nullptr;
  return MemberIds.try_emplace({DRE->getDecl(), ME->getMemberDecl()}, ME).first->second;
}

TensorFact LayoutAnalysis::Impl::evalOperator(const CXXOperatorCallExpr *OC, State &S) {
  llvm::StringRef Name = operatorOpName(OC);
  switch (OC->getOperator()) {
  case OO_Equal:
    // `dst[i] = src` / `dst.index(...) = src`: a copy_ into the view.
    if (Recording && OC->getNumArgs() == 2 && Model.isTensorExpr(OC->getArg(1))) {
      Facts[OC->getArg(0)] = evalTensor(OC->getArg(0), S);
      Facts[OC->getArg(1)] = evalTensor(OC->getArg(1), S);
    }
    return Model.isTensorExpr(OC) ? assumedResult(OC) : unknownFact();
  case OO_Subscript:
    // `x[i]` with an integer selects along dim 0 (a view); anything else
    // (`outputs[0]` of a container, a tensor index) is a new value.
    if (Model.isTensorExpr(OC->getArg(0)) && isIntExpr(OC->getArg(1)->IgnoreImpCasts())) {
      OpCall C{OC, "select", sem::lookup("select"),       OC->getArg(0),
               {}, S,        evalTensor(OC->getArg(0), S)};
      if (Recording)
        Facts[C.SelfE] = C.Self;
      TensorFact R = sliceAlong(C, 0, 1);
      trackStorage(C, R);
      return R;
    }
    if (Model.isTensorExpr(OC) && !Model.isTensorExpr(OC->getArg(0)))
      return onCertainCUDA(assumedResult(OC), OC);
    [[fallthrough]];
  case OO_Call:
    if (isModuleCall(OC) && OC->getNumArgs() >= 2)
      return moduleResult(OC, holderForward(OC), OC->getArg(1), S);
    // A lambda of the TU (`auto heads = [&](const Tensor &t) { return
    // t.view({B, -1, H, D}).transpose(1, 2); }`): what its body returns, as
    // for a function.
    if (const auto *MD = dyn_cast_or_null<CXXMethodDecl>(OC->getDirectCallee());
        MD && MD->getParent()->isLambda())
      if (std::optional<TensorFact> R = calleeResult(OC, MD, S))
        return onArgsDevice(*R, OC, S);
    [[fallthrough]];
  default:
    if (Name.empty())
      return Model.isTensorExpr(OC) ? assumedResult(OC) : unknownFact();
  }
  if (!OC->getNumArgs())
    return unknownFact();
  unsigned First = Model.isTensorExpr(OC->getArg(0)) ? 0 : 1;
  if (First >= OC->getNumArgs())
    return unknownFact();
  llvm::SmallVector<const Expr *, 2> Args;
  for (unsigned I = 0; I < OC->getNumArgs(); ++I)
    if (I != First)
      Args.push_back(OC->getArg(I));
  return evalOp(OC, Name, OC->getArg(First), Args, S);
}

TensorFact LayoutAnalysis::Impl::evalCall(const CallExpr *Call, State &S) {
  const FunctionDecl *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier())
    return Model.isTensorExpr(Call) ? assumedResult(Call) : unknownFact();
  llvm::StringRef Name = FD->getName();
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  if (MC && isModuleForward(MC->getMethodDecl()) && Call->getNumArgs())
    return moduleResult(Call, FD, Call->getArg(0), S);
  if (const CallExpr *Rnn = Model.isTensorExpr(Call) ? rnnOutputCall(Call) : nullptr)
    return rnnOutput(Call, Rnn, S); // std::get<0>(lstm(x))
  if (isInNamespace(FD, {"std"}) && Name == "get" && Call->getNumArgs() == 1)
    if (const TemplateArgumentList *TA = FD->getTemplateSpecializationArgs();
        TA && TA->size() && TA->get(0).getKind() == TemplateArgument::Integral)
      if (auto F = valuesOrIndices(Call->getArg(0), TA->get(0).getAsIntegral().getZExtValue(), S))
        return *F;
  if ((MC && !Model.isTensorExpr(MC->getImplicitObjectArgument())) ||
      (!MC && !isTensorApi(FD) && !isStdMoveLike(Call)))
    if (std::optional<TensorFact> R = calleeResult(Call, FD, S))
      return onArgsDevice(*R, Call, S);
  if (MC) {
    if (!Model.isTensorExpr(MC->getImplicitObjectArgument()))
      return Model.isTensorExpr(Call) ? assumedResult(Call) : unknownFact();
    llvm::SmallVector<const Expr *, 4> Args(Call->arg_begin(), Call->arg_end());
    return evalOp(Call, Name, MC->getImplicitObjectArgument(), Args, S);
  }
  if (isStdMoveLike(Call))
    return evalTensor(Call->getArg(0), S);
  if (!isTensorApi(FD))
    return Model.isTensorExpr(Call) ? assumedResult(Call) : unknownFact();
  if (Call->getNumArgs() && Model.isTensorExpr(Call->getArg(0))) {
    llvm::SmallVector<const Expr *, 4> Args(Call->arg_begin() + 1, Call->arg_end());
    return evalOp(Call, Name, Call->getArg(0), Args, S);
  }
  llvm::SmallVector<const Expr *, 4> Args(Call->arg_begin(), Call->arg_end());
  return evalOp(Call, Name, nullptr, Args, S);
}

// Element I of a (values, indices) result (ops.def TT_VALUES_INDICES):
// `std::get<1>(x.max(1))`, `auto [v, i] = x.topk(k)`, through a local
// `auto top = x.max(1)`: values in x's dtype, int64 indices.
std::optional<TensorFact> LayoutAnalysis::Impl::valuesOrIndices(const Expr *Tuple, std::size_t I,
                                                                State &S) {
  if (const VarDecl *V = varOf(Tuple))
    Tuple = Locals.initializerOf(V);
  const auto *Call = Tuple ? dyn_cast<CallExpr>(stripHandle(Tuple)) : nullptr;
  const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(Call);
  if (!FD || !FD->getIdentifier() || I > 1 || !sem::returnsValuesIndices(FD->getName()) ||
      !(MC ? Model.isTensorExpr(MC->getImplicitObjectArgument()) : isTensorApi(FD)))
    return std::nullopt;
  TensorFact F = evalCall(Call, S);
  if (I == 1) {
    F.DType = "Long";
    F.ElemSize = 8;
    F.DTypeAssumed = F.FloatingOp = false;
  }
  return F;
}

TensorFact LayoutAnalysis::Impl::evalOp(const CallExpr *Call, llvm::StringRef Name,
                                        const Expr *SelfE, llvm::ArrayRef<const Expr *> Args,
                                        State &S) {
  llvm::StringRef Row = Model.rowName(Call, Name);
  const sem::OpInfo *Op = sem::lookup(Row);
  if (Recording) { // the operands' facts, for checks that compare them (dtype, device)
    llvm::SmallVector<const Expr *, 4> Ts;
    for (const Expr *A : Args)
      Model.tensorOperands(A, Ts);
    for (const Expr *T : Ts)
      Facts[T] = evalTensor(T, S);
  }
  // In-place ops return self, its layout unchanged (bar TT_RESHAPES_SELF),
  // whether the table lists them or not (index_add_, masked_fill_).
  if (sem::inPlaceKeepsLayout(Row)) {
    if (!SelfE)
      return unknownFact();
    TensorFact Self = evalTensor(SelfE, S);
    if (Recording)
      Facts[SelfE] = Self;
    return Self;
  }
  if (sem::isInPlaceName(Row) || globalPooling(Name, Args))
    return unknownFact(); // t_, resize_...: self's new layout is not followed
  if (!Model.isTensorExpr(Call) && !sem::returnsValuesIndices(Row)) // (values, indices): the values
    return unknownFact();
  if (!SelfE) {
    OpCall C{Call, Name, Op, nullptr, Args, S, TensorFact()};
    return Op && Op->storage == sem::Storage::Factory ? factory(C) : unlistedMaker(C);
  }
  OpCall C{Call, Name, Op, SelfE, Args, S, evalTensor(SelfE, S)};
  if (Recording)
    Facts[SelfE] = C.Self;
  if (!Op) { // an op the table does not know allocates its result, on self's device
    TensorFact R = freshContiguous(Call);
    inheritDevice(R, C.Self);
    return R;
  }
  return applyOp(C);
}

// A pooling op whose window is a run-time size of a tensor
// (`F::max_pool1d(h, MaxPool1dFuncOptions(h.size(2)))`): global pooling, whose
// output has size-1 dims the sizes > 1 default would deny. Its layout is left
// unknown rather than decided from that default.
bool LayoutAnalysis::Impl::globalPooling(llvm::StringRef Name,
                                         llvm::ArrayRef<const Expr *> Args) const {
  if (!Name.contains("pool"))
    return false;
  auto IsSizeCall = [&](const Stmt *S) {
    const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(S);
    const CXXMethodDecl *MD = MC ? MC->getMethodDecl() : nullptr;
    return MD && MD->getIdentifier() && (MD->getName() == "size" || MD->getName() == "sizes") &&
           Model.isTensorExpr(MC->getImplicitObjectArgument()->IgnoreParenImpCasts());
  };
  llvm::SmallVector<const Stmt *, 16> Work(Args.begin(), Args.end());
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (IsSizeCall(S))
      return true;
    if (S)
      Work.append(S->child_begin(), S->child_end());
  }
  return false;
}

// A library function the table does not list that takes no tensor first
// (`torch::from_blob(p, sizes, torch::kDouble)`): a dtype its options name is
// its result's; the rest is taken with the defaults.
// `torch::cat({a, b})`: on the device its tensors share; operands on two
// devices the code shows make it throw.
void LayoutAnalysis::Impl::onListDevice(const OpCall &C, TensorFact &F) {
  llvm::SmallVector<const Expr *, 4> Es;
  if (!C.Args.empty() && !Model.tensorOperand(C.Args.front()))
    Model.tensorOperands(C.Args.front(), Es);
  std::optional<TensorFact> First;
  for (const Expr *E : Es) {
    TensorFact O = evalTensor(E, C.S);
    if (!First)
      First = O;
    else
      combineDevice(*First, *First, O);
  }
  if (First && First->Device != TensorFact::AnyDevice)
    inheritDevice(F, *First);
  F.Throws = First && First->Throws;
}

// torch::cat / torch::stack of a braced list: the elements' rank (one more
// for stack) and the sizes of the first element whose sizes are known, but
// along the joined dim: the list's length for stack, a new size for cat. An
// empty element is skipped: cat takes a 1-D empty tensor beside any rank.
std::optional<Shape> LayoutAnalysis::Impl::joinedShape(const OpCall &C) {
  const bool Stack = C.Name == "stack";
  if ((!Stack && C.Name != "cat") || C.Args.empty() || Model.tensorOperand(C.Args.front()))
    return std::nullopt;
  llvm::SmallVector<const Expr *, 4> Es;
  Model.tensorOperands(C.Args.front(), Es);
  for (const Expr *E : Es) {
    TensorFact O = evalTensor(E, C.S);
    if (!O.Sizes || llvm::any_of(*O.Sizes, [](const Mono &M) { return M.isConst(0); }))
      continue;
    Shape Sz = *O.Sizes;
    // C.arg(1) is null for the default argument (dim 0).
    auto D = normDim(C.arg(1) ? argInt(C, 1) : 0, Sz.size() + Stack);
    if (!D)
      return std::nullopt;
    if (Stack)
      Sz.insert(Sz.begin() + *D, Mono::constant(std::int64_t(Es.size())));
    else
      Sz[*D] = ST.sym(C.Call, 1);
    return Sz;
  }
  return std::nullopt;
}

// Note [stacked symbols]
// `torch::stack({z1, z2})` of tensors of unknown rank along dim D >= 0: its
// dims are the first element's with the list's length inserted at D. The
// result's symbols (its Src is the call) are identified with them, so
// `torch::stack({z1, z2}).transpose(0, 1).view({z1.size(0), -1})` is decided
// at each rank as the element's sizes say.
void LayoutAnalysis::Impl::identifyStacked(const OpCall &C) {
  if (C.Name != "stack" || C.Args.empty() || Model.tensorOperand(C.Args.front()))
    return;
  auto D = C.arg(1) ? argInt(C, 1) : std::optional<std::int64_t>(0);
  llvm::SmallVector<const Expr *, 4> Es;
  Model.tensorOperands(C.Args.front(), Es);
  if (!D || *D < 0 || *D > 8 || Es.empty())
    return;
  TensorFact E = evalTensor(Es.front(), C.S);
  if (E.Sizes || !E.Src || E.SwapA >= 0 || E.UnitDims || E.NarrowDim >= 0)
    return;
  const Mono Count = Mono::constant((std::int64_t)Es.size());
  for (std::int64_t K = 0; K <= 8; ++K)
    ST.identify(C.Call, K + 1,
                K < *D ? ST.sym(E.Src, K + 1) : K == *D ? Count : ST.sym(E.Src, K));
  if (*D == 0)
    ST.identify(C.Call, kLastDim, ST.sym(E.Src, kLastDim));
}

TensorFact LayoutAnalysis::Impl::unlistedMaker(const OpCall &C) {
  TensorFact F = assumedResult(C.Call);
  if (auto Sz = C.Op ? joinedShape(C) : std::nullopt) {
    setContiguous(F, *Sz); // allocated: contiguous whatever the defaults
    F.Assumed = false;
  } else if (C.Op) {
    identifyStacked(C);
  }
  if (C.Op)
    onListDevice(C, F);
  if (DTypeName DT = dtypeInArgs(C.Args); DT.Size) {
    F.DType = DT.Name;
    F.ElemSize = DT.Size;
    F.DTypeAssumed = false;
  }
  return F;
}

// A tensor returned by a function of the TU: what its body makes of inputs
// taken with the defaults, when that says more than the defaults or follows
// its inputs' device.
std::optional<TensorFact> LayoutAnalysis::Impl::calleeResult(const CallExpr *Call,
                                                             const FunctionDecl *FD, State &S) {
  const FunctionDecl *Def = readableCallee(FD);
  if (!Callees || !Def || !Model.isTensorExpr(Call))
    return std::nullopt;
  const LayoutAnalysis *L = Callees(Def);
  if (!L || !L->returnFact())
    return std::nullopt;
  const TensorFact *R = &*L->returnFact();
  bool Kind = (!R->DType.empty() && !R->DTypeAssumed) ||
              (R->Device != TensorFact::AnyDevice && !R->DeviceAssumed);
  // Computed from its tensor parameters (their default device, no call's):
  // on the device the arguments share (onArgsDevice, onInputDevice).
  bool FromInputs = R->DeviceAssumed && !R->KindSource.CallResult;
  if (!R->Sizes && R->Contig != TensorFact::No && R->SwapA < 0 && !Kind && !FromInputs)
    return std::nullopt;
  return importFact(*R, Call, Def, L->symbols(), S);
}

// F, a value taken with the defaults, on CUDA where the device facts say E
// certainly is: an element of a list of tensors (`halves[0]` of `auto halves
// = t.chunk(2)`), a tensor field of a struct a call returned (`kp.coords` of
// `auto kp = decode(hm)`, a function given CUDA tensors computing on CUDA).
TensorFact LayoutAnalysis::Impl::onCertainCUDA(TensorFact F, const Expr *E) {
  if (DeviceVars && DeviceVars->deviceOf(E) == DeviceKnown::CUDA) {
    F.Device = TensorFact::Accelerator;
    F.DeviceAssumed = F.DeviceRuntime = F.DeviceIfAvailable = false;
  }
  return F;
}

// A module's output (`m(x)`, `m->forward(x)`): what a forward of the TU
// returns, on the device of its input, as every layer computes (a module
// whose parameters are elsewhere throws), or on CUDA where the device facts
// know the module is (a member its class moves there).
TensorFact LayoutAnalysis::Impl::moduleResult(const CallExpr *Call, const FunctionDecl *FD,
                                              const Expr *Input, State &S) {
  if (!Model.isTensorExpr(Call))
    return unknownFact();
  std::optional<TensorFact> R = FD ? calleeResult(Call, FD, S) : std::nullopt;
  const Expr *T = Model.tensorOperand(Input);
  TensorFact F = R ? *R : assumedResult(Call);
  const Expr *M = R ? nullptr : calledModule(Call);
  if (const sem::ModuleInfo *Row = M ? libraryModule(M->getType()) : nullptr; T && Row)
    libraryModuleLayout(*Row, Call, evalTensor(T, S), F);
  return onCertainCUDA(onInputDevice(F, T, S), Call);
}

// How many leading dims of its input a Conv or Pool module keeps (the batch;
// pooling also the channels); the others get fresh sizes. None for an input
// of a rank the module rejects.
static std::optional<size_t> keptLeadingDims(const sem::ModuleInfo &Row, size_t Rank) {
  size_t Spatial = static_cast<size_t>(Row.dims);
  if (Rank != Spatial + 1 && Rank != Spatial + 2)
    return std::nullopt;
  return (Rank == Spatial + 2 ? 1 : 0) + (Row.shape == sem::ModuleShape::Pool ? 1 : 0);
}

// The sizes of a library module's output (its TT_MODULE row) on input sizes
// Sz: Linear maps [*, in] to [*, out], Embedding [*] to [*, dim];
// convolutions and pooling keep the rank and leading dims. False: unknown.
bool LayoutAnalysis::Impl::moduleOutputSizes(const sem::ModuleInfo &Row, const CallExpr *Call,
                                             Shape &Sz) {
  using S = sem::ModuleShape;
  switch (Row.shape) {
  case S::Same:
    return true;
  case S::Linear:
    Sz.back() = ST.sym(Call, (std::int64_t)Sz.size());
    return true;
  case S::Embedding:
    Sz.push_back(ST.sym(Call, (std::int64_t)Sz.size()));
    return true;
  case S::Conv:
  case S::Pool:
    if (std::optional<size_t> Kept = keptLeadingDims(Row, Sz.size())) {
      for (size_t I = *Kept; I < Sz.size(); ++I)
        Sz[I] = ST.sym(Call, (std::int64_t)I);
      return true;
    }
    return false;
  case S::Other:
    return false;
  }
  return false;
}

// F, the output of a library module on input In, where its row makes it a
// contiguous tensor of sizes that follow from In's.
void LayoutAnalysis::Impl::libraryModuleLayout(const sem::ModuleInfo &Row, const CallExpr *Call,
                                               const TensorFact &In, TensorFact &F) {
  bool Contiguous = Row.layout == sem::ModuleLayout::Contiguous ||
                    (Row.layout == sem::ModuleLayout::AsInput && In.Contig == TensorFact::Yes);
  if (!In.Sizes || In.Sizes->empty() || !Contiguous)
    return;
  Shape Sz = *In.Sizes;
  if (!moduleOutputSizes(Row, Call, Sz))
    return;
  setContiguous(F, Sz);
  F.Src = F.Root = Call;
}

// F, what a function of the TU returns, on the device its tensor arguments
// share when F's is only its inputs' default (the summary does not depend on
// the arguments: `scale(x)` returning `x.to(kFloat)` is on x's device).
TensorFact LayoutAnalysis::Impl::onArgsDevice(TensorFact F, const CallExpr *Call, State &S) {
  if (F.Device != TensorFact::AnyDevice && !F.DeviceAssumed)
    return F;
  const Expr *Shown = nullptr;
  TensorFact::DeviceKind D = TensorFact::AnyDevice;
  for (const Expr *A : Call->arguments()) {
    const Expr *T = Model.tensorOperand(A);
    TensorFact AF = T ? evalTensor(T, S) : unknownFact();
    if (AF.Device == TensorFact::AnyDevice || AF.DeviceAssumed)
      continue;
    if (Shown && AF.Device != D)
      return F; // arguments on two devices: the summary cannot say which
    Shown = T;
    D = AF.Device;
  }
  return onInputDevice(F, Shown, S);
}

// F, a module's output, on the device of its input T when F's own is not known.
TensorFact LayoutAnalysis::Impl::onInputDevice(TensorFact F, const Expr *T, State &S) {
  if (!T || (F.Device != TensorFact::AnyDevice && !F.DeviceAssumed))
    return F;
  TensorFact In = evalTensor(T, S);
  if (Recording)
    Facts[T] = In;
  F.Device = In.Device;
  F.DeviceAssumed = In.DeviceAssumed;
  F.DeviceRuntime = In.DeviceRuntime;
  F.DeviceIfAvailable = In.DeviceIfAvailable;
  if (In.DeviceAssumed)
    F.KindSource = In.KindSource;
  return F;
}


// The module call whose result (a plain struct) a tensor field ME is read
// from: the call itself, or a local initialised by it and never assigned.
const CallExpr *LayoutAnalysis::Impl::structResultOf(const MemberExpr *ME) {
  if (ME->isArrow() || !Model.isTensorStructField(ME->getMemberDecl()))
    return nullptr;
  const Expr *Base = ME->getBase()->IgnoreImplicit();
  const auto *DRE = dyn_cast<DeclRefExpr>(Base);
  const auto *V = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  if (!V)
    return moduleCallIn(Base);
  const Expr *Init = Locals.initializerOf(V);
  return Init ? moduleCallIn(Init) : nullptr;
}

// Element 0 of a recurrent module's output, E (Note [batch_first RNN outputs]
// in RnnModules.h), on an input not known to be unbatched: with batch_first a
// [B, T, H] transposed from [T, B, H], without it a fresh contiguous
// [T, B, H] (an input of unknown rank taken as batched, as nearly all are);
// otherwise the result of a call. On its input's device, as every module's
// output.
TensorFact LayoutAnalysis::Impl::rnnOutput(const Expr *E, const CallExpr *Rnn, State &S) {
  TensorFact F = assumedResult(E);
  const Expr *In = Model.tensorOperand(moduleInput(Rnn));
  TensorFact InF = In ? evalTensor(In, S) : unknownFact();
  std::optional<bool> BatchFirst = rnnBatchFirst(Rnn);
  if (BatchFirst && !(InF.Sizes && InF.Sizes->size() == 2)) {
    // Batch and time are the input's (`x.unsqueeze(1)`: one step, which the
    // transpose leaves viewable); the features are the module's.
    auto InSize = [&](std::int64_t D) { return sizeAt(InF, D).value_or(ST.sym(Rnn, D + 1)); };
    Shape Sz = {InSize(0), InSize(1), ST.sym(Rnn, 3)};
    F.AssumedSource.clear(); // sizes > 1 only: the message names the module
    F.Src = F.Root = Rnn;
    if (!*BatchFirst) {
      setContiguous(F, Sz);
      return onInputDevice(F, In, S);
    }
    setLayout(F, Sz, {Sz[2], ST.mul(Sz[0], Sz[2]), Mono::constant(1)});
    F.Origin = ("batch_first " + rnnKind(Rnn)).str();
    F.OriginLoc = Rnn->getExprLoc();
  }
  return onInputDevice(F, In, S);
}

// A callee's fact in this function: its symbols bound to the call's
// arguments where they stand for them (bindCalleeSymbol), else fresh for this
// call; its storage unknown, its defaults named as the callee's.
TensorFact LayoutAnalysis::Impl::importFact(const TensorFact &F, const CallExpr *Call,
                                            const FunctionDecl *FD, const SymTable &From,
                                            State &S) {
  TensorFact R = F;
  auto Bind = [&](const void *K, std::int64_t I) { return bindCalleeSymbol(Call, FD, K, I, S); };
  auto Import = [&](const std::optional<Shape> &Sh) -> std::optional<Shape> {
    if (!Sh)
      return std::nullopt;
    Shape Out;
    for (const Mono &M : *Sh)
      Out.push_back(ST.import(M, Call, From, Bind));
    return Out;
  };
  R.Sizes = Import(F.Sizes);
  R.Strides = Import(F.Strides);
  std::string In = " in '" + FD->getNameAsString() + "'";
  if (!R.AssumedSource.empty())
    R.AssumedSource += In;
  if (!R.KindSource.Text.empty())
    R.KindSource.Text += In;
  R.Src = Call;
  if (const Expr *Arg = F.Sizes ? nullptr : argumentOf(Call, FD, F.Src))
    if (!withArgumentSizes(R, F, evalTensor(Arg, S)))
      return unknownLike(R);
  R.Root = Call; // what the call returned: its views here share it
  R.SliceDim = -1;
  R.Lo = R.Hi = TensorFact::Bound();
  R.Broadcast = R.BroadcastAssumed = false;
  R.ExpandCall = nullptr;
  return R;
}

// R, a callee's result of unknown rank with its parameter's sizes (F.Src is
// the parameter), at a call given A: A's sizes. False when F's layout rests
// on the parameter's contiguity and A is not contiguous (a transposed
// argument): the default the callee was analysed with does not hold here.
bool LayoutAnalysis::Impl::withArgumentSizes(TensorFact &R, const TensorFact &F,
                                             const TensorFact &A) {
  if (F.Assumed && A.Contig == TensorFact::No)
    return false;
  if (F.Contig == TensorFact::Yes && F.SwapA < 0 && !F.UnitDims && A.Contig == TensorFact::Yes &&
      A.Sizes) {
    setContiguous(R, *A.Sizes);
    R.Assumed = A.Assumed;
  } else if (A.Src && !A.Sizes && A.SwapA < 0 && !A.UnitDims && A.NarrowDim < 0) {
    R.Src = A.Src;
  }
  return true;
}

// What the callee's symbol (K, I) is at this call (keys as evalInt and
// sizeAt make them): a size of a tensor parameter (K the parameter, I its
// dimension + 1) is the argument's; an integer parameter (I = 0) is the
// argument's value; a field of a struct parameter (`cfg.heads`: K the field,
// I the parameter) is the same field of the argument variable; a field of the
// object (`dim_`: I the context) is the caller's own when the call is on `this`.
std::optional<Mono> LayoutAnalysis::Impl::bindCalleeSymbol(const CallExpr *Call,
                                                           const FunctionDecl *FD, const void *K,
                                                           std::int64_t I, State &S) {
  if (I == (std::int64_t)(intptr_t)&Ctx) {
    const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
    bool OnThis = MC && isa<CXXThisExpr>(MC->getImplicitObjectArgument()->IgnoreParenImpCasts());
    return OnThis ? std::optional<Mono>(ST.sym(K, I)) : std::nullopt;
  }
  unsigned Shift = objectArgs(Call, FD);
  for (unsigned J = 0; J < FD->getNumParams() && J + Shift < Call->getNumArgs(); ++J) {
    const ParmVarDecl *P = FD->getParamDecl(J);
    const Expr *Arg = Call->getArg(J + Shift);
    if (I == (std::int64_t)(intptr_t)P) {
      const auto *DRE = dyn_cast<DeclRefExpr>(Arg->IgnoreParenImpCasts());
      return DRE ? std::optional<Mono>(ST.sym(K, (std::int64_t)(intptr_t)DRE->getDecl()))
                 : std::nullopt;
    }
    if (P != K)
      continue;
    if (I == 0 && P->getType()->isIntegerType())
      return evalInt(Arg, S);
    if (I > 0 && Model.isTensorExpr(Arg))
      return sizeAt(evalTensor(Arg, S), I - 1);
  }
  return std::nullopt;
}

void LayoutAnalysis::Impl::recordReturn(const ReturnStmt *RS, State &S) {
  const Expr *V = RS->getRetValue();
  if (!Recording || !V)
    return;
  if (!Model.isTensorExpr(V))
    return recordReturnedFields(V, S);
  TensorFact F = normalised(evalTensor(V, S));
  Returned = Returned ? layout::join(*Returned, F) : F;
}

// `return {logits, means, stds};` of a struct of tensors: each field's fact.
void LayoutAnalysis::Impl::recordReturnedFields(const Expr *V, State &S) {
  const auto *RD = Model.isTensorStruct(V->getType()) ? V->getType()->getAsCXXRecordDecl()
                                                      : nullptr;
  if (!RD)
    return;
  for (const FieldDecl *F : RD->fields()) {
    if (!Model.isTensorType(F->getType()))
      continue;
    std::optional<TensorFact> R = structField(V, F, S);
    TensorFact N = R ? normalised(*R) : unknownFact();
    auto [It, New] = ReturnedFields.try_emplace(F, N);
    if (!New)
      It->second = layout::join(It->second, N);
  }
}

// F with its sizes and strides in this table's normal form (for importers).
TensorFact LayoutAnalysis::Impl::normalised(TensorFact F) const {
  for (std::optional<Shape> *Sh : {&F.Sizes, &F.Strides})
    if (*Sh)
      for (Mono &M : **Sh)
        M = ST.norm(M);
  return F;
}

// Field F of a struct-valued E: its braced initialiser, the tracked field of
// a local, what the call that initialised the local returns in F, or what a
// callee returns in F; none when none of these says.
std::optional<TensorFact> LayoutAnalysis::Impl::structField(const Expr *E, const FieldDecl *F,
                                                            State &S, int Depth) {
  E = stripHandle(E); // `Out{a, b}`, copies and temporaries
  if (!E || Depth > 4)
    return std::nullopt;
  // A local's braced initialiser was evaluated where it stood, not here.
  if (const auto *IL = dyn_cast<InitListExpr>(E); IL && !Depth) {
    const unsigned I = F->getFieldIndex();
    if (I < IL->getNumInits() && Model.isTensorExpr(IL->getInit(I)))
      return evalTensor(IL->getInit(I), S);
    return std::nullopt;
  }
  if (const VarDecl *V = varOf(E)) {
    if (!V->isLocalVarDecl() || V->getType()->isReferenceType() || Untracked.count(V))
      return std::nullopt;
    if (auto It = S.L.find({V, F}); It != S.L.end())
      return It->second;
    const Expr *Init = Locals.initializerOf(V);
    return Init ? structField(Init, F, S, Depth + 1) : std::nullopt;
  }
  if (const auto *Call = dyn_cast<CallExpr>(E))
    return calleeField(Call, F, S);
  return std::nullopt;
}

// Field F of the struct a function of the TU returns, when its layout says
// more than the defaults (a view, a batch_first LSTM's output).
std::optional<TensorFact> LayoutAnalysis::Impl::calleeField(const CallExpr *Call,
                                                            const FieldDecl *F, State &S) {
  const FunctionDecl *Def = readableBodyOf(Call);
  const LayoutAnalysis *L = Callees && Def ? Callees(Def) : nullptr;
  const TensorFact *R = L ? L->returnFieldFact(F) : nullptr;
  if (!R || (R->Contig != TensorFact::No && !R->Sizes))
    return std::nullopt;
  return importFact(*R, Call, Def, L->symbols(), S);
}

std::optional<Mono> LayoutAnalysis::Impl::evalSizeQuery(const Expr *E, State &S) {
  // t.size(d), t.sizes()[d], t.numel(), t.dim()
  const Expr *Obj = nullptr, *Idx = nullptr;
  llvm::StringRef What;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
    // LibTorch declares size()/sizes()/dim() on TensorBase: look through the
    // derived-to-base cast.
    const auto *MD = MC->getMethodDecl();
    const Expr *O = MC->getImplicitObjectArgument();
    O = O ? O->IgnoreParenImpCasts() : nullptr;
    if (!MD || !MD->getIdentifier() || !Model.isTensorExpr(O))
      return std::nullopt;
    What = MD->getName();
    Obj = O;
    Idx = MC->getNumArgs() >= 1 ? MC->getArg(0) : nullptr;
  } else if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E);
             OC && OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2) {
    const auto *In = dyn_cast<CXXMemberCallExpr>(OC->getArg(0)->IgnoreParenImpCasts());
    const Expr *O = In ? In->getImplicitObjectArgument() : nullptr;
    O = O ? O->IgnoreParenImpCasts() : nullptr;
    if (!In || !In->getMethodDecl() || !In->getMethodDecl()->getIdentifier() ||
        In->getMethodDecl()->getName() != "sizes" || !Model.isTensorExpr(O))
      return std::nullopt;
    What = "size";
    Obj = O;
    Idx = OC->getArg(1);
  }
  if (!Obj)
    return std::nullopt;
  TensorFact F = evalTensor(Obj, S);
  if (What == "size" && Idx) {
    return sizeAt(F, constInt(Idx, Ctx));
  } else if (What == "numel" && F.Sizes) {
    return ST.product(*F.Sizes);
  } else if (What == "dim" && F.Sizes) {
    return Mono::constant((std::int64_t)F.Sizes->size());
  }
  return std::nullopt;
}

// Size D of a tensor with fact F: its known size, else its source's symbol.
std::optional<Mono> LayoutAnalysis::Impl::sizeAt(const TensorFact &F,
                                                 std::optional<std::int64_t> D) {
  if (F.Sizes) {
    if (auto N = normDim(D, F.Sizes->size()))
      return (*F.Sizes)[*N];
  } else if (D && F.NarrowDim >= 0 && *D == F.NarrowDim) {
    return F.NarrowLen;
  } else if (D && *D >= 0) {
    std::int64_t K = *D == F.SwapA ? F.SwapB : *D == F.SwapB ? F.SwapA : *D;
    if (K < 32 && (F.UnitDims >> K) & 1)
      return Mono::constant(1); // `x.unsqueeze(1).size(1)`, whatever x's sizes
    if (F.Src)
      return ST.sym(F.Src, K + 1);
  } else if (D == -1 && F.Src && F.SwapA < 0 && F.NarrowDim < 0) {
    return ST.sym(F.Src, kLastDim); // named by rank in decideUnknownRank
  }
  return std::nullopt;
}

Mono LayoutAnalysis::Impl::evalInt(const Expr *E, State &S) {
  if (!E)
    return ST.sym(nullptr, 0);
  E = E->IgnoreParenCasts();
  if (auto V = constInt(E, Ctx))
    return Mono::constant(*V);
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
      if (auto It = S.I.find(VD); It != S.I.end())
        return It->second;
    return ST.sym(DRE->getDecl(), 0);
  }
  if (const auto *BO = dyn_cast<BinaryOperator>(E)) {
    if (BO->getOpcode() == BO_Mul)
      return ST.mul(evalInt(BO->getLHS(), S), evalInt(BO->getRHS(), S));
    if (BO->getOpcode() == BO_Div)
      return ST.divSize(evalInt(BO->getLHS(), S), evalInt(BO->getRHS(), S), E);
    return ST.sym(E, 0);
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    // A field read (`cfg.n_head`, `hidden_`): the same symbol throughout.
    const Expr *Base = ME->getBase()->IgnoreParenImpCasts();
    const void *BaseKey = nullptr;
    if (const auto *BD = dyn_cast<DeclRefExpr>(Base))
      BaseKey = BD->getDecl();
    else if (isa<CXXThisExpr>(Base))
      BaseKey = &Ctx;
    if (BaseKey)
      return ST.sym(ME->getMemberDecl(), (std::int64_t)(intptr_t)BaseKey);
    return ST.sym(E, 0);
  }
  if (auto M = evalSizeQuery(E, S))
    return *M;
  return ST.sym(E, 0);
}

std::optional<ShapeArg> LayoutAnalysis::Impl::shapeArg(const Expr *E, State &S, bool Expand) {
  llvm::SmallVector<const Expr *, 4> Elts;
  if (!intList(E, Elts))
    return std::nullopt;
  ShapeArg R;
  for (const Expr *X : Elts) {
    Mono M = evalInt(X, S);
    if (M.isConst(-1)) {
      if (R.Infer >= 0 && !Expand) // expand's -1s keep sizes: any number of them
        return std::nullopt;
      R.Infer = (int)R.Sizes.size();
    } else if (M.isConst() && M.Num < 0) {
      return std::nullopt;
    }
    R.Sizes.push_back(M);
  }
  return R;
}

// The new shape with its -1 worked out from Self's sizes (a fresh symbol
// when they are unknown).
std::optional<Shape> LayoutAnalysis::Impl::inferShape(const ShapeArg &A, const TensorFact &Self,
                                                      const void *Key) {
  Shape R = A.Sizes;
  if (A.Infer < 0)
    return R;
  Mono Rest = Mono::constant(1);
  for (size_t I = 0; I < R.size(); ++I)
    if ((int)I != A.Infer)
      Rest = ST.mul(Rest, R[I]);
  R[A.Infer] =
      Self.Sizes ? ST.divSize(ST.product(*Self.Sizes), Rest, Key) : ST.sym(Key, 1000 + A.Infer);
  return R;
}

//===----------------------------------------------------------------------===//
// Flow
//===----------------------------------------------------------------------===//

// Facts of the keys both paths have, joined; the others dropped. Keep, when
// given, names a variable's or field's fact after its sizes (keepRank).
template <typename Key, typename KeepFn>
static void joinFacts(llvm::DenseMap<Key, TensorFact> &Into,
                      const llvm::DenseMap<Key, TensorFact> &From, KeepFn Keep) {
  llvm::SmallVector<Key, 8> Drop;
  for (auto &[K, F] : Into) {
    auto It = From.find(K);
    if (It == From.end()) {
      Drop.push_back(K);
      continue;
    }
    TensorFact J = layout::join(F, It->second);
    Keep(J, F, It->second, K);
    F = std::move(J);
  }
  for (Key K : Drop)
    Into.erase(K);
}

// Note [rank across a join]
// A variable holding contiguous tensors of one rank but other sizes on two
// paths (`k = torch::cat({cache_k, k}, 2)` on one) keeps the rank: each dim
// the paths disagree on becomes a run-time size of its own, named after the
// variable (so the fixpoint is reached: the next join names it the same).
// A size 1 on either path is not generalised (decoding one token). Where
// the ranks differ or one is unknown, a contiguous value keeps an identity of
// its own for its sizes, so a later permute or view names the rank afresh
// (`audio = torch::randn({B, C, T})`, then `audio = conv(...)` in a loop).
void LayoutAnalysis::Impl::keepRank(TensorFact &R, const TensorFact &A, const TensorFact &B,
                                    const void *Key) {
  if (R.Sizes || A.Contig != TensorFact::Yes || B.Contig != TensorFact::Yes)
    return;
  if (!A.Sizes || !B.Sizes || A.Sizes->size() != B.Sizes->size()) {
    if (!R.Src && A.SwapA < 0 && B.SwapA < 0 && !A.UnitDims && !B.UnitDims)
      R.Src = Key;
    return;
  }
  Shape Sz;
  for (size_t I = 0; I < A.Sizes->size(); ++I) {
    const Mono &X = (*A.Sizes)[I], &Y = (*B.Sizes)[I];
    if (X.Top || Y.Top || (X != Y && (X.isConst(1) || Y.isConst(1))))
      return;
    Sz.push_back(X == Y ? X : ST.sym(Key, 2000 + (std::int64_t)I));
  }
  setContiguous(R, Sz);
}

bool LayoutAnalysis::Impl::join(State &Into, const State &From) {
  State Old = Into;
  auto Keep = [this](TensorFact &R, const TensorFact &A, const TensorFact &B, const void *K) {
    keepRank(R, A, B, K);
  };
  joinFacts(Into.T, From.T, Keep);
  joinFacts(Into.M, From.M, Keep);
  joinFacts(Into.L, From.L, [](TensorFact &, const TensorFact &, const TensorFact &, auto) {});
  llvm::SmallVector<const VarDecl *, 8> Drop;
  for (auto &[V, M] : Into.I) {
    auto It = From.I.find(V);
    if (It == From.I.end() || It->second != M)
      Drop.push_back(V);
  }
  for (const VarDecl *V : Drop)
    Into.I.erase(V);
  return !(Old == Into);
}

void LayoutAnalysis::Impl::prescan(const Stmt *St) {
  if (!St)
    return;
  auto Mark = [&](const Expr *E) {
    if (const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? E->IgnoreParenImpCasts() : nullptr))
      if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
        Untracked.insert(VD);
  };
  if (const auto *UO = dyn_cast<UnaryOperator>(St); UO && UO->getOpcode() == UO_AddrOf)
    Mark(UO->getSubExpr());
  if (const auto *L = dyn_cast<LambdaExpr>(St)) {
    for (const LambdaCapture &C : L->captures())
      if (C.capturesVariable() && C.getCaptureKind() == LCK_ByRef)
        if (const auto *VD = dyn_cast<VarDecl>(C.getCapturedVar()))
          Untracked.insert(VD);
    return; // the body is analysed on its own
  }
  if (const auto *RF = dyn_cast<CXXForRangeStmt>(St)) {
    const auto *R = dyn_cast<DeclRefExpr>(RF->getRangeInit()->IgnoreParenImpCasts());
    const auto *P = R ? dyn_cast<ParmVarDecl>(R->getDecl()) : nullptr;
    const VarDecl *LV = RF->getLoopVariable();
    if (P && Model.isTensorVectorType(P->getType().getNonReferenceType()) &&
        Model.isTensorType(LV->getType().getNonReferenceType()) &&
        (!LV->getType()->isReferenceType() ||
         LV->getType().getNonReferenceType().isConstQualified()))
      InputElements.insert(LV);
  }
  if (const auto *DS = dyn_cast<DeclStmt>(St))
    for (const Decl *D : DS->decls())
      if (const auto *VD = dyn_cast<VarDecl>(D); VD && VD->getType()->isReferenceType()) {
        Mark(VD->getInit());
        if (const auto *ME = dyn_cast_or_null<MemberExpr>(
                VD->getInit() ? stripHandle(VD->getInit()) : nullptr)) // `auto &t = b.x;`
          Mark(ME->getBase());
      }
  for (const Stmt *C : St->children())
    prescan(C);
}

void LayoutAnalysis::Impl::assignTensor(const VarDecl *V, const Expr *Init, State &S) {
  if (Untracked.count(V))
    return;
  if (Init)
    S.T[V] = evalTensor(Init, S);
  else
    S.T.erase(V);
}

void LayoutAnalysis::Impl::transfer(const Stmt *St, State &S) {
  if (const auto *DS = dyn_cast<DeclStmt>(St)) {
    for (const Decl *D : DS->decls()) {
      const auto *VD = dyn_cast<VarDecl>(D);
      if (VD && InputElements.count(VD)) {
        S.T[VD] = assumedInput(VD, "'" + VD->getName().str() + "'", VD->getName());
        continue;
      }
      if (!VD || VD->getType()->isReferenceType())
        continue;
      forgetFields(S, VD); // declared anew (each iteration of a loop body)
      initFields(VD, S);
      if (Model.isTensorType(VD->getType()))
        assignTensor(VD, VD->getInit(), S);
      else if (VD->getType()->isIntegerType() && !Untracked.count(VD) && VD->getInit())
        S.I[VD] = evalInt(VD->getInit(), S);
      else
        S.I.erase(VD);
    }
    return;
  }
  if (const auto *E = dyn_cast<Expr>(St); E && E->getBeginLoc().isMacroID())
    assertionFacts(E, S);
  if (const auto *BO = dyn_cast<BinaryOperator>(St)) {
    const VarDecl *V = BO->isAssignmentOp() ? varOf(BO->getLHS()) : nullptr;
    if (!V || !V->getType()->isIntegerType() || Untracked.count(V))
      return;
    if (BO->getOpcode() == BO_Assign)
      S.I[V] = evalInt(BO->getRHS(), S);
    else if (BO->getOpcode() == BO_MulAssign && S.I.count(V))
      S.I[V] = ST.mul(S.I[V], evalInt(BO->getRHS(), S));
    else
      S.I.erase(V);
    return;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(St)) {
    if (UO->isIncrementDecrementOp())
      if (const VarDecl *V = varOf(UO->getSubExpr()))
        S.I.erase(V);
    return;
  }
  if (const auto *Call = dyn_cast<CallExpr>(St))
    transferCall(Call, S);
  else if (const auto *RS = dyn_cast<ReturnStmt>(St))
    recordReturn(RS, S);
}

// The object `x` of `x.name()` (looking through implicit nodes), and name.
static const Expr *queriedObject(const Expr *E, llvm::StringRef &Name) {
  const auto *MC = dyn_cast<CXXMemberCallExpr>(E->IgnoreParenImpCasts());
  if (!MC || !MC->getMethodDecl() || !MC->getMethodDecl()->getIdentifier())
    return nullptr;
  Name = MC->getMethodDecl()->getName();
  return MC->getImplicitObjectArgument();
}

// `x.scalar_type() == kX` or `x.dtype() == kX`, either way round: x and kX.
static std::pair<const Expr *, DTypeName> dtypeTest(const Expr *E) {
  const Expr *L = nullptr, *R = nullptr;
  if (const auto *BO = dyn_cast<BinaryOperator>(E); BO && BO->getOpcode() == BO_EQ)
    std::tie(L, R) = std::pair(BO->getLHS(), BO->getRHS());
  // `x.dtype() == torch::kFloat`: TypeMeta's operator== with a ScalarType.
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E);
      OC && OC->getOperator() == OO_EqualEqual && OC->getNumArgs() == 2)
    std::tie(L, R) = std::pair(OC->getArg(0), OC->getArg(1));
  if (!L)
    return {};
  for (auto [Q, D] : {std::pair(L, R), std::pair(R, L)}) {
    llvm::StringRef Name;
    if (const Expr *Obj = queriedObject(Q, Name); Obj && (Name == "scalar_type" || Name == "dtype"))
      return {Obj, dtypeIn(D)};
  }
  return {};
}

// E is a condition of an assertion macro (TORCH_CHECK, TORCH_INTERNAL_ASSERT,
// AT_ASSERT, assert) that must hold for the code after it to run: its own
// argument, or a conjunct of it, not negated by the user.
bool LayoutAnalysis::Impl::isAsserted(const Expr *E) const {
  const SourceManager &SM = Ctx.getSourceManager();
  SourceLocation L = E->getBeginLoc();
  if (!L.isMacroID() || !SM.isMacroArgExpansion(L))
    return false;
  Token Tok;
  if (Lexer::getRawToken(SM.getExpansionLoc(L), Tok, SM, Ctx.getLangOpts()) ||
      !Tok.is(tok::raw_identifier) ||
      !llvm::is_contained(
          {"TORCH_CHECK", "TORCH_INTERNAL_ASSERT", "AT_ASSERT", "AT_ASSERTM", "assert"},
          Tok.getRawIdentifier()))
    return false;
  // Up to the macro's own code: only parentheses, casts and && in between.
  const Stmt *Cur = E;
  for (int I = 0; I < 16; ++I) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    if (Ps.empty()) // outside the traversal scope: a negation could not be seen
      return false;
    const auto *P = Ps[0].get<Expr>();
    // The user's condition is spelled in the user's file, the macro's code
    // in its header.
    if (!P ||
        SM.getFileID(SM.getSpellingLoc(P->getBeginLoc())) != SM.getFileID(SM.getSpellingLoc(L)))
      return true; // reached the macro's code
    const auto *BO = dyn_cast<BinaryOperator>(P);
    if (!isa<ParenExpr, ImplicitCastExpr, ExprWithCleanups>(P) &&
        !(BO && BO->getOpcode() == BO_LAnd))
      return false;
    Cur = P;
  }
  return false;
}

// `this->f`'s dtype, where S asserts `f.scalar_type() == kX` (or `dtype()`).
DTypeName LayoutAnalysis::Impl::assertedDTypeIn(const Stmt *S, const FieldDecl *F) const {
  if (!S || isa<LambdaExpr>(S))
    return {};
  if (const auto *E = dyn_cast<Expr>(S))
    if (auto [Obj, DT] = dtypeTest(E); DT.Size && ownMember(Obj) == F && isAsserted(E))
      return DT;
  for (const Stmt *C : S->children())
    if (DTypeName DT = assertedDTypeIn(C, F); DT.Size)
      return DT;
  return {};
}

// F's dtype as its class keeps it: asserted by every constructor (the class's
// invariant, `TORCH_CHECK(images_.scalar_type() == torch::kByte)` in a
// dataset's), or else the one every value given F is made with (madeDType).
DTypeName LayoutAnalysis::Impl::fieldDType(const FieldDecl *F) {
  auto &FieldDTypes = classes().FieldDTypes;
  if (auto It = FieldDTypes.find(F); It != FieldDTypes.end())
    return It->second;
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (!RD || RD->ctors().empty())
    return FieldDTypes[F] = madeDType(F);
  DTypeName Found;
  bool All = true;
  for (const CXXConstructorDecl *C : RD->ctors()) {
    if (C->isCopyOrMoveConstructor() && C->isImplicit())
      continue; // a copy keeps the invariant
    const FunctionDecl *Def = nullptr;
    DTypeName DT = C->hasBody(Def) ? assertedDTypeIn(Def->getBody(), F) : DTypeName();
    All = All && DT.Size && (!Found.Size || DT.Name == Found.Name);
    Found = DT;
  }
  return FieldDTypes[F] = All && Found.Size ? Found : madeDType(F);
}

// The dtype every value F's class gives F is made with, when each is a
// factory naming one (`stats_ = torch::zeros({R, 5}, torch::kLong)`).
// `torch::zeros({n, d})`, `torch::full({n}, 0.5)`: a float factory given its
// sizes (and fill) only, so of the default dtype, float32.
static bool plainDefaultFactory(const CallExpr *Call, llvm::StringRef Name) {
  unsigned Given = llvm::count_if(Call->arguments(),
                                  [](const Expr *A) { return !isa<CXXDefaultArgExpr>(A); });
  if (Name == "full")
    return Given == 2 && Call->getArg(1)->IgnoreImpCasts()->getType()->isFloatingType();
  return Given == 1 && llvm::is_contained({"zeros", "ones", "empty", "rand", "randn"}, Name);
}

// The call that made a member's value: through `register_buffer(name, v)`
// and through methods whose result has self's dtype given integers or a
// device only (`ones({n, n}, kBool).triu(1)`, `.to(device)`).
const CallExpr *LayoutAnalysis::Impl::madeBy(const Expr *V) const {
  const auto *Call = dyn_cast_or_null<CallExpr>(stripHandle(V));
  for (unsigned Hops = 0; Call && Hops < 8; ++Hops) {
    const FunctionDecl *FD = Call->getDirectCallee();
    StringRef N = FD && FD->getIdentifier() ? FD->getName() : "";
    const Expr *Next = nullptr;
    const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
    if ((N == "register_buffer" || N == "register_parameter") && Call->getNumArgs() >= 2) {
      Next = Call->getArg(1);
    } else if (MC && isTensorApi(FD) && Model.isTensorExpr(MC->getImplicitObjectArgument())) {
      sem::ResultDType Rule = sem::resultDType(Model.rowName(Call, N));
      bool Plain = llvm::all_of(Call->arguments(), [](const Expr *A) {
        // `to(device)` converts the device to options.
        const auto *CE = dyn_cast<CXXConstructExpr>(stripHandle(A)->IgnoreImplicit());
        if (CE && CE->getNumArgs() == 1 && isTensorOptionsType(CE->getType()))
          A = CE->getArg(0);
        QualType T = A->getType().getNonReferenceType();
        return isa<CXXDefaultArgExpr>(A) || T->isIntegralOrEnumerationType() ||
               (isDeviceLikeType(T) && !isTensorOptionsType(T));
      });
      if ((Rule == sem::ResultDType::Self || Rule == sem::ResultDType::Own) && Plain)
        Next = MC->getImplicitObjectArgument();
    }
    if (!Next)
      break;
    Call = dyn_cast<CallExpr>(stripHandle(Next));
  }
  return Call;
}

DTypeName LayoutAnalysis::Impl::madeDType(const FieldDecl *F) {
  DTypeName Found;
  llvm::SmallVector<const Expr *, 4> Values = valuesOfField(F);
  if (classes().Sites && !classes().Sites->addFieldWrites(F, Values))
    return {};
  for (const Expr *V : Values) {
    const CallExpr *Call = madeBy(V);
    const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
    const sem::OpInfo *Op = FD && FD->getIdentifier() && isTensorApi(FD)
                                ? sem::lookup(Model.rowName(Call, FD->getName()))
                                : nullptr;
    DTypeName DT = Op && Op->storage == sem::Storage::Factory && Op->layout != sem::Layout::Same
                       ? factoryDType(Call)
                       : DTypeName();
    if (Op && !DT.Size && plainDefaultFactory(Call, Op->name))
      DT = {"Float", 4}; // `obs_(torch::zeros({cap, dim}))`, as factory() takes a local's
    if (!DT.Size || (Found.Size && DT.Name != Found.Name))
      return {};
    Found = DT;
  }
  return Found;
}

DTypeName LayoutAnalysis::Impl::factoryDType(const CallExpr *Call) {
  if (DTypeName D = dtypeIn(Call); D.Size)
    return D;
  for (const Expr *A : Call->arguments()) {
    const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(A));
    const auto *V = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
    if (!V || !isTensorOptionsType(V->getType()))
      continue;
    if (const Expr *Init = Locals.initializerOf(V))
      return dtypeIn(Init);
  }
  return {};
}

// Facts an assertion establishes: the dtype of `x.scalar_type() == kX`,
// `x.is_contiguous()`, `x.is_cuda()`.
void LayoutAnalysis::Impl::assertionFacts(const Expr *E, State &S) {
  // `a && b` is a statement of its own where both paths meet: each conjunct
  // holds there (its own statement's fact was lost at the join).
  if (const auto *BO = dyn_cast<BinaryOperator>(E->IgnoreParens());
      BO && BO->getOpcode() == BO_LAnd) {
    assertionFacts(BO->getLHS(), S);
    assertionFacts(BO->getRHS(), S);
    return;
  }
  llvm::StringRef Name;
  auto [Obj, DT] = dtypeTest(E);
  if (!Obj)
    Obj = queriedObject(E, Name);
  const VarDecl *V = Obj ? varOf(Obj) : nullptr;
  if (!V || !Model.isTensorType(V->getType()) || Untracked.count(V) || !isAsserted(E))
    return;
  TensorFact F = evalVar(V, nullptr, S);
  if (DT.Size) {
    F.DType = DT.Name;
    F.ElemSize = DT.Size;
    F.DTypeAssumed = false;
  } else if (Name == "is_contiguous" && F.Contig != TensorFact::Yes) {
    F.Contig = TensorFact::Yes;
    F.Assumed = false;
    F.Origin.clear();
  } else if (Name == "is_cuda") {
    F.Device = TensorFact::Accelerator;
    F.DeviceAssumed = false;
  } else {
    return;
  }
  S.T[V] = F;
}

void LayoutAnalysis::Impl::transferCall(const CallExpr *Call, State &S) {
  if (Recording && Model.isTensorExpr(Call))
    (void)evalTensor(Call, S);
  if (Recording) {
    recordWrite(Call, S);
    // tensors passed to any call (`model->forward(x)`), before the call
    for (const Expr *A : Call->arguments())
      if (const Expr *T = Model.tensorOperand(A); T && !Facts.count(T))
        Facts[T] = evalTensor(T, S);
  }
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
      OC && OC->getOperator() == OO_Equal && OC->getNumArgs() == 2) {
    const VarDecl *V = varOf(OC->getArg(0));
    if (V && Model.isTensorType(V->getType()) &&
        isa<DeclRefExpr>(OC->getArg(0)->IgnoreParenImpCasts())) {
      assignTensor(V, OC->getArg(1), S);
      return;
    }
    if (const FieldDecl *F = thisMember(OC->getArg(0))) {
      TensorFact V = evalTensor(OC->getArg(1), S);
      S.M[F] = V;
      return;
    }
    if (auto K = localField(OC->getArg(0))) {
      TensorFact V = evalTensor(OC->getArg(1), S);
      S.L[*K] = V;
      return;
    }
    if (const VarDecl *V = varOf(OC->getArg(0))) // `b = next_batch()`: every field anew
      forgetFields(S, V);
  }
  if (mayAssignMembers(Call))
    S.M.clear();
  const FunctionDecl *FD = Call->getDirectCallee();
  // In-place ops that change the layout (TT_RESHAPES_SELF: t_, resize_,
  // set_...) and swap: forget the handle.
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call)) {
    const VarDecl *V = varOf(MC->getImplicitObjectArgument());
    StringRef N = FD && FD->getIdentifier() ? FD->getName() : "";
    bool Relayouts = (sem::isInPlaceName(N) && !sem::inPlaceKeepsLayout(N)) || N == "swap";
    if (V && Relayouts && Model.isTensorType(V->getType()))
      S.T.erase(V);
    if (const FieldDecl *F = thisMember(MC->getImplicitObjectArgument());
        F && !N.empty() && !sem::inPlaceKeepsLayout(N))
      S.M.erase(F);
    if (auto K = localField(MC->getImplicitObjectArgument()); K && Relayouts)
      S.L.erase(*K);
    if (V && !Model.isTensorType(V->getType())) // a method of the struct itself
      forgetFields(S, V);
  }
  forgetWrittenArgs(Call, S);
}

// An in-place write: the facts of the written tensor and of its tensor
// inputs, for the checks of writes into expanded or overlapping memory.
void LayoutAnalysis::Impl::recordWrite(const CallExpr *Call, State &S) {
  const Expr *Target = Model.inPlaceTarget(Call);
  if (!Target)
    return;
  // Evaluate first: evaluation records nested facts and may grow the map.
  TensorFact Out = evalTensor(Target, S);
  Facts[Target] = std::move(Out);
  for (const Expr *A : Call->arguments()) {
    const Expr *T = Model.tensorOperand(A);
    if (!T || A == Target)
      continue;
    TensorFact In = evalTensor(T, S);
    Facts[T] = std::move(In);
  }
}

// Arguments bound to non-const references (or moved from) may change.
void LayoutAnalysis::Impl::forgetWrittenArgs(const CallExpr *Call, State &S) {
  const FunctionDecl *FD = Call->getDirectCallee();
  // A module holder's call operator forwards (`Args&&`) to forward(), whose
  // tensor parameters are inputs.
  if (!FD || isModuleCall(Call))
    return;
  unsigned Shift = objectArgs(Call, FD);
  for (unsigned I = Shift; I < Call->getNumArgs() && I - Shift < FD->getNumParams(); ++I) {
    const VarDecl *V = varOf(Call->getArg(I));
    QualType PT = FD->getParamDecl(I - Shift)->getType();
    bool Writable = PT->isReferenceType() &&
                    (!PT->getPointeeType().isConstQualified() || PT->isRValueReferenceType());
    if (V && Writable) {
      S.T.erase(V);
      S.I.erase(V);
      forgetFields(S, V);
    }
    if (auto K = localField(Call->getArg(I)); K && Writable)
      S.L.erase(*K);
    if (const FieldDecl *F = thisMember(Call->getArg(I)); F && Writable)
      S.M.erase(F);
  }
}

// A tensor parameter: an input taken as contiguous, of the rank, device and
// dtype its callers show (sizes its own symbols, as `p.size(d)` names them,
// or their constants).
TensorFact LayoutAnalysis::Impl::paramFact(const ParmVarDecl *P) {
  TensorFact F = assumedInput(P, "'" + P->getName().str() + "'", P->getName());
  auto It = Params.find(P);
  if (It == Params.end())
    return F;
  const ParamFact &C = It->second;
  if (C.Sizes) {
    Shape Sz;
    for (auto [D, N] : llvm::enumerate(*C.Sizes))
      Sz.push_back(N ? Mono::constant(*N) : ST.sym(P, std::int64_t(D) + 1));
    setContiguous(F, Sz);
  }
  if (C.Device != TensorFact::AnyDevice) {
    F.Device = C.Device;
    F.DeviceAssumed = false;
    F.DeviceRuntime = C.DeviceRuntime;
    F.DeviceIfAvailable = C.DeviceIfAvailable;
  }
  if (!C.DType.empty()) {
    F.DType = C.DType;
    F.ElemSize = C.ElemSize;
    F.DTypeAssumed = false;
  }
  return F;
}

void LayoutAnalysis::Impl::run(const FunctionDecl *FD) {
  Stmt *Body = FD->getBody();
  if (!Body)
    return;
  Fn = FD;
  prescan(Body);
  CFG::BuildOptions Opts;
  Opts.setAllAlwaysAdd();
  std::unique_ptr<CFG> G = CFG::buildCFG(FD, Body, &Ctx, Opts);
  if (!G)
    return;
  State Entry;
  for (const ParmVarDecl *P : FD->parameters()) {
    if (Untracked.count(P))
      continue;
    if (Model.isTensorType(P->getType()))
      Entry.T[P] = paramFact(P);
    else if (P->getType()->isIntegerType())
      Entry.I[P] = ST.sym(P, 0);
  }
  ForwardDataflow<Impl> Flow(*G, *this);
  if (!Flow.solve(std::move(Entry)))
    return;
  // Record what the checks ask about, at the fixpoint.
  Recording = true;
  Flow.replay([](const CFGBlock &, unsigned, const Stmt *, State &) {});
  Recording = false;
}

LayoutAnalysis::LayoutAnalysis(const TensorModel &Model, ASTContext &Ctx)
    : P(std::make_unique<Impl>(Model, Ctx)) {}
LayoutAnalysis::~LayoutAnalysis() = default;

void LayoutAnalysis::run(const FunctionDecl *FD) { P->run(FD); }
void LayoutAnalysis::setCallees(CalleeFn F) { P->Callees = std::move(F); }
void LayoutAnalysis::setDeviceVars(DeviceFacts *D) { P->DeviceVars = D; }
void LayoutAnalysis::setClassFacts(LayoutClassFacts *C) { P->Classes = C; }
void LayoutAnalysis::setParamFacts(ParamFacts S) { P->Params = std::move(S); }
const std::optional<TensorFact> &LayoutAnalysis::returnFact() const { return P->Returned; }
const TensorFact *LayoutAnalysis::returnFieldFact(const FieldDecl *F) const {
  auto It = P->ReturnedFields.find(F);
  return It == P->ReturnedFields.end() ? nullptr : &It->second;
}
const SymTable &LayoutAnalysis::symbols() const { return P->ST; }

const TensorFact *LayoutAnalysis::factOf(const Expr *E) const {
  auto It = P->Facts.find(E);
  return It == P->Facts.end() ? nullptr : &It->second;
}

const ViewQuery *LayoutAnalysis::queryOf(const CallExpr *Call) const {
  auto It = P->Queries.find(Call);
  return It == P->Queries.end() ? nullptr : &It->second;
}

const ConversionQuery *LayoutAnalysis::conversionOf(const CallExpr *Call) const {
  auto It = P->Conversions.find(Call);
  return It == P->Conversions.end() ? nullptr : &It->second;
}

std::string LayoutAnalysis::formatShape(llvm::ArrayRef<Mono> Sizes) {
  std::string R = "[";
  for (size_t I = 0; I < Sizes.size(); ++I) {
    if (!Sizes[I].isConst())
      return "";
    R += (I ? ", " : "") + std::to_string(Sizes[I].Num);
  }
  return R + "]";
}

std::string LayoutAnalysis::assumption(const ViewQuery &Q) {
  bool Contiguous = Q.Input.Assumed && !Q.Input.AssumedSource.empty();
  if (!Q.MinRank)
    return assumption(Q.Input);
  std::string Rank = std::to_string(Q.MinRank) + " or more dimensions: with fewer, the new "
                                                  "shape is its own)";
  if (!Contiguous)
    return " (assuming the input has " + Rank;
  return " (assuming " + Q.Input.AssumedSource + " is contiguous, as nearly all tensors are, " +
         "and has " + Rank;
}

std::string LayoutAnalysis::assumption(const TensorFact &F) {
  if (!F.Assumed || F.AssumedSource.empty())
    return "";
  return " (assuming " + F.AssumedSource + " is contiguous, as nearly all tensors are)";
}

std::optional<std::int64_t> LayoutAnalysis::bytesOf(const TensorFact &F) {
  if (!F.Sizes || !F.ElemSize || !llvm::all_of(*F.Sizes, [](const Mono &M) { return M.isConst(); }))
    return std::nullopt;
  std::int64_t N = F.ElemSize;
  for (const Mono &M : *F.Sizes)
    N *= M.Num;
  return N;
}

std::string LayoutAnalysis::formatBytes(std::int64_t Bytes) {
  char Buf[64];
  if (Bytes < 1024)
    std::snprintf(Buf, sizeof Buf, "%" PRId64 " bytes", Bytes);
  else if (Bytes < (1 << 20))
    std::snprintf(Buf, sizeof Buf, "%.1f KiB", Bytes / 1024.0);
  else if (Bytes < (1LL << 30))
    std::snprintf(Buf, sizeof Buf, "%.1f MiB", Bytes / 1048576.0);
  else
    std::snprintf(Buf, sizeof Buf, "%.1f GiB", Bytes / 1073741824.0);
  return Buf;
}

} // namespace clang::tidy::tensor
