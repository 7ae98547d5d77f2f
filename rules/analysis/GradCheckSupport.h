// What the autograd checks share: how to name the written tensor and the
// write, where a tensor came to require grad, the NoGradGuard-block fix-it
// and the typed finding.
#pragma once

#include "analysis/Finding.h"
#include "analysis/GradFacts.h"

#include "clang/Basic/Diagnostic.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

namespace clang::tidy::tensor {

/// "'w'", "'lin->weight'": the written tensor as spelled, quoted.
std::string tensorName(const Expr *E, ASTContext &Ctx);
/// "add_", "-=", "copy_": the in-place call or operator.
std::string writeCallName(const CallExpr *Write);
/// Why a value requires grad, from GradFact::Source: "an element of 'parameters()'".
std::string describeGradSource(const Stmt *Source);

/// `p -= lr * g;` -> `{ torch::NoGradGuard no_grad; p -= lr * g; }` (tt::
/// for tt tensors), when the write is a whole statement outside macros and
/// template instantiations.
std::optional<llvm::SmallVector<FixItHint, 2>>
noGradBlockFix(const CallExpr *Write, const Stmt *Body, const Expr *Target, ASTContext &Ctx);

/// The typed finding of an autograd write at Loc.
Finding gradFinding(StringRef Check, HazardKind Hazard, SourceLocation Loc, const CallExpr *Write,
                    const Expr *Target, const GradFact &F, FixKind Fix, const SourceManager &SM);

} // namespace clang::tidy::tensor
