#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// A value that requires grad (a forward output, a loss) accumulated inside a
/// loop into state that outlives the iteration (`total += loss`,
/// `losses.push_back(loss)`, `m[k] = out`), when nothing differentiates the
/// accumulation afterwards: every iteration's autograd graph stays alive.
/// Docs: docs/checks/tensor-graph-kept-across-iterations.md
class GraphKeptAcrossIterationsCheck : public TensorCheck {
public:
  GraphKeptAcrossIterationsCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

  /// One accumulation: the state it goes into, the value kept, how.
  struct Accumulation {
    enum KindT { AddInto, SelfSum, Insert, KeyedStore } Kind = AddInto;
    const Stmt *Site = nullptr;   // the whole accumulation
    const Expr *Target = nullptr; // total, losses, m
    const Expr *Value = nullptr;  // loss: the value that requires grad
    const Expr *Key = nullptr;    // m[k] = out: k
  };

private:
  ReportedOnce Reported; // template instantiations repeat a statement
};

} // namespace clang::tidy::tensor
