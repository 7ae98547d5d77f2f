// Autograd facts of one function body, flow-sensitively over its CFG: whether
// a tensor value requires grad, whether it is a leaf (or a view of one), and
// whether grad mode is on at a point. Three-valued: where the code does not
// say (a parameter `torch::Tensor x`), the answer is Unknown and the checks
// stay silent. See docs/design.md, "Autograd facts".
#pragma once

#include "analysis/TensorModel.h"
#include "analysis/VectorElements.h"

#include "clang/AST/Decl.h"
#include "clang/AST/Expr.h"
#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <cstdint>
#include <memory>

namespace clang {
class CFG;
class CFGBlock;
} // namespace clang

#include <functional>

namespace clang::tidy::tensor {

/// A method of the user's module, other than forward, that runs one of its
/// layers (`decode`, `encode`, `infer`): its result comes from them as
/// forward's does, on its input's device.
bool isUserLayerMethod(const CXXMemberCallExpr *Call);

/// `lin->weight`, `conv->bias`, a member of the user's module registered as a
/// parameter.
bool isParameterField(const FieldDecl *F);

/// A module class of the user's holding no parameters: none registered, no
/// submodule, no module field, nothing set to require grad (an EMA codebook
/// of buffers). Its forward's result requires grad only as its body makes it
/// from the arguments.
bool isBufferOnlyModule(const CXXRecordDecl *RD);

class FrozenParameters;

/// What the autograd facts read off the TU's classes: the same from every
/// function, so memoised once per TU (AnalysisManager owns it) rather than
/// once per function, which re-walked a class's methods for each.
class GradClassFacts {
public:
  enum class LayerMethod : std::uint8_t { No, Layer, LayerUnderNoGrad };
  /// isUserLayerMethod, and whether the method returns only under a no-grad
  /// guard of its own (`encode_codes` for a prior's data).
  LayerMethod layerMethod(const CXXMemberCallExpr *Call);
  /// isParameterField.
  bool parameterField(const FieldDecl *F);
  /// isBufferOnlyModule.
  bool bufferOnlyModule(const CXXRecordDecl *RD);
  /// Fields its class only ever sets to leaves that require grad; GradFacts
  /// fills it, since deciding that evaluates the values.
  llvm::DenseMap<const FieldDecl *, bool> LeafFields;

private:
  llvm::DenseMap<const FieldDecl *, bool> ParameterFields;
  llvm::DenseMap<const CXXMethodDecl *, LayerMethod> LayerMethods;
  llvm::DenseMap<const CXXRecordDecl *, bool> BufferOnly;
};

enum class GradKind : std::uint8_t {
  Unknown,      // the code does not say
  NoGrad,       // does not require grad: plain factories, detach(), data(), grad(),
                // non-differentiable ops, results made under no-grad
  Leaf,         // a leaf that requires grad: a parameter, a requires-grad factory,
                // requires_grad_(); on a container or options value: holds/makes such leaves
  LeafView,     // a view of such a leaf
  NonLeaf,      // made by a differentiable op from a requires-grad input (has a grad_fn)
  RequiresGrad, // requires grad, leaf or not (the paths disagree, or `to()` of a leaf)
  Undefined,    // a default-constructed handle (`torch::Tensor mask;`): no tensor yet, every
                // op on it throws, so a join takes the other path's fact
};

enum class Tri : std::uint8_t { No, Yes, Unknown };

struct GradFact {
  GradKind Kind = GradKind::Unknown;
  /// Where the value came to require grad: the factory, `parameters()`,
  /// `requires_grad_()`, the parameter member, the module call.
  const Stmt *Source = nullptr;

  Tri requiresGrad() const {
    if (Kind == GradKind::Unknown || Kind == GradKind::Undefined)
      return Tri::Unknown;
    return Kind == GradKind::NoGrad ? Tri::No : Tri::Yes;
  }
  /// A leaf that requires grad, or a view of one (PyTorch refuses in-place
  /// writes on both while grad mode is on).
  bool isGradLeafOrView() const { return Kind == GradKind::Leaf || Kind == GradKind::LeafView; }
  bool operator==(const GradFact &O) const { return Kind == O.Kind && Source == O.Source; }
};

class GradFacts {
public:
  /// Frozen: the modules whose parameters the file freezes (none if null).
  /// Classes: the TU's memo (a private one if null).
  GradFacts(const TensorModel &Model, ASTContext &Ctx, const FrozenParameters *Frozen = nullptr,
            GradClassFacts *Classes = nullptr);
  ~GradFacts();

  /// Facts of FD's parameters at its entry (from its callers).
  using EntryFacts = llvm::DenseMap<const ValueDecl *, GradFact>;

  /// Analyses FD's body (a function, method or lambda call operator).
  /// GradOffAtEntry: every call of FD runs with grad mode off (the caller's
  /// `NoGradGuard`), so its whole body does. Entry: what its parameters are
  /// known to be (a parameter not in it is Unknown).
  void run(const FunctionDecl *FD, bool GradOffAtEntry = false, EntryFacts Entry = EntryFacts());

  /// Whether a function of the TU returns a value requiring grad when only
  /// its I-th parameter does (Yes / No / Unknown); set by the manager.
  /// I == NoParam: when no parameter is known to (a module parameter's
  /// output still does).
  using CalleeFn = std::function<Tri(const FunctionDecl *, unsigned)>;
  static constexpr unsigned NoParam = ~0u;
  void setCallees(CalleeFn F) { Callees = std::move(F); }
  /// The join of the facts of the tensors the body returns (Unknown if none);
  /// a struct built in the return (`return {loss, box}`) counts as the meet
  /// of its tensors: Yes only when every one requires grad.
  Tri returnRequiresGrad() const { return Returned; }

  /// The fact of the value E has at its own program point (tensor handles,
  /// containers of parameters, TensorOptions); Unknown if never recorded.
  GradFact factOf(const Expr *E) const;

  /// False when S runs under a no-grad guard (`NoGradGuard`,
  /// `AutoGradMode(false)`, `InferenceMode`) declared in an enclosing block
  /// of this body, or around every call of it.
  bool gradEnabledAt(const Stmt *S) const { return !GradOffAtEntry && !NoGradStmts.contains(S); }

  /// Calls that run with grad mode off inside (`torch::nn::init::*`): their
  /// in-place writes are not recorded by autograd.
  static bool runsWithoutGrad(const CallExpr *Call);

  /// The CFG the facts were computed on (every sub-expression an element),
  /// and where S is in it: for searches from a point. Null / {null, 0} when
  /// the body was not analysed or S is not an element.
  const CFG *cfg() const { return Cfg.get(); }
  std::pair<const CFGBlock *, unsigned> position(const Stmt *S) const {
    auto It = Positions.find(S);
    return It == Positions.end() ? std::pair<const CFGBlock *, unsigned>{nullptr, 0} : It->second;
  }

  struct Impl;

private:
  const TensorModel &Model;
  ASTContext &Ctx;
  const FrozenParameters *Frozen;
  std::unique_ptr<GradClassFacts> OwnClasses;
  GradClassFacts *Classes;
  llvm::DenseMap<const Expr *, GradFact> Facts;
  llvm::DenseSet<const Stmt *> NoGradStmts;
  bool GradOffAtEntry = false;
  CalleeFn Callees;
  Tri Returned = Tri::Unknown;
  bool AnyReturn = false;
  std::unique_ptr<CFG> Cfg;
  llvm::DenseMap<const Stmt *, std::pair<const CFGBlock *, unsigned>> Positions;
  std::unique_ptr<VectorElements> Vectors; // of the function run analyses
};

/// The tensor E passes: E itself, or the tensor a wrapper is built from
/// (tt's `detail::LocatedTensor` operands); null when E is not a tensor.
const Expr *passedTensor(const Expr *E, const TensorModel &Model);

/// True when S (inside Body) runs under a `NoGradGuard` (or
/// `AutoGradMode(false)` / `InferenceMode`) declared in an enclosing block.
bool isUnderNoGrad(const Stmt *S, const Stmt *Body);

/// A `NoGradGuard` / `AutoGradMode(false)` / `InferenceMode` declaration.
bool isNoGradGuardDecl(const Stmt *St);

} // namespace clang::tidy::tensor
