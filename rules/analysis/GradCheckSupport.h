// What the autograd checks share: how to name the written tensor and the
// write, where a tensor came to require grad, the NoGradGuard-block fix-it
// and the typed finding.
#pragma once

#include "analysis/Finding.h"
#include "analysis/GradFacts.h"

#include "analysis/TensorModel.h"

#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Basic/Diagnostic.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

namespace clang::tidy::tensor {

/// Matches every call outside system headers as "write" (the autograd checks
/// then keep the in-place writes).
void registerWriteMatcher(ast_matchers::MatchFinder *Finder,
                          ast_matchers::MatchFinder::MatchCallback *CB);

/// An in-place write the autograd checks look at: its target, the function it
/// is in and that function's autograd facts.
struct GradWrite {
  const CallExpr *Write = nullptr;
  const Expr *Target = nullptr;
  const FunctionDecl *FD = nullptr;
  const GradFacts *G = nullptr;
};
/// The "write" match as a GradWrite; nullopt when it is no in-place write,
/// runs without grad (`torch::nn::init::*`), is library or dependent code, or
/// the function has no facts.
std::optional<GradWrite> matchedGradWrite(const ast_matchers::MatchFinder::MatchResult &Result,
                                          const TensorModel &Model);

/// "'w'", "'lin->weight'": the written tensor as spelled, quoted.
std::string tensorName(const Expr *E, ASTContext &Ctx);
/// "add_", "-=", "copy_": the in-place call or operator.
std::string writeCallName(const CallExpr *Write);
/// Why a value requires grad, from GradFact::Source: "an element of 'parameters()'".
std::string describeGradSource(const Stmt *Source);
/// GradFact::Source says the value is a module's parameter (`parameters()`,
/// a weight member, `register_parameter`), not just any leaf.
bool isParameterSource(const Stmt *Source);

/// `p -= lr * g;` -> `{ torch::NoGradGuard no_grad; p -= lr * g; }` (tt::
/// for tt tensors), when the write is a whole statement outside macros and
/// template instantiations.
std::optional<llvm::SmallVector<FixItHint, 2>>
noGradBlockFix(const CallExpr *Write, const Stmt *Body, const Expr *Target, ASTContext &Ctx);

/// The typed finding of an autograd write at Loc.
Finding gradFinding(StringRef Check, HazardKind Hazard, SourceLocation Loc, const CallExpr *Write,
                    const Expr *Target, const GradFact &F, FixKind Fix, const SourceManager &SM);

} // namespace clang::tidy::tensor
