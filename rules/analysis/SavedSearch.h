// Searches over a function's CFG (GradFacts::cfg) for the autograd checks:
// which earlier op saved a tensor for backward, and whether a backward()
// can run after a point.
#pragma once

#include "analysis/GradFacts.h"

#include "llvm/ADT/STLFunctionalExtras.h"

namespace clang::tidy::tensor {

/// The op call that saved the value V holds at Write (its result, or one of
/// its inputs, by the op table's TT_SAVES and the grad facts), searching
/// back from Write to V's definitions. Null when none, or when an earlier
/// in-place write to V lies in between (that one is reported).
/// V defined from a call to a function of the TU that returns what an op in
/// its body saved (`auto t = model.forward(x);`, forward returning
/// `torch::tanh(...)`) counts: Callees gives that function's grad facts.
struct SavedBy {
  const CallExpr *Op = nullptr;
  bool Result = false;               // the op saved its result (else the input V)
  const FunctionDecl *Via = nullptr; // the callee whose return it came through
};
using CalleeGrads = llvm::function_ref<const GradFacts *(const FunctionDecl *)>;
SavedBy findSaver(const GradFacts &G, const TensorModel &Model, const ValueDecl *V,
                  const Stmt *Write, CalleeGrads Callees, unsigned Depth = 0);

/// A `backward()` / `torch::autograd::backward` / `torch::autograd::grad` call
/// reachable from Write without running Op again; null when none.
const CallExpr *findBackwardAfter(const GradFacts &G, const TensorModel &Model, const Stmt *Write,
                                  const Stmt *Op);

/// `x.backward()`, `torch::autograd::backward(...)`, `torch::autograd::grad(...)`.
bool isBackwardCall(const Stmt *S, const TensorModel &Model);

} // namespace clang::tidy::tensor
