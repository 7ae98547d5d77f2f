#include "SyncInLoopCheck.h"

#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

SyncInLoopCheck::SyncInLoopCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void SyncInLoopCheck::registerMatchers(MatchFinder *Finder) {
  // FIXME: match the hazard.
}

void SyncInLoopCheck::check(const MatchFinder::MatchResult &Result) {
  // FIXME: diagnose, with a fix-it where one is safe (once per location:
  // ReportedOnce), and emit the typed finding next to the diagnostic:
  //   Finding F;
  //   F.Check = getID().str();
  //   F.Hazard = HazardKind::...; F.Where = SourcePoint::at(Loc, *Result.SourceManager); ...
  //   emitFinding(std::move(F));
  // (rules/analysis/Finding.h), then add its row to tool/verify/Rules.cpp.
}

} // namespace clang::tidy::tensor
