#include "DeviceMismatchCheck.h"

#include "analysis/AstHelpers.h"
#include "analysis/GradFacts.h"

#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

namespace {

// A device the code shows (not a default taken for an input), or CUDA chosen
// whenever the machine has one (`is_available() ? kCUDA : kCPU`): mixing it
// with a CPU tensor throws on every machine with a GPU, where the code is
// meant to run.
bool known(const TensorFact &F, TensorFact::DeviceKind D) {
  return F.Device == D && F.deviceShownOrIfAvailable();
}

// The device facts (flow-insensitive, through calls and modules) put E on CUDA.
bool onCuda(const Expr *E, DeviceFacts *Devices) {
  return Devices && onCuda(Devices->deviceOf(E));
}

// E's device when it is CUDA: shown by the code, or chosen by
// `is_available() ? kCUDA : kCPU` (CUDAIfAvailable), which is CUDA on every
// machine with a GPU, where such code is meant to run; else Unknown.
DeviceKnown cudaSide(const TensorFact &F, const Expr *E, DeviceFacts *Devices) {
  if (known(F, TensorFact::Accelerator))
    return F.DeviceIfAvailable ? DeviceKnown::CUDAIfAvailable : DeviceKnown::CUDA;
  // A value that comes from an op that throws (two devices in a helper): none.
  return !F.Throws && onCuda(E, Devices) ? Devices->deviceOf(E) : DeviceKnown::Unknown;
}

// E is a parameter, or a local handle copy of one (`Tensor p = p0;`): its
// device is the callers'. Two such on two devices were passed so: the caller
// made the mistake, and is where it is reported.
bool fromCaller(const Expr *E) {
  const VarDecl *V = varOf(E);
  if (V && !isa<ParmVarDecl>(V) && V->isLocalVarDecl() && V->getInit())
    V = varOf(V->getInit());
  return isa_and_nonnull<ParmVarDecl>(V);
}

// The module E names has parameters to be on a device: a library module that
// holds weights (its TT_MODULE row), or a module class of the user's.
bool hasParameters(const Expr *E) {
  E = moduleValue(E); // `fc` of `fc(x)`, not the ModuleHolder base its operator() takes
  if (userModuleClass(E->getType()))
    return true;
  const sem::ModuleInfo *Row = libraryModule(E->getType());
  return Row && Row->holdsWeights();
}

// Ops PyTorch runs through TensorIterator accept a 0-dim CPU tensor next to
// CUDA tensors (a "CPU scalar"); these do not (they need dim >= 1 anyway).
bool rejectsCpuScalars(StringRef Op) {
  return llvm::is_contained({"matmul", "mm", "bmm", "linear", "conv1d", "conv2d", "cat", "stack"},
                            Op);
}

// Ops that take tensors on other devices by design: copies and conversions,
// indexing (CPU indices into a CUDA tensor).
bool crossesDevices(StringRef Op) {
  return llvm::is_contained({"copy_", "to", "type_as", "index_put_", "index", "set_", "cuda", "cpu",
                             "expand_as", "view_as", "reshape_as", "new_empty", "new_zeros",
                             "zeros_like", "ones_like", "empty_like"},
                            Op);
}

std::string textOf(const Expr *E, const ASTContext &Ctx) {
  return Lexer::getSourceText(CharSourceRange::getTokenRange(E->getSourceRange()),
                              Ctx.getSourceManager(), Ctx.getLangOpts())
      .str();
}

// A variable or member named the same way (`x`, `this->net_`), for matching
// the module a `to()` moved with the one a call uses.
const ValueDecl *nameOf(const Expr *E) {
  E = E ? stripHandle(E) : nullptr;
  if (const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E))
    return DRE->getDecl();
  return ownMember(E);
}

// The last statement before Use in its function, at a level that always runs
// before it, that moves Module with `to(d)` / `cuda()` / `cpu()`: the device
// text when it is CUDA, "" otherwise.
class MoveFinder : public RecursiveASTVisitor<MoveFinder> {
public:
  MoveFinder(const ValueDecl *Module, const Stmt *Use, ASTContext &Ctx, DeviceFacts *Devices)
      : Module(Module), Use(Use), Ctx(Ctx), Devices(Devices) {}
  std::string Device;
  bool IfAvailable = false; // Device is `is_available() ? kCUDA : kCPU`

  bool VisitCXXMemberCallExpr(CXXMemberCallExpr *MC) {
    const CXXMethodDecl *MD = MC->getMethodDecl();
    if (!MD || !MD->getIdentifier() ||
        nameOf(moduleValue(MC->getImplicitObjectArgument())) != Module)
      return true;
    StringRef N = MD->getName();
    if (N != "to" && N != "cuda" && N != "cpu")
      return true;
    if (!Ctx.getSourceManager().isBeforeInTranslationUnit(MC->getEndLoc(), Use->getBeginLoc()) ||
        !dominates(MC))
      return true;
    bool Runtime = false;
    IfAvailable = false;
    TensorFact::DeviceKind D = N == "cuda" ? TensorFact::Accelerator
                               : N == "cpu" ? TensorFact::CPU
                               : MC->getNumArgs()
                                   ? layoutDevice(MC->getArg(0), Runtime, IfAvailable)
                                   : TensorFact::AnyDevice;
    Device = D == TensorFact::Accelerator && (!Runtime || IfAvailable)
                 ? (N == "cuda" ? std::string("torch::kCUDA") : textOf(MC->getArg(0), Ctx))
                 : "";
    return true;
  }

private:
  // `to(device)` with `torch::Device device(torch::kCUDA)`: the variable's values.
  TensorFact::DeviceKind layoutDevice(const Expr *A, bool &Runtime, bool &IfAvailable);
  // Always runs before Use: its statement is in a block enclosing Use.
  bool dominates(const Stmt *S) {
    const Stmt *Cur = S;
    for (int I = 0; I < 64; ++I) {
      DynTypedNodeList Ps = Ctx.getParents(*Cur);
      const Stmt *P = Ps.empty() ? nullptr : Ps[0].get<Stmt>();
      if (!P)
        return false;
      if (isa<CompoundStmt>(P))
        return encloses(P, Use);
      if (!isa<Expr, ExprWithCleanups>(P))
        return false;
      Cur = P;
    }
    return false;
  }
  bool encloses(const Stmt *Outer, const Stmt *Inner) {
    DynTypedNode N = DynTypedNode::create(*Inner);
    for (int I = 0; I < 256; ++I) {
      if (N.get<Stmt>() == Outer)
        return true;
      DynTypedNodeList Ps = Ctx.getParents(N);
      if (Ps.empty())
        return false;
      N = Ps[0];
    }
    return false;
  }
  const ValueDecl *Module;
  const Stmt *Use;
  ASTContext &Ctx;
  DeviceFacts *Devices;
};

} // namespace
} // namespace clang::tidy::tensor

// The layout analysis reads device arguments; its reader is shared.
#include "analysis/LayoutImpl.h"

namespace clang::tidy::tensor {

TensorFact::DeviceKind MoveFinder::layoutDevice(const Expr *A, bool &Runtime, bool &IfAvailable) {
  layout::DeviceOrigin Origin;
  TensorFact::DeviceKind D = layout::deviceOf(A, &Origin, Devices);
  Runtime = Origin.Runtime;
  IfAvailable = Origin.IfAvailable;
  return D;
}

DeviceMismatchCheck::DeviceMismatchCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void DeviceMismatchCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(callExpr(unless(isExpansionInSystemHeader())).bind("call"), this);
}

void DeviceMismatchCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CallExpr>("call");
  if (!Call)
    return;
  const FunctionDecl *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier()) {
    // `model(x)`: ModuleHolder's operator() calls forward.
    const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
    if (OC && isModuleCall(OC) && OC->getNumArgs() == 2 && Model.isTensorExpr(OC->getArg(1)))
      checkForward(Call, OC->getArg(0), OC->getArg(1), Result);
    else if (OC)
      checkOp(Call, Result);
    return;
  }
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call); MC && FD->getName() == "forward" &&
                                                          MC->getNumArgs() >= 1 &&
                                                          Model.isTensorExpr(MC->getArg(0))) {
    const Expr *Obj = moduleValue(MC->getImplicitObjectArgument());
    if (isModuleHolderType(Obj->getType()) || isModuleRecord(MC->getRecordDecl()))
      return checkForward(Call, Obj, MC->getArg(0), Result);
  }
  // `model->infer(ids)`: a method of the user's module that runs its layers.
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  if (MC && AnalysisManager::get(Model, *Result.Context).gradClasses().layerMethod(MC) !=
                GradClassFacts::LayerMethod::No)
    for (const Expr *A : MC->arguments())
      if (Model.isTensorExpr(A))
        return checkForward(Call, moduleValue(MC->getImplicitObjectArgument()), A, Result);
  checkOp(Call, Result);
}

DeviceMismatchCheck::Sides DeviceMismatchCheck::sidesOf(llvm::ArrayRef<const Expr *> Es,
                                                        const LayoutAnalysis &LA,
                                                        DeviceFacts *Devices, StringRef Op) {
  Sides S;
  for (const Expr *E : Es) {
    const TensorFact *F = LA.factOf(E);
    if (!F)
      continue;
    bool Scalar = F->Sizes ? F->Sizes->empty() : !F->HasDims; // may be a 0-dim CPU tensor
    // A module's unregistered member stays behind when the module moves.
    bool LeftBehind = Devices && Devices->hostMember(E);
    // A plain class's field its class makes on the host, with dimensions.
    bool HostField = !LeftBehind && Devices && Devices->hostField(E);
    if (known(*F, TensorFact::CPU) || LeftBehind || HostField) {
      // Not when the device facts put it on CUDA: the value of an op that
      // throws (reported there) or a fact one analysis cannot see.
      if (!S.Cpu && (!Scalar || LeftBehind || HostField || rejectsCpuScalars(Op)) &&
          !onCuda(E, Devices)) {
        S.Cpu = E;
        S.LeftBehind = LeftBehind;
      }
    } else if (DeviceKnown D = cudaSide(*F, E, Devices);
               D != DeviceKnown::Unknown && (!S.Cuda || (!nameOf(S.Cuda) && nameOf(E)))) {
      S.Cuda = E; // a named one when there is one: the fix-it moves to its device
      S.CudaKind = D;
    }
  }
  return S;
}

// An op of the table whose tensor operands' facts show a CPU tensor and a
// CUDA tensor.
void DeviceMismatchCheck::checkOp(const CallExpr *Call, const MatchFinder::MatchResult &Result) {
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
  const sem::OpInfo *Op = OC ? sem::lookup(operatorOpName(OC)) : Model.opOf(Call);
  if (!Op || (Op->storage != sem::Storage::Fresh && Op->storage != sem::Storage::InPlace) ||
      crossesDevices(Op->name))
    return;
  llvm::SmallVector<const Expr *, 4> Es;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    Es.push_back(MC->getImplicitObjectArgument());
  for (const Expr *A : Call->arguments())
    Model.tensorOperands(A, Es);
  if (Es.size() < 2)
    return;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Call);
  if (!LA)
    return;
  Sides S = sidesOf(Es, *LA, AnalysisManager::get(Model, *Result.Context).devicesAt(Call),
                    Op->name);
  const Expr *Cpu = S.Cpu, *Cuda = S.Cuda;
  if (!Cpu || !Cuda || (fromCaller(Cpu) && fromCaller(Cuda)))
    return;
  // Moving the tensor an in-place op writes would write a temporary: no fix-it.
  bool WritesCpu = Op->storage == sem::Storage::InPlace && Cpu == Es.front();
  const Expr *CudaName = nameOf(Cuda) && !WritesCpu ? stripHandle(Cuda) : nullptr;
  std::string CudaText = textOf(Cuda, *Result.Context);
  std::string OpName = OC ? "'" + std::string(getOperatorSpelling(OC->getOperator())) + "'"
                          : "'" + std::string(Op->name) + "'";
  report({Call, reportLoc(Call), OpName, Cpu,
          CudaName ? textOf(CudaName, *Result.Context) + ".device()" : "", "'" + CudaText + "'",
          false, S.CudaKind, S.LeftBehind},
         Result);
}

// `model->forward(x)` / `model(x)` (or a method running its layers) with x
// on the CPU after `model->to(kCUDA)`.
void DeviceMismatchCheck::checkForward(const CallExpr *Call, const Expr *ModuleE, const Expr *Input,
                                       const MatchFinder::MatchResult &Result) {
  const ValueDecl *Module = nameOf(ModuleE);
  const FunctionDecl *Fn = enclosingFunction(Call, *Result.Context);
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Call);
  const TensorFact *F = LA ? LA->factOf(Input) : nullptr;
  if (!Module || !Fn || !Fn->getBody() || !F || !known(*F, TensorFact::CPU))
    return;
  DeviceFacts *Devices = AnalysisManager::get(Model, *Result.Context).devicesAt(Call);
  MoveFinder Moves(Module, Call, *Result.Context, Devices);
  Moves.TraverseStmt(Fn->getBody());
  DeviceKnown Kind = Moves.IfAvailable ? DeviceKnown::CUDAIfAvailable : DeviceKnown::CUDA;
  if (Moves.Device.empty()) {
    // A member module of a class its holders move (Note [module device]):
    // no device expression here for a fix-it. Not a parameter known CPU from
    // the callers: the call that passes it is reported.
    bool Weighted = hasParameters(ModuleE) && !fromCaller(Input);
    DeviceKnown D =
        Devices && Weighted ? Devices->cudaModuleMember(ModuleE) : DeviceKnown::Unknown;
    if (D == DeviceKnown::Unknown)
      return;
    Kind = D;
  }
  std::string Name = "'" + textOf(ModuleE, *Result.Context) + "'";
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  std::string Method = MC ? MC->getMethodDecl()->getNameAsString() : "forward";
  report({Call, reportLoc(Call), "'" + Method + "'", Input, Moves.Device,
          "the parameters of " + Name + ", moved to CUDA", true, Kind},
         Result);
}

// The diagnostic: what is combined, why it throws, and Move, the advice.
static std::string messageFor(const DeviceMismatchCheck::Mismatch &M, StringRef CpuText,
                              StringRef Move) {
  std::string Member = M.LeftBehind ? " (a member the module's to() does not move: it is not "
                                      "registered)"
                                    : "";
  std::string Where = M.CudaKind == DeviceKnown::CUDAIfAvailable
                          ? " on a machine with CUDA (its device is "
                            "'is_available() ? kCUDA : kCPU')"
                      : M.CudaKind == DeviceKnown::CallerChosen
                          ? " when its caller passes a CUDA device (no call in view chooses one)"
                          : "";
  return M.Op + " combines the CPU tensor '" + CpuText.str() + "'" + Member + " with " + M.Other +
         ": throws at run time" + Where +
         " ('Expected all tensors to be on the same device, but found at least two devices, "
         "cuda:0 and cpu!'); move it with '" +
         Move.str() + "'" + (M.LeftBehind ? " or register it with register_buffer" : "");
}

void DeviceMismatchCheck::report(const Mismatch &M, const MatchFinder::MatchResult &Result) {
  ASTContext &Ctx = *Result.Context;
  // One report per CPU local: its later uses are the same mistake, mended
  // where it is made.
  const VarDecl *Local = varOf(M.Cpu);
  if (!Reported.first(M.Loc) ||
      (Local && Local->isLocalVarDecl() && !Reported.first(Local->getLocation())))
    return;
  std::string CpuText = textOf(M.Cpu, Ctx);
  const Expr *Cpu = stripHandle(M.Cpu);
  const auto *COC = dyn_cast<CXXOperatorCallExpr>(Cpu);
  bool Postfix = isa<ParenExpr>(M.Cpu->IgnoreImplicit()) ||
                 (COC ? COC->getOperator() == OO_Subscript
                      : isa<DeclRefExpr, MemberExpr, CallExpr, ParenExpr>(Cpu));
  std::string Base = Postfix ? CpuText : "(" + CpuText + ")";
  std::string Moved = Base + ".to(" + M.Device + ")";
  bool Fixable = !M.Device.empty() && !M.Cpu->getBeginLoc().isMacroID() &&
                 !M.Cpu->getEndLoc().isMacroID() && !inTemplateInstantiation(M.Call, Ctx);
  std::string Msg = messageFor(M, CpuText, Fixable ? Moved : Base + ".to(<device>)");
  {
    auto D = diagText(M.Loc, Msg, DiagnosticIDs::Error);
    if (Fixable)
      D << FixItHint::CreateReplacement(CharSourceRange::getTokenRange(M.Cpu->getSourceRange()),
                                        Moved);
  }
  Finding F;
  F.Check = getID().str();
  F.Hazard = HazardKind::DeviceMismatch;
  F.Where = SourcePoint::at(M.Loc, Ctx.getSourceManager());
  F.Op = F.Where;
  F.OpName = StringRef(M.Op).trim('\'').str();
  F.Fix = Fixable ? FixKind::ToOtherDevice : FixKind::None;
  F.Facts.push_back(deviceFact(M.CudaKind, Fact::DevicesKnown));
  if (M.Module)
    F.Facts.push_back(Fact::ModuleMoved);
  if (M.LeftBehind)
    F.Facts.push_back(Fact::MemberNotRegistered);
  emitFinding(std::move(F));
}

} // namespace clang::tidy::tensor
