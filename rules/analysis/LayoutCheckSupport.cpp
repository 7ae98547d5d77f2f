#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/Expr.h"
#include "clang/AST/ExprCXX.h"
#include "clang/Basic/SourceManager.h"

namespace clang::tidy::tensor {

Finding layoutFinding(StringRef Check, HazardKind Hazard, const Expr *Call, const ViewQuery &Q,
                      FixKind Fix, const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = Hazard;
  F.Where = SourcePoint::at(reportLoc(Call), SM);
  F.Op = F.Where;
  if (const auto *C = dyn_cast<CallExpr>(Call))
    if (const FunctionDecl *FD = C->getDirectCallee())
      F.OpName = FD->getNameAsString();
  F.Origin = SourcePoint::at(Q.Input.OriginLoc, SM);
  F.Fix = Fix;
  if (Q.Input.Sizes)
    F.Facts.push_back(Fact::LayoutKnown);
  F.Facts.push_back(Q.Certain ? Fact::LayoutCertain : Fact::LayoutUnproven);
  if (Q.Input.Assumed)
    F.Facts.push_back(Fact::AssumedContiguous);
  return F;
}

std::optional<OriginNote> originNote(const ViewQuery &Q, const Expr *Call,
                                     const SourceManager &SM) {
  SourceLocation OL = Q.Input.OriginLoc;
  if (OL.isInvalid() || SM.isPointWithin(OL, Call->getBeginLoc(), Call->getEndLoc()))
    return std::nullopt;
  return OriginNote{OL, Q.Input.Origin};
}

} // namespace clang::tidy::tensor
