#include "InplaceOverlapCheck.h"

#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

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

void InplaceOverlapCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Write = Result.Nodes.getNodeAs<CallExpr>("write");
  std::string Op = Write ? writeOpName(Write, Model) : "";
  if (Op.empty() || !checksOverlap(Op))
    return;
  const Expr *Target = Model.inPlaceTarget(Write);
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(Write);
  const TensorFact *Out = LA ? LA->factOf(Target) : nullptr;
  if (!Out)
    return;
  for (const Expr *Arg : Write->arguments()) {
    const Expr *A = Model.tensorOperand(Arg);
    const TensorFact *In = A && Arg != Target ? LA->factOf(A) : nullptr;
    if (!In)
      continue;
    OverlapQuery Q = LayoutAnalysis::overlap(*Out, *In);
    bool Shift = Q.Result == OverlapQuery::TooHard && Q.Dim >= 0;
    if (Q.Result == OverlapQuery::Partial || Shift) {
      report(Write, Op, A, *Out, Q, Result);
      return;
    }
  }
}

void InplaceOverlapCheck::report(const CallExpr *Write, StringRef Op, const Expr *Source,
                                 const TensorFact &Out, const OverlapQuery &Q,
                                 const MatchFinder::MatchResult &Result) {
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
    Msg += (Out.SliceDim < 0 ? " (a slice along dimension " + std::to_string(Q.Dim) + " of it"
                             : " (overlapping slices along dimension " + std::to_string(Q.Dim)) +
           "): PyTorch cannot detect it and the result depends on the order in which elements "
           "are written";
  if (Q.Assumed)
    Msg += "; assuming the tensor is contiguous and its sizes exceed the offsets, as nearly all do";
  std::optional<FixItHint> Fix = cloneAfter(Source, *Result.Context);
  auto D = diag(Loc, Msg, Throws ? DiagnosticIDs::Error : DiagnosticIDs::Warning);
  if (Fix)
    D << *Fix;
  Finding F = writeLayoutFinding(
      getID(), Throws ? HazardKind::OverlapThrows : HazardKind::OverlapOrderDependent, Write, Loc,
      Out, Fix ? FixKind::CloneSource : FixKind::None, *Result.SourceManager);
  F.Facts.push_back(Fact::SameStorage);
  emitFinding(std::move(F));
}

} // namespace clang::tidy::tensor
