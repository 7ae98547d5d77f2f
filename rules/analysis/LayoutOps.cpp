// The layout analysis's op handlers: what each op family does to sizes,
// strides, dtype and device. Storage and default layout come from the op
// table (tt/ops.def); the handlers refine them by the call's arguments.
#include "analysis/LayoutImpl.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/StringSwitch.h"

namespace clang::tidy::tensor {

using namespace layout;

TensorFact LayoutAnalysis::Impl::applyOp(const OpCall &C) {
  Handler H = llvm::StringSwitch<Handler>(C.Name)
                  .Cases("view", "reshape", &Impl::reshapeOp)
                  .Cases("view_as", "reshape_as", &Impl::reshapeAsOp)
                  .Case("flatten", &Impl::flattenOp)
                  .Case("contiguous", &Impl::contiguousOp)
                  .Cases("t", "transpose", &Impl::transposeOp)
                  .Case("permute", &Impl::permuteOp)
                  .Case("unfold", &Impl::unfoldOp)
                  .Cases("select", "narrow", "slice", &Impl::sliceOp)
                  .Cases("unsqueeze", "squeeze", &Impl::squeezeOp)
                  .Cases("expand", "expand_as", "broadcast_to", &Impl::expandOp)
                  .Case("clone", &Impl::cloneOp)
                  .Cases("to", "cuda", "cpu", "type", "type_as", "toType", &Impl::convertOp)
                  .Cases("matmul", "mm", "bmm", &Impl::matmulOp)
                  .Default(&Impl::byTable);
  TensorFact R = (this->*H)(C);
  trackStorage(C, R);
  return R;
}

// Ops whose result keeps every element of self in place (a view of the same
// footprint, or a slice of it) and so keeps an expanded dimension.
static bool keepsElements(llvm::StringRef Name) {
  return llvm::StringSwitch<bool>(Name)
      .Cases("t", "transpose", "permute", "unsqueeze", "narrow", "slice", true)
      .Cases("detach", "data", "variable_data", true)
      .Default(false);
}

// Which storage the result lies in, and whether it keeps a stride-0
// dimension of size > 1: views keep self's (the slice and expand handlers
// refine them), every other op allocates (may-alias ops: unknown).
void LayoutAnalysis::Impl::trackStorage(const OpCall &C, TensorFact &R) const {
  sem::Storage St = C.Op ? C.Op->storage : sem::Storage::Fresh;
  bool Shares = St == sem::Storage::View || St == sem::Storage::Detach;
  // Conversions decide whether they return self (same storage) or copy.
  bool Converts =
      St == sem::Storage::MayAlias &&
      llvm::is_contained({"to", "cpu", "cuda", "type", "type_as", "toType", "contiguous"}, C.Name);
  if (Converts && R.Root && R.Root == C.Self.Root)
    return;
  if (!Shares && R.MinChunks) {
    // A copy of overlapping windows is dense, laid out as TensorIterator picks.
    R.MinChunks = 0;
    if (R.Contig == TensorFact::No) {
      R.Contig = TensorFact::Unknown;
      R.Origin.clear();
    }
  }
  if (!Shares) {
    R.Root = St != sem::Storage::MayAlias || (Converts && R.Root == C.Call) ? C.Call : nullptr;
    R.SliceDim = -1;
    R.Lo = R.Hi = TensorFact::Bound();
    R.Broadcast = R.BroadcastAssumed = false;
    R.ExpandCall = nullptr;
    return;
  }
  bool Slices = C.Name == "narrow" || C.Name == "slice";
  // A contiguous view of all of a contiguous value has its footprint.
  bool Whole = R.Contig == TensorFact::Yes && C.Self.Contig == TensorFact::Yes &&
               llvm::is_contained({"view", "view_as", "unsqueeze", "squeeze"}, C.Name);
  bool Keeps = St == sem::Storage::Detach || C.Name == "t" || C.Name == "transpose" ||
               C.Name == "permute" || Whole || (Slices && R.SliceDim >= 0);
  bool Footprint = R.SliceDim >= 0 || (R.Contig != TensorFact::Unknown && C.Self.SliceDim < 0);
  R.Root = Keeps && Footprint ? C.Self.Root : nullptr;
  if (!R.Root)
    R.SliceDim = -1;
  if (C.Name == "expand" || C.Name == "expand_as" || C.Name == "broadcast_to")
    return; // expandOp decided
  keepBroadcast(C, R);
}

// A view keeps an expanded dimension while its strides show one, or (rank
// unknown) when it keeps every dimension.
void LayoutAnalysis::Impl::keepBroadcast(const OpCall &C, TensorFact &R) const {
  const TensorFact &Self = C.Self;
  R.Broadcast = R.BroadcastAssumed = false;
  R.ExpandCall = nullptr;
  if (!Self.Broadcast)
    return;
  if (R.Strides) {
    for (size_t I = 0; I < R.Strides->size(); ++I) {
      const Mono &Sz = (*R.Sizes)[I];
      if ((*R.Strides)[I].isConst(0) && !Sz.isConst(1) && !Sz.isConst(0)) {
        R.Broadcast = true;
        R.BroadcastAssumed |= Self.BroadcastAssumed || !Sz.isConst();
      }
    }
  } else if (keepsElements(C.Name) && !C.Self.Strides) {
    R.Broadcast = true;
    R.BroadcastAssumed = Self.BroadcastAssumed;
  }
  if (R.Broadcast)
    R.ExpandCall = Self.ExpandCall;
}

void LayoutAnalysis::Impl::derived(TensorFact &R, const TensorFact &Self, const OpCall &C) const {
  if (R.Contig == TensorFact::No && Self.Contig != TensorFact::No) {
    R.Origin = C.Name.str();
    R.OriginLoc = C.Call->getExprLoc();
  } else if (R.Contig != TensorFact::No) {
    R.Origin.clear();
    R.OriginLoc = SourceLocation();
  }
}

static bool isFloatingDType(llvm::StringRef N) {
  return llvm::is_contained({"Float", "Double", "Half", "BFloat16"}, N);
}

//===----------------------------------------------------------------------===//
// Factories
//===----------------------------------------------------------------------===//

bool layout::isTensorOptionsType(QualType T) {
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  return RD && RD->getIdentifier() && RD->getName() == "TensorOptions";
}

// The device TensorOptions built in place name: `.device(d)` / `torch::device(d)`
// in the chain, else the CPU; options from a local never assigned again are
// its initializer's; from another variable, any device.
static TensorFact::DeviceKind optionsDevice(const Expr *E, DeviceOrigin &Origin, DeviceFacts *Vars,
                                            FixedLocals &Locals) {
  E = stripHandle(E);
  // `auto opts = TensorOptions().dtype(kFloat).device(device);`, never assigned again.
  if (const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E)) {
    const auto *V = dyn_cast<VarDecl>(DRE->getDecl());
    const Expr *Init = V && isTensorOptionsType(V->getType()) ? Locals.initializerOf(V) : nullptr;
    if (!Init)
      return TensorFact::AnyDevice; // `x.options()` of a tensor x: its device, not known here
    return optionsDevice(Init, Origin, Vars, Locals);
  }
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E)) {
    if (CE->getNumArgs() == 0)
      return TensorFact::CPU;
    TensorFact::DeviceKind D = deviceOf(CE->getArg(0), &Origin, Vars);
    std::string Ty = CE->getArg(0)->getType().getAsString();
    if (D == TensorFact::AnyDevice &&
        (Ty.find("ScalarType") != std::string::npos || Ty.find("TypeMeta") != std::string::npos))
      return TensorFact::CPU; // zeros({n}, kLong): a dtype, the default device
    return D == TensorFact::AnyDevice ? optionsDevice(CE->getArg(0), Origin, Vars, Locals) : D;
  }
  const auto *Call = dyn_cast<CallExpr>(E);
  const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
  if (!FD || !FD->getIdentifier())
    return TensorFact::AnyDevice;
  if (FD->getName() == "device" && Call->getNumArgs() >= 1)
    return deviceOf(Call->getArg(Call->getNumArgs() - 1), &Origin, Vars);
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    return optionsDevice(MC->getImplicitObjectArgument(), Origin, Vars, Locals);
  return isTensorApi(FD) ? TensorFact::CPU : TensorFact::AnyDevice; // torch::dtype(...)
}

// The device a factory's arguments name; CPU when they name none.
static TensorFact::DeviceKind factoryDevice(llvm::ArrayRef<const Expr *> Args, DeviceOrigin &Origin,
                                            DeviceFacts *Vars, FixedLocals &Locals) {
  for (const Expr *A : Args) {
    if (isa<CXXDefaultArgExpr>(A))
      continue;
    if (TensorFact::DeviceKind D = deviceOf(A, &Origin, Vars); D != TensorFact::AnyDevice)
      return D;
    if (isTensorOptionsType(A->getType()))
      return optionsDevice(A, Origin, Vars, Locals);
  }
  return TensorFact::CPU;
}

// The size of `arange(end)` / `arange(start, end[, step])` when its bounds are
// constants. Bounds: the bound expressions (the numbers before the options).
static std::optional<Shape> arangeShape(llvm::ArrayRef<const Expr *> Args, const ASTContext &Ctx,
                                        bool &AllInt, llvm::SmallVectorImpl<const Expr *> &Bounds) {
  llvm::SmallVector<std::optional<std::int64_t>, 3> V;
  AllInt = true;
  for (const Expr *A : Args) {
    const Expr *X = A->IgnoreImplicit();
    if (const auto *CE = dyn_cast<CXXConstructExpr>(X); CE && CE->getNumArgs() == 1)
      X = CE->getArg(0)->IgnoreParenImpCasts(); // Scalar(3)
    if (!X->getType()->isArithmeticType())
      break;
    AllInt &= X->getType()->isIntegerType();
    V.push_back(constInt(X, Ctx));
    Bounds.push_back(X);
  }
  if (!AllInt || V.empty() || llvm::any_of(V, [](auto X) { return !X; }))
    return std::nullopt;
  std::int64_t Start = V.size() >= 2 ? *V[0] : 0, End = V.size() >= 2 ? *V[1] : *V[0];
  std::int64_t Step = V.size() >= 3 ? *V[2] : 1;
  if (Step <= 0 || End < Start)
    return std::nullopt;
  return Shape{Mono::constant((End - Start + Step - 1) / Step)};
}

// The sizes of `randint(low, high, {sizes})`: its IntArrayRef argument.
std::optional<Shape> LayoutAnalysis::Impl::sizesArg(const OpCall &C) {
  for (const Expr *A : C.Args)
    if (!isa<CXXDefaultArgExpr>(A) &&
        A->getType().getAsString().find("ArrayRef") != std::string::npos)
      if (auto S = shapeArg(A, C.S); S && S->Infer < 0)
        return S->Sizes;
  return std::nullopt;
}

// The sizes of `torch::tensor(data)` as far as its data's type tells: a
// scalar makes a 0-dim tensor, a std::vector or ArrayRef one dim, a braced
// list of scalars one dim of its length.
// The data `torch::tensor(data)` is given, through the TensorDataContainer conversions.
static const Expr *tensorDataSource(const Expr *A) {
  for (int I = 0; A && I < 4; ++I) {
    A = A->IgnoreImplicit();
    const auto *CE = dyn_cast<CXXConstructExpr>(A);
    if (!CE || CE->getNumArgs() != 1 ||
        CE->getType().getAsString().find("TensorDataContainer") == std::string::npos)
      break;
    A = CE->getArg(0);
  }
  return A;
}

static std::optional<Shape> tensorDataShape(const Expr *A, SymTable &ST) {
  A = tensorDataSource(A);
  if (!A)
    return std::nullopt;
  if (const auto *IL = dyn_cast<CXXStdInitializerListExpr>(A)) {
    const auto *Init = dyn_cast<InitListExpr>(IL->getSubExpr()->IgnoreImplicit());
    bool Flat = Init && llvm::all_of(Init->inits(), [&](const Expr *E) {
                  return tensorDataShape(E, ST) == std::optional<Shape>(Shape{});
                });
    return Flat ? std::optional<Shape>(Shape{Mono::constant(Init->getNumInits())}) : std::nullopt;
  }
  QualType T = A->getType().getNonReferenceType();
  if (T->isArithmeticType())
    return Shape{};
  std::string N = T.getCanonicalType().getAsString();
  if (N.find("std::vector<") != std::string::npos || N.find("c10::ArrayRef<") != std::string::npos)
    return Shape{ST.sym(A, 1)};
  return std::nullopt;
}

// The dtype `torch::tensor(data)` gives its data when no option names one (as
// LibTorch 1.13 does): integers (a scalar, a braced list, a std::vector) make
// int64, uint8_t makes uint8, floating numbers the default float32. Empty when
// the element type is another (bool, int8_t) or not seen.
static DTypeName tensorDataDType(const Expr *A) {
  A = tensorDataSource(A);
  if (const auto *IL = dyn_cast_or_null<CXXStdInitializerListExpr>(A)) {
    const auto *Init = dyn_cast<InitListExpr>(IL->getSubExpr()->IgnoreImplicit());
    return Init && Init->getNumInits() ? tensorDataDType(Init->getInit(0)) : DTypeName{};
  }
  QualType T = A ? A->getType().getNonReferenceType() : QualType();
  if (const auto *Spec = T.isNull() ? nullptr
                                    : dyn_cast_or_null<ClassTemplateSpecializationDecl>(
                                          T->getAsCXXRecordDecl());
      Spec && Spec->getTemplateArgs().size() >= 1 &&
      Spec->getTemplateArgs()[0].getKind() == TemplateArgument::Type &&
      llvm::is_contained({"vector", "ArrayRef"}, Spec->getName()))
    T = Spec->getTemplateArgs()[0].getAsType();
  if (T.isNull() || !T->isArithmeticType() || T->isBooleanType())
    return {};
  if (T->isFloatingType())
    return {"Float", 4};
  T = T.getCanonicalType();
  if (T->isSpecificBuiltinType(BuiltinType::UChar))
    return {"Byte", 1};
  if (T->isAnyCharacterType() || T->isSpecificBuiltinType(BuiltinType::SChar))
    return {};
  return {"Long", 8};
}

// `t.sizes()` of a tensor t: a shape with t's rank.
bool LayoutAnalysis::Impl::isSizesOfTensor(const Expr *E) const {
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(E ? stripHandle(E) : nullptr);
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  return M && M->getIdentifier() && M->getName() == "sizes" &&
         Model.isTensorExpr(MC->getImplicitObjectArgument()->IgnoreParenImpCasts());
}

// `t.options()` among a factory's arguments, directly, under `.dtype(..)` /
// `.requires_grad(..)`, or through a local never assigned again: t, whose
// device and dtype the options carry. Not under `.device(..)`, which wins.
const Expr *LayoutAnalysis::Impl::optionsOfTensor(llvm::ArrayRef<const Expr *> Args) {
  for (const Expr *A : Args) {
    const Expr *E = isa<CXXDefaultArgExpr>(A) ? nullptr : stripHandle(A);
    for (int Depth = 0; E && Depth < 8; ++Depth) {
      if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
        const auto *V = dyn_cast<VarDecl>(DRE->getDecl());
        E = V && isTensorOptionsType(V->getType()) ? Locals.initializerOf(V) : nullptr;
        E = E ? stripHandle(E) : nullptr;
        continue;
      }
      const auto *MC = dyn_cast<CXXMemberCallExpr>(E);
      const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
      if (!M || !M->getIdentifier() || M->getName() == "device")
        break;
      const Expr *Obj = MC->getImplicitObjectArgument()->IgnoreImpCasts(); // TensorBase::options()
      if (M->getName() == "options" && Model.isTensorExpr(Obj))
        return Obj;
      E = stripHandle(Obj);
    }
  }
  return nullptr;
}

TensorFact LayoutAnalysis::Impl::factory(const OpCall &C) {
  TensorFact F = freshContiguous(C.Call);
  DTypeName DT = dtypeInArgs(C.Args);
  DeviceOrigin Origin;
  F.Device = factoryDevice(C.Args, Origin, deviceVars(), Locals);
  F.DeviceRuntime = Origin.Runtime;
  F.DeviceIfAvailable = Origin.IfAvailable;
  if (const Expr *Of = F.Device == TensorFact::AnyDevice ? optionsOfTensor(C.Args) : nullptr) {
    TensorFact T = evalTensor(Of, C.S); // `zeros({}, x.options())`: x's device and dtype
    F.Device = T.Device;
    F.DeviceAssumed = T.DeviceAssumed;
    F.DeviceRuntime = T.DeviceRuntime;
    F.DeviceIfAvailable = T.DeviceIfAvailable;
    if (!DT.Size && !T.DType.empty()) {
      DT = DTypeName{T.DType, T.ElemSize};
      F.DTypeAssumed = T.DTypeAssumed;
      F.IntegerNamed = T.IntegerNamed;
    }
  }
  std::optional<Shape> Sz;
  bool Integral = false;
  if (llvm::is_contained({"zeros", "ones", "empty", "rand", "randn", "full"}, C.Name)) {
    if (auto A = shapeArg(C.arg(0), C.S); A && A->Infer < 0)
      Sz = A->Sizes;
    F.HasDims = !Sz && isSizesOfTensor(C.arg(0));
  } else if (C.Name == "arange") {
    llvm::SmallVector<const Expr *, 3> Bounds;
    Sz = arangeShape(C.Args, Ctx, Integral, Bounds);
    // Run-time integer bounds: rank 1 all the same, `arange(n)` of size n.
    if (!Sz && Integral && !Bounds.empty())
      Sz = Shape{Bounds.size() == 1 ? evalInt(Bounds[0], C.S) : ST.sym(Bounds[0], 1)};
  } else if (C.Name == "linspace" && C.Args.size() >= 3) {
    Sz = Shape{evalInt(C.Args[2], C.S)};
  } else if (C.Name == "randint" || C.Name == "randperm") {
    Integral = true; // int64, as PyTorch makes them
    Sz = C.Name == "randperm" && C.arg(0) ? std::optional<Shape>(Shape{evalInt(C.Args[0], C.S)})
                                          : sizesArg(C);
  } else if (C.Name == "tensor" && C.arg(0)) {
    Sz = tensorDataShape(C.arg(0), ST);
    if (!DT.Size)
      DT = tensorDataDType(C.arg(0));
  }
  // torch::tensor takes its dtype from the data.
  if (!DT.Size && C.Name != "tensor")
    DT = Integral ? DTypeName{"Long", 8} : DTypeName{"Float", 4};
  F.DType = DT.Name;
  F.ElemSize = DT.Size;
  if (Sz)
    setContiguous(F, *Sz);
  else if (factoryAlwaysRanked(C.Name))
    F.HasDims = true; // `arange(n - 1, -1, -1.0)`: 1-D, its size unknown
  return F;
}

//===----------------------------------------------------------------------===//
// view / reshape / flatten
//===----------------------------------------------------------------------===//

TensorFact LayoutAnalysis::Impl::reshapeOp(const OpCall &C) {
  return reshapeLike(C, C.Self, shapeArg(C.arg(0), C.S));
}

TensorFact LayoutAnalysis::Impl::reshapeAsOp(const OpCall &C) {
  TensorFact Other = C.arg(0) ? evalTensor(C.arg(0), C.S) : unknownFact();
  std::optional<ShapeArg> New;
  if (Other.Sizes)
    New = ShapeArg{*Other.Sizes, -1};
  return reshapeLike(C, C.Self, New);
}

TensorFact LayoutAnalysis::Impl::flattenOp(const OpCall &C) {
  std::int64_t Start = argInt(C, 0).value_or(C.arg(0) ? INT64_MIN : 0);
  std::int64_t End = argInt(C, 1).value_or(C.arg(1) ? INT64_MIN : -1);
  if (Start == INT64_MIN || End == INT64_MIN)
    return unknownLike(C.Self);
  if (!C.Self.Sizes)
    return reshapeLike(C, C.Self, flattenShape(C.Self, Start, End),
                       flattenSwapped(C.Self, Start, End));
  size_t Rank = C.Self.Sizes->size();
  if (Rank == 0)
    return C.Self;
  auto S0 = normDim(Start, Rank), E0 = normDim(End, Rank);
  if (!S0 || !E0 || *S0 > *E0)
    return unknownLike(C.Self);
  if (*S0 == *E0)
    return C.Self;
  ShapeArg NS;
  Mono P = Mono::constant(1);
  for (size_t I = 0; I < Rank; ++I) {
    if ((std::int64_t)I < *S0 || (std::int64_t)I > *E0) {
      NS.Sizes.push_back((*C.Self.Sizes)[I]);
      continue;
    }
    P = ST.mul(P, (*C.Self.Sizes)[I]);
    if ((std::int64_t)I == *E0)
      NS.Sizes.push_back(P);
  }
  return reshapeLike(C, C.Self, NS);
}

// flatten(Start) of a tensor of unknown rank as a new shape: its sizes
// before Start (symbols of its source, swapped as it is), then -1.
std::optional<ShapeArg> LayoutAnalysis::Impl::flattenShape(const TensorFact &Self,
                                                           std::int64_t Start, std::int64_t End) {
  if (End != -1 || Start < 0 || Start > 8 || (Start > 0 && !Self.Src))
    return std::nullopt;
  ShapeArg A;
  for (std::int64_t K = 0; K < Start; ++K) {
    std::int64_t D = K == Self.SwapA ? Self.SwapB : K == Self.SwapB ? Self.SwapA : K;
    A.Sizes.push_back((Self.UnitDims >> D) & 1 ? Mono::constant(1)
                      : D == Self.NarrowDim    ? Self.NarrowLen
                                               : ST.sym(Self.Src, D + 1));
  }
  A.Infer = (int)A.Sizes.size();
  A.Sizes.push_back(Mono::constant(-1));
  return A;
}

// flatten(Start, End) of a contiguous tensor of unknown rank with dims A and
// B swapped (`x.transpose(0, 1).flatten(0, 1)`): with sizes > 1, merged dims
// view only when they are consecutive in the source, in its order; a range
// of two or more that holds A or B is not (the dim at A is B, and its
// neighbours are A - 1 and A + 1, never B - 1 or B + 1).
std::optional<Viewability> LayoutAnalysis::Impl::flattenSwapped(const TensorFact &Self,
                                                                std::int64_t Start,
                                                                std::int64_t End) {
  if (Self.Sizes || Self.SwapA < 0 || Self.UnitDims || Start < 0 || End <= Start)
    return std::nullopt;
  auto In = [&](int D) { return Start <= D && D <= End; };
  if (In(Self.SwapA) || In(Self.SwapB))
    return Viewability::NotViewable;
  return std::nullopt;
}

TensorFact LayoutAnalysis::Impl::reshapeLike(const OpCall &C, const TensorFact &In,
                                             std::optional<ShapeArg> New,
                                             std::optional<Viewability> Decided) {
  std::optional<Shape> NewShape = New ? inferShape(*New, In, C.Call) : std::nullopt;
  Shape NewStride;
  ViewQuery Q = decideView(In, New, NewShape, NewStride);
  if (Q.Result == ViewQuery::Unknown && Decided)
    Q.Result = *Decided;
  if (Recording)
    Queries[C.Call] = Q;
  TensorFact R = unknownLike(In);
  R.Assumed = In.Assumed;
  R.AssumedSource = In.AssumedSource;
  if (Q.Result == ViewQuery::Viewable) {
    if (NewShape && In.Sizes)
      setLayout(R, *NewShape, NewStride);
    else if (NewShape)
      setContiguous(R, *NewShape);
    else
      R.Contig = TensorFact::Yes;
    if (R.Contig == TensorFact::No) {
      R.Origin = In.Origin;
      R.OriginLoc = In.OriginLoc;
    }
    return R;
  }
  if (Q.Result == ViewQuery::NotViewable && !C.Name.starts_with("view")) {
    // reshape copies into a fresh contiguous tensor.
    R.Assumed = false;
    if (NewShape)
      setContiguous(R, *NewShape);
    else
      R.Contig = TensorFact::Yes;
    return R;
  }
  return unknownLike(In);
}

// `t.view({1, n, d})` with no more dims than t: the leading 1 says t's
// leading run-time size is 1 (a batch of one, `pos_embed` of [1, N, D]), not
// > 1 as Note [Generic symbols] assumes of a size the code does not show.
static Shape withBatchOfOne(const Shape &Sizes, const Shape &New) {
  Shape R = Sizes;
  if (!R.empty() && !R[0].isConst() && !New.empty() && New[0].isConst(1) &&
      New.size() <= R.size())
    R[0] = Mono::constant(1);
  return R;
}

ViewQuery LayoutAnalysis::Impl::decideView(const TensorFact &In, const std::optional<ShapeArg> &New,
                                           const std::optional<Shape> &NewShape, Shape &NewStride) {
  ViewQuery Q;
  Q.Input = In;
  Q.NewSizes = NewShape;
  if (In.Sizes && NewShape) {
    Shape Sizes = withBatchOfOne(*In.Sizes, *NewShape);
    // Element counts that differ say a size taken as generic is not (a
    // Linear's out_features of 1 viewed away): the strides cannot tell.
    const Mono OldCount = ST.product(Sizes), NewCount = ST.product(*NewShape);
    if (ST.eq(OldCount, NewCount) != Cmp::NE)
      Q.Result = computeStride(ST, Sizes, *In.Strides, *NewShape, NewStride);
    // A contiguous tensor is one chunk: a view of it, where it succeeds, is
    // contiguous, though sizes the analysis cannot relate (a Linear's
    // out_features against `num_actions_`) leave the element count unproved.
    if (Q.Result == ViewQuery::Unknown && In.Contig == TensorFact::Yes &&
        !(OldCount.isConst() && NewCount.isConst())) {
      Q.Result = ViewQuery::Viewable;
      NewStride = contiguousStrides(ST, *NewShape);
    }
    // Sizes the analysis cannot relate: the chunks still tell.
    if (Q.Result == ViewQuery::Unknown &&
        tooFewDimsForChunks(countChunks(ST, Sizes, *In.Strides), *NewShape))
      Q.Result = ViewQuery::NotViewable;
    auto AllConst = [](const Shape &V) {
      return llvm::all_of(V, [](const Mono &M) { return M.isConst(); });
    };
    Q.Certain = !In.Assumed && AllConst(*In.Sizes) && AllConst(*In.Strides) && AllConst(*NewShape);
    if (Q.Certain)
      Q.Bytes = LayoutAnalysis::bytesOf(In);
  } else if (In.Sizes && New &&
             tooFewDimsForChunks(countChunks(ST, *In.Sizes, *In.Strides), New->Sizes)) {
    // A new shape whose sizes the analysis cannot relate to the input's
    // (`view({n * per, -1})` of an expanded embedding): the chunks tell.
    Q.Result = ViewQuery::NotViewable;
  } else if (In.Contig == TensorFact::Yes) {
    Q.Result = ViewQuery::Viewable;
  } else if (!In.Sizes && (In.SwapA >= 0 || (In.NarrowDim >= 0 && !In.NarrowMayBeWhole)) &&
             New) {
    Q.Result = decideUnknownRank(In, *New, Q.MinRank).value_or(ViewQuery::Unknown);
  } else if (!In.Sizes && New && tooFewDimsForChunks(In.MinChunks, New->Sizes)) {
    Q.Result = ViewQuery::NotViewable;
  }
  return Q;
}

// New's sizes at one rank of an unknown-rank input whose source has sizes
// Source there and which has sizes Sz (Swapped after its swap): `x.size(-1)`
// named after the source, `-1` inferred from Sz's element count; nullopt when
// the shape does not fit that rank. Note [kept outer dim]: the size the
// analysis cannot relate in `reshape({-1, hidden})` or `view({n, -1})` is the
// tensor's own last or first.
std::optional<Shape> LayoutAnalysis::Impl::shapeAtRank(const TensorFact &In, const ShapeArg &New,
                                                       const Shape &Source, const Shape &Sz,
                                                       const Shape &Swapped) {
  Shape NS = New.Sizes;
  for (Mono &M : NS) // `x.size(-1)`: the source's last dim at this rank
    if (ST.eq(M, ST.sym(In.Src, kLastDim)) == Cmp::EQ)
      M = Source.back();
  if (std::optional<Shape> Fit = inferredShape(NS, New.Infer, Sz))
    return Fit;
  if (NS.size() != 2 || New.Infer < 0)
    return std::nullopt;
  Mono &Kept = NS[1 - New.Infer];
  auto Related = [&](const Mono &S) { return ST.eq(Kept, S) == Cmp::EQ; };
  if (Kept.isConst() || llvm::any_of(Source, Related))
    return std::nullopt; // a size the code relates: it says where it goes
  Kept = New.Infer == 0 ? Swapped.back() : Swapped.front();
  return inferredShape(NS, New.Infer, Sz);
}

// NS with its entry Infer (-1: none) the quotient of Sz's element count by
// the others; nullopt when it does not divide (or, without one, differs).
std::optional<Shape> LayoutAnalysis::Impl::inferredShape(Shape NS, int Infer, const Shape &Sz) {
  Mono Numel = ST.product(Sz);
  if (Infer < 0)
    return ST.eq(ST.product(NS), Numel) == Cmp::EQ ? std::optional<Shape>(NS) : std::nullopt;
  Mono Rest = Mono::constant(1);
  for (size_t I = 0; I < NS.size(); ++I)
    if ((int)I != Infer)
      Rest = ST.mul(Rest, NS[I]);
  auto Q = ST.exactQuotient(Numel, Rest);
  if (!Q)
    return std::nullopt;
  NS[Infer] = *Q;
  return NS;
}

// A contiguous tensor of unknown rank with two dims swapped, or narrowed
// along one: decide for each rank the new shape fits (unknownRankLayout);
// when its sizes are unrelated, count chunks. Note [no-op at the smallest
// rank]: a shape that is the input's own at the smallest rank and a copy at
// every rank above says the code expects more dims
// (`lstm_out.transpose(0, 1).flatten(1)`); MinRank says how many.
std::optional<Viewability> LayoutAnalysis::Impl::decideUnknownRank(const TensorFact &In,
                                                                   const ShapeArg &New,
                                                                   int &MinRank) {
  // A literal 1 where a swapped dim lands (`o.transpose(1, 2).reshape({B, 1,
  // -1})` of one decoding step) says that dim has size 1, as withBatchOfOne
  // reads a leading 1: the swap may move nothing.
  auto UnitAt = [&](int D) { return D < (int)New.Sizes.size() && New.Sizes[D].isConst(1); };
  if (In.SwapA >= 0 && (UnitAt(In.SwapA) || UnitAt(In.SwapB)))
    return std::nullopt;
  std::optional<Viewability> Smallest, Above;
  bool NoOp = false;
  const int Low = std::max(In.SwapB, In.NarrowDim) + 1, High = In.Matrix ? Low : Low + 3;
  for (int Rank = Low; In.Src && Rank <= High; ++Rank) {
    Shape Sz, St;
    std::optional<Shape> NS = unknownRankLayout(In, New, Rank, Sz, St);
    if (!NS)
      continue; // not this rank
    Shape NSt;
    Viewability V = computeStride(ST, Sz, St, *NS, NSt);
    if (V == Viewability::Unknown || (Above && *Above != V))
      return std::nullopt;
    if (Smallest) {
      Above = V;
      continue;
    }
    Smallest = V;
    NoOp = sameSizes(*NS, Sz);
    MinRank = Rank + 1;
  }
  if (Smallest && Above && *Above != *Smallest && NoOp && *Above == Viewability::NotViewable &&
      !rankShown(In.Src))
    return Above;
  MinRank = 0;
  if (Smallest)
    return Above && *Above != *Smallest ? std::nullopt : Smallest;
  if (In.SwapA >= 0 && !In.UnitDims &&
      tooFewDimsForChunks(chunksAfterSwap(In.SwapA, In.SwapB), New.Sizes))
    return Viewability::NotViewable;
  return std::nullopt;
}

// In's sizes and strides at one rank (its source's, swapped or narrowed as
// In is), and New's sizes there; nullopt when New does not fit that rank.
std::optional<Shape> LayoutAnalysis::Impl::unknownRankLayout(const TensorFact &In,
                                                             const ShapeArg &New, int Rank,
                                                             Shape &Sz, Shape &St) {
  for (int K = 0; K < Rank; ++K)
    Sz.push_back((In.UnitDims >> K) & 1 ? Mono::constant(1) : ST.sym(In.Src, K + 1));
  St = contiguousStrides(ST, Sz);
  const Shape Source = Sz;
  if (In.NarrowDim >= 0)
    Sz[In.NarrowDim] = In.NarrowLen;
  Shape Swapped = Sz;
  if (In.SwapA >= 0)
    std::swap(Swapped[In.SwapA], Swapped[In.SwapB]);
  std::optional<Shape> NS = shapeAtRank(In, New, Source, Sz, Swapped);
  if (In.SwapA >= 0)
    std::swap(St[In.SwapA], St[In.SwapB]);
  Sz = std::move(Swapped);
  return NS;
}

// Src is a parameter some call passes a tensor of known rank: the callers
// say which ranks it takes, and a no-op at the smallest is no evidence.
bool LayoutAnalysis::Impl::rankShown(const void *Src) const {
  auto It = Params.find(static_cast<const ParmVarDecl *>(Src));
  return It != Params.end() && It->second.RankShown;
}

bool LayoutAnalysis::Impl::sameSizes(llvm::ArrayRef<Mono> A, llvm::ArrayRef<Mono> B) const {
  if (A.size() != B.size())
    return false;
  for (size_t I = 0; I < A.size(); ++I)
    if (ST.eq(A[I], B[I]) != Cmp::EQ)
      return false;
  return true;
}

//===----------------------------------------------------------------------===//
// Layout-changing views
//===----------------------------------------------------------------------===//

TensorFact LayoutAnalysis::Impl::contiguousOp(const OpCall &C) {
  TensorFact R = C.Self;
  if (Recording) {
    ConversionQuery Q;
    Q.Result = C.Self.Contig == TensorFact::Yes  ? ConversionQuery::ReturnsSelf
               : C.Self.Contig == TensorFact::No ? ConversionQuery::Copies
                                                 : ConversionQuery::Unknown;
    Q.Assumed = C.Self.Assumed;
    Conversions[C.Call] = Q;
  }
  R.Root = C.Self.Contig == TensorFact::Yes  ? C.Self.Root
           : C.Self.Contig == TensorFact::No ? C.Call
                                             : nullptr;
  R.Assumed = false;
  if (C.Self.Sizes)
    setContiguous(R, *C.Self.Sizes);
  renameUnranked(R, C.Call);
  R.Contig = TensorFact::Yes;
  derived(R, C.Self, C);
  return R;
}

TensorFact LayoutAnalysis::Impl::transposeOp(const OpCall &C) {
  std::optional<std::int64_t> A = 0, B = 1;
  if (C.Name == "transpose") {
    A = argInt(C, 0);
    B = argInt(C, 1);
  }
  const TensorFact &Self = C.Self;
  if (!A || !B)
    return unknownLike(Self);
  TensorFact R = Self;
  if (Self.Sizes) {
    size_t Rank = Self.Sizes->size();
    if (C.Name == "t" && Rank < 2)
      return Self;
    auto NA = normDim(A, Rank), NB = normDim(B, Rank);
    if (!NA || !NB)
      return unknownLike(Self);
    Shape Sz = *Self.Sizes, St = *Self.Strides;
    std::swap(Sz[*NA], Sz[*NB]);
    std::swap(St[*NA], St[*NB]);
    setLayout(R, Sz, St);
    derived(R, Self, C);
    return R;
  }
  // Unknown rank: transpose(a, b) of two distinct non-negative dims of a
  // contiguous tensor, neither known to have size 1; t() is taken as a
  // matrix transpose (on a vector it would be a no-op).
  auto Unit = [&](std::int64_t D) { return (Self.UnitDims >> D) & 1; };
  if (Self.Contig != TensorFact::Yes || Self.SwapA >= 0 || *A < 0 || *B < 0 || *A == *B ||
      *A >= 8 || *B >= 8 || Unit(*A) || Unit(*B))
    return unknownLike(Self);
  R.Contig = TensorFact::No;
  R.Assumed = true;
  R.SwapA = (int)std::min(*A, *B);
  R.SwapB = (int)std::max(*A, *B);
  R.Matrix = C.Name == "t";
  derived(R, Self, C);
  return R;
}

// unfold(d, size, step) of a contiguous tensor: dim d becomes the windows
// (stride * step) and a last dim of `size` (stride of d) is added. Windows
// that are not back to back (step != size, generically) overlap or leave
// gaps: not contiguous, and at any rank dims up to d, the windows and the
// window elements are runs a view cannot merge.
TensorFact LayoutAnalysis::Impl::unfoldOp(const OpCall &C) {
  const TensorFact &Self = C.Self;
  std::optional<std::int64_t> D = argInt(C, 0);
  TensorFact R = unknownLike(Self);
  if (!D || !C.arg(1) || !C.arg(2) || Self.Contig != TensorFact::Yes || Self.SwapA >= 0 ||
      Self.UnitDims)
    return R;
  std::optional<std::int64_t> ND = D;
  if (Self.Sizes)
    ND = normDim(D, Self.Sizes->size());
  bool Last = (Self.Sizes && ND && *ND + 1 == (std::int64_t)Self.Sizes->size()) || *D == -1;
  Mono Size = evalInt(C.arg(1), C.S);
  if (!ND || (*ND < 0 && !Last) || Size.isConst(1) ||
      ST.eq(Size, evalInt(C.arg(2), C.S)) != Cmp::NE)
    return R;
  // Whether dims [From, To) hold a size > 1 (unknown sizes: generically).
  auto Run = [&](std::int64_t From, std::int64_t To) {
    for (std::int64_t I = From; I < To; ++I)
      if (!Self.Sizes || !(*Self.Sizes)[I].isConst(1))
        return true;
    return false;
  };
  R.Contig = TensorFact::No;
  R.Assumed = Self.Assumed;
  R.AssumedSource = Self.AssumedSource;
  R.MinChunks = Run(0, *ND) + 2 + (Self.Sizes && Run(*ND + 1, Self.Sizes->size()));
  derived(R, Self, C);
  return R;
}

TensorFact LayoutAnalysis::Impl::permuteOp(const OpCall &C) {
  llvm::SmallVector<const Expr *, 4> E;
  if (!intList(C.arg(0), E))
    return unknownLike(C.Self);
  llvm::SmallVector<std::int64_t, 4> P;
  for (const Expr *X : E) {
    auto V = constInt(X, Ctx);
    if (!V)
      return unknownLike(C.Self);
    P.push_back(*V);
  }
  const TensorFact &Self = C.Self;
  Shape Sz, St;
  if (Self.Sizes) {
    if (P.size() != Self.Sizes->size())
      return unknownLike(Self);
    Sz = *Self.Sizes;
    St = *Self.Strides;
  } else if (auto Named = rankedSizes(Self, P.size())) {
    // The permutation names the rank.
    Sz = *Named;
    St = contiguousStrides(ST, Sz);
  } else {
    return unknownLike(Self);
  }
  Shape NSz, NSt;
  for (std::int64_t D : P) {
    auto N = normDim(D, Sz.size());
    if (!N)
      return unknownLike(Self);
    NSz.push_back(Sz[*N]);
    NSt.push_back(St[*N]);
  }
  TensorFact R = Self;
  setLayout(R, NSz, NSt);
  derived(R, Self, C);
  return R;
}

TensorFact LayoutAnalysis::Impl::sliceOp(const OpCall &C) {
  std::optional<std::int64_t> D =
      C.Name == "slice" && !C.arg(0) ? std::optional<std::int64_t>(0) : argInt(C, 0);
  if (!D)
    return unknownLike(C.Self);
  return sliceAlong(C, *D, 1);
}

// A slice that leaves out part of its dim whatever the tensor's sizes (>1
// each): `select`, or a narrow / slice starting past 0.
static bool dropsPartOfDim(const OpCall &C, size_t First, const ASTContext &Ctx) {
  if (C.Name == "select")
    return true;
  const Expr *S = C.arg(First);
  std::optional<std::int64_t> Start = S ? constInt(S, Ctx) : std::nullopt;
  // A run-time start (`ctx.narrow(1, cfg.hdim, cfg.cdim)`) is > 0 by the
  // defaults (Note [Generic symbols]): the slice leaves out what precedes it.
  return Start ? *Start > 0 : S && isIntExpr(S->IgnoreImpCasts());
}

// `seq.narrow(1, 1, T - 1)`, `tokens.slice(1, 1)` of a contiguous tensor of
// unknown rank: its source's sizes and strides but for dim D
// (decideUnknownRank). A slice with a step changes the stride: not one.
void LayoutAnalysis::Impl::narrowedUnranked(const OpCall &C, const TensorFact &Self,
                                            std::int64_t D, size_t First, TensorFact &R) {
  bool Narrow = C.Name == "narrow";
  const Expr *Step = Narrow ? nullptr : C.arg(First + 2);
  if ((!Narrow && C.Name != "slice") || !Self.Src || Self.SwapA >= 0 || Self.UnitDims ||
      Self.NarrowDim >= 0 || D > 8 || (Narrow && !C.arg(First + 1)) ||
      (Step && constInt(Step, Ctx) != std::optional<std::int64_t>(1)))
    return;
  R.Src = Self.Src;
  R.NarrowDim = (int)D;
  R.NarrowLen = Narrow ? evalInt(C.arg(First + 1), C.S)
                       : sliceLength(C, ST.sym(Self.Src, D + 1), First, 1);
}

// select / narrow / slice along dim D; Arg0 is the index of the dim argument.
TensorFact LayoutAnalysis::Impl::sliceAlong(const OpCall &C, std::int64_t D, size_t First) {
  const TensorFact &Self = C.Self;
  TensorFact R = Self;
  auto StepArg = C.Name == "slice" ? C.arg(First + 2) : nullptr;
  std::optional<std::int64_t> Step = StepArg ? constInt(StepArg, Ctx) : 1;
  if (!Self.Sizes) {
    // Along dim 0 of a contiguous tensor (with step 1) it stays contiguous.
    if (D > 0 && Self.Contig == TensorFact::Yes && dropsPartOfDim(C, First, Ctx)) {
      R = unknownLike(Self);
      R.Contig = TensorFact::No; // dim 0 (size > 1) keeps its stride over the rest
      R.Assumed = true;
      R.AssumedSource = Self.AssumedSource;
      narrowedUnranked(C, Self, D, First, R);
      derived(R, Self, C);
    } else if (D != 0 || Step != 1 || Self.Contig != TensorFact::Yes) {
      R = unknownLike(Self);
      // `x.narrow(2, 0, n)`: the whole dim or a part, its strides in order
      // either way, so an op on it makes a contiguous result (Note [dense results]).
      if (D > 0 && Step == 1 && Self.Contig == TensorFact::Yes && C.Name != "select") {
        narrowedUnranked(C, Self, D, First, R);
        R.NarrowMayBeWhole = R.NarrowDim >= 0;
      }
    } else {
      R.Src = nullptr;
      R.UnitDims = C.Name == "select" ? Self.UnitDims >> 1 : Self.UnitDims & ~1u;
      // `keys_.narrow(0, 0, n)`: still contiguous, its other sizes its source's,
      // so a permute after it names them (renameUnranked).
      narrowedUnranked(C, Self, 0, First, R);
      renameUnranked(R, C.Call);
    }
    if (C.Name != "select" && Step == 1 && D >= 0 && D < 31 && Self.Src &&
        !((Self.UnitDims >> D) & 1))
      sliceSpan(C, R, D, ST.sym(Self.Src, D + 1), First);
    return R;
  }
  auto N = normDim(D, Self.Sizes->size());
  if (!N || !Step || *Step <= 0)
    return unknownLike(Self);
  Shape Sz = *Self.Sizes, St = *Self.Strides;
  if (C.Name == "select") {
    Sz.erase(Sz.begin() + *N);
    St.erase(St.begin() + *N);
  } else if (C.Name == "narrow") {
    Sz[*N] = evalInt(C.arg(First + 1), C.S);
  } else {
    Sz[*N] = sliceLength(C, Sz[*N], First, *Step);
    St[*N] = ST.mul(St[*N], Mono::constant(*Step));
  }
  setLayout(R, Sz, St);
  derived(R, Self, C);
  if (C.Name != "select" && *Step == 1)
    sliceSpan(C, R, *N, (*Self.Sizes)[*N], First);
  return R;
}

// The bounds of a step-1 slice of a whole, dense value along dim D (length
// Len), for the overlap of two slices of one storage.
void LayoutAnalysis::Impl::sliceSpan(const OpCall &C, TensorFact &R, std::int64_t D,
                                     const Mono &Len, size_t First) {
  const TensorFact &Self = C.Self;
  R.SliceDim = -1;
  bool Whole = Self.SliceDim < 0 && Self.SwapA < 0 && Self.Contig == TensorFact::Yes;
  if (!Whole)
    return;
  auto Lo = boundOf(C.arg(First), Len, C.S, false);
  std::optional<TensorFact::Bound> Hi;
  if (C.Name == "narrow") {
    auto N = boundOf(C.arg(First + 1), Len, C.S, false);
    if (Lo && N && (Lo->Base.isConst() || N->Base.isConst()))
      Hi = TensorFact::Bound{Lo->Base.isConst() ? N->Base : Lo->Base, Lo->Off + N->Off};
  } else {
    Hi = boundOf(C.arg(First + 1), Len, C.S, true);
  }
  if (!Lo || !Hi)
    return;
  R.SliceDim = (int)D;
  R.Lo = *Lo;
  R.Hi = *Hi;
}

// A slice bound: a constant (negative: from the end), a run-time size
// (`n - 1`) plus or minus a constant, or absent (the start / the end).
std::optional<TensorFact::Bound> LayoutAnalysis::Impl::boundOf(const Expr *E, const Mono &Len,
                                                               State &S, bool End) {
  using Bound = TensorFact::Bound;
  // From the end of a dimension of known length: a constant.
  auto Resolve = [&](Bound B) {
    if (B.Base == Len && Len.isConst())
      B = Bound{Mono::constant(0), std::clamp<std::int64_t>(Len.Num + B.Off, 0, Len.Num)};
    else if (B.Base.isConst() && Len.isConst())
      B.Off = std::min(B.Off, Len.Num);
    return B;
  };
  if (!E)
    return Resolve(End ? Bound{Len, 0} : Bound{});
  if (auto V = constInt(E, Ctx)) {
    if (*V == INT64_MAX)
      return Resolve(Bound{Len, 0});
    return Resolve(*V < 0 ? Bound{Len, *V} : Bound{Mono::constant(0), *V});
  }
  for (int I = 0; I < 4; ++I) { // through std::optional<int64_t>
    E = E->IgnoreImplicit();
    const auto *CE = dyn_cast<CXXConstructExpr>(E);
    if (!CE || CE->getNumArgs() != 1)
      break;
    E = CE->getArg(0);
  }
  E = E->IgnoreParenImpCasts();
  std::int64_t Off = 0;
  if (const auto *BO = dyn_cast<BinaryOperator>(E);
      BO && (BO->getOpcode() == BO_Sub || BO->getOpcode() == BO_Add)) {
    auto K = constInt(BO->getRHS(), Ctx);
    if (!K)
      return std::nullopt;
    Off = BO->getOpcode() == BO_Sub ? -*K : *K;
    E = BO->getLHS();
  }
  Mono Base = evalInt(E, S);
  if (Base.Top || Base.Den != 1)
    return std::nullopt;
  if (Base.isConst())
    return Resolve(Bound{Mono::constant(0), Base.Num + Off});
  return Resolve(Bound{ST.norm(Base), Off});
}

Mono LayoutAnalysis::Impl::sliceLength(const OpCall &C, const Mono &Len, size_t First,
                                       std::int64_t Step) {
  auto Start = C.arg(First) ? constInt(C.arg(First), Ctx) : std::optional<std::int64_t>(0);
  auto End =
      C.arg(First + 1) ? constInt(C.arg(First + 1), Ctx) : std::optional<std::int64_t>(INT64_MAX);
  if (!Start || !End || !Len.isConst())
    return ST.sym(C.Call, 0);
  std::int64_t L = Len.Num, A = *Start < 0 ? *Start + L : *Start;
  std::int64_t B = *End < 0 ? *End + L : *End;
  A = std::clamp<std::int64_t>(A, 0, L);
  B = std::clamp<std::int64_t>(B, A, L);
  return Mono::constant((B - A + Step - 1) / Step);
}

TensorFact LayoutAnalysis::Impl::squeezeOp(const OpCall &C) {
  const TensorFact &Self = C.Self;
  TensorFact R = Self;
  if (!Self.Sizes) {
    if (Self.Contig != TensorFact::Yes)
      return unknownLike(Self);
    R.Src = nullptr; // dims move: the symbols no longer line up
    R.UnitDims = 0;
    auto D = argInt(C, 0);
    if (C.Name == "unsqueeze" && D && *D >= 0 && *D < 31) {
      std::uint32_t Low = Self.UnitDims & ((1u << *D) - 1);
      R.UnitDims = Low | ((Self.UnitDims >> *D) << (*D + 1)) | (1u << *D);
    }
    return R;
  }
  Shape Sz = *Self.Sizes, St = *Self.Strides;
  size_t Rank = Sz.size();
  if (C.Name == "unsqueeze") {
    auto D = argInt(C, 0);
    auto N = D ? normDim(*D < 0 ? *D + 1 : *D, Rank + 1) : std::nullopt;
    if (!N)
      return unknownLike(Self);
    Mono NewSt = (size_t)*N < Rank ? ST.mul(Sz[*N], St[*N]) : Mono::constant(1);
    Sz.insert(Sz.begin() + *N, Mono::constant(1));
    St.insert(St.begin() + *N, NewSt);
  } else if (!C.arg(0)) {
    for (size_t I = Sz.size(); I-- > 0;) {
      if (!Sz[I].isConst())
        return unknownLike(Self);
      if (Sz[I].isConst(1)) {
        Sz.erase(Sz.begin() + I);
        St.erase(St.begin() + I);
      }
    }
  } else {
    auto N = normDim(argInt(C, 0), Rank);
    if (!N || !Sz[*N].isConst())
      return unknownLike(Self);
    if (Sz[*N].isConst(1)) {
      Sz.erase(Sz.begin() + *N);
      St.erase(St.begin() + *N);
    }
  }
  setLayout(R, Sz, St);
  derived(R, Self, C);
  return R;
}

std::optional<Shape> LayoutAnalysis::Impl::rankedSizes(const TensorFact &Self, size_t Rank) {
  if (Self.Sizes || Self.Contig != TensorFact::Yes || Self.SwapA >= 0 || !Self.Src || Rank > 8)
    return std::nullopt;
  Shape Sz;
  for (size_t K = 0; K < Rank; ++K)
    Sz.push_back((Self.UnitDims >> K) & 1 ? Mono::constant(1)
                                          : ST.sym(Self.Src, (std::int64_t)K + 1));
  return Sz;
}

// The target sizes of expand / expand_as. `expand_as(other)` of an other of
// unknown rank is taken at self's rank, its size-1 dims broadcast to sizes > 1.
std::optional<Shape> LayoutAnalysis::Impl::expandTarget(const OpCall &C) {
  if (C.Name == "expand") {
    if (auto A = shapeArg(C.arg(0), C.S, /*Expand=*/true))
      return A->Sizes; // -1 stays -1: keep that dim
    return std::nullopt;
  }
  if (!C.arg(0))
    return std::nullopt;
  TensorFact Other = evalTensor(C.arg(0), C.S);
  if (Other.Sizes || !C.Self.Sizes)
    return Other.Sizes;
  Shape NS = *C.Self.Sizes;
  for (size_t I = 0; I < NS.size(); ++I)
    if (NS[I].isConst(1))
      NS[I] = ST.sym(Other.Src ? Other.Src : C.Call, (std::int64_t)I + 1);
  return NS;
}

// The input's sizes and strides for expand. Of an unknown rank taken as
// contiguous, the target names the rank, and a dim whose target is none of
// the input's own sizes is taken as a broadcast size-1 dim: what expand is
// for (`expand({B, n_heads, T, T})` of a [B, 1, T, T] mask). When the code
// made size-1 dims itself (`d.unsqueeze(1).expand({R, S, 3})`), those are
// what it broadcasts, and its other dims keep their sizes (> 1, the default).
bool LayoutAnalysis::Impl::expandInput(const TensorFact &Self, const Shape &NS,
                                       const Expr *Call, Shape &Sz, Shape &St) {
  if (Self.Sizes) {
    Sz = *Self.Sizes;
    St = *Self.Strides;
    return NS.size() >= Sz.size();
  }
  auto Named = rankedSizes(Self, NS.size());
  if (!Named && Self.UnitDims && Self.Contig == TensorFact::Yes && Self.SwapA < 0 &&
      NS.size() <= 8) {
    // Its own sizes have no names (an unsqueeze moved them): a kept dim is
    // the target's size, or a size of this call's own for -1.
    for (size_t K = 0; K < NS.size(); ++K)
      Sz.push_back((Self.UnitDims >> K) & 1 ? Mono::constant(1)
                   : NS[K].isConst(-1)      ? ST.sym(Call, (std::int64_t)K + 1)
                                            : NS[K]);
    St = contiguousStrides(ST, Sz);
    return true;
  }
  if (!Named)
    return false;
  Sz = *Named;
  auto OwnSize = [&](const Mono &W) {
    return llvm::any_of(*Named, [&](const Mono &H) { return ST.eq(W, H) == Cmp::EQ; });
  };
  // A target that is another of its sizes says the two are equal (a square
  // [T, T] mask): expand keeps that dim, whatever broadcast it does not.
  for (size_t I = 0; I < NS.size(); ++I)
    if (!NS[I].isConst(-1))
      Sz[I] = OwnSize(NS[I]) || (Self.UnitDims && !Sz[I].isConst(1)) ? NS[I] : Mono::constant(1);
  St = contiguousStrides(ST, Sz);
  return true;
}

TensorFact LayoutAnalysis::Impl::expandOp(const OpCall &C) {
  const TensorFact &Self = C.Self;
  std::optional<Shape> NS = expandTarget(C);
  Shape InSz, InSt;
  if (!NS || !expandInput(Self, *NS, C.Call, InSz, InSt))
    return expandedUnknown(C, NS);
  size_t Lead = NS->size() - InSz.size();
  Shape Sz(NS->size()), St(NS->size());
  for (size_t I = 0; I < NS->size(); ++I) {
    const Mono &Want = (*NS)[I];
    if (I < Lead) {
      if (Want.isConst(-1))
        return unknownLike(Self);
      Sz[I] = Want;
      St[I] = Mono::constant(0);
      continue;
    }
    const Mono &Have = InSz[I - Lead];
    // A size other than 1 must already be the target's (else expand
    // throws): a run-time size is taken as > 1, so as kept.
    bool Keeps = Want.isConst(-1) || ST.eq(Want, Have) == Cmp::EQ || !Have.isConst();
    if (Keeps) {
      Sz[I] = Have;
      St[I] = InSt[I - Lead];
    } else if (Have.isConst(1)) {
      Sz[I] = Want;
      St[I] = Mono::constant(0);
    } else {
      return unknownLike(Self);
    }
  }
  TensorFact R = Self;
  setLayout(R, Sz, St);
  derived(R, Self, C);
  for (size_t I = 0; I < Sz.size(); ++I) {
    if (!St[I].isConst(0) || Sz[I].isConst(1) || Sz[I].isConst(0))
      continue;
    R.Broadcast = true;
    R.BroadcastAssumed |= !Sz[I].isConst(); // a run-time size, taken as > 1
  }
  R.ExpandCall = R.Broadcast ? C.Call : nullptr;
  if (!R.Broadcast)
    R.BroadcastAssumed = false;
  return R;
}

// An expand whose input or target the analysis cannot line up (rank
// unknown): code expands to broadcast, so a dimension is taken as expanded,
// unless every target size is -1 (keep) or a literal 1.
TensorFact LayoutAnalysis::Impl::expandedUnknown(const OpCall &C, const std::optional<Shape> &NS) {
  TensorFact R = unknownLike(C.Self);
  auto Keeps = [](std::optional<std::int64_t> V) { return V == -1 || V == 1; };
  llvm::SmallVector<const Expr *, 4> Elts;
  if (C.Name == "expand" && intList(C.arg(0), Elts) &&
      llvm::all_of(Elts, [&](const Expr *X) { return Keeps(constInt(X, Ctx)); }))
    return R;
  if (NS && llvm::all_of(*NS, [&](const Mono &M) { return M.isConst() && Keeps(M.Num); }))
    return R;
  R.Broadcast = R.BroadcastAssumed = true;
  R.ExpandCall = C.Call;
  return R;
}

//===----------------------------------------------------------------------===//
// Copies and conversions
//===----------------------------------------------------------------------===//

static bool hasStrideZero(const TensorFact &F) {
  return F.Strides && llvm::any_of(*F.Strides, [](const Mono &M) { return M.isConst(0); });
}

TensorFact LayoutAnalysis::Impl::cloneOp(const OpCall &C) {
  // preserve_format keeps the strides of a dense tensor; an expanded one
  // comes back contiguous, one with gaps dense (Note [dense results]).
  TensorFact R = C.Self; // same sizes: Src (their identity) stays
  if (hasStrideZero(C.Self))
    setContiguous(R, *C.Self.Sizes);
  denseLike(R, C.Call);
  if (const Expr *Fmt = C.arg(0); Fmt && !dtypeIn(Fmt).Size) {
    const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(Fmt));
    if (DRE && DRE->getDecl()->getName() == "Contiguous") {
      if (C.Self.Sizes)
        setContiguous(R, *C.Self.Sizes);
      R.Contig = TensorFact::Yes;
      R.Assumed = false;
    } else if (Fmt->getType().getAsString().find("MemoryFormat") != std::string::npos) {
      return unknownLike(C.Self);
    }
  }
  derived(R, C.Self, C);
  return R;
}

// The tensor whose property A reads (`x.dtype()`, `x.scalar_type()` for
// Device false, `x.device()` for Device true), or null.
static const Expr *propertySource(const Expr *A, const TensorModel &Model, bool Device) {
  for (int I = 0; A && I < 6; ++I) { // through the conversions to TensorOptions
    A = stripHandle(A)->IgnoreImplicit();
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(A)) {
      const CXXMethodDecl *MD = MC->getMethodDecl();
      const Expr *Of = MC->getImplicitObjectArgument()->IgnoreImpCasts(); // past TensorBase
      StringRef N = MD && MD->getIdentifier() ? MD->getName() : "";
      bool Names = Device ? N == "device" : (N == "dtype" || N == "scalar_type");
      return Names && Model.isTensorExpr(Of) ? Of : nullptr;
    }
    const auto *CE = dyn_cast<CXXConstructExpr>(A);
    A = CE && CE->getNumArgs() >= 1 ? CE->getArg(0) : nullptr;
  }
  return nullptr;
}

ConversionTarget LayoutAnalysis::Impl::targetOf(const OpCall &C) {
  ConversionTarget T;
  if (C.Name == "cpu")
    T.Device = TensorFact::CPU;
  else if (C.Name == "cuda")
    T.Device = TensorFact::Accelerator;
  for (const Expr *A : C.Args) {
    if (Model.isTensorExpr(A)) { // to(other), type_as(other)
      TensorFact O = evalTensor(A, C.S);
      T.DType = {O.DType, O.ElemSize};
      T.Device = C.Name == "type_as" ? TensorFact::AnyDevice : O.Device;
      T.DeviceRuntime = O.DeviceRuntime || O.DeviceAssumed;
      T.DeviceIfAvailable = O.DeviceIfAvailable && !O.DeviceAssumed;
      continue;
    }
    if (const Expr *Of = propertySource(A, Model, false)) { // to(other.dtype())
      TensorFact O = evalTensor(Of, C.S);
      if (!T.DType.Size && !O.DType.empty())
        T.DType = {O.DType, O.ElemSize};
      T.Unresolved |= O.DType.empty();
      continue;
    }
    // to(other.device()): other's device where the code shows it; else a
    // run-time device (the accelerator, or the input's own on a CPU run).
    if (const Expr *Of = propertySource(A, Model, true)) {
      TensorFact O = evalTensor(Of, C.S);
      bool Shown = O.Device != TensorFact::AnyDevice && O.deviceShownOrIfAvailable();
      if (Shown && T.Device == TensorFact::AnyDevice) {
        T.Device = O.Device;
        T.DeviceRuntime = O.DeviceRuntime;
        T.DeviceIfAvailable = O.DeviceIfAvailable;
        continue;
      }
    }
    DTypeName D = dtypeIn(A);
    DeviceOrigin Origin;
    TensorFact::DeviceKind Dev = deviceOf(A, &Origin, deviceVars());
    if (!T.DType.Size)
      T.DType = D;
    if (T.Device == TensorFact::AnyDevice) {
      T.Device = Dev;
      T.DeviceRuntime = Origin.Runtime;
      T.DeviceIfAvailable = Origin.IfAvailable;
    }
    // A dtype or options held in a variable: which conversion is unknown.
    std::string Ty = A->getType().getAsString();
    if (!D.Size && Dev == TensorFact::AnyDevice && !isa<CXXDefaultArgExpr>(A) &&
        (Ty.find("ScalarType") != std::string::npos ||
         Ty.find("TensorOptions") != std::string::npos || Ty.find("TypeMeta") != std::string::npos))
      T.Unresolved = true;
  }
  return T;
}

TensorFact LayoutAnalysis::Impl::convertOp(const OpCall &C) {
  ConversionTarget T = targetOf(C);
  const TensorFact &Self = C.Self;
  // Each part either keeps the input's value, changes it, or is unknown.
  enum Part { Keeps, Changes, Unsure };
  auto DevPart = T.Device == TensorFact::AnyDevice      ? Keeps
                 : Self.Device == TensorFact::AnyDevice ? Unsure
                 : Self.Device == T.Device              ? Keeps
                                                        : Changes;
  // `actions.to(kFloat)`: integer data by its name, float32 only by default;
  // to int64 (`labels.to(kLong)`) it may well be int64 already.
  bool IntegerNamed = Self.DTypeAssumed && Self.IntegerNamed;
  bool IntegerInput = IntegerNamed && isFloatingDType(T.DType.Name);
  auto DTypePart = !T.DType.Size                            ? Keeps
                   : Self.DType.empty()                     ? Unsure
                   : IntegerInput                           ? Changes
                   : IntegerNamed && T.DType.Name == "Long" ? Unsure
                   : Self.DType == T.DType.Name ? Keeps
                                                : Changes;
  if (Recording) {
    ConversionQuery Q;
    Q.Transfer = DevPart == Changes;
    Q.RunTimeDevice = DevPart == Changes && T.DeviceRuntime && DTypePart != Changes;
    Q.InputDTypeAssumed = Self.DTypeAssumed;
    Q.ToFloating = T.DType.Size && isFloatingDType(T.DType.Name);
    Q.Result = DevPart == Changes || DTypePart == Changes ? ConversionQuery::Copies
               : DevPart == Keeps && DTypePart == Keeps && !T.Unresolved
                   ? ConversionQuery::ReturnsSelf
                   : ConversionQuery::Unknown;
    Q.Assumed =
        (DevPart != Keeps && Self.DeviceAssumed) || (DTypePart != Keeps && Self.DTypeAssumed);
    Conversions[C.Call] = Q;
  }
  TensorFact R = Self;
  // Storage: the input's when the conversion returns it, new when it copies.
  R.Root = DevPart == Changes || DTypePart == Changes                ? C.Call
           : DevPart == Keeps && DTypePart == Keeps && !T.Unresolved ? Self.Root
                                                                     : nullptr;
  if (T.Device != TensorFact::AnyDevice) {
    R.Device = T.Device;
    R.DeviceAssumed = false;
    R.DeviceRuntime = T.DeviceRuntime;
    R.DeviceIfAvailable = T.DeviceIfAvailable;
  }
  if (T.DType.Size) {
    R.DTypeAssumed = false;
    R.DType = T.DType.Name;
    R.ElemSize = T.DType.Size;
    R.FloatingOp = false;
  } else if (T.Unresolved) { // to(other.scalar_type()): a dtype known only at run time
    R.DType = "";
    R.ElemSize = 0;
    R.DTypeAssumed = R.FloatingOp = false;
  }
  return R;
}

//===----------------------------------------------------------------------===//
// Math
//===----------------------------------------------------------------------===//

// Right-aligned broadcast of two shapes; nullopt when a pair of sizes
// cannot be decided (two unrelated run-time sizes).
std::optional<Shape> LayoutAnalysis::Impl::broadcast(const Shape &A, const Shape &B) const {
  size_t N = std::max(A.size(), B.size());
  Shape R(N);
  for (size_t I = 0; I < N; ++I) {
    const Mono *X = I < N - A.size() ? nullptr : &A[I - (N - A.size())];
    const Mono *Y = I < N - B.size() ? nullptr : &B[I - (N - B.size())];
    if (!X || (Y && X->isConst(1)))
      R[I] = *Y;
    else if (!Y || Y->isConst(1) || ST.eq(*X, *Y) == Cmp::EQ)
      R[I] = *X;
    else if (!X->isConst() || !Y->isConst())
      R[I] = X->isConst() ? *X : *Y; // both > 1 (generic), so equal when the op runs
    else
      return std::nullopt;
  }
  return R;
}

// A batched matmul with one operand of unknown rank (a cache's keys, a
// parameter): taken as of the known one's rank, as attention's operands
// are, so the result is [batch..., A's rows, B's columns].
std::optional<Shape> LayoutAnalysis::Impl::batchedLikeKnown(const OpCall &C,
                                                            const std::optional<Shape> &A,
                                                            const std::optional<Shape> &B) {
  if (A.has_value() == B.has_value())
    return std::nullopt;
  const Shape &K = A ? *A : *B;
  if (K.size() < 3)
    return std::nullopt;
  Shape R(K.begin(), K.end() - 2);
  R.push_back(A ? K[K.size() - 2] : ST.sym(C.Call, K.size() - 2));
  R.push_back(B ? K.back() : ST.sym(C.Call, K.size() - 1));
  return R;
}

// Size D of an operand of an op that takes only tensors of this Rank (mm, bmm):
// its own when its rank is known, else the call's symbol for dim D.
Mono LayoutAnalysis::Impl::sizeOfRank(const OpCall &C, const TensorFact &F, size_t Rank,
                                      size_t D) {
  return F.Sizes && F.Sizes->size() == Rank ? (*F.Sizes)[D] : ST.sym(C.Call, std::int64_t(D));
}

// The result's last size: the other operand's last, else a symbol of the call.
Mono LayoutAnalysis::Impl::resultCol(const OpCall &C, const TensorFact &O, size_t Rank) {
  return O.Sizes && O.Sizes->size() == Rank ? O.Sizes->back()
                                             : ST.sym(C.Call, std::int64_t(Rank) - 1);
}

TensorFact LayoutAnalysis::Impl::matmulOp(const OpCall &C) {
  TensorFact R = freshContiguous(C.Call);
  inheritKind(R, C.Self);
  resultDType(C, R);
  TensorFact O = C.arg(0) ? evalTensor(C.arg(0), C.S) : unknownFact();
  combineDevice(R, C.Self, O);
  if (auto Sz = batchedLikeKnown(C, C.Self.Sizes, O.Sizes))
    setContiguous(R, *Sz);
  else if (C.Name == "mm" && (!C.Self.Sizes || !O.Sizes)) // always [n, m]
    setContiguous(R, {sizeOfRank(C, C.Self, 2, 0), resultCol(C, O, 2)});
  else if (C.Name == "bmm" && (!C.Self.Sizes || !O.Sizes)) // always [b, n, m]
    setContiguous(R, {C.Self.Sizes ? sizeOfRank(C, C.Self, 3, 0) : sizeOfRank(C, O, 3, 0),
                      sizeOfRank(C, C.Self, 3, 1), resultCol(C, O, 3)});
  if (!C.Self.Sizes || !O.Sizes || C.Self.Sizes->size() < 2 || O.Sizes->size() < 2)
    return R;
  const Shape &A = *C.Self.Sizes, &B = *O.Sizes;
  auto Batch = broadcast(Shape(A.begin(), A.end() - 2), Shape(B.begin(), B.end() - 2));
  if (!Batch)
    return R;
  Batch->push_back(A[A.size() - 2]);
  Batch->push_back(B.back());
  setContiguous(R, *Batch);
  return R;
}

// Note [dense results]
// The layout PyTorch allocates for a result like R (TensorIterator's
// reorder_dimensions, empty_like's infer_dense_strides): R's own strides when
// R is non-overlapping and dense (a transpose), else dense in the order of
// R's strides, stride-0 dims skipped. So `raw.narrow(2, 5, 4).exp()` and
// `arange(n).unsqueeze(0).expand({b, n}).clamp_min(0)` are contiguous; an
// order the strides do not decide is not followed.
void LayoutAnalysis::Impl::denseLike(TensorFact &R, const void *Key) {
  if (!R.Sizes && R.NarrowDim >= 0) { // strides in order: contiguous
    R.Contig = TensorFact::Yes;
    renameUnranked(R, Key);
    return;
  }
  if (!R.Sizes || !R.Strides || R.Contig == TensorFact::Yes ||
      (!hasStrideZero(R) && !hasGaps(*R.Sizes, *R.Strides)))
    return;
  std::optional<Mono> Prev;
  for (const Mono &St : *R.Strides) {
    if (St.isConst(0))
      continue;
    if (Prev && ST.cmp(*Prev, St) != Cmp::GT) {
      R = unknownLike(R);
      return;
    }
    Prev = St;
  }
  setContiguous(R, *R.Sizes);
}

// R, of unknown rank with dims swapped or narrowed from its source, made
// contiguous: its sizes get a new identity (Key), each dim identified with
// the size it had (SymTable::identify), so `x.transpose(0, 1).contiguous()`
// keeps x's sizes in their new order.
void LayoutAnalysis::Impl::renameUnranked(TensorFact &R, const void *Key) {
  if (R.Sizes || (R.SwapA < 0 && R.NarrowDim < 0))
    return;
  if (R.Src)
    for (int K = 0; K < 8; ++K) {
      const int From = K == R.SwapA ? R.SwapB : K == R.SwapB ? R.SwapA : K;
      if (!((R.UnitDims >> K) & 1))
        ST.identify(Key, K + 1, K == R.NarrowDim ? R.NarrowLen : ST.sym(R.Src, From + 1));
    }
  R.Src = R.Src ? Key : nullptr;
  R.SwapA = R.SwapB = R.NarrowDim = -1;
  R.NarrowMayBeWhole = false;
  R.Matrix = false;
}

// Strides that leave gaps between elements (a narrow, a step): ordered
// innermost first, each stride is not the one before times its size. False
// where a comparison cannot be decided.
bool LayoutAnalysis::Impl::hasGaps(llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides) {
  llvm::SmallVector<std::pair<Mono, Mono>, 6> Dims; // (stride, size), size > 1
  for (size_t I = 0; I < Sizes.size(); ++I)
    if (!Sizes[I].isConst(1))
      Dims.push_back({Strides[I], Sizes[I]});
  for (size_t I = 1; I < Dims.size(); ++I) // insertion sort by stride, ascending
    for (size_t J = I; J > 0; --J) {
      Cmp C = ST.cmp(Dims[J - 1].first, Dims[J].first);
      if (C == Cmp::Unknown || C == Cmp::NE)
        return false;
      if (C != Cmp::GT)
        break;
      std::swap(Dims[J - 1], Dims[J]);
    }
  Mono Next = Mono::constant(1);
  for (const auto &[St, Sz] : Dims) {
    if (ST.eq(St, Next) != Cmp::EQ)
      return ST.cmp(St, Next) == Cmp::GT;
    Next = ST.mul(St, Sz);
  }
  return false;
}

// Ops whose result has self's sizes though the table makes it contiguous.
static bool keepsShape(llvm::StringRef Name) {
  return llvm::StringSwitch<bool>(Name)
      .Cases("softmax", "log_softmax", "layer_norm", "masked_fill", "batch_norm", true)
      .Cases("group_norm", "instance_norm", "cumsum", "cumprod", "triu", "tril", true)
      .Default(false);
}

TensorFact LayoutAnalysis::Impl::elementwise(const OpCall &C) {
  TensorFact R = C.Self;
  if (C.Op->storage == sem::Storage::Fresh)
    R.Src = C.Call;
  denseLike(R, C.Call);
  // R is now self made dense: a self whose strides are in order (a narrow)
  // orders the result's dims as a contiguous one would, `x.narrow(2, 1, h) /
  // w` is contiguous. combineDevice below changes only R's device.
  std::optional<TensorFact> Mixed;
  for (const Expr *A : C.Args) {
    if (!Model.isTensorExpr(A))
      continue;
    TensorFact O = evalTensor(A, C.S);
    combineDevice(R, C.Self, O);
    bool Same = O.Sizes && C.Self.Sizes && *O.Sizes == *C.Self.Sizes &&
                *O.Strides == *C.Self.Strides;
    if (!Mixed && !Same && !selfDecidesUnranked(R, O))
      Mixed = mixedLayout(R, O);
  }
  if (!Mixed)
    return R;
  Mixed->Device = R.Device;
  Mixed->DeviceRuntime = R.DeviceRuntime;
  Mixed->DeviceIfAvailable = R.DeviceIfAvailable;
  Mixed->Throws = R.Throws;
  return *Mixed;
}

// The result of operands of different layouts. TensorIterator
// (reorder_dimensions) orders the result's dims by the first operand whose
// strides tell two dims apart, so a contiguous self of the result's shape with
// no size-1 dim makes it contiguous whatever the others are; an operand of
// unknown rank is taken to broadcast into self (a bias, a mask, a scale). A
// broadcast of contiguous operands is contiguous.
TensorFact LayoutAnalysis::Impl::mixedLayout(const TensorFact &Self, const TensorFact &O) {
  TensorFact U = unknownLike(Self);
  if (!Self.Sizes)
    return U;
  std::optional<Shape> B = O.Sizes ? broadcast(*Self.Sizes, *O.Sizes) : Self.Sizes;
  if (!B)
    return U;
  // Self's sizes (all > 1) are the result's when the other has no more dims.
  bool SelfDecides = Self.Contig == TensorFact::Yes && B->size() == Self.Sizes->size() &&
                     llvm::none_of(*Self.Sizes, [](const Mono &M) { return M.isConst(1); });
  if (SelfDecides || (O.Sizes && O.Contig == TensorFact::Yes && Self.Contig == TensorFact::Yes)) {
    setContiguous(U, SelfDecides ? *Self.Sizes : *B);
    U.Assumed = Self.Assumed;
    U.AssumedSource = Self.AssumedSource;
  }
  return U;
}

// Self of unknown rank, taken as contiguous with no size-1 dim, decides the
// result's layout (whatever the other's layout) when the other operand has no
// more dims: a 0-d tensor (`e - e.max()`), a vector (a bias), or one of
// unknown rank taken to broadcast into self.
bool LayoutAnalysis::Impl::selfDecidesUnranked(const TensorFact &Self, const TensorFact &O) {
  return !Self.Sizes && Self.Contig == TensorFact::Yes && Self.SwapA < 0 && !Self.UnitDims &&
         !Self.MinChunks && (!O.Sizes || O.Sizes->size() <= 1);
}

// A floating-point number passed as a Scalar (`x * 0.5`, `x.add(t, 0.1)`).
static bool isFloatScalar(const Expr *A) {
  const Expr *V = scalarSource(A);
  return V && V->getType()->isRealFloatingType();
}

// An integer, or a floating literal with no fraction (`clamp(0, 255.0)`).
static bool isWholeScalar(const Expr *A) {
  const Expr *V = scalarSource(A);
  if (const auto *U = dyn_cast_or_null<UnaryOperator>(V); U && U->getOpcode() == UO_Minus)
    V = U->getSubExpr()->IgnoreParenImpCasts();
  if (!V || V->getType()->isIntegerType())
    return V != nullptr;
  const auto *FL = dyn_cast<FloatingLiteral>(V);
  return FL && FL->getValue().isInteger();
}

// Whole numbers stay whole through a TT_KEEPS_WHOLE op whose scalar
// arguments are whole (`x.round().clamp(0, 255)`).
static bool keepsWholeValues(const OpCall &C) {
  if (!C.Self.WholeValues || !sem::keepsWhole(C.Name))
    return false;
  for (size_t I = 0; I < C.Args.size(); ++I)
    if (C.arg(I) && !isWholeScalar(C.arg(I)))
      return false;
  return true;
}

// The dtype of a computed result (ops.def's TT_RESULT_DTYPE rows; otherwise
// self's when every tensor operand has it): unknown where the promotion of
// mixed operands would decide.
void LayoutAnalysis::Impl::resultDType(const OpCall &C, TensorFact &R) {
  sem::ResultDType Rule = sem::resultDType(C.Name);
  // div with a rounding mode keeps integers, and gives whole numbers.
  bool Rounding = C.Name == "div" && C.arg(1);
  bool Floating = Rule == sem::ResultDType::Floating && !Rounding;
  R.WholeValues = Rounding || sem::wholeResult(C.Name) || keepsWholeValues(C);
  // Floating for certain: made so by this op, or by one before it (x.softmax(1).mul(10)).
  bool KeepsFloating = C.Self.FloatingOp && (Rule == sem::ResultDType::Self ||
                                              Rule == sem::ResultDType::Own);
  bool FloatScalar = false; // a promoting op's floating scalar operand: `x * 0.5`
  auto Set = [&](DTypeName D, bool Assumed) {
    R.DType = D.Name;
    R.ElemSize = D.Size;
    R.DTypeAssumed = Assumed;
    R.FloatingOp = Floating || FloatScalar || (KeepsFloating && isFloatingDType(D.Name));
  };
  if (Rule == sem::ResultDType::Bool || Rule == sem::ResultDType::Long)
    return Set(Rule == sem::ResultDType::Bool ? DTypeName{"Bool", 1} : DTypeName{"Long", 8}, false);
  if (Rule == sem::ResultDType::Own && !C.Self.DType.empty()) // indices, masks take no part
    return Set({C.Self.DType, C.Self.ElemSize}, C.Self.DTypeAssumed);
  if (Rule == sem::ResultDType::Values)
    return valuesDType(C, R);
  // Same: every tensor operand has self's dtype; OthersIntegral: the others
  // are known integers or bools (indices, masks), which a float self outranks.
  bool Same = true, OthersIntegral = true, Assumed = C.Self.DTypeAssumed;
  for (const Expr *A : C.Args) {
    if (isa<CXXDefaultArgExpr>(A))
      continue;
    if (!Model.isTensorExpr(A)) {
      if (DTypeName D = dtypeIn(A); D.Size) { // sum(kDouble), softmax(1, kFloat)
        Set(D, false);
        R.FloatingOp = false;
        return;
      }
      FloatScalar |= sem::scalarPromotes(C.Name) && isFloatScalar(A);
      continue;
    }
    TensorFact O = evalTensor(A, C.S);
    Same &= O.DType == C.Self.DType;
    OthersIntegral &= O.DType == C.Self.DType ||
                      (!O.DTypeAssumed && !O.DType.empty() && !isFloatingDType(O.DType));
    Assumed |= O.DTypeAssumed && O.DType == C.Self.DType;
  }
  bool SelfFloat = isFloatingDType(C.Self.DType);
  if (!Same && SelfFloat && OthersIntegral) // x[idx], x * mask: self's dtype
    return Set({C.Self.DType, C.Self.ElemSize}, Assumed);
  bool SelfInt = C.Self.ElemSize && !SelfFloat && C.Self.DType != "Bool" &&
                 !C.Self.DType.starts_with("Complex");
  if (Same && SelfFloat)
    return Set({C.Self.DType, C.Self.ElemSize}, Assumed);
  if (Same && SelfInt)
    return Set(Floating || FloatScalar ? DTypeName{"Float", 4}
                                       : DTypeName{C.Self.DType, C.Self.ElemSize},
               Assumed);
  bool WasFloating = C.Self.FloatingOp || SelfFloat;
  R.DType = "";
  R.ElemSize = 0;
  R.DTypeAssumed = false;
  R.FloatingOp = Floating || WasFloating || FloatScalar; // `depth * 256.0`
}

// `torch::where(cond, a, b)`, `a.where(cond, b)`: the dtype the values agree
// on; unknown where they differ (promotion is not modelled).
void LayoutAnalysis::Impl::valuesDType(const OpCall &C, TensorFact &R) {
  bool Method = isa<CXXMemberCallExpr>(C.Call);
  llvm::SmallVector<const Expr *, 3> Values;
  if (Method)
    Values.push_back(C.SelfE);
  bool Scalar = false; // a float scalar would promote integer values
  for (size_t I = Method ? 1 : 0; I < C.Args.size(); ++I)
    if (C.arg(I) && Model.isTensorExpr(C.arg(I)))
      Values.push_back(C.arg(I));
    else
      Scalar |= C.arg(I) != nullptr;
  R.DType = "";
  R.ElemSize = 0;
  R.DTypeAssumed = R.FloatingOp = false;
  for (const Expr *V : Values) {
    TensorFact O = V == C.SelfE ? C.Self : evalTensor(V, C.S);
    if (O.DType.empty() || (R.ElemSize && O.DType != R.DType)) {
      R.DType = "";
      R.ElemSize = 0;
      return;
    }
    R.DType = O.DType;
    R.ElemSize = O.ElemSize;
    R.DTypeAssumed |= O.DTypeAssumed;
  }
  if (Scalar && !isFloatingDType(R.DType)) {
    R.DType = "";
    R.ElemSize = 0;
  }
}

TensorFact LayoutAnalysis::Impl::byTable(const OpCall &C) {
  TensorFact R = byLayout(C);
  if (C.Op->storage == sem::Storage::Fresh)
    resultDType(C, R);
  return R;
}

TensorFact LayoutAnalysis::Impl::byLayout(const OpCall &C) {
  switch (C.Op->layout) {
  case sem::Layout::Same: {
    if (C.Op->storage == sem::Storage::Factory) { // *_like
      TensorFact R = C.Self;
      R.Src = C.Call;
      if (hasStrideZero(R))
        setContiguous(R, *R.Sizes);
      denseLike(R, C.Call);
      if (DTypeName D = dtypeIn(C.Call); D.Size) {
        R.DType = D.Name;
        R.ElemSize = D.Size;
        R.DTypeAssumed = R.FloatingOp = false;
      }
      return R;
    }
    if (C.Op->storage == sem::Storage::Fresh)
      return elementwise(C);
    return C.Self; // detach, data, may-alias ops that keep the layout
  }
  case sem::Layout::Contiguous: {
    TensorFact F = freshContiguous(C.Call);
    inheritKind(F, C.Self);
    if (keepsShape(C.Name) && C.Self.Sizes)
      setContiguous(F, *C.Self.Sizes);
    return F;
  }
  default:
    return unknownLike(C.Self);
  }
}

} // namespace clang::tidy::tensor
