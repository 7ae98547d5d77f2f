#include "ViewNonContiguousCheck.h"

#include "analysis/LayoutCheckSupport.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

ViewNonContiguousCheck::ViewNonContiguousCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context), UnprovenAsError(boolOption("UnprovenAsError", true)) {}

void ViewNonContiguousCheck::storeOptions(ClangTidyOptions::OptionMap &Opts) {
  TensorCheck::storeOptions(Opts);
  storeBool(Opts, "UnprovenAsError", UnprovenAsError);
}

void ViewNonContiguousCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxMemberCallExpr(callee(cxxMethodDecl(hasAnyName("view", "view_as"))),
                                       unless(isExpansionInSystemHeader()))
                         .bind("view"),
                     this);
}

// An error when the code shows the layout (sizes may be run-time values, see
// UnprovenAsError); a warning when it rests on an input taken as contiguous.
DiagnosticIDs::Level ViewNonContiguousCheck::severity(const ViewQuery &Q) const {
  if (Q.Certain || (UnprovenAsError && !Q.Input.Assumed))
    return DiagnosticIDs::Error;
  return DiagnosticIDs::Warning;
}

void ViewNonContiguousCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *View = Result.Nodes.getNodeAs<CXXMemberCallExpr>("view");
  if (!View || !Model.isTensorExpr(View->getImplicitObjectArgument()))
    return;
  const LayoutAnalysis *LA = AnalysisManager::get(Model, *Result.Context).layoutAt(View);
  const ViewQuery *Q = LA ? LA->queryOf(View) : nullptr;
  if (!Q || Q->Result != ViewQuery::NotViewable)
    return;
  const auto *ME = dyn_cast<MemberExpr>(View->getCallee());
  if (!ME || !Reported.first(ME->getMemberLoc()))
    return;

  std::string What = Q->Input.Origin.empty()
                         ? std::string("a non-contiguous tensor")
                         : "the non-contiguous result of '" + Q->Input.Origin + "'";
  std::string Name = View->getMethodDecl()->getName().str();
  std::string Reshape = Name == "view" ? "reshape" : "reshape_as";
  std::string Msg = "'" + Name + "' on " + What;
  if (Q->Certain) {
    Msg += " always throws at run time";
    std::string Sz = LayoutAnalysis::formatShape(*Q->Input.Sizes);
    std::string St = LayoutAnalysis::formatShape(*Q->Input.Strides);
    if (Q->NewSizes && !Sz.empty() && !St.empty())
      Msg += ": sizes " + Sz + " with strides " + St + " cannot be viewed as " +
             LayoutAnalysis::formatShape(*Q->NewSizes);
  } else {
    Msg += " throws at run time unless the dimensions it merges have size 1" +
           LayoutAnalysis::assumption(*Q);
  }
  Msg += " ('view size is not compatible with input tensor's size and stride'); ";
  // When the layout is known, reshape would copy for certain: make that copy
  // explicit (tensor-reshape-non-contiguous accepts it). Otherwise reshape
  // copies only if it must.
  bool Known = Q->Input.Sizes.has_value();
  Msg += Known ? "make the copy explicit with '.contiguous()." + Name + "(...)' or use '" +
                     Reshape + "'"
               : "use '" + Reshape +
                     "' (which copies only when it must) or make the copy explicit with "
                     "'.contiguous()." +
                     Name + "(...)'";
  {
    auto D = diagText(ME->getMemberLoc(), Msg, severity(*Q));
    bool Fixable = !ME->getMemberLoc().isMacroID() && !ME->isArrow() &&
                   !inTemplateInstantiation(View, *Result.Context);
    if (Fixable)
      D << (Known ? FixItHint::CreateInsertion(ME->getMemberLoc(), "contiguous().")
                  : FixItHint::CreateReplacement(ME->getMemberLoc(), Reshape));
    emitFinding(layoutFinding(getID(), HazardKind::ViewThrows, View, *Q,
                              !Fixable ? FixKind::None
                              : Known  ? FixKind::ContiguousFirst
                                       : FixKind::ReshapeForView,
                              *Result.SourceManager));
  }
  if (auto N = originNote(*Q, View, *Result.SourceManager))
    diag(N->Loc, OriginNote::Format, DiagnosticIDs::Note) << N->Origin;
}

} // namespace clang::tidy::tensor
