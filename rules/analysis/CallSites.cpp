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
    if (Callee)
      argumentEscapes(Call, Callee);
    if (!Callee || !Caller)
      return true;
    Out.Calls[Callee->getCanonicalDecl()].push_back({Call, Caller});
    CalleeExprs.insert(Call->getCallee()->IgnoreParenImpCasts());
    return true;
  }
  bool VisitDeclRefExpr(DeclRefExpr *DRE) { return referenced(DRE, DRE->getDecl()); }
  // Handle copies are most constructions in a TU and carry no argument of interest.
  bool VisitCXXConstructExpr(CXXConstructExpr *CE) {
    const CXXConstructorDecl *Ctor = CE->getConstructor();
    if (Caller && Ctor && !Ctor->isCopyOrMoveConstructor())
      Out.Constructions[Ctor->getCanonicalDecl()].push_back({CE, Caller});
    return true;
  }
  bool VisitTagTypeLoc(TagTypeLoc TL) {
    if (const auto *RD = dyn_cast<CXXRecordDecl>(TL.getDecl()))
      Out.NamedRecords.insert(RD->getCanonicalDecl());
    return true;
  }
  bool VisitMemberExpr(MemberExpr *ME) { return referenced(ME, ME->getMemberDecl()); }

  // Field values: `s.F = v` (a class's operator= or a built-in one).
  bool VisitCXXOperatorCallExpr(CXXOperatorCallExpr *OC) {
    if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2)
      assigned(OC->getArg(0), OC->getArg(1));
    return true;
  }
  bool VisitBinaryOperator(BinaryOperator *BO) {
    if (BO->getOpcode() == BO_Assign)
      assigned(BO->getLHS(), BO->getRHS());
    return true;
  }
  // `S{v, ...}`: each field its initialiser (the semantic form; the walk
  // sees the syntactic one).
  bool VisitInitListExpr(InitListExpr *Written) {
    const InitListExpr *ILE = Written->isSemanticForm() ? Written : Written->getSemanticForm();
    const auto *RD = ILE ? ILE->getType()->getAsCXXRecordDecl() : nullptr;
    if (!RD)
      return true;
    if (RD->getNumBases() || RD->isUnion()) { // initialisers not one per field in order
      for (const FieldDecl *F : RD->fields())
        Out.FieldsEscaped.insert(F);
      return true;
    }
    unsigned I = 0;
    for (const FieldDecl *F : RD->fields())
      if (I < ILE->getNumInits())
        if (const Expr *V = ILE->getInit(I++); !isa<ImplicitValueInitExpr, CXXDefaultInitExpr>(V))
          Out.FieldValues[F].push_back(V);
    return true;
  }
  // A field bound to a non-const reference or whose address is taken may
  // change out of sight.
  bool VisitUnaryOperator(UnaryOperator *UO) {
    if (UO->getOpcode() == UO_AddrOf)
      escapes(UO->getSubExpr());
    return true;
  }
  bool VisitReturnStmt(ReturnStmt *R) { // `Tensor &weights() { return w_; }`
    if (Caller && R->getRetValue() && isMutableRef(Caller->getReturnType()))
      escapes(R->getRetValue());
    return true;
  }
  bool VisitVarDecl(VarDecl *V) {
    if (isMutableRef(V->getType()) && V->getInit())
      escapes(V->getInit());
    return true;
  }

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

  static bool isMutableRef(QualType T) {
    return T->isLValueReferenceType() && !T.getNonReferenceType().isConstQualified();
  }
  static const FieldDecl *fieldOf(const Expr *E) {
    const auto *ME = dyn_cast<MemberExpr>(E->IgnoreParenImpCasts());
    return ME ? dyn_cast<FieldDecl>(ME->getMemberDecl()) : nullptr;
  }
  void assigned(const Expr *L, const Expr *R) {
    if (const FieldDecl *F = fieldOf(L))
      Out.FieldValues[F].push_back(R);
  }
  void escapes(const Expr *E) {
    if (const FieldDecl *F = fieldOf(E))
      Out.FieldsEscaped.insert(F);
  }
  // `torch::load(s.F, path)`, `std::swap(a.F, b.F)`: a non-const reference.
  void argumentEscapes(const CallExpr *Call, const FunctionDecl *Callee) {
    unsigned Shift = isa<CXXOperatorCallExpr>(Call) && isa<CXXMethodDecl>(Callee) ? 1 : 0;
    for (unsigned I = Shift; I < Call->getNumArgs(); ++I)
      if (I - Shift < Callee->getNumParams() &&
          isMutableRef(Callee->getParamDecl(I - Shift)->getType()) &&
          !forwarded(Callee, I - Shift))
        escapes(Call->getArg(I));
  }
  // Parameter K of a template's instance is a forwarding reference
  // (`options.device(Args&&... args)` given an lvalue): it only passes the
  // argument on, read as the template's own code says.
  static bool forwarded(const FunctionDecl *Callee, unsigned K) {
    const FunctionDecl *Pattern = Callee->getTemplateInstantiationPattern();
    if (!Pattern)
      return false;
    for (unsigned P = 0; P < Pattern->getNumParams(); ++P) {
      const ParmVarDecl *Param = Pattern->getParamDecl(P);
      QualType T = Param->getType();
      if (const auto *PE = T->getAs<PackExpansionType>())
        T = PE->getPattern(); // the pack stands for every parameter from P on
      if (P == K || (Param->isParameterPack() && K > P))
        return T->isRValueReferenceType();
    }
    return false;
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

bool CallSites::addFieldWrites(const FieldDecl *F,
                               llvm::SmallVectorImpl<const Expr *> &Out) const {
  if (FieldsEscaped.contains(F))
    return false;
  const SourceManager &SM = F->getASTContext().getSourceManager();
  if (!SM.isWrittenInMainFile(SM.getFileLoc(F->getLocation())))
    return true; // other files may write it: the class's own code says
  if (auto It = FieldValues.find(F); It != FieldValues.end())
    Out.append(It->second.begin(), It->second.end());
  return true;
}

std::vector<CallSites::Site> CallSites::named(llvm::ArrayRef<llvm::StringRef> Names) const {
  std::vector<Site> Out;
  for (const auto &[FD, Sites] : Calls)
    if (FD->getIdentifier() && llvm::is_contained(Names, FD->getName()))
      Out.insert(Out.end(), Sites.begin(), Sites.end());
  return Out;
}

} // namespace clang::tidy::tensor
