#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// A device-to-host synchronisation (`item()`, `cpu()`, `to(kCPU)`) of a CUDA
/// tensor on every iteration of a loop, whose value is only added up or logged.
/// Docs: docs/checks/tensor-sync-in-loop.md
class SyncInLoopCheck : public TensorCheck {
public:
  SyncInLoopCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

  /// What the host value is used for.
  struct Sink {
    enum Kind : uint8_t { Other, Accumulate, Log } What = Other;
    /// `acc += t.item<T>()` with nothing else on the right: the fix-it's statement.
    const CompoundAssignOperator *Accum = nullptr;
  };

private:
  Sink sinkOf(const Expr *Value, const Stmt *Loop, ASTContext &Ctx, unsigned Depth = 0);
  Sink sinkOfVar(const VarDecl *V, const Stmt *Loop, ASTContext &Ctx, unsigned Depth);
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
