#include "analysis/AliasCheckSupport.h"

#include "analysis/AnalysisManager.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/StmtCXX.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

void registerBodyMatchers(MatchFinder *Finder, MatchFinder::MatchCallback *CB) {
  Finder->addMatcher(functionDecl(isDefinition(), unless(isImplicit())).bind("fn"), CB);
  Finder->addMatcher(lambdaExpr().bind("lambda"), CB);
}

const FunctionDecl *matchedBody(const MatchFinder::MatchResult &Result) {
  const FunctionDecl *FD = Result.Nodes.getNodeAs<FunctionDecl>("fn");
  if (FD) {
    if (const auto *MD = dyn_cast<CXXMethodDecl>(FD); MD && MD->getParent()->isLambda())
      return nullptr; // analysed through the lambdaExpr match
  } else if (const auto *LE = Result.Nodes.getNodeAs<LambdaExpr>("lambda")) {
    FD = LE->getCallOperator();
  }
  if (!FD || !FD->hasBody() || FD->isDependentContext())
    return nullptr;
  if (Result.SourceManager->isInSystemHeader(FD->getLocation()) || isTensorLibraryCode(FD))
    return nullptr;
  return FD;
}

std::string declName(const ValueDecl *D) { return D ? D->getNameAsString() : "<unknown>"; }

std::string writeName(const WriteEvent &W) {
  if (W.Via)
    return W.Via->getNameAsString();
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(W.Write))
    return getOperatorSpelling(OC->getOperator());
  if (const auto *Call = dyn_cast<CallExpr>(W.Write))
    if (const FunctionDecl *FD = Call->getDirectCallee())
      return FD->getNameAsString();
  return "write";
}

// `out.logits` for a field of a local struct (`lin->weight` of a local
// module), else the handle's name.
std::string handleName(const AffectedHandle &A) {
  if (!A.Owner)
    return declName(A.Decl);
  return A.Owner->getNameAsString() + (isModuleHolderType(A.Owner->getType()) ? "->" : ".") +
         declName(A.Decl);
}

std::string changedName(const AffectedHandle &A, const TensorModel &M) {
  std::string N = "'" + handleName(A) + "'";
  if (A.Decl && !M.isTensorType(A.Decl->getType()))
    return "an element of " + N;
  return N;
}

std::string exposureNote(const AffectedHandle &A) {
  std::string N = "'" + handleName(A) + "'";
  switch (A.Why) {
  case Exposure::ReadLater:
    return N + " is read here";
  case Exposure::Parameter:
    return N + " is a parameter: the caller's tensor changes";
  case Exposure::Member:
    return N + " is a data member: the object's tensor changes";
  case Exposure::Global:
    return N + " is a global or static: every user of it sees the change";
  case Exposure::Captured:
    return N + " belongs to the enclosing function";
  case Exposure::External:
    return N + " refers to a tensor owned outside this function";
  case Exposure::Stored:
    return N + " is stored here and outlives this statement";
  case Exposure::RequiresGrad:
    return N + " requires grad";
  case Exposure::SavedForBackward:
    return N + " was saved for backward by an earlier op: backward() here raises \"one of the "
               "variables needed for gradient computation has been modified by an inplace "
               "operation\"";
  }
  return N;
}

SourceLocation exposureLoc(const AffectedHandle &A) {
  if (A.Where)
    return A.Where->getBeginLoc();
  return A.Decl ? A.Decl->getLocation() : SourceLocation();
}

bool inMacro(SourceRange R) { return R.getBegin().isMacroID() || R.getEnd().isMacroID(); }

std::string text(const Expr *E, ASTContext &Ctx) {
  return Lexer::getSourceText(CharSourceRange::getTokenRange(E->getSourceRange()),
                              Ctx.getSourceManager(), Ctx.getLangOpts())
      .str();
}

namespace {
const Stmt *stripFull(const Stmt *S) {
  if (const auto *E = dyn_cast_or_null<Expr>(S))
    return E->IgnoreImplicit();
  return S;
}

bool findStatement(const Stmt *Cur, const Expr *E) {
  if (!Cur)
    return false;
  auto Is = [&](const Stmt *S) { return S && stripFull(S) == E; };
  if (const auto *CS = dyn_cast<CompoundStmt>(Cur)) {
    for (const Stmt *C : CS->body())
      if (Is(C))
        return true;
  } else if (const auto *If = dyn_cast<IfStmt>(Cur)) {
    if (Is(If->getThen()) || Is(If->getElse()))
      return true;
  } else if (const auto *F = dyn_cast<ForStmt>(Cur)) {
    if (Is(F->getBody()))
      return true;
  } else if (const auto *W = dyn_cast<WhileStmt>(Cur)) {
    if (Is(W->getBody()))
      return true;
  } else if (const auto *R = dyn_cast<CXXForRangeStmt>(Cur)) {
    if (Is(R->getBody()))
      return true;
  } else if (const auto *D = dyn_cast<DoStmt>(Cur)) {
    if (Is(D->getBody()))
      return true;
  } else if (const auto *SC = dyn_cast<SwitchCase>(Cur)) {
    if (Is(SC->getSubStmt()))
      return true;
  } else if (const auto *L = dyn_cast<LabelStmt>(Cur)) {
    if (Is(L->getSubStmt()))
      return true;
  }
  for (const Stmt *C : Cur->children())
    if (C && !isa<LambdaExpr>(C) && findStatement(C, E))
      return true;
  return false;
}

SourceLocation afterEnd(const Expr *E, ASTContext &Ctx) {
  return Lexer::getLocForEndOfToken(E->getEndLoc(), 0, Ctx.getSourceManager(), Ctx.getLangOpts());
}

const CXXRecordDecl *recordOf(QualType T) { return T.getNonReferenceType()->getAsCXXRecordDecl(); }

bool hasMember(const CXXRecordDecl *RD, DeclarationName Name, unsigned MinParams = 0) {
  if (!RD || !RD->hasDefinition())
    return false;
  for (const NamedDecl *D : RD->lookup(Name)) {
    const auto *FD = D->getAsFunction();
    if (FD && FD->getNumParams() >= MinParams)
      return true;
  }
  for (const CXXBaseSpecifier &B : RD->bases())
    if (hasMember(B.getType()->getAsCXXRecordDecl(), Name, MinParams))
      return true;
  return false;
}

bool hasOperator(const CXXRecordDecl *RD, OverloadedOperatorKind K, ASTContext &Ctx) {
  DeclarationName Name = Ctx.DeclarationNames.getCXXOperatorName(K);
  if (hasMember(RD, Name))
    return true;
  const DeclContext *NS = RD->getEnclosingNamespaceContext();
  return NS && !NS->lookup(Name).empty();
}

// The enum `clone` takes ("c10::MemoryFormat", "tt::MemoryFormat"), read
// from its parameter type, optional<> or not.
std::optional<std::string> memoryFormatSpelling(const CXXRecordDecl *RD, ASTContext &Ctx) {
  for (; RD && RD->hasDefinition();) {
    for (const NamedDecl *D : RD->lookup(&Ctx.Idents.get("clone"))) {
      const auto *FD = D->getAsFunction();
      if (!FD || FD->getNumParams() == 0)
        continue;
      QualType T = FD->getParamDecl(0)->getType().getNonReferenceType();
      if (const auto *Spec = T->getAs<TemplateSpecializationType>()) {
        if (Spec->template_arguments().empty() ||
            Spec->template_arguments()[0].getKind() != TemplateArgument::Type)
          continue;
        T = Spec->template_arguments()[0].getAsType();
      } else if (const auto *RT = T->getAsCXXRecordDecl()) {
        const auto *CT = dyn_cast<ClassTemplateSpecializationDecl>(RT);
        if (!CT || CT->getTemplateArgs().size() == 0 ||
            CT->getTemplateArgs()[0].getKind() != TemplateArgument::Type)
          continue;
        T = CT->getTemplateArgs()[0].getAsType();
      }
      if (const auto *ET = T->getAs<EnumType>())
        if (ET->getDecl()->getIdentifier() && ET->getDecl()->getName() == "MemoryFormat")
          return ET->getDecl()->getQualifiedNameAsString();
    }
    RD = RD->getNumBases() ? RD->bases_begin()->getType()->getAsCXXRecordDecl() : nullptr;
  }
  return std::nullopt;
}

OverloadedOperatorKind binaryOf(OverloadedOperatorKind K) {
  switch (K) {
  case OO_PlusEqual:
    return OO_Plus;
  case OO_MinusEqual:
    return OO_Minus;
  case OO_StarEqual:
    return OO_Star;
  case OO_SlashEqual:
    return OO_Slash;
  case OO_PercentEqual:
    return OO_Percent;
  case OO_AmpEqual:
    return OO_Amp;
  case OO_PipeEqual:
    return OO_Pipe;
  case OO_CaretEqual:
    return OO_Caret;
  case OO_LessLessEqual:
    return OO_LessLess;
  case OO_GreaterGreaterEqual:
    return OO_GreaterGreater;
  default:
    return OO_None;
  }
}

bool needsParens(const Expr *E) {
  E = E->IgnoreUnlessSpelledInSource();
  if (isa<BinaryOperator, ConditionalOperator>(E))
    return true;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E))
    return OC->getNumArgs() == 2 && OC->getOperator() != OO_Subscript &&
           OC->getOperator() != OO_Call;
  return false;
}
} // namespace

bool isFullStatement(const Expr *E, const Stmt *Body) { return findStatement(Body, E); }

std::optional<llvm::SmallVector<FixItHint, 2>> outOfPlaceFix(const WriteEvent &W, ASTContext &Ctx) {
  if (!W.Direct || W.Via || inMacro(W.Write->getSourceRange()))
    return std::nullopt;
  // `b = b.add(1)` needs an assignable handle; a const one gets the clone fix.
  if (W.RootDecl && W.RootDecl->getType().getNonReferenceType().isConstQualified())
    return std::nullopt;
  const CXXRecordDecl *RD = recordOf(W.Target->getType());
  std::string Handle = text(W.Root, Ctx);
  if (!RD || Handle.empty())
    return std::nullopt;
  llvm::SmallVector<FixItHint, 2> Fix;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(W.Write)) {
    OverloadedOperatorKind Bin = binaryOf(OC->getOperator());
    if (Bin == OO_None || !hasOperator(RD, Bin, Ctx))
      return std::nullopt;
    std::string Rhs = text(OC->getArg(1), Ctx);
    if (needsParens(OC->getArg(1)))
      Rhs = "(" + Rhs + ")";
    Fix.push_back(FixItHint::CreateReplacement(OC->getSourceRange(), Handle + " = " + Handle + " " +
                                                                         getOperatorSpelling(Bin) +
                                                                         " " + Rhs));
    return Fix;
  }
  const auto *MC = dyn_cast<CXXMemberCallExpr>(W.Write);
  const auto *ME = MC ? dyn_cast<MemberExpr>(MC->getCallee()->IgnoreParenImpCasts()) : nullptr;
  if (!ME || !MC->getMethodDecl() || !MC->getMethodDecl()->getIdentifier())
    return std::nullopt;
  llvm::StringRef Name = MC->getMethodDecl()->getName();
  if (!Name.ends_with("_"))
    return std::nullopt;
  llvm::StringRef Out = Name.drop_back();
  const sem::OpInfo *Op = sem::lookup(std::string_view(Out.data(), Out.size()));
  if ((Op && Op->storage != sem::Storage::Fresh) || !hasMember(RD, &Ctx.Idents.get(Out)))
    return std::nullopt;
  Fix.push_back(FixItHint::CreateInsertion(W.Write->getBeginLoc(), Handle + " = "));
  Fix.push_back(FixItHint::CreateReplacement(ME->getMemberLoc(), Out));
  return Fix;
}

std::optional<llvm::SmallVector<FixItHint, 2>> cloneFix(const AliasEdge &E, ASTContext &Ctx) {
  if (!E.Site || inMacro(E.Site->getSourceRange()))
    return std::nullopt;
  llvm::SmallVector<FixItHint, 2> Fix;
  const auto *MC = dyn_cast<CXXMemberCallExpr>(E.Site);
  if (E.Kind == EdgeKind::MayAlias && MC && MC->getMethodDecl()) {
    const auto *ME = dyn_cast<MemberExpr>(MC->getCallee()->IgnoreParenImpCasts());
    llvm::StringRef Op = MC->getMethodDecl()->getName();
    std::optional<std::string> MF =
        memoryFormatSpelling(recordOf(MC->getImplicitObjectArgument()->getType()), Ctx);
    if (ME && MF && Op == "contiguous") {
      Fix.push_back(FixItHint::CreateReplacement(
          CharSourceRange::getTokenRange(ME->getMemberLoc(), MC->getRParenLoc()),
          "clone(" + *MF + "::Contiguous)"));
      return Fix;
    }
    if (ME && MF && (Op == "reshape" || Op == "flatten" || Op == "reshape_as")) {
      Fix.push_back(
          FixItHint::CreateInsertion(ME->getMemberLoc(), "clone(" + *MF + "::Contiguous)."));
      return Fix;
    }
    if (Op == "to") {
      // to(x) -> to(x, /*non_blocking=*/false, /*copy=*/true): one copy.
      const CXXMethodDecl *MD = MC->getMethodDecl();
      unsigned Explicit = 0;
      while (Explicit < MC->getNumArgs() && !isa<CXXDefaultArgExpr>(MC->getArg(Explicit)))
        ++Explicit;
      if (Explicit > 0 && Explicit + 1 < MD->getNumParams() &&
          MD->getParamDecl(Explicit)->getName() == "non_blocking" &&
          MD->getParamDecl(Explicit + 1)->getName() == "copy") {
        Fix.push_back(FixItHint::CreateInsertion(afterEnd(MC->getArg(Explicit - 1), Ctx),
                                                 ", /*non_blocking=*/false, /*copy=*/true"));
        return Fix;
      }
    }
  }
  Fix.push_back(FixItHint::CreateInsertion(afterEnd(E.Site, Ctx), ".clone()"));
  return Fix;
}

std::optional<FixItHint> detachCloneFix(const AliasEdge &E, ASTContext &Ctx) {
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(E.Site);
  if (!MC || inMacro(MC->getSourceRange()))
    return std::nullopt;
  if (E.Kind == EdgeKind::Detach)
    return FixItHint::CreateInsertion(afterEnd(MC, Ctx), ".clone()");
  const auto *ME = dyn_cast<MemberExpr>(MC->getCallee()->IgnoreParenImpCasts());
  const CXXRecordDecl *RD = recordOf(MC->getImplicitObjectArgument()->getType());
  if (!ME || !hasMember(RD, &Ctx.Idents.get("detach")))
    return std::nullopt;
  return FixItHint::CreateReplacement(
      CharSourceRange::getTokenRange(ME->getMemberLoc(), MC->getRParenLoc()), "detach().clone()");
}

const FunctionAliasResult *analyseMatchedBody(const ast_matchers::MatchFinder::MatchResult &Result,
                                              const TensorModel &Model, const FunctionDecl *&FD) {
  FD = matchedBody(Result);
  return FD ? AnalysisManager::get(Model, *Result.Context).alias().analyze(FD) : nullptr;
}

const AffectedHandle *pickAffected(const WriteEvent &W,
                                   llvm::function_ref<bool(const AffectedHandle &)> Eligible) {
  const AffectedHandle *Best = nullptr;
  for (const AffectedHandle &A : W.Affected)
    if (Eligible(A) &&
        (!Best || (Best->Why != Exposure::ReadLater && A.Why == Exposure::ReadLater)))
      Best = &A;
  return Best;
}

Finding writeFinding(StringRef Check, HazardKind Hazard, SourceLocation Loc, const WriteEvent &W,
                     const AffectedHandle &A, const AliasEdge &E, FixKind Fix,
                     const SourceManager &SM) {
  Finding F;
  F.Check = Check.str();
  F.Hazard = Hazard;
  F.Where = SourcePoint::at(Loc, SM);
  F.Op = SourcePoint::at(W.Write->getExprLoc(), SM);
  F.OpName = writeName(W);
  if (E.Site)
    F.Origin = SourcePoint::at(E.Site->getBeginLoc(), SM);
  if (W.RootDecl)
    F.Handles.push_back(handleOf(HandleRole::Written, W.RootDecl, SM));
  F.Handles.push_back(handleOf(HandleRole::Changed, A.Decl, SM));
  F.Fix = Fix;
  switch (E.Kind) {
  case EdgeKind::MayAlias:
    F.Facts.push_back(Fact::MayAliasOp);
    break;
  case EdgeKind::Detach:
    F.Facts.push_back(Fact::SharesVersion);
    break;
  case EdgeKind::Data:
    F.Facts.push_back(Fact::NoVersionCounter);
    break;
  default:
    F.Facts.push_back(Fact::HandleCopy);
  }
  if (A.Why == Exposure::SavedForBackward)
    F.Facts.insert(F.Facts.end(), {Fact::SavedForBackward, Fact::BackwardInFunction});
  else
    F.Facts.push_back(A.Why == Exposure::ReadLater ? Fact::ReadLater : Fact::Escapes);
  return F;
}

} // namespace clang::tidy::tensor
