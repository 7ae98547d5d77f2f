#pragma once

#include "ClangTidyCheck.h"
#include "analysis/LayoutAnalysis.h"
#include "analysis/LoopAnalysis.h"
#include "analysis/TensorModel.h"

#include "llvm/ADT/DenseSet.h"

namespace clang::tidy::tensor {

/// clone/contiguous/to/cuda/cpu of a loop-invariant tensor inside a loop
/// Docs: docs/checks/tensor-clone-in-loop.md
class CloneInLoopCheck : public ClangTidyCheck {
public:
  CloneInLoopCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    Layouts.clear();
    Loops.clear();
    Reported.clear();
  }
  bool isLanguageVersionSupported(const LangOptions &LangOpts) const override {
    return LangOpts.CPlusPlus;
  }

private:
  const std::string TensorTypes;
  const TensorModel Model;
  LayoutCache Layouts{Model};
  llvm::DenseMap<const FunctionDecl *, std::unique_ptr<LoopAnalysis>> Loops;
  llvm::DenseSet<SourceLocation> Reported; // template instantiations repeat a call
};

} // namespace clang::tidy::tensor
