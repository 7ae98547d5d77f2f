// Where a tensor lives, as far as the code shows it is CUDA (for the checks
// whose hazard exists only there). Unlike LayoutAnalysis, which takes any
// computed device for an accelerator and unknown inputs for CPU tensors (the
// defaults a layout or copy judgement needs), this answers "CUDA" only where
// the code says so, and follows values through the calls that keep a device:
// tensor ops and operators (operands share a device), and functions or module
// calls given a CUDA tensor (a model fed CUDA inputs runs on CUDA).
// Flow-insensitive per variable: every value a variable is given must agree.
#pragma once

#include "analysis/Finding.h"
#include "analysis/TensorModel.h"
#include "analysis/VectorElements.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/Decl.h"
#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

enum class DeviceKnown : uint8_t {
  Unknown,         // a parameter, a loader's tensor, a device chosen elsewhere
  NotCUDA,         // CPU as the code shows (kCPU, cpu(), a factory without a device)
  CUDA,            // kCUDA, "cuda", cuda(), a torch::Device made from them
  CUDAIfAvailable, // `torch::cuda::is_available() ? kCUDA : kCPU`: CUDA whenever there is one
  CallerChosen,    // a device parameter no call in view passes (Note [caller's device])
};

/// Two values a tensor may hold: CUDA only when both are (the weaker kind of CUDA).
DeviceKnown meetDevices(DeviceKnown A, DeviceKnown B);
/// D is CUDA in the runs the code is written for: CUDA, CUDAIfAvailable, CallerChosen.
bool onCuda(DeviceKnown D);
/// The fact a finding on a tensor on D carries: IfCuda when D is plainly CUDA.
Fact deviceFact(DeviceKnown D, Fact IfCuda);

class DeviceFacts {
public:
  DeviceFacts(const TensorModel &Model, ASTContext &Ctx, const FunctionDecl *FD);

  /// The device of the tensor E on every evaluation (Depth: variables followed so far).
  DeviceKnown deviceOf(const Expr *E, unsigned Depth = 0);
  /// The device a device expression names (kCUDA, torch::Device(...),
  /// TensorOptions().device(d), a variable holding one).
  DeviceKnown deviceNamed(const Expr *D, unsigned Depth = 0);

  /// E is a tensor member of a module class that its module's moves leave on
  /// the host: never registered, every value made on the CPU with at least
  /// one dimension (Note [module device]); memoised.
  bool hostMember(const Expr *E);
  /// E is a private tensor field of a plain class every value of which its
  /// class makes on the CPU with at least one dimension (Note [own tensor
  /// field]); memoised.
  bool hostField(const Expr *E);
  /// The device of the parameters of the module E names when it is a member
  /// of `this` moved to CUDA (`fc`, `model_->fc` of a class its holders move,
  /// Note [module device]); Unknown otherwise.
  DeviceKnown cudaModuleMember(const Expr *E, unsigned Depth = 0);
  /// The device a module move names: `cuda()`, `cpu()`, `to(device[, dtype])`.
  DeviceKnown deviceOfMove(const CXXMemberCallExpr *MC, unsigned Depth = 0);

private:
  bool madeOnHost(const FieldDecl *F);
  /// Each of Values is a factory's tensor with dimensions, on the CPU.
  bool allMadeOnHost(llvm::ArrayRef<const Expr *> Values);
  DeviceKnown ofVar(const VarDecl *V, bool IsDevice, unsigned Depth);
  using VarKey = std::pair<const ValueDecl *, unsigned>;
  /// The meet of Start() and Of over Rest, memoised under Key; a value that
  /// reads Key itself sees Start()'s device as a hypothesis, confirmed or
  /// weakened by the meet.
  DeviceKnown solve(VarKey Key, llvm::function_ref<DeviceKnown()> Start,
                    llvm::ArrayRef<const Expr *> Rest,
                    llvm::function_ref<DeviceKnown(const Expr *)> Of);
  /// A private tensor field of a plain class read in its methods: the meet
  /// of every value the class gives it (Note [own tensor field]).
  DeviceKnown ofOwnField(const FieldDecl *F, unsigned Depth);
  /// Appends every value F gets when its whole class is in view; false otherwise.
  bool wholeClassGives(const FieldDecl *F, llvm::SmallVectorImpl<const Expr *> &Out);
  /// The value V holds at Use when one assignment (or the declaration)
  /// certainly gives it: see Note [reaching assignment]; else null.
  const Expr *reachingValue(const DeclRefExpr *Use, const VarDecl *V) const;
  /// The value St (a statement of a block before the use) gives V: Found
  /// false when St does not assign V; null when it does but not plainly.
  const Expr *valueGivenBy(const Stmt *St, const VarDecl *V, bool &Found) const;
  /// An assignment to V within S, outside Except.
  bool assignsWithin(const VarDecl *V, const Stmt *S, const Stmt *Except = nullptr) const;
  DeviceKnown ofField(const FieldDecl *F, unsigned Depth);
  /// A device (IsDevice) or tensor parameter the body never assigns: what
  /// every call of its function passes (`train(model, data, device)`,
  /// `evaluate(model, test_x.to(device))` from main).
  DeviceKnown ofParam(const ParmVarDecl *P, bool IsDevice, unsigned Depth);
  /// A module member of a plain class (not itself a module) that every
  /// constructor moves to CUDA and no other method moves: CUDA; a registered
  /// member of a module class: its class's device (Note [module device]); memoised.
  DeviceKnown ofModuleMember(const FieldDecl *F, unsigned Depth);
  /// The module member of `this` whose module E runs or reads a tensor of
  /// (`unet_->forward(x)`, `model_(x)`, `model_->emb->weight`), or null.
  static const FieldDecl *rootModuleMember(const Expr *E);
  DeviceKnown ofCall(const CallExpr *C, unsigned Depth);
  /// `batch.tokens` of a local aggregate `Batch batch{x.to(dev), ...}`: its
  /// initialiser met with every value assigned to the field; none when the
  /// variable is not such an aggregate or is assigned whole.
  std::optional<DeviceKnown> ofLocalField(const MemberExpr *ME, unsigned Depth);
  std::optional<DeviceKnown> ofLocalField(const VarDecl *V, const FieldDecl *F, unsigned Depth);
  /// A local struct argument (`model->forward(batch)`) with a tensor field on CUDA.
  DeviceKnown ofStructArgument(const Expr *A, unsigned Depth);
  /// Records the fields of a struct copied in a declaration and assigned by
  /// the statements right after it (`Batch in = b; in.x = b.x.to(dev);`).
  void noteOverwrittenFields(const CompoundStmt *CS);
  /// A local `std::vector<Tensor>`: the meet of every tensor it is given.
  DeviceKnown ofTensorVector(const VarDecl *V, unsigned Depth);
  /// A list argument (`torch::cat({a, b})`, `torch::stack(v)`): CUDA when an
  /// element is (a list's tensors share a device).
  DeviceKnown ofListArgument(const Expr *A, unsigned Depth);
  DeviceKnown ofFactory(const CallExpr *C, unsigned Depth);
  /// CUDA when an argument is; Unknown for a function of ours (Ours) given a
  /// tensor on the host too.
  DeviceKnown anyArgument(const CallExpr *C, unsigned Depth, bool Ours = false);
  DeviceKnown ofReturns(const FunctionDecl *Def, unsigned Depth);
  DeviceKnown ofMovedModule(const CallExpr *C);
  /// Def's body moves a tensor to the host (`cpu()`, `kCPU`); memoised.
  bool bodyMovesToHost(const FunctionDecl *Def);

  const TensorModel &Model;
  ASTContext &Ctx;
  const FunctionDecl *Fn; // the function whose facts these are
  /// Every value assigned to a local variable after its declaration.
  llvm::DenseMap<const VarDecl *, llvm::SmallVector<const Expr *, 2>> Assigned;
  /// Every value assigned to a field of a local variable (`batch.x = ...`).
  llvm::DenseMap<std::pair<const VarDecl *, const FieldDecl *>, llvm::SmallVector<const Expr *, 2>>
      FieldAssigned;
  /// The tensors each local vector of tensors is given, and the vectors in progress.
  VectorElements Vectors;
  llvm::DenseSet<const VarDecl *> VectorInProgress;
  /// The fields whose initial value no one reads (noteOverwrittenFields).
  llvm::DenseSet<std::pair<const VarDecl *, const FieldDecl *>> DeadInitField;
  /// ofVar's answers (a variable, as a device or a tensor), the ones in
  /// progress, and the hypotheses of those (their initial value, when CUDA).
  /// (keyed by a plain class's tensor field too: ofOwnField)
  llvm::DenseMap<VarKey, DeviceKnown> Known, Hypothesis;
  llvm::DenseSet<VarKey> InProgress;
  /// What the answer being computed rests on: the hop bound or a cycle
  /// without a hypothesis (Hard), the hypotheses of variables in progress.
  struct CutState {
    bool Hard = false;
    llvm::SmallDenseSet<VarKey, 2> Hyps;
  };
  CutState Cut;
  /// ofField's answers (Unknown while in progress: a field set from itself).
  llvm::DenseMap<const FieldDecl *, DeviceKnown> FieldKnown;
  llvm::DenseMap<VarKey, DeviceKnown> ParamKnown; // ofParam's answers
  llvm::DenseMap<const FunctionDecl *, bool> HostMovers;
  llvm::DenseMap<const FieldDecl *, DeviceKnown> ModuleMembers;
  llvm::DenseMap<const VarDecl *, DeviceKnown> MovedLocals; // ofMovedModule's memo
  llvm::DenseMap<const FieldDecl *, bool> HostMembers; // hostMember's answers
  llvm::DenseMap<const FieldDecl *, bool> HostFields;  // hostField's answers
};

} // namespace clang::tidy::tensor
