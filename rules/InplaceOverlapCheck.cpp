#include "InplaceOverlapCheck.h"

#include "analysis/AstHelpers.h"
#include "analysis/LayoutCheckSupport.h"
#include "analysis/LayoutImpl.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

// Ops that compare their inputs with the output (TensorIterator's
// elementwise ops, copy_): table rows whose out-of-place form is elementwise.
static bool checksOverlap(StringRef Op) {
  if (Op == "copy_")
    return true;
  const sem::OpInfo *Info = sem::lookup(Op.drop_back().str());
  return Info && Info->storage == sem::Storage::Fresh && Info->layout == sem::Layout::Same;
}

namespace {
// `x.narrow(d, s, n)`: x (a variable or a member of this) and the arguments.
struct Narrow {
  const ValueDecl *Base = nullptr;
  const Expr *Dim = nullptr, *Start = nullptr, *Len = nullptr;
};

std::optional<Narrow> narrowOf(const Expr *E) {
  const auto *MC = dyn_cast<CXXMemberCallExpr>(stripHandle(E));
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  if (!M || !M->getIdentifier() || M->getName() != "narrow" || MC->getNumArgs() != 3)
    return std::nullopt;
  const Expr *Obj = MC->getImplicitObjectArgument();
  const ValueDecl *Base = varOf(Obj);
  if (!Base)
    Base = ownMember(Obj);
  if (!Base)
    return std::nullopt;
  return Narrow{Base, MC->getArg(0), MC->getArg(1), MC->getArg(2)};
}

bool sameExpr(const Expr *A, const Expr *B, const ASTContext &Ctx) {
  llvm::FoldingSetNodeID IA, IB;
  A->IgnoreParenImpCasts()->Profile(IA, Ctx, true);
  B->IgnoreParenImpCasts()->Profile(IB, Ctx, true);
  return IA == IB;
}
} // namespace

// Note [shifted narrows]: `x.narrow(d, 1, n - 1).sub_(x.narrow(d, 0, n - 1))`
// where x's rank or d is not known (`narrow(-1, ...)`, a `dim` parameter):
// two narrows of one tensor along the same dim, of the same length, from
// constant starts closer than that length, overlap at any rank. The dim as
// written, or none.
static std::optional<std::string> shiftedNarrows(const Expr *Target, const Expr *Source,
                                                 const ASTContext &Ctx) {
  std::optional<Narrow> W = narrowOf(Target), R = narrowOf(Source);
  if (!W || !R || W->Base != R->Base || !sameExpr(W->Dim, R->Dim, Ctx) ||
      !sameExpr(W->Len, R->Len, Ctx))
    return std::nullopt;
  std::optional<std::int64_t> A = layout::constInt(W->Start, Ctx),
                              B = layout::constInt(R->Start, Ctx),
                              Len = layout::constInt(W->Len, Ctx);
  if (!A || !B || *A == *B || (Len && std::abs(*A - *B) >= *Len))
    return std::nullopt;
  if (std::optional<std::int64_t> D = layout::constInt(W->Dim, Ctx))
    return std::to_string(*D);
  return "'" +
         Lexer::getSourceText(CharSourceRange::getTokenRange(W->Dim->getSourceRange()),
                              Ctx.getSourceManager(), Ctx.getLangOpts())
             .str() +
         "'";
}

void InplaceOverlapCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Write = Result.Nodes.getNodeAs<CallExpr>("write");
  std::string Op = Write ? writeOpName(Write, Model) : "";
  if (Op.empty() || !checksOverlap(Op))
    return;
  const Expr *Target = Model.inPlaceTarget(Write);
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Write);
  const TensorFact *Out = LA ? LA->factOf(Target) : nullptr;
  for (const Expr *Arg : Write->arguments()) {
    const Expr *A = Model.tensorOperand(Arg);
    const TensorFact *In = A && Out && Arg != Target ? LA->factOf(A) : nullptr;
    OverlapQuery Q = In ? LayoutAnalysis::overlap(*Out, *In) : OverlapQuery();
    bool Shift = Q.Result == OverlapQuery::TooHard && Q.Dim >= 0;
    if (Q.Result == OverlapQuery::Partial || Shift) {
      report(Write, Op, A, Out ? *Out : TensorFact(), Q, std::to_string(Q.Dim), Result);
      return;
    }
    std::optional<std::string> Dim =
        A && Arg != Target && Q.Result == OverlapQuery::Unknown
            ? shiftedNarrows(Target, A, *Result.Context)
            : std::nullopt;
    if (Dim) {
      TensorFact Slices = Out ? *Out : TensorFact();
      Slices.SliceDim = 0; // two slices (the message's form)
      Slices.Assumed = true;
      Q.Result = OverlapQuery::TooHard;
      Q.Assumed = true;
      report(Write, Op, A, Slices, Q, *Dim, Result);
      return;
    }
  }
}

void InplaceOverlapCheck::report(const CallExpr *Write, StringRef Op, const Expr *Source,
                                 const TensorFact &Out, const OverlapQuery &Q,
                                 const std::string &Dim, const MatchFinder::MatchResult &Result) {
  SourceLocation Loc = reportLoc(Write);
  if (!Reported.first(Loc))
    return;
  bool Throws = Q.Result == OverlapQuery::Partial;
  std::string Msg =
      "in-place '" + Op.str() + "' reads a tensor that partially overlaps the one it writes";
  if (Throws)
    Msg += ": throws at run time ('unsupported operation: some elements of the input tensor and "
           "the written-to tensor refer to a single memory location. Please clone() the tensor "
           "before performing the operation.')";
  else
    Msg += (Out.SliceDim < 0 ? " (a slice along dimension " + Dim + " of it"
                             : " (overlapping slices along dimension " + Dim) +
           "): PyTorch cannot detect it and the result depends on the order in which elements "
           "are written";
  if (Q.Assumed)
    Msg += "; assuming the tensor is contiguous and its sizes exceed the offsets, as nearly all do";
  std::optional<FixItHint> Fix = cloneAfter(Source, *Result.Context);
  auto D = diagText(Loc, Msg, Throws ? DiagnosticIDs::Error : DiagnosticIDs::Warning);
  if (Fix)
    D << *Fix;
  Finding F = writeLayoutFinding(
      getID(), Throws ? HazardKind::OverlapThrows : HazardKind::OverlapOrderDependent, Write, Loc,
      Out, Fix ? FixKind::CloneSource : FixKind::None, *Result.SourceManager);
  F.Facts.push_back(Fact::SameStorage);
  emitFinding(std::move(F));
}

} // namespace clang::tidy::tensor
