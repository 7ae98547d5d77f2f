// Where a value kept in state goes: the state an expression names (a local,
// a member), whether that state outlives a loop iteration, and whether what
// is kept in it may still be differentiated (it reaches backward() or
// autograd::grad, is returned, or is handed to code we cannot see).
#pragma once

#include "analysis/LoopAnalysis.h"
#include "analysis/TensorModel.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/Expr.h"

namespace clang::tidy::tensor {

/// E without handle-preserving nodes and the runtime's operand wrappers
/// (tt::detail::LocatedTensor: `a += b` passes `b` through one).
const Expr *operandOf(const Expr *E, const TensorModel &Model);

/// The declaration whose state E names: a variable (`total`, `stats.losses`
/// -> `stats`) or a member of *this (`history_`); null otherwise.
const ValueDecl *stateRoot(const Expr *E);

/// State that survives the end of an iteration of Loop: a member, or a
/// variable declared outside the loop.
bool outlivesIteration(const ValueDecl *Root, const Stmt *Loop, LoopAnalysis &LA);

class KeptValueFlow {
public:
  KeptValueFlow(const TensorModel &Model, ASTContext &Ctx) : Model(Model), Ctx(Ctx) {}

  /// E certainly holds an autograd graph at At: it requires grad, with grad
  /// mode on there, and is not a leaf (a parameter holds no graph; GradFacts);
  /// false when it does not or the code does not say.
  bool holdsGraphAt(const Expr *E, const Stmt *At) const;

  /// The state Target names, or what is derived from it, may be
  /// differentiated: it reaches backward()/autograd::grad, a return of a
  /// type that holds tensors (outside eval mode), code outside the tensor
  /// libraries, a lambda, or state we cannot see (globals, reference
  /// parameters). Members are followed through every method of their class;
  /// reference parameters and returned values into the TU's callers.
  /// Consumed: the value kept was differentiated already (its graph freed):
  /// a value computed from the state and returned is then followed into the
  /// callers too.
  bool mayBeDifferentiated(const Expr *Target, const Stmt *At, bool Consumed = false) const;

private:
  static constexpr unsigned kMaxCallerHops = 3;
  bool differentiable(const ValueDecl *Root, const Stmt *At, unsigned Depth,
                      const CallExpr *From = nullptr, bool Consumed = false) const;
  bool callersMayDifferentiate(const ParmVarDecl *P, unsigned Depth) const;
  bool callersMayUseResult(const Stmt *At, unsigned Depth) const;

  const TensorModel &Model;
  ASTContext &Ctx;
};

} // namespace clang::tidy::tensor
