// What the checks built on the alias analysis share: which bodies to analyse,
// how to name a write and an exposure, and the fix-it building blocks.
#pragma once

#include "analysis/AliasAnalysis.h"
#include "analysis/Finding.h"

#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Basic/Diagnostic.h"

#include <optional>
#include <string>

namespace clang::tidy::tensor {

// Matches every function, method and lambda body the alias checks analyse.
void registerBodyMatchers(ast_matchers::MatchFinder *Finder,
                          ast_matchers::MatchFinder::MatchCallback *CB);
// The body matched by registerBodyMatchers, or nullptr when it is not
// analysed here (system header, dependent, lambda seen through its class).
const FunctionDecl *matchedBody(const ast_matchers::MatchFinder::MatchResult &Result);

// The alias analysis of the body registerBodyMatchers matched (FD set to it),
// or nullptr when it is not analysed here.
const FunctionAliasResult *analyseMatchedBody(const ast_matchers::MatchFinder::MatchResult &Result,
                                              const TensorModel &Model, const FunctionDecl *&FD);

// "add_", "-=", or the callee of a mutating call.
std::string writeName(const WriteEvent &W);
std::string declName(const ValueDecl *D);

// The note text that says why an affected handle matters, and where to put it.
std::string exposureNote(const AffectedHandle &A);
SourceLocation exposureLoc(const AffectedHandle &A);

// R begins or ends in a macro expansion (no fix-it there).
bool inMacro(SourceRange R);
// E as spelled in the source.
std::string text(const Expr *E, ASTContext &Ctx);

// True when E is a whole statement (its value unused).
bool isFullStatement(const Expr *E, const Stmt *Body);

// `b.add_(1)` -> `b = b.add(1)`, `b -= m` -> `b = b - m`, when the
// out-of-place form exists for the handle's type.
std::optional<llvm::SmallVector<FixItHint, 2>> outOfPlaceFix(const WriteEvent &W, ASTContext &Ctx);

// `.clone()` at the alias creation (the single-copy form for may-alias ops).
std::optional<llvm::SmallVector<FixItHint, 2>> cloneFix(const AliasEdge &E, ASTContext &Ctx);

// `a.detach()` -> `a.detach().clone()`, `a.data()` -> `a.detach().clone()`.
std::optional<FixItHint> detachCloneFix(const AliasEdge &E, ASTContext &Ctx);

// The handle a write is reported for, among those Eligible: one read later
// first, then one that escapes.
const AffectedHandle *pickAffected(const WriteEvent &W,
                                   llvm::function_ref<bool(const AffectedHandle &)> Eligible);

// The typed finding of a write W at Loc that changes A through edge E.
Finding writeFinding(StringRef Check, HazardKind Hazard, SourceLocation Loc, const WriteEvent &W,
                     const AffectedHandle &A, const AliasEdge &E, FixKind Fix,
                     const SourceManager &SM);

} // namespace clang::tidy::tensor
