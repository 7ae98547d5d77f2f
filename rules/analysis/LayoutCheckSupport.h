// What the checks built on the layout analysis share.
#pragma once

#include "analysis/Finding.h"
#include "analysis/LayoutAnalysis.h"
#include "analysis/AnalysisManager.h"
#include "analysis/TensorCheck.h"
#include "analysis/TensorModel.h"

#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Basic/Diagnostic.h"

namespace clang::tidy::tensor {

// The typed finding of a view/reshape call whose input layout Q describes.
Finding layoutFinding(StringRef Check, HazardKind Hazard, const Expr *Call, const ViewQuery &Q,
                      FixKind Fix, const SourceManager &SM);

// The "made non-contiguous here" note for a call whose input layout Q
// describes, unless the layout was made inside the call itself.
struct OriginNote {
  static constexpr const char *Format = "made non-contiguous here by '%0'";
  SourceLocation Loc;
  std::string Origin; // the op, for %0
};
std::optional<OriginNote> originNote(const ViewQuery &Q, const Expr *Call, const SourceManager &SM);

// Calls that may write a tensor in place (`*_` methods and functions,
// compound and temporary assignment), bound as "write".
void registerWriteMatchers(ast_matchers::MatchFinder *Finder,
                           ast_matchers::MatchFinder::MatchCallback *CB);

// The in-place op a write performs, by PyTorch's name: "add_" for `+=`,
// "copy_" / "fill_" for `a[i] = t` / `a[i] = 1`; "" when not a write.
std::string writeOpName(const CallExpr *Call, const TensorModel &Model);

// The fact of Write's target when PyTorch refuses Write because the target is
// expanded (stride 0 along a dim of size > 1): the write never happens.
const TensorFact *expandedWriteTarget(const CallExpr *Write, const TensorModel &Model,
                                      ASTContext &Ctx);

// `.clone()` inserted after E, unless E is in a macro or a template
// instantiation (the fix would edit every instantiation).
std::optional<FixItHint> cloneAfter(const Expr *E, ASTContext &Ctx);

// Base of the checks that judge in-place writes on the layout facts: it
// matches the writes, reports a location once, releases the analyses per TU.
class LayoutWriteCheck : public TensorCheck {
public:
  using TensorCheck::TensorCheck;
  void registerMatchers(ast_matchers::MatchFinder *Finder) override {
    registerWriteMatchers(Finder, this);
  }
  void onEndOfTranslationUnit() override {
    AnalysisManager::release();
    Reported.clear();
  }

protected:
  ReportedOnce Reported; // template instantiations repeat a call
};

// The typed finding of an in-place write whose target fact is F.
Finding writeLayoutFinding(StringRef Check, HazardKind Hazard, const CallExpr *Write,
                           SourceLocation Loc, const TensorFact &F, FixKind Fix,
                           const SourceManager &SM);

} // namespace clang::tidy::tensor
