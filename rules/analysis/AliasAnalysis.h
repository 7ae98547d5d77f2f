// Flow-sensitive, intraprocedural alias analysis for tensor handles.
//
// Every handle value is an abstract node; a node remembers the nodes it was
// derived from and how (handle copy, view, may-alias op, detach). The state at
// a program point maps each local handle to the nodes it may hold; a worklist
// over the clang CFG computes it (join = union, so a singleton means "must").
// At each in-place write the analysis walks the derivation graph from the
// written node and reports the other handles that see the write, with the
// first alias edge crossed, and whether each is read later or escapes.
// Functions defined in the TU are summarised (mutates parameter i, returns an
// alias of parameter i) so that calls to them are not black boxes.
#pragma once

#include "analysis/AstHelpers.h"
#include "analysis/GradFacts.h"
#include "analysis/TensorModel.h"

#include "clang/AST/Decl.h"
#include "clang/AST/Stmt.h"
#include "llvm/ADT/DenseMap.h"

#include <functional>
#include <memory>
#include <vector>

namespace clang {
class ASTContext;
class CFG;
} // namespace clang

namespace clang::tidy::tensor {

enum class EdgeKind : uint8_t { View, Copy, MayAlias, Detach, Data };

// One derivation step: the node at its head was made from Parent.
struct AliasEdge {
  unsigned Parent = 0;
  EdgeKind Kind = EdgeKind::Copy;
  const Expr *Site = nullptr; // the copied expression, or the op call
};

// Why a handle that sees a write matters.
enum class Exposure : uint8_t {
  ReadLater,    // a local handle read after the write
  Parameter,    // the caller's tensor
  Member,       // a data member
  Global,       // a global or static variable
  Captured,     // a variable of the enclosing function (inside a lambda)
  External,     // a reference to storage this function does not own
  Stored,       // stored into a member, global or reference parameter, or captured by a lambda
  RequiresGrad, // made with requires_grad(true) or given requires_grad_()
  SavedForBackward, // an op saved it for backward, and a backward() runs after the write
};

// A handle that sees an in-place write.
struct AffectedHandle {
  const ValueDecl *Decl = nullptr; // the handle (variable or member)
  const VarDecl *Owner = nullptr;  // Decl is a field of this local struct (`out.logits`)
  Exposure Why = Exposure::ReadLater;
  const Stmt *Where = nullptr; // the later read, or where it was stored/captured
  bool CrossedAlias = false;   // a handle copy or may-alias op lies in between
  bool CrossedDetach = false;  // the written handle is a detached copy of it
  AliasEdge FirstAlias;        // valid when CrossedAlias
  AliasEdge FirstDetach;       // valid when CrossedDetach
};

struct WriteEvent {
  const Expr *Write = nullptr;  // the in-place call / operator, or a call of a mutating function
  const Expr *Target = nullptr; // the written tensor expression
  const Expr *Root = nullptr;   // Target without its explicit-view calls
  const ValueDecl *RootDecl = nullptr; // the handle Root names, if any
  bool Direct = false;                 // Target names the handle itself (`b.add_(1)`, `b -= m`)
  const FunctionDecl *Via = nullptr;   // set when the write happens inside this callee
  bool ViaCopyOnly = false; // Via writes the argument only through a handle it copies
  std::vector<AffectedHandle> Affected;
};

struct FunctionSummary {
  llvm::SmallVector<bool, 4> MutatesParam;
  /// A write reaches the parameter itself or a view of it, not only a copy
  /// of its handle (`auto y = x.to(kFloat); y.sub_(m)`: the callee's own finding).
  llvm::SmallVector<bool, 4> WritesParamItself;
  int ReturnsParam = -1; // index of the parameter every return aliases, or -1
  EdgeKind ReturnKind = EdgeKind::Copy;
};

struct FunctionAliasResult {
  std::vector<WriteEvent> Writes;
};

class AliasAnalysis {
public:
  AliasAnalysis(const TensorModel &Model, ASTContext &Ctx);
  ~AliasAnalysis();

  // Analyses a definition (function, method, lambda call operator). Returns
  // nullptr for bodies it does not analyse (dependent, no CFG, no tensor write).
  const FunctionAliasResult *analyze(const FunctionDecl *FD);

  // The summary of a callee defined in this TU, or nullptr when unknown.
  const FunctionSummary *summary(const FunctionDecl *FD);

  ASTContext &context() const { return Ctx; }

  /// Whether a may-alias op call (`to`, `contiguous`...) copies, from the
  /// facts at the call (the AnalysisManager answers from the layout facts).
  /// Without one, a may-alias op is taken as an alias.
  void setCopiesOracle(std::function<bool(const CallExpr *)> F) { Copies = std::move(F); }
  bool copies(const CallExpr *Call) const { return Copies && Copies(Call); }

  /// The backward() that reads V's value at Write because an earlier op
  /// saved it (the AnalysisManager answers from the grad facts); null when
  /// none. Asked only of a detached write's source that is not read again.
  using SavedUse = std::function<const Stmt *(const ValueDecl *V, const Expr *Write)>;
  void setSavedOracle(SavedUse F) { Saved = std::move(F); }
  const Stmt *savedUse(const ValueDecl *V, const Expr *Write) const {
    return Saved ? Saved(V, Write) : nullptr;
  }

private:
  struct Cached {
    std::unique_ptr<FunctionAliasResult> Result;
    std::unique_ptr<FunctionSummary> Summary;
    bool Done = false;
  };
  Cached &run(const FunctionDecl *FD);

  const TensorModel &Model;
  ASTContext &Ctx;
  std::function<bool(const CallExpr *)> Copies;
  SavedUse Saved;
  llvm::DenseMap<const FunctionDecl *, Cached> Cache;
  llvm::DenseMap<const FunctionDecl *, bool> InProgress;
};

} // namespace clang::tidy::tensor
