#include "analysis/CallSites.h"

#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/Basic/SourceManager.h"

namespace clang::tidy::tensor {

class CallSiteIndexer : public RecursiveASTVisitor<CallSiteIndexer> {
public:
  explicit CallSiteIndexer(CallSites &Out) : Out(Out) {}

  bool shouldVisitTemplateInstantiations() const { return true; }
  bool shouldVisitLambdaBody() const { return true; }

  using Base = RecursiveASTVisitor<CallSiteIndexer>;
  bool TraverseFunctionDecl(FunctionDecl *D) {
    return within(D, [&] { return Base::TraverseFunctionDecl(D); });
  }
  bool TraverseCXXMethodDecl(CXXMethodDecl *D) {
    return within(D, [&] { return Base::TraverseCXXMethodDecl(D); });
  }
  bool TraverseCXXConstructorDecl(CXXConstructorDecl *D) {
    return within(D, [&] { return Base::TraverseCXXConstructorDecl(D); });
  }
  bool TraverseCXXDestructorDecl(CXXDestructorDecl *D) {
    return within(D, [&] { return Base::TraverseCXXDestructorDecl(D); });
  }
  bool TraverseLambdaExpr(LambdaExpr *E) {
    return within(E->getCallOperator(), [&] { return Base::TraverseLambdaExpr(E); });
  }

  // Pre-order: a call is seen before its callee expression.
  bool VisitCallExpr(CallExpr *Call) {
    const FunctionDecl *Callee = Call->getDirectCallee();
    if (!Callee || !Caller)
      return true;
    Out.Calls[Callee->getCanonicalDecl()].push_back({Call, Caller});
    CalleeExprs.insert(Call->getCallee()->IgnoreParenImpCasts());
    return true;
  }
  bool VisitDeclRefExpr(DeclRefExpr *DRE) { return referenced(DRE, DRE->getDecl()); }
  bool VisitMemberExpr(MemberExpr *ME) { return referenced(ME, ME->getMemberDecl()); }

private:
  template <typename F> bool within(const FunctionDecl *FD, F Traverse) {
    const FunctionDecl *Outer = Caller;
    Caller = FD;
    bool R = Traverse();
    Caller = Outer;
    return R;
  }
  bool referenced(const Expr *E, const ValueDecl *D) {
    if (const auto *FD = dyn_cast<FunctionDecl>(D); FD && !CalleeExprs.contains(E))
      Out.Escaped.insert(FD->getCanonicalDecl());
    return true;
  }

  CallSites &Out;
  const FunctionDecl *Caller = nullptr;
  llvm::DenseSet<const Expr *> CalleeExprs;
};

CallSites::CallSites(ASTContext &Ctx) {
  CallSiteIndexer Indexer(*this);
  const SourceManager &SM = Ctx.getSourceManager();
  for (Decl *D : Ctx.getTranslationUnitDecl()->decls())
    if (SM.isWrittenInMainFile(SM.getFileLoc(D->getLocation())))
      Indexer.TraverseDecl(D);
}

std::optional<llvm::ArrayRef<CallSites::Site>> CallSites::of(const FunctionDecl *FD) const {
  FD = FD->getCanonicalDecl();
  if (const auto *MD = dyn_cast<CXXMethodDecl>(FD); MD && MD->isVirtual())
    return std::nullopt;
  if (Escaped.contains(FD))
    return std::nullopt;
  auto It = Calls.find(FD);
  if (It == Calls.end())
    return llvm::ArrayRef<Site>();
  return llvm::ArrayRef<Site>(It->second);
}

std::vector<CallSites::Site> CallSites::named(llvm::ArrayRef<llvm::StringRef> Names) const {
  std::vector<Site> Out;
  for (const auto &[FD, Sites] : Calls)
    if (FD->getIdentifier() && llvm::is_contained(Names, FD->getName()))
      Out.insert(Out.end(), Sites.begin(), Sites.end());
  return Out;
}

} // namespace clang::tidy::tensor
