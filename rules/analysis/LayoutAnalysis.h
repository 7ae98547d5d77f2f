// Layout (shape / stride / contiguity) analysis: flow-sensitive over the clang
// CFG of one function body. Tracks, per local tensor handle and per local
// integer, what is known about sizes and strides, symbolically when they come
// from run-time values, and decides with PyTorch's own rule (computeStride)
// whether a view/reshape can alias its input. Layout sources come only from the
// op table (tt/ops.def); ops it models precisely refine the table by arguments.
#pragma once

#include "analysis/AstHelpers.h"
#include "analysis/Shape.h"
#include "analysis/TensorModel.h"

#include "clang/AST/Decl.h"
#include "clang/AST/Expr.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace clang::tidy::tensor {

class CallSites;

class DeviceFacts;

/// What is known about one tensor value.
struct TensorFact {
  enum ContigKind : std::uint8_t { Unknown, Yes, No };
  ContigKind Contig = Unknown;
  /// The fact relies on a default the code does not show: an input of
  /// unknown origin taken as a contiguous float32 CPU tensor, run-time sizes
  /// taken as > 1.
  bool Assumed = false;
  /// The dtype / device are the float32 / CPU defaults, not shown.
  bool DTypeAssumed = false, DeviceAssumed = false;
  /// An input whose name says it holds integer data (namesIntegerData): its
  /// float32 default is not relied on where it would decide a conversion.
  bool IntegerNamed = false;
  /// The input taken as contiguous, for messages: "'x'", "the result of 'l(x)'".
  std::string AssumedSource;
  /// The input whose dtype / device are taken as float32 / CPU: its words
  /// for messages, and whether it is the result of a call the analysis does
  /// not follow (not an input the function was given).
  struct AssumedKind {
    std::string Text;
    bool CallResult = false;
    bool operator==(const AssumedKind &O) const {
      return Text == O.Text && CallResult == O.CallResult;
    }
  } KindSource;
  /// Sizes and strides, when the rank is known.
  std::optional<Shape> Sizes, Strides;
  /// Rank unknown but not 0: made with another tensor's sizes
  /// (`torch::rand(x.sizes())`), which real tensors have (not a CPU scalar).
  bool HasDims = false;
  /// Element size in bytes, when the dtype is known.
  unsigned ElemSize = 0;
  /// The dtype's name ("Float", "Long"...), when known.
  llvm::StringRef DType;
  enum DeviceKind : std::uint8_t { AnyDevice, CPU, Accelerator };
  /// CPU for factories without a device; Accelerator after `cuda()` or `to(d)`
  /// with a device other than kCPU (code that moves tensors targets one).
  DeviceKind Device = AnyDevice;
  /// The accelerator came from a run-time device value (a torch::Device
  /// variable, `other.device()`): it may be the CPU.
  bool DeviceRuntime = false;
  /// With DeviceRuntime: the value is `is_available() ? kCUDA : kCPU`
  /// (DeviceKnown::CUDAIfAvailable), CUDA on every machine that has one.
  bool DeviceIfAvailable = false;
  /// The code shows the device, or chooses CUDA whenever there is one.
  bool deviceShownOrIfAvailable() const {
    return !DeviceAssumed && (!DeviceRuntime || DeviceIfAvailable);
  }
  /// Made by an op that certainly throws (operands on two devices the code
  /// shows): no value flows from it, so a join takes the other side's fact.
  bool Throws = false;
  /// Made by an op whose result is floating point whatever its input's dtype
  /// (softmax, exp, true division): floating even when DType is unknown.
  bool FloatingOp = false;
  /// Holds whole numbers: made by round/floor/ceil/trunc (ops.def
  /// TT_WHOLE_RESULT) or a rounding division, or a view or copy of such a value,
  /// or a TT_KEEPS_WHOLE op (clamp...) of one with whole bounds.
  bool WholeValues = false;
  /// Unknown rank: the (normalised) dims a transpose swapped on a tensor taken
  /// as contiguous; -1 when none.
  int SwapA = -1, SwapB = -1;
  /// The swap is t()'s: the tensor is taken as a matrix (2 dims at most).
  bool Matrix = false;
  /// Unknown rank: dims known to have size 1 (bit i: dim i, from unsqueeze).
  std::uint32_t UnitDims = 0;
  /// Unknown rank: a narrow of a contiguous tensor (sizes Src's) along this
  /// dim to NarrowLen elements, strides Src's contiguous ones; -1 when none.
  int NarrowDim = -1;
  Mono NarrowLen;
  /// The narrow starts at 0 and may keep the whole dim (`x.narrow(2, 0, n)`):
  /// its strides are in order, but whether a view of it works is not known.
  bool NarrowMayBeWhole = false;
  /// Unknown sizes: a view can merge no fewer runs of dims than this, at any
  /// rank (the overlapping windows of `unfold`); 0 when not known.
  int MinChunks = 0;
  /// Identity of the value the sizes of an unknown-rank tensor belong to.
  const void *Src = nullptr;
  /// The op that made it non-contiguous (for messages) and where.
  std::string Origin;
  SourceLocation OriginLoc;
  /// A dimension of stride 0 and size > 1 (PyTorch's internal overlap), made
  /// by ExpandCall; Assumed: it rests on the defaults (sizes > 1, an expand of
  /// a tensor of unknown rank taken as broadcasting).
  bool Broadcast = false, BroadcastAssumed = false;
  const CallExpr *ExpandCall = nullptr;
  /// The value whose storage holds the elements (the input or the op that
  /// allocated it), when views of it are followed; null: unknown.
  const void *Root = nullptr;
  /// A slice of Root along SliceDim (-1: all of Root), with step 1: indices
  /// [Lo, Hi), each a run-time size (the dimension's length, `n`; constant 0
  /// for none) plus a constant.
  struct Bound {
    Mono Base = Mono::constant(0);
    std::int64_t Off = 0;
    bool operator==(const Bound &O) const { return Base == O.Base && Off == O.Off; }
  };
  int SliceDim = -1;
  Bound Lo, Hi;

  bool hasShape() const { return Sizes.has_value(); }
  bool operator==(const TensorFact &O) const;
  bool operator!=(const TensorFact &O) const { return !(*this == O); }
};

/// How the elements of an in-place op's output and an input share memory, as
/// at::get_overlap_status decides (aten/src/ATen/MemoryOverlap.cpp).
struct OverlapQuery {
  enum Kind : std::uint8_t { Unknown, Disjoint, Full, Partial, TooHard };
  Kind Result = Unknown;
  /// Rests on a default (an input taken as contiguous, sizes > 1).
  bool Assumed = false;
  /// For a shift (a slice of one dimension): the dimension.
  int Dim = -1;
};

/// Whether a view/reshape of a tensor to a new shape can alias it.
struct ViewQuery {
  using Kind = Viewability;
  static constexpr Kind Unknown = Viewability::Unknown, Viewable = Viewability::Viewable,
                        NotViewable = Viewability::NotViewable;
  Kind Result = Unknown;
  /// Decided from concrete sizes and a known input: holds on every run.
  bool Certain = false;
  /// Bytes a copy of the input takes, when sizes and dtype are concrete.
  std::optional<std::int64_t> Bytes;
  /// The input's fact and the requested shape (when known).
  TensorFact Input;
  std::optional<Shape> NewSizes;
  /// Decided for an input of unknown rank taken to have at least this many
  /// dims (Note [no-op at the smallest rank]); 0: at every rank.
  int MinRank = 0;
};

/// Whether a may-alias op (`contiguous`, `to`, `cpu`, `cuda`, `float`...)
/// returns its input or copies it, from the facts at the call.
struct ConversionQuery {
  enum Kind : std::uint8_t { Unknown, ReturnsSelf, Copies };
  Kind Result = Unknown;
  /// The decision rests on a default (e.g. an input taken as contiguous).
  bool Assumed = false;
  /// The device changes (a synchronising transfer).
  bool Transfer = false;
  /// The copy rests on a device chosen at run time (`is_available() ? kCUDA :
  /// kCPU`, a parameter): where that device is the input's (a CPU-only run),
  /// the conversion returns its input.
  bool RunTimeDevice = false;
  /// The input's dtype is the float32 default, not shown by the code.
  bool InputDTypeAssumed = false;
  /// The target dtype is a floating one (`to(kFloat)`, `toType(kHalf)`).
  bool ToFloating = false;
};

namespace layout {
/// A dtype's name ("Float", "Long"...) and element size; Size 0: unknown.
struct DTypeName {
  llvm::StringRef Name;
  unsigned Size = 0;
};
} // namespace layout

/// What the layout facts read off the TU's classes (a member's dtype as its
/// class keeps it): the same from every function, so memoised once per TU
/// (AnalysisManager owns it) rather than once per function.
struct LayoutClassFacts {
  llvm::DenseMap<const FieldDecl *, layout::DTypeName> FieldDTypes;
  /// The TU's call and field-write index, for the values code outside a
  /// class gives its fields (none: the class's own code only).
  const CallSites *Sites = nullptr;
};

/// What every call of a function in the main file passes for one of its
/// tensor parameters, where all agree (Note [call-site facts] in
/// AnalysisManager.cpp): a contiguous tensor of this rank, each size the same
/// constant at every call or (none) a run-time value; a device the code shows.
struct ParamFact {
  std::optional<llvm::SmallVector<std::optional<std::int64_t>, 4>> Sizes;
  TensorFact::DeviceKind Device = TensorFact::AnyDevice;
  bool DeviceRuntime = false;
  bool DeviceIfAvailable = false; // as TensorFact's
  llvm::StringRef DType;           // the dtype every call shows, if one
  unsigned ElemSize = 0;
  /// Some call passes a tensor whose rank its caller knows, whatever its
  /// layout: the rank is not the reader's guess (Note [no-op at the smallest
  /// rank]).
  bool RankShown = false;
  bool says() const {
    return Sizes || Device != TensorFact::AnyDevice || RankShown || !DType.empty();
  }
};
using ParamFacts = llvm::DenseMap<const ParmVarDecl *, ParamFact>;

/// The device part of the meet of A and B (TensorFacts or ParamFacts) into R,
/// which may be A: a device where both agree; chosen at run time where either
/// is; CUDA-if-available where every run-time side is and the device agrees.
template <typename Fact> void meetDevice(Fact &R, const Fact &A, const Fact &B) {
  bool Runtime = A.DeviceRuntime || B.DeviceRuntime;
  bool Same = A.Device == B.Device;
  bool IfAvailable = Runtime && Same && A.Device == TensorFact::Accelerator &&
                     (A.DeviceIfAvailable || !A.DeviceRuntime) &&
                     (B.DeviceIfAvailable || !B.DeviceRuntime);
  R.Device = Same ? A.Device : TensorFact::AnyDevice;
  R.DeviceRuntime = Runtime;
  R.DeviceIfAvailable = IfAvailable;
}

class LayoutAnalysis {
public:
  LayoutAnalysis(const TensorModel &Model, ASTContext &Ctx);
  ~LayoutAnalysis();

  /// The analysis of a callee defined in the TU, for the facts of what it
  /// returns; null when unavailable (no body, a recursive call).
  using CalleeFn = std::function<const LayoutAnalysis *(const FunctionDecl *)>;
  void setCallees(CalleeFn F);
  /// The function's device facts, for the devices its variables hold
  /// (`torch::Device device(torch::kCUDA)`); without them such a device is a
  /// run-time value.
  void setDeviceVars(DeviceFacts *D);
  /// The TU's memo of class facts (a private one when not set).
  void setClassFacts(LayoutClassFacts *C);
  /// What the callers give parameters, used at entry instead of an unknown
  /// rank and device (the defaults still hold for contiguity and dtype).
  void setParamFacts(ParamFacts P);

  /// Analyses the body of a function (or a lambda's call operator).
  void run(const FunctionDecl *FD);

  /// The join of the facts of every tensor the function returns, sizes and
  /// strides normalised (symbols of this analysis); none if it returns none.
  const std::optional<TensorFact> &returnFact() const;
  /// The join of field F of every struct the function returns, as returnFact.
  const TensorFact *returnFieldFact(const FieldDecl *F) const;
  /// The table the symbols of returnFact() live in.
  const SymTable &symbols() const;

  /// The fact about a tensor expression that is the object (or first
  /// argument) of a recorded call, at that program point; null if unknown.
  const TensorFact *factOf(const Expr *E) const;
  /// For view, view_as, reshape, reshape_as and flatten calls: can the result alias.
  const ViewQuery *queryOf(const CallExpr *Call) const;
  /// For the may-alias ops of the table: does the call copy.
  const ConversionQuery *conversionOf(const CallExpr *Call) const;

  /// Overlap of the written tensor Out and an input In of one in-place op.
  static OverlapQuery overlap(const TensorFact &Out, const TensorFact &In);

  /// Text for a byte count: "512 bytes", "3.0 KiB", "4.0 MiB", "1.5 GiB".
  static std::string formatBytes(std::int64_t Bytes);
  /// "[2, 3]" when every size is a constant, else "".
  static std::string formatShape(llvm::ArrayRef<Mono> Sizes);
  /// assumption(Q.Input), and the rank Q.MinRank assumes.
  static std::string assumption(const ViewQuery &Q);
  /// "; assuming 'x' is contiguous, as nearly all tensors are" when F rests
  /// on an input taken as contiguous, else "".
  static std::string assumption(const TensorFact &F);
  /// Bytes of a tensor whose sizes and dtype are known constants.
  static std::optional<std::int64_t> bytesOf(const TensorFact &F);

  struct State;

private:
  class Impl;
  std::unique_ptr<Impl> P;
};

} // namespace clang::tidy::tensor
