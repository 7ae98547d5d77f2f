#include "ViewNonContiguousCheck.h"

#include "clang/AST/ExprCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

ViewNonContiguousCheck::ViewNonContiguousCheck(StringRef Name, ClangTidyContext *Context)
    : ClangTidyCheck(Name, Context),
      TensorTypes(Options.get("TensorTypes", TensorModel::DefaultTensorTypes)),
      Model(TensorTypes) {}

void ViewNonContiguousCheck::storeOptions(ClangTidyOptions::OptionMap &Opts) {
  Options.store(Opts, "TensorTypes", TensorTypes);
}

void ViewNonContiguousCheck::registerMatchers(MatchFinder *Finder) {
  // First version: `view` called directly on the result of a permuting op.
  Finder->addMatcher(
      cxxMemberCallExpr(callee(cxxMethodDecl(hasName("view"))),
                        on(ignoringImplicit(cxxMemberCallExpr(
                                                callee(cxxMethodDecl(hasAnyName("t", "transpose", "permute"))))
                                                .bind("src"))))
          .bind("view"),
      this);
}

void ViewNonContiguousCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *View = Result.Nodes.getNodeAs<CXXMemberCallExpr>("view");
  const auto *Src = Result.Nodes.getNodeAs<CXXMemberCallExpr>("src");
  if (!View || !Src || !Model.isTensorExpr(Src) || !Model.opOf(View))
    return;
  const sem::OpInfo *SrcOp = Model.opOf(Src);
  if (!SrcOp || SrcOp->layout != sem::Layout::Permuted)
    return;
  const auto *ME = dyn_cast<MemberExpr>(View->getCallee());
  if (!ME)
    return;
  diag(ME->getMemberLoc(), "'view' on the non-contiguous result of '%0' throws at run time; "
                           "use 'reshape' (which copies) or make the copy explicit with "
                           "'.contiguous().view(...)'",
       DiagnosticIDs::Error)
      << Src->getMethodDecl()->getName()
      << FixItHint::CreateReplacement(ME->getMemberLoc(), "reshape");
}

} // namespace clang::tidy::tensor
