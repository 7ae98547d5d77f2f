#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// `auto y = x.clone();` whose copy is rewritten in place at once (use the
/// out-of-place op on x), or that nothing needs (use x).
/// Docs: docs/checks/tensor-unnecessary-clone.md
class UnnecessaryCloneCheck : public TensorCheck {
public:
  UnnecessaryCloneCheck(StringRef Name, ClangTidyContext *Context);
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

  /// The clone `auto V = Src.clone();` in its block.
  struct CloneDecl {
    const CXXMemberCallExpr *Call = nullptr;
    const VarDecl *V = nullptr;
    const DeclStmt *DS = nullptr;
    llvm::SmallVector<const Stmt *, 8> Rest; // the block's statements after DS: V's lifetime
  };

private:
  void reportInPlaceFirst(const CloneDecl &C, const Stmt *First, ASTContext &Ctx);
  void reportUnneeded(const CloneDecl &C, ASTContext &Ctx);
  bool reportChained(const CXXMemberCallExpr *Clone, ASTContext &Ctx);
  const sem::OpInfo *freshSourceOp(const CXXMemberCallExpr *Clone) const;
  TensorDiag diagInPlaceAtOnce(SourceLocation Loc, StringRef Src, StringRef Op,
                               const std::string &Use);
  void reportOnTemporary(const CXXMemberCallExpr *Clone, const CXXMemberCallExpr *InPlace,
                         ASTContext &Ctx);
  void reportFreshSource(const CXXMemberCallExpr *Clone, ASTContext &Ctx);
  bool promotesInteger(const CXXMemberCallExpr *Clone, StringRef OutOfPlace, ASTContext &Ctx);
  Finding temporaryFinding(const CXXMemberCallExpr *Clone, FixKind Fix, Fact Why,
                           const SourceManager &SM) const;
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
