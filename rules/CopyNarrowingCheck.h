#pragma once

#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"

namespace clang::tidy::tensor {

/// Flags `copy_`, assignment into an indexed view (`dst[i] = src`) and
/// `index_put_` with integer/slice indices where the source's dtype converts
/// lossily into the destination's: silent in PyTorch.
/// Docs: docs/checks/tensor-copy-narrowing.md
class CopyNarrowingCheck : public TensorCheck {
public:
  CopyNarrowingCheck(StringRef Name, ClangTidyContext *Context);
  void storeOptions(ClangTidyOptions::OptionMap &Opts) override;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override;
  void check(const ast_matchers::MatchFinder::MatchResult &Result) override;
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

  struct Copy; // one copy into a tensor: the call, its destination and source

private:
  void report(const Copy &C, const ast_matchers::MatchFinder::MatchResult &Result);
  struct SourceDType {
    StringRef DType;     // what the copy converts from
    bool Floating;       // floating for certain, width unknown
    std::string Assumed; // the message's words for a default, or ""
    Fact Why;
  };
  std::optional<SourceDType>
  sourceDType(const Copy &C, const TensorFact &D, const TensorFact &S,
              const ast_matchers::MatchFinder::MatchResult &Result) const;
  // Take a source of unknown dtype as float32 when the destination is integral.
  const bool AssumeFloatSources;
  ReportedOnce Reported;
};

} // namespace clang::tidy::tensor
