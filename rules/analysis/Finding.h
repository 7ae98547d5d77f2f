// The typed finding: what a check found, in a form the driver and --verify
// can read without parsing the diagnostic's English. Each check emits one
// next to its clang diagnostic (emitFinding); the tensor-tidy driver registers
// a sink that collects them per TU. Under stock clang-tidy no sink is
// registered and findings are dropped (docs/design.md, "Typed findings").
//
// The JSON form (toJSON/fromJSON, versioned by FindingSchemaVersion) is the
// only serialisation: worker processes hand findings back in it, the cache
// stores it, and the driver's JSON/SARIF output embeds it.
#pragma once

#include "clang/Basic/SourceLocation.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/JSON.h"

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace clang {
class Expr;
class NamedDecl;
class SourceManager;
} // namespace clang

namespace clang::tidy::tensor {

/// Bumped whenever a field changes meaning or a required field is added.
inline constexpr int FindingSchemaVersion = 1;

/// What can go wrong at run time.
enum class HazardKind {
  SharedStorageWrite,    // an in-place write changes another handle's data
  DetachedWrite,         // an in-place write changes a tensor behind autograd's back
  ViewThrows,            // view() on a non-viewable layout throws
  ImplicitCopy,          // reshape/flatten silently copies
  LoopInvariantCopy,     // a copy of a loop-invariant tensor on every iteration
  ExpandedWrite,         // an in-place write into a stride-0 (expanded) dimension throws
  OverlapThrows,         // an in-place op's input partially overlaps its output: throws
  OverlapOrderDependent, // ... where PyTorch cannot tell: the result depends on order
  NarrowingCopy,      // copy_ silently converts to a narrower dtype
  DeviceMismatch,     // an op combines tensors on two devices: throws
  LeafInplace,        // an in-place write on a leaf that requires grad (autograd refuses)
  SavedInplace,       // an in-place write on a tensor saved for backward (backward refuses)
  GraphKept,          // a value that requires grad kept across loop iterations
  UnneededCopy,       // a clone nothing needs, or rewritten in place at once
  DeviceSyncInLoop,   // a device-to-host sync on every iteration, only to accumulate or log
};

/// What the offered fix-it does (None: no fix-it).
enum class FixKind {
  None,
  OutOfPlace,       // b.add_(1) -> b = b.add(1)
  CloneAtAlias,     // .clone() where the alias is made
  DetachClone,      // detach() -> detach().clone()
  ContiguousFirst,  // x.view(...) / x.reshape(...) -> x.contiguous().view(...)
  ReshapeForView,   // view -> reshape
  UseSource,        // x.clone() -> x (never written)
  HoistOutOfLoop,   // the declaration moves before the loop
  HoistAndCopyInto, // one buffer before the loop, copy_ into it
  CloneAtExpand,    // x.expand(...) -> x.expand(...).clone()
  CloneSource,      // dst.copy_(src) -> dst.copy_(src.clone())
  ExplicitConvert,  // copy_(src) -> copy_(src.to(dst.scalar_type()))
  ToOtherDevice,    // x -> x.to(other.device())
  NoGradBlock,      // the update wrapped in `{ torch::NoGradGuard no_grad; ... }`
  DetachKept,       // total += loss -> total += loss.detach()
  OutOfPlaceOnSource, // y = x.clone(); y.mul_(2) -> y = x.mul(2)
  AccumulateOnDevice, // s += t.item() -> s_t = s_t + t.detach(), read once after the loop
};

/// A fact the check relied on; --verify and readers of the report can tell a
/// proven finding from an assumed one.
enum class Fact {
  LayoutKnown,       // sizes and strides of the input are known
  LayoutCertain,     // the layout cannot be viewed, for any sizes
  LayoutUnproven,    // non-viewable unless merged dimensions have size 1
  AssumedContiguous, // an input of unknown layout taken as contiguous (or sizes as > 1)
  HandleCopy,        // a handle copy shares storage
  MayAliasOp,        // an op that may return its input
  SharesVersion,     // detach(): shares the version counter
  NoVersionCounter,  // .data(): not even the version counter
  ReadLater,         // the changed handle is read after the write
  Escapes,           // the changed handle escapes (returned, stored, passed)
  LoopInvariant,     // the copied value does not change in the loop
  WrittenInLoop,     // the copy is written inside the loop
  ExpandAssumed,     // an expand taken as broadcasting (sizes > 1, rank unknown)
  SameStorage,       // both operands are views of one storage
  DTypesKnown,       // both dtypes are shown by the code
  AssumedFloat32,    // a source of unknown dtype taken as float32
  AssumedInt64,      // a source whose name says integer data, taken as int64
  DevicesKnown,      // both devices are shown by the code
  ModuleMoved,       // a module's parameters were moved to the device
  LeafRequiresGrad,   // the written tensor is a leaf (or a view of one) that requires grad
  SavedForBackward,   // an earlier op saved the written tensor for its backward
  BackwardInFunction, // backward() through that op runs later in the same function
  RequiresGrad,       // the kept value requires grad (a module output, a loss)
  NotDifferentiated,  // nothing differentiates the accumulation afterwards
  FirstUseInPlace,       // the copy's first use is an in-place op with an out-of-place form
  CopyOnlyRead,          // neither the copy nor its source is written while the copy lives
  FreshSource,           // the copied tensor is an op's fresh result that nothing else holds
  DeviceCUDA,            // the tensor is on CUDA, as the code shows
  DeviceCUDAIfAvailable, // on CUDA whenever the machine has one (is_available() ? kCUDA : kCPU)
  DeviceChosenByCaller,  // on the device a parameter names that no call in view passes
  MemberNotRegistered,   // a module's tensor member its to() leaves on the CPU (not registered)
};

/// A point in a file: absolute path (the driver makes it so), 1-based line
/// and column, byte offset.
struct SourcePoint {
  std::string File;
  unsigned Line = 0, Col = 0, Offset = 0;
  bool valid() const { return !File.empty(); }
  /// The file location (macro arguments spelled, expansions at their use)
  /// the diagnostic would be reported at; empty when invalid.
  static SourcePoint at(SourceLocation Loc, const SourceManager &SM);
};

enum class HandleRole {
  Written, // the handle the write goes through
  Changed, // another handle whose data the write changes
  Source,  // the tensor a copy is made from
};

struct Handle {
  HandleRole Role = HandleRole::Written;
  std::string Name;
  SourcePoint Decl;
};

struct Finding {
  std::string Check; // e.g. tensor-alias-then-mutate
  HazardKind Hazard = HazardKind::SharedStorageWrite;
  SourcePoint Where; // the diagnostic's location
  SourcePoint Op;    // the write or op that is the hazard
  std::string OpName;
  /// Where the alias / detach / non-contiguous layout was made, when known.
  SourcePoint Origin;
  std::vector<Handle> Handles;
  FixKind Fix = FixKind::None;
  std::vector<Fact> Facts;

  const Handle *handle(HandleRole R) const;
  bool has(Fact F) const;
  /// Makes every path absolute against Dir (paths are as the compiler saw them).
  void resolvePaths(llvm::StringRef Dir);
};

llvm::StringRef name(HazardKind K);
llvm::StringRef name(FixKind K);
llvm::StringRef name(Fact F);
llvm::StringRef name(HandleRole R);

llvm::json::Value toJSON(const Finding &F);
/// Rejects a different schema version or an unknown enum name.
bool fromJSON(const llvm::json::Value &V, Finding &F);

/// Where a check's findings go. The tensor-tidy worker sets one per TU; with
/// none set (stock clang-tidy) emitFinding does nothing.
using FindingSink = std::function<void(Finding)>;
void setFindingSink(FindingSink Sink);
void emitFinding(Finding F);

/// One finding per source location: template instantiations and repeated
/// matches report a call once.
class ReportedOnce {
public:
  /// True the first time Loc is seen.
  bool first(SourceLocation Loc) { return Seen.insert(Loc).second; }
  void clear() { Seen.clear(); }

private:
  llvm::DenseSet<SourceLocation> Seen;
};

/// Where a call is reported: the member name of a member call (`x.view`
/// points at `view`), else the expression's location.
SourceLocation reportLoc(const Expr *Call);

/// A declaration as a handle of the finding.
Handle handleOf(HandleRole Role, const NamedDecl *D, const SourceManager &SM);

} // namespace clang::tidy::tensor
