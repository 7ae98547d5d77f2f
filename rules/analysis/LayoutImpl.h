// Private to the layout analysis (LayoutAnalysis.cpp: values and flow;
// LayoutOps.cpp: one handler per op family).
#pragma once

#include "analysis/AstHelpers.h"
#include "analysis/DeviceFacts.h"
#include "analysis/LayoutAnalysis.h"

#include "clang/AST/ASTContext.h"
#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

namespace layout {
// `ST.sym(Src, kLastDim)`: `x.size(-1)` of a tensor of unknown rank, named
// after its rank where one is tried (decideUnknownRank).
constexpr std::int64_t kLastDim = 1000;
bool isIntExpr(const Expr *X);
bool intList(const Expr *E, llvm::SmallVectorImpl<const Expr *> &Out);
std::optional<std::int64_t> constInt(const Expr *E, const ASTContext &Ctx);
DTypeName dtypeNamed(llvm::StringRef N);
DTypeName dtypeIn(const Stmt *S);
DTypeName dtypeInArgs(llvm::ArrayRef<const Expr *> Args);
/// A TensorOptions (c10's, or the runtime's), by value or reference.
bool isTensorOptionsType(QualType T);
/// How a device argument names its device: as a run-time value (it may be
/// the CPU), and whether that value is CUDA whenever the machine has one.
struct DeviceOrigin {
  bool Runtime = false;
  bool IfAvailable = false;
};
TensorFact::DeviceKind deviceOf(const Expr *A, DeviceOrigin *Origin = nullptr,
                                DeviceFacts *Vars = nullptr);
TensorFact unknownFact();
TensorFact assumedInput(const void *Src, std::string Source, llvm::StringRef Name = "");
TensorFact freshContiguous(const void *Src);
TensorFact join(const TensorFact &A, const TensorFact &B);
TensorFact::ContigKind toContig(Contig C);
std::optional<std::int64_t> normDim(std::optional<std::int64_t> D, size_t Rank);
} // namespace layout

struct LayoutAnalysis::State {
  llvm::DenseMap<const VarDecl *, TensorFact> T;
  llvm::DenseMap<const VarDecl *, Mono> I;
  /// Members of `this` the body assigned (`particles_ = x.expand(...)`), until
  /// a call that may assign them again.
  llvm::DenseMap<const FieldDecl *, TensorFact> M;
  /// Tensor fields of local struct variables the body assigned
  /// (`data.timestamps = torch::empty({n}, torch::kFloat)`), until the
  /// variable is assigned whole, redeclared or given to a writing call.
  llvm::DenseMap<std::pair<const VarDecl *, const FieldDecl *>, TensorFact> L;

  bool operator==(const State &O) const {
    return T == O.T && I == O.I && M == O.M && L == O.L;
  }
};

/// A tensor op call being evaluated: its name, table row, self and arguments.
struct OpCall {
  const CallExpr *Call;
  llvm::StringRef Name;
  const sem::OpInfo *Op;
  const Expr *SelfE;
  llvm::ArrayRef<const Expr *> Args;
  LayoutAnalysis::State &S;
  TensorFact Self;

  const Expr *arg(size_t I) const {
    return I < Args.size() && !isa<CXXDefaultArgExpr>(Args[I]) ? Args[I] : nullptr;
  }
};

/// What a conversion asks for: a dtype and/or a device (empty / AnyDevice: keep).
struct ConversionTarget {
  layout::DTypeName DType;
  TensorFact::DeviceKind Device = TensorFact::AnyDevice;
  bool DeviceRuntime = false; // the device is a run-time value
  bool DeviceIfAvailable = false; // ... CUDA whenever the machine has one
  bool Unresolved = false;    // a dtype or options the analysis cannot read
};

/// A new shape argument: its sizes, and which one was -1 (inferred).
struct ShapeArg {
  Shape Sizes;
  int Infer = -1;
};

class LayoutAnalysis::Impl {
public:
  Impl(const TensorModel &Model, ASTContext &Ctx) : Model(Model), Ctx(Ctx) {}

  void run(const FunctionDecl *FD);

  // Dataflow domain.
  using State = LayoutAnalysis::State;
  void transfer(const Stmt *St, State &S);
  bool join(State &Into, const State &From);
  void keepRank(TensorFact &R, const TensorFact &A, const TensorFact &B, const void *Key);
  void widen(State &S) {
    S.T.clear();
    S.I.clear();
  }

  const TensorModel &Model;
  ASTContext &Ctx;
  SymTable ST;
  llvm::DenseSet<const VarDecl *> Untracked;
  /// Loop variables over the elements of a vector of tensors the function
  /// is given (`for (const auto &out : outs)`): inputs, as parameters are.
  llvm::DenseSet<const VarDecl *> InputElements;
  const FunctionDecl *Fn = nullptr;
  bool Recording = false;
  llvm::DenseMap<const Expr *, TensorFact> Facts;
  llvm::DenseMap<const CallExpr *, ViewQuery> Queries;
  llvm::DenseMap<const CallExpr *, ConversionQuery> Conversions;
  LayoutAnalysis::CalleeFn Callees;
  std::optional<TensorFact> Returned;
  llvm::DenseMap<const FieldDecl *, TensorFact> ReturnedFields; // of a returned struct
  DeviceFacts *DeviceVars = nullptr; // what device variables hold (null: run-time values)
  FixedLocals Locals; // structResultOf's and the factories' locals
  LayoutClassFacts *Classes = nullptr; // the TU's memo (OwnClasses when none is set)
  LayoutClassFacts OwnClasses;
  ParamFacts Params; // what the callers pass (AnalysisManager)
  // memberStorage's identities of `v.f`: the first such expression.
  llvm::DenseMap<std::pair<const ValueDecl *, const ValueDecl *>, const MemberExpr *> MemberIds;

  const CallExpr *structResultOf(const MemberExpr *ME);

  DeviceFacts *deviceVars() const { return DeviceVars; }
  LayoutClassFacts &classes() { return Classes ? *Classes : OwnClasses; }

  std::optional<std::int64_t> argInt(const OpCall &C, size_t I) const {
    return layout::constInt(C.arg(I), Ctx);
  }
  std::string describe(const Expr *E) const;
  TensorFact onCertainCUDA(TensorFact F, const Expr *E);
  TensorFact paramFact(const ParmVarDecl *P);
  TensorFact assumedResult(const Expr *E) const {
    TensorFact F = layout::assumedInput(E, "the result of '" + describe(E) + "'");
    F.KindSource.CallResult = true;
    return F;
  }

  // Values.
  TensorFact evalTensor(const Expr *E, State &S);
  TensorFact evalVar(const VarDecl *VD, const Expr *Ref, State &S);
  TensorFact evalOperator(const CXXOperatorCallExpr *OC, State &S);
  TensorFact evalCall(const CallExpr *Call, State &S);
  const Expr *optionsOfTensor(llvm::ArrayRef<const Expr *> Args);
  std::optional<TensorFact> valuesOrIndices(const Expr *Tuple, std::size_t I, State &S);
  TensorFact evalOp(const CallExpr *Call, llvm::StringRef Name, const Expr *SelfE,
                    llvm::ArrayRef<const Expr *> Args, State &S);
  Mono evalInt(const Expr *E, State &S);
  std::optional<TensorFact> calleeResult(const CallExpr *Call, const FunctionDecl *FD, State &S);
  TensorFact moduleResult(const CallExpr *Call, const FunctionDecl *FD, const Expr *Input,
                          State &S);
  TensorFact onInputDevice(TensorFact F, const Expr *T, State &S);
  TensorFact onArgsDevice(TensorFact F, const CallExpr *Call, State &S);
  TensorFact rnnOutput(const Expr *E, const CallExpr *Rnn, State &S);
  TensorFact importFact(const TensorFact &F, const CallExpr *Call, const FunctionDecl *FD,
                        const SymTable &From, State &S);
  bool withArgumentSizes(TensorFact &R, const TensorFact &F, const TensorFact &A);
  std::optional<Mono> bindCalleeSymbol(const CallExpr *Call, const FunctionDecl *FD, const void *K,
                                       std::int64_t I, State &S);
  std::optional<Mono> sizeAt(const TensorFact &F, std::optional<std::int64_t> D);
  void recordReturn(const ReturnStmt *RS, State &S);
  void recordReturnedFields(const Expr *V, State &S);
  TensorFact normalised(TensorFact F) const;
  std::optional<TensorFact> structField(const Expr *E, const FieldDecl *F, State &S,
                                        int Depth = 0);
  std::optional<TensorFact> calleeField(const CallExpr *Call, const FieldDecl *F, State &S);
  std::optional<Mono> evalSizeQuery(const Expr *E, State &S);
  std::optional<ShapeArg> shapeArg(const Expr *E, State &S, bool Expand = false);
  std::optional<Shape> inferShape(const ShapeArg &A, const TensorFact &Self, const void *Key);

  // Op handlers, one per family (dispatched by name in applyOp).
  using Handler = TensorFact (Impl::*)(const OpCall &);
  TensorFact applyOp(const OpCall &C);
  TensorFact factory(const OpCall &C);
  TensorFact unlistedMaker(const OpCall &C);
  std::optional<Shape> joinedShape(const OpCall &C);
  void identifyStacked(const OpCall &C);
  bool isSizesOfTensor(const Expr *E) const;
  std::optional<Shape> sizesArg(const OpCall &C);
  TensorFact reshapeOp(const OpCall &C);
  TensorFact reshapeAsOp(const OpCall &C);
  TensorFact flattenOp(const OpCall &C);
  TensorFact contiguousOp(const OpCall &C);
  TensorFact transposeOp(const OpCall &C);
  TensorFact permuteOp(const OpCall &C);
  TensorFact unfoldOp(const OpCall &C);
  TensorFact sliceOp(const OpCall &C);
  TensorFact squeezeOp(const OpCall &C);
  TensorFact expandOp(const OpCall &C);
  /// Sizes of an unknown-rank tensor taken as contiguous, at a rank the code
  /// names (a permutation, an expand): symbols, or 1 for known unit dims.
  std::optional<Shape> rankedSizes(const TensorFact &Self, size_t Rank);
  bool globalPooling(llvm::StringRef Name, llvm::ArrayRef<const Expr *> Args) const;
  std::optional<Shape> expandTarget(const OpCall &C);
  bool expandInput(const TensorFact &Self, const Shape &NS, const Expr *Call, Shape &Sz, Shape &St);
  TensorFact expandedUnknown(const OpCall &C, const std::optional<Shape> &NS);
  TensorFact cloneOp(const OpCall &C);
  TensorFact convertOp(const OpCall &C);
  TensorFact matmulOp(const OpCall &C);
  Mono sizeOfRank(const OpCall &C, const TensorFact &F, size_t Rank, size_t D);
  Mono resultCol(const OpCall &C, const TensorFact &O, size_t Rank);
  TensorFact byTable(const OpCall &C);
  TensorFact byLayout(const OpCall &C);

  // Helpers of the handlers.
  // What an op's result keeps of its input whatever the layout: dtype, device
  // (and whole values, which an op that computes resets in resultDType).
  static void inheritKind(TensorFact &R, const TensorFact &Self) {
    R.ElemSize = Self.ElemSize;
    R.DType = Self.DType;
    R.DTypeAssumed = Self.DTypeAssumed;
    R.IntegerNamed = Self.IntegerNamed;
    R.FloatingOp = Self.FloatingOp;
    R.WholeValues = Self.WholeValues;
    inheritDevice(R, Self);
  }
  static void inheritDevice(TensorFact &R, const TensorFact &Self) {
    R.Device = Self.Device;
    R.DeviceAssumed = Self.DeviceAssumed;
    R.DeviceRuntime = Self.DeviceRuntime;
    R.DeviceIfAvailable = Self.DeviceIfAvailable;
    R.KindSource = Self.KindSource;
  }
  // The device of an op's result, given another tensor operand O: a CPU
  // scalar tensor goes where the other operand is; operands on two devices
  // the code shows make the op throw (device-mismatch says so once), so what
  // follows is not judged on a device it never gets. Else self's device.
  static void combineDevice(TensorFact &R, const TensorFact &Self, const TensorFact &O) {
    // `arange(n) >= starts` with starts' device taken by default: the result
    // is on the host only by that default too (starts may be on CUDA).
    if (O.Device == Self.Device && Self.Device == TensorFact::CPU && O.DeviceAssumed)
      R.DeviceAssumed = true;
    if (O.Device == TensorFact::AnyDevice || Self.Device == TensorFact::AnyDevice ||
        O.Device == Self.Device)
      return;
    auto Scalar = [](const TensorFact &F) {
      return F.Device == TensorFact::CPU && F.Sizes && F.Sizes->empty();
    };
    if (Scalar(Self)) {
      inheritDevice(R, O);
    } else if (!Scalar(O) && Self.deviceShownOrIfAvailable() && O.deviceShownOrIfAvailable()) {
      R.Device = TensorFact::AnyDevice;
      R.Throws = true;
    }
  }
  TensorFact unknownLike(const TensorFact &Self) const {
    TensorFact U;
    inheritKind(U, Self);
    return U;
  }
  void setLayout(TensorFact &F, Shape Sizes, Shape Strides) {
    F.Contig = layout::toContig(contigOf(ST, Sizes, Strides));
    F.Sizes = std::move(Sizes);
    F.Strides = std::move(Strides);
    F.SwapA = F.SwapB = -1;
    F.UnitDims = 0;
    F.NarrowDim = -1;
    F.NarrowMayBeWhole = false;
  }
  void setContiguous(TensorFact &F, const Shape &Sizes) {
    setLayout(F, Sizes, contiguousStrides(ST, Sizes));
  }
  void derived(TensorFact &R, const TensorFact &Self, const OpCall &C) const;
  std::optional<Shape> batchedLikeKnown(const OpCall &C, const std::optional<Shape> &A,
                                       const std::optional<Shape> &B);
  std::optional<ShapeArg> flattenShape(const TensorFact &Self, std::int64_t Start,
                                       std::int64_t End);
  static std::optional<Viewability> flattenSwapped(const TensorFact &Self, std::int64_t Start,
                                                   std::int64_t End);
  /// Decided: what the caller knows when the shapes alone do not tell.
  TensorFact reshapeLike(const OpCall &C, const TensorFact &Self, std::optional<ShapeArg> New,
                         std::optional<Viewability> Decided = std::nullopt);
  ViewQuery decideView(const TensorFact &In, const std::optional<ShapeArg> &New,
                       const std::optional<Shape> &NewShape, Shape &NewStride);
  std::optional<Shape> shapeAtRank(const TensorFact &In, const ShapeArg &New, const Shape &Source,
                                   const Shape &Sz, const Shape &Swapped);
  std::optional<Shape> inferredShape(Shape NS, int Infer, const Shape &Sz);
  std::optional<Viewability> decideUnknownRank(const TensorFact &In, const ShapeArg &New,
                                               int &MinRank);
  std::optional<Shape> unknownRankLayout(const TensorFact &In, const ShapeArg &New, int Rank,
                                         Shape &Sz, Shape &St);
  void narrowedUnranked(const OpCall &C, const TensorFact &Self, std::int64_t D, size_t First,
                        TensorFact &R);
  bool sameSizes(llvm::ArrayRef<Mono> A, llvm::ArrayRef<Mono> B) const;
  bool rankShown(const void *Src) const;
  TensorFact sliceAlong(const OpCall &C, std::int64_t D, size_t First);
  Mono sliceLength(const OpCall &C, const Mono &Len, size_t First, std::int64_t Step);
  void sliceSpan(const OpCall &C, TensorFact &R, std::int64_t D, const Mono &Len, size_t First);
  std::optional<TensorFact::Bound> boundOf(const Expr *E, const Mono &Len, State &S, bool End);
  void trackStorage(const OpCall &C, TensorFact &R) const;
  void keepBroadcast(const OpCall &C, TensorFact &R) const;
  void recordWrite(const CallExpr *Call, State &S);
  ConversionTarget targetOf(const OpCall &C);
  std::optional<Shape> broadcast(const Shape &A, const Shape &B) const;
  TensorFact elementwise(const OpCall &C);
  void denseLike(TensorFact &R, const void *Key);
  void renameUnranked(TensorFact &R, const void *Key);
  bool hasGaps(llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides);
  bool moduleOutputSizes(const sem::ModuleInfo &Row, const CallExpr *Call, Shape &Sz);
  void libraryModuleLayout(const sem::ModuleInfo &Row, const CallExpr *Call, const TensorFact &In,
                           TensorFact &F);
  TensorFact mixedLayout(const TensorFact &Self, const TensorFact &O);
  static bool selfDecidesUnranked(const TensorFact &Self, const TensorFact &O);
  void onListDevice(const OpCall &C, TensorFact &F);
  void resultDType(const OpCall &C, TensorFact &R);
  void valuesDType(const OpCall &C, TensorFact &R);
  void prescan(const Stmt *St);
  void assignTensor(const VarDecl *V, const Expr *Init, State &S);
  bool isAsserted(const Expr *E) const;
  layout::DTypeName fieldDType(const FieldDecl *F);
  layout::DTypeName madeDType(const FieldDecl *F);
  const CallExpr *madeBy(const Expr *V) const;
  /// The dtype a factory call names, in its arguments or in the initializer
  /// of a local TensorOptions it is given that is never assigned again.
  layout::DTypeName factoryDType(const CallExpr *Call);
  const void *memberStorage(const MemberExpr *ME);
  const FieldDecl *thisMember(const Expr *E) const;
  std::optional<std::pair<const VarDecl *, const FieldDecl *>> localField(const Expr *E) const;
  static void forgetFields(State &S, const VarDecl *V);
  void initFields(const VarDecl *V, State &S);
  bool mayAssignMembers(const CallExpr *Call) const;
  layout::DTypeName assertedDTypeIn(const Stmt *S, const FieldDecl *F) const;
  void assertionFacts(const Expr *E, State &S);
  void transferCall(const CallExpr *Call, State &S);
  void forgetWrittenArgs(const CallExpr *Call, State &S);
};

} // namespace clang::tidy::tensor
