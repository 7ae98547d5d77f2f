#include "analysis/Finding.h"

#include "clang/AST/Decl.h"
#include "clang/AST/ExprCXX.h"
#include "clang/Basic/SourceManager.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/Path.h"

namespace json = llvm::json;

namespace clang::tidy::tensor {

// ------------------------------------------------------------ enum names --
// One table per enum: name() and the reader both use it.

namespace {

template <typename E> struct Named {
  E Value;
  const char *Name;
};

constexpr Named<HazardKind> HazardNames[] = {
    {HazardKind::SharedStorageWrite, "shared-storage-write"},
    {HazardKind::DetachedWrite, "detached-write"},
    {HazardKind::ViewThrows, "view-throws"},
    {HazardKind::ImplicitCopy, "implicit-copy"},
    {HazardKind::LoopInvariantCopy, "loop-invariant-copy"},
    {HazardKind::ExpandedWrite, "expanded-write"},
    {HazardKind::OverlapThrows, "overlap-throws"},
    {HazardKind::OverlapOrderDependent, "overlap-order-dependent"},
    {HazardKind::NarrowingCopy, "narrowing-copy"},
    {HazardKind::DeviceMismatch, "device-mismatch"},
    {HazardKind::LeafInplace, "leaf-inplace"},
    {HazardKind::SavedInplace, "saved-inplace"},
    {HazardKind::GraphKept, "graph-kept-across-iterations"},
    {HazardKind::UnneededCopy, "unneeded-copy"},
    {HazardKind::DeviceSyncInLoop, "device-sync-in-loop"},
};
constexpr Named<FixKind> FixNames[] = {
    {FixKind::None, "none"},
    {FixKind::OutOfPlace, "out-of-place"},
    {FixKind::CloneAtAlias, "clone-at-alias"},
    {FixKind::DetachClone, "detach-clone"},
    {FixKind::ContiguousFirst, "contiguous-first"},
    {FixKind::ReshapeForView, "reshape-for-view"},
    {FixKind::UseSource, "use-source"},
    {FixKind::HoistOutOfLoop, "hoist-out-of-loop"},
    {FixKind::HoistAndCopyInto, "hoist-and-copy-into"},
    {FixKind::CloneAtExpand, "clone-at-expand"},
    {FixKind::CloneSource, "clone-source"},
    {FixKind::ExplicitConvert, "explicit-convert"},
    {FixKind::ToOtherDevice, "to-other-device"},
    {FixKind::NoGradBlock, "no-grad-block"},
    {FixKind::DetachKept, "detach-kept"},
    {FixKind::OutOfPlaceOnSource, "out-of-place-on-source"},
    {FixKind::AccumulateOnDevice, "accumulate-on-device"},
};
constexpr Named<Fact> FactNames[] = {
    {Fact::LayoutKnown, "layout-known"},
    {Fact::LayoutCertain, "layout-certain"},
    {Fact::LayoutUnproven, "layout-unproven"},
    {Fact::AssumedContiguous, "assumed-contiguous-input"},
    {Fact::HandleCopy, "handle-copy"},
    {Fact::MayAliasOp, "may-alias-op"},
    {Fact::SharesVersion, "shares-version-counter"},
    {Fact::NoVersionCounter, "no-version-counter"},
    {Fact::ReadLater, "read-later"},
    {Fact::Escapes, "escapes"},
    {Fact::LoopInvariant, "loop-invariant"},
    {Fact::WrittenInLoop, "written-in-loop"},
    {Fact::ExpandAssumed, "expand-assumed"},
    {Fact::SameStorage, "same-storage"},
    {Fact::DTypesKnown, "dtypes-known"},
    {Fact::AssumedFloat32, "assumed-float32"},
    {Fact::AssumedInt64, "assumed-int64"},
    {Fact::DevicesKnown, "devices-known"},
    {Fact::ModuleMoved, "module-moved"},
    {Fact::LeafRequiresGrad, "leaf-requires-grad"},
    {Fact::SavedForBackward, "saved-for-backward"},
    {Fact::BackwardInFunction, "backward-in-function"},
    {Fact::RequiresGrad, "requires-grad"},
    {Fact::NotDifferentiated, "not-differentiated-later"},
    {Fact::FirstUseInPlace, "first-use-in-place"},
    {Fact::CopyOnlyRead, "copy-only-read"},
    {Fact::FreshSource, "fresh-source"},
    {Fact::DeviceCUDA, "device-cuda"},
    {Fact::DeviceCUDAIfAvailable, "device-cuda-if-available"},
    {Fact::DeviceChosenByCaller, "device-chosen-by-caller"},
    {Fact::MemberNotRegistered, "member-not-registered"},
};
constexpr Named<HandleRole> RoleNames[] = {
    {HandleRole::Written, "written"},
    {HandleRole::Changed, "changed"},
    {HandleRole::Source, "source"},
};

template <typename E, size_t N> llvm::StringRef nameIn(const Named<E> (&T)[N], E V) {
  for (const Named<E> &X : T)
    if (X.Value == V)
      return X.Name;
  return "";
}

template <typename E, size_t N>
std::optional<E> parseIn(const Named<E> (&T)[N], std::optional<llvm::StringRef> S) {
  if (S)
    for (const Named<E> &X : T)
      if (*S == X.Name)
        return X.Value;
  return std::nullopt;
}

} // namespace

llvm::StringRef name(HazardKind K) { return nameIn(HazardNames, K); }
llvm::StringRef name(FixKind K) { return nameIn(FixNames, K); }
llvm::StringRef name(Fact F) { return nameIn(FactNames, F); }
llvm::StringRef name(HandleRole R) { return nameIn(RoleNames, R); }

// ------------------------------------------------------------ the record --

SourcePoint SourcePoint::at(SourceLocation Loc, const SourceManager &SM) {
  SourcePoint P;
  if (Loc.isInvalid())
    return P;
  SourceLocation FL = SM.getFileLoc(Loc);
  FileID FID = SM.getFileID(FL);
  OptionalFileEntryRef FE = SM.getFileEntryRefForID(FID);
  if (!FE)
    return P;
  P.File = FE->getName().str();
  P.Offset = SM.getFileOffset(FL);
  P.Line = SM.getLineNumber(FID, P.Offset);
  P.Col = SM.getColumnNumber(FID, P.Offset);
  return P;
}

const Handle *Finding::handle(HandleRole R) const {
  for (const Handle &H : Handles)
    if (H.Role == R)
      return &H;
  return nullptr;
}

bool Finding::has(Fact F) const { return llvm::is_contained(Facts, F); }

void Finding::resolvePaths(llvm::StringRef Dir) {
  auto Resolve = [Dir](SourcePoint &P) {
    if (P.File.empty() || llvm::sys::path::is_absolute(P.File) || Dir.empty())
      return;
    llvm::SmallString<256> Abs(Dir);
    llvm::sys::path::append(Abs, P.File);
    llvm::sys::path::remove_dots(Abs, /*remove_dot_dot=*/false);
    P.File = std::string(Abs);
  };
  Resolve(Where);
  Resolve(Op);
  Resolve(Origin);
  for (Handle &H : Handles)
    Resolve(H.Decl);
}

// ------------------------------------------------------------- JSON form --

static json::Value toJSON(const SourcePoint &P) {
  if (!P.valid())
    return nullptr;
  return json::Object{{"file", P.File}, {"line", P.Line}, {"col", P.Col}, {"offset", P.Offset}};
}

static bool fromJSON(const json::Value *V, SourcePoint &P) {
  if (!V || V->getAsNull())
    return true; // absent: invalid point
  const json::Object *O = V->getAsObject();
  if (!O)
    return false;
  auto File = O->getString("file");
  auto Line = O->getInteger("line"), Col = O->getInteger("col"), Off = O->getInteger("offset");
  if (!File || !Line || !Col || !Off)
    return false;
  P.File = File->str();
  P.Line = *Line;
  P.Col = *Col;
  P.Offset = *Off;
  return true;
}

json::Value toJSON(const Finding &F) {
  json::Array Handles, Facts;
  for (const Handle &H : F.Handles)
    Handles.push_back(
        json::Object{{"role", name(H.Role)}, {"name", H.Name}, {"decl", toJSON(H.Decl)}});
  for (Fact X : F.Facts)
    Facts.push_back(name(X));
  return json::Object{{"schema", FindingSchemaVersion},
                      {"check", F.Check},
                      {"hazard", name(F.Hazard)},
                      {"where", toJSON(F.Where)},
                      {"op", toJSON(F.Op)},
                      {"op_name", F.OpName},
                      {"origin", toJSON(F.Origin)},
                      {"handles", std::move(Handles)},
                      {"fix", name(F.Fix)},
                      {"facts", std::move(Facts)}};
}

bool fromJSON(const json::Value &V, Finding &F) {
  const json::Object *O = V.getAsObject();
  if (!O || O->getInteger("schema") != FindingSchemaVersion)
    return false;
  auto Check = O->getString("check");
  auto Hazard = parseIn(HazardNames, O->getString("hazard"));
  auto Fix = parseIn(FixNames, O->getString("fix"));
  if (!Check || !Hazard || !Fix)
    return false;
  F = Finding();
  F.Check = Check->str();
  F.Hazard = *Hazard;
  F.Fix = *Fix;
  F.OpName = O->getString("op_name").value_or("").str();
  if (!fromJSON(O->get("where"), F.Where) || !fromJSON(O->get("op"), F.Op) ||
      !fromJSON(O->get("origin"), F.Origin))
    return false;
  if (const json::Array *Hs = O->getArray("handles"))
    for (const json::Value &HV : *Hs) {
      const json::Object *HO = HV.getAsObject();
      auto Role = HO ? parseIn(RoleNames, HO->getString("role")) : std::nullopt;
      if (!Role)
        return false;
      Handle H;
      H.Role = *Role;
      H.Name = HO->getString("name").value_or("").str();
      if (!fromJSON(HO->get("decl"), H.Decl))
        return false;
      F.Handles.push_back(std::move(H));
    }
  if (const json::Array *Fs = O->getArray("facts"))
    for (const json::Value &FV : *Fs) {
      auto X = parseIn(FactNames, FV.getAsString());
      if (!X)
        return false;
      F.Facts.push_back(*X);
    }
  return true;
}

// ----------------------------------------------------------------- sink --

static FindingSink &sink() {
  static FindingSink S;
  return S;
}

void setFindingSink(FindingSink Sink) { sink() = std::move(Sink); }

void emitFinding(Finding F) {
  if (sink())
    sink()(std::move(F));
}

// -------------------------------------------------------------- helpers --

SourceLocation reportLoc(const Expr *Call) {
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    if (const auto *ME = dyn_cast<MemberExpr>(MC->getCallee()->IgnoreParenImpCasts()))
      return ME->getMemberLoc();
  return Call->getExprLoc();
}

Handle handleOf(HandleRole Role, const NamedDecl *D, const SourceManager &SM) {
  Handle H;
  H.Role = Role;
  if (D) {
    H.Name = D->getNameAsString();
    H.Decl = SourcePoint::at(D->getLocation(), SM);
  }
  return H;
}

} // namespace clang::tidy::tensor
