#include "analysis/AstHelpers.h"

#include "clang/AST/Attr.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "llvm/ADT/STLExtras.h"

namespace clang::tidy::tensor {

const Expr *stripHandle(const Expr *E) {
  while (E) {
    const Expr *Prev = E;
    E = E->IgnoreParenImpCasts();
    if (const auto *M = dyn_cast<MaterializeTemporaryExpr>(E))
      E = M->getSubExpr();
    else if (const auto *B = dyn_cast<CXXBindTemporaryExpr>(E))
      E = B->getSubExpr();
    else if (const auto *C = dyn_cast<ExprWithCleanups>(E))
      E = C->getSubExpr();
    else if (const auto *F = dyn_cast<CXXFunctionalCastExpr>(E))
      E = F->getSubExpr();
    else if (const auto *CE = dyn_cast<CXXConstructExpr>(E);
             CE && CE->getNumArgs() >= 1 && CE->getConstructor()->isCopyOrMoveConstructor())
      E = CE->getArg(0);
    if (E == Prev)
      break;
  }
  return E;
}

llvm::SmallVector<const Expr *, 4> bracedElements(const Expr *E) {
  E = stripHandle(E);
  if (const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E); CE && CE->getNumArgs() >= 1)
    E = stripHandle(CE->getArg(0)); // ArrayRef(std::initializer_list), vector(...)
  if (const auto *SIL = dyn_cast_or_null<CXXStdInitializerListExpr>(E))
    E = stripHandle(SIL->getSubExpr());
  const auto *IL = dyn_cast_or_null<InitListExpr>(E);
  using Exprs = llvm::SmallVector<const Expr *, 4>;
  return IL ? Exprs(IL->inits()) : Exprs();
}

const Expr *scalarSource(const Expr *A) {
  for (int I = 0; A && I < 4; ++I) {
    A = A->IgnoreImplicit();
    const auto *CE = dyn_cast<CXXConstructExpr>(A);
    if (!CE || CE->getNumArgs() != 1)
      break;
    A = CE->getArg(0);
  }
  return A ? A->IgnoreParenImpCasts() : nullptr;
}

const VarDecl *varOf(const Expr *E) {
  if (!E)
    return nullptr;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(E)))
    return dyn_cast<VarDecl>(DRE->getDecl());
  return nullptr;
}

const InitListExpr *aggregateInit(const VarDecl *V) {
  if (!V || !V->isLocalVarDecl() || V->getType()->isReferenceType() || !V->getInit())
    return nullptr;
  const auto *IL = dyn_cast<InitListExpr>(V->getInit()->IgnoreImplicit());
  const auto *RD = V->getType()->getAsCXXRecordDecl();
  return IL && RD && !RD->getNumBases() ? IL : nullptr;
}

const Expr *aggregateFieldInit(const VarDecl *V, const FieldDecl *F) {
  const InitListExpr *IL = aggregateInit(V);
  return IL && F && F->getFieldIndex() < IL->getNumInits() ? IL->getInit(F->getFieldIndex())
                                                           : nullptr;
}

const ValueDecl *ownMember(const Expr *E) {
  const auto *ME = E ? dyn_cast<MemberExpr>(E->IgnoreParenImpCasts()) : nullptr;
  return ME && isa<CXXThisExpr>(ME->getBase()->IgnoreParenImpCasts()) ? ME->getMemberDecl()
                                                                       : nullptr;
}

bool inNamespacePath(const Decl *D, llvm::StringRef Prefix) {
  const auto *ND = dyn_cast<NamedDecl>(D);
  return ND && llvm::StringRef(ND->getQualifiedNameAsString()).starts_with(Prefix);
}

bool isTorchModuleBase(const CXXRecordDecl *RD) {
  return RD && RD->getIdentifier() && inNamespacePath(RD, "torch::nn::") &&
         (RD->getName() == "Module" || RD->getName() == "Cloneable");
}

// RD is torch::nn::Module or derives from it.
bool isModuleRecord(const CXXRecordDecl *RD) {
  if (!RD || !RD->hasDefinition())
    return false;
  RD = RD->getDefinition();
  if (isTorchModuleBase(RD))
    return true;
  return RD->forallBases([](const CXXRecordDecl *B) { return !isTorchModuleBase(B); }) == false;
}

// A module value: Impl, holder (Linear, Sequential...), pointer or shared_ptr to one.
bool isModuleHolderType(QualType T) {
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  if (!RD || !RD->getIdentifier())
    return false;
  if (isModuleRecord(RD))
    return true;
  if (!RD->hasDefinition())
    return false;
  auto IsHolder = [](const CXXRecordDecl *B) {
    return B->getIdentifier() && (B->getName() == "ModuleHolder" || B->getName() == "AnyModule") &&
           inNamespacePath(B, "torch::nn::");
  };
  return IsHolder(RD) ||
         !RD->getDefinition()->forallBases([&](const CXXRecordDecl *B) { return !IsHolder(B); });
}

const FunctionDecl *readableCallee(const FunctionDecl *FD) {
  const FunctionDecl *Def = FD ? FD->getDefinition() : nullptr;
  if (!Def || isTensorLibraryCode(Def))
    return nullptr;
  if (const auto *MD = dyn_cast<CXXMethodDecl>(Def);
      MD && MD->isVirtual() && !MD->hasAttr<FinalAttr>() && !MD->getParent()->hasAttr<FinalAttr>())
    return nullptr;
  return Def;
}

std::pair<const Expr *, const Expr *> assignmentSides(const Stmt *S) {
  if (const auto *OC = dyn_cast_or_null<CXXOperatorCallExpr>(S);
      OC && OC->getOperator() == OO_Equal && OC->getNumArgs() == 2)
    return {OC->getArg(0), OC->getArg(1)};
  if (const auto *BO = dyn_cast_or_null<BinaryOperator>(S); BO && BO->getOpcode() == BO_Assign)
    return {BO->getLHS(), BO->getRHS()};
  return {nullptr, nullptr};
}

bool isModuleCall(const CallExpr *Call) {
  const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call);
  return OC && OC->getOperator() == OO_Call && OC->getNumArgs() &&
         isModuleHolderType(OC->getArg(0)->getType());
}

// The Impl a ModuleHolder<Impl> (or a class derived from one) holds.
static const CXXRecordDecl *heldImpl(const CXXRecordDecl *RD) {
  for (int Depth = 0; RD && RD->hasDefinition() && Depth < 4; ++Depth) {
    const auto *TS = dyn_cast<ClassTemplateSpecializationDecl>(RD);
    if (TS && TS->getIdentifier() && TS->getName() == "ModuleHolder" &&
        TS->getTemplateArgs().size() == 1 &&
        TS->getTemplateArgs()[0].getKind() == TemplateArgument::Type)
      return TS->getTemplateArgs()[0].getAsType()->getAsCXXRecordDecl();
    const CXXRecordDecl *Def = RD->getDefinition();
    RD = Def->getNumBases() == 1 ? Def->bases_begin()->getType()->getAsCXXRecordDecl() : nullptr;
  }
  return nullptr;
}

const CXXRecordDecl *userModuleClass(QualType T) {
  T = T.getNonReferenceType();
  if (T->isPointerType())
    T = T->getPointeeType();
  const CXXRecordDecl *RD = T->getAsCXXRecordDecl();
  const auto *TS = dyn_cast_or_null<ClassTemplateSpecializationDecl>(RD);
  if (TS && TS->getIdentifier() && TS->getName() == "shared_ptr" && TS->isInStdNamespace() &&
      TS->getTemplateArgs().size() >= 1 &&
      TS->getTemplateArgs()[0].getKind() == TemplateArgument::Type)
    RD = TS->getTemplateArgs()[0].getAsType()->getAsCXXRecordDecl();
  if (const CXXRecordDecl *Impl = heldImpl(RD))
    RD = Impl;
  RD = RD ? RD->getDefinition() : nullptr;
  return RD && isModuleRecord(RD) && !isTensorLibraryCode(RD) ? RD : nullptr;
}

// S calls one of Names (a direct callee's plain name).
static bool callsNamed(const Stmt *S, llvm::ArrayRef<llvm::StringRef> Names) {
  if (const auto *C = dyn_cast_or_null<CallExpr>(S))
    if (const FunctionDecl *F = C->getDirectCallee();
        F && F->getIdentifier() && llvm::is_contained(Names, F->getName()))
      return true;
  return S && llvm::any_of(S->children(), [&](const Stmt *C) { return callsNamed(C, Names); });
}

static constexpr llvm::StringRef kRegisters[] = {"register_module", "register_parameter",
                                                 "register_buffer"};

// S registers member F by name: `register_module("fc", fc)` as a statement.
static bool registersMember(const Stmt *S, const FieldDecl *F) {
  const auto *C = dyn_cast_or_null<CallExpr>(S);
  const FunctionDecl *Callee = C ? C->getDirectCallee() : nullptr;
  if (Callee && Callee->getIdentifier() && llvm::is_contained(kRegisters, Callee->getName()) &&
      C->getNumArgs() >= 2 && ownMember(stripHandle(C->getArg(1))) == F)
    return true;
  return S && llvm::any_of(S->children(), [&](const Stmt *C) { return registersMember(C, F); });
}

bool movesWithModule(const FieldDecl *F) {
  if (llvm::any_of(valuesOfField(F), [](const Expr *V) { return callsNamed(V, kRegisters); }))
    return true;
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  return RD && llvm::any_of(RD->methods(), [&](const CXXMethodDecl *M) {
           const FunctionDecl *Def = M->getDefinition();
           return Def && registersMember(Def->getBody(), F);
         });
}

const CXXMethodDecl *holderForward(const CallExpr *Call) {
  if (!isModuleCall(Call))
    return nullptr;
  const auto *OC = cast<CXXOperatorCallExpr>(Call);
  const CXXRecordDecl *Impl =
      heldImpl(OC->getArg(0)->getType().getNonReferenceType()->getAsCXXRecordDecl());
  if (!Impl || !Impl->hasDefinition() || isTensorLibraryCode(Impl))
    return nullptr;
  const CXXMethodDecl *Found = nullptr;
  for (const CXXMethodDecl *M : Impl->getDefinition()->methods()) {
    if (!M->getIdentifier() || M->getName() != "forward" ||
        M->getNumParams() != Call->getNumArgs() - 1)
      continue;
    if (Found)
      return nullptr; // overloads the argument count does not tell apart
    Found = M;
  }
  return Found;
}

const FunctionDecl *readableBodyOf(const CallExpr *Call) {
  if (const FunctionDecl *FD = readableCallee(Call->getDirectCallee()))
    return FD;
  return readableCallee(holderForward(Call));
}

const Expr *moduleValue(const Expr *E) {
  E = stripHandle(E);
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E))
    if ((OC->getOperator() == OO_Arrow || OC->getOperator() == OO_Star) && OC->getNumArgs() >= 1)
      return stripHandle(OC->getArg(0));
  if (const auto *UO = dyn_cast<UnaryOperator>(E); UO && UO->getOpcode() == UO_Deref)
    return stripHandle(UO->getSubExpr());
  return E;
}

const Expr *calledModule(const CallExpr *Call) {
  if (isModuleCall(Call))
    return moduleValue(Call->getArg(0));
  const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
  return MC && isModuleForward(MC->getMethodDecl()) ? moduleValue(MC->getImplicitObjectArgument())
                                                     : nullptr;
}

llvm::StringRef libraryModuleName(QualType T) {
  const CXXRecordDecl *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  if (!RD || !RD->getIdentifier() || !inNamespacePath(RD, "torch::nn::"))
    return "";
  llvm::StringRef N = RD->getName();
  N.consume_back("Impl");
  return N;
}

const ::tt::semantics::ModuleInfo *libraryModule(QualType T) {
  llvm::StringRef N = libraryModuleName(T);
  return N.empty() ? nullptr : ::tt::semantics::lookupModule({N.data(), N.size()});
}

bool isModuleForward(const CXXMethodDecl *MD) {
  if (!MD || !(MD->getOverloadedOperator() == OO_Call ||
               (MD->getIdentifier() && MD->getName() == "forward")))
    return false;
  return isModuleRecord(MD->getParent());
}

const CXXMethodDecl *customFunctionForward(const CallExpr *Call) {
  const auto *Apply = dyn_cast_or_null<CXXMethodDecl>(Call->getDirectCallee());
  if (!Apply || !Apply->isStatic() || !Apply->getIdentifier() || Apply->getName() != "apply")
    return nullptr;
  const auto *Base = dyn_cast<ClassTemplateSpecializationDecl>(Apply->getParent());
  if (!Base || !Base->getIdentifier() || Base->getName() != "Function" ||
      !inNamespacePath(Base, "torch::autograd::") || Base->getTemplateArgs().size() != 1 ||
      Base->getTemplateArgs()[0].getKind() != TemplateArgument::Type)
    return nullptr;
  const CXXRecordDecl *F = Base->getTemplateArgs()[0].getAsType()->getAsCXXRecordDecl();
  if (!F || !F->hasDefinition())
    return nullptr;
  for (const CXXMethodDecl *M : F->getDefinition()->methods())
    if (M->isStatic() && M->getIdentifier() && M->getName() == "forward" && M->hasBody())
      return M;
  return nullptr;
}

const VarDecl *handleVar(const ValueDecl *D) {
  if (const auto *B = dyn_cast_or_null<BindingDecl>(D))
    return B->getHoldingVar();
  return dyn_cast_or_null<VarDecl>(D);
}

bool isComputingOperator(const CXXOperatorCallExpr *OC) {
  llvm::StringRef N = operatorOpName(OC);
  return !N.empty() && !N.ends_with("_");
}

llvm::StringRef operatorOpName(const CXXOperatorCallExpr *OC) {
  switch (OC->getOperator()) {
  case OO_Plus:
    return "add";
  case OO_Minus:
    return OC->getNumArgs() == 1 ? "neg" : "sub";
  case OO_Star:
    return OC->getNumArgs() == 2 ? "mul" : ""; // unary: a dereference
  case OO_Slash:
    return "div";
  case OO_PlusEqual:
    return "add_";
  case OO_MinusEqual:
    return "sub_";
  case OO_StarEqual:
    return "mul_";
  case OO_SlashEqual:
    return "div_";
  case OO_Greater:
    return "gt";
  case OO_Less:
    return "lt";
  case OO_GreaterEqual:
    return "ge";
  case OO_LessEqual:
    return "le";
  case OO_EqualEqual:
    return "eq";
  case OO_ExclaimEqual:
    return "ne";
  case OO_Amp:
    return OC->getNumArgs() == 2 ? "bitwise_and" : "";
  case OO_Pipe:
    return "bitwise_or";
  case OO_Caret:
    return "bitwise_xor";
  case OO_Tilde:
    return "bitwise_not";
  case OO_AmpEqual:
    return "bitwise_and_";
  case OO_PipeEqual:
    return "bitwise_or_";
  case OO_CaretEqual:
    return "bitwise_xor_";
  default:
    return "";
  }
}

bool isStdMoveLike(const CallExpr *Call) {
  const auto *FD = Call->getDirectCallee();
  return FD && FD->getIdentifier() && FD->isInStdNamespace() && Call->getNumArgs() == 1 &&
         (FD->getName() == "move" || FD->getName() == "forward");
}

bool isInNamespace(const Decl *D, llvm::ArrayRef<llvm::StringRef> Names) {
  if (!D) // a call through a pointer has no callee
    return false;
  for (const DeclContext *C = D->getDeclContext(); C; C = C->getParent())
    if (const auto *NS = dyn_cast<NamespaceDecl>(C))
      if (NS->getIdentifier() && llvm::is_contained(Names, NS->getName()) &&
          isa<TranslationUnitDecl>(NS->getParent()->getRedeclContext()))
        return true;
  return false;
}

bool isTensorLibraryCode(const Decl *D) {
  return isInNamespace(D, {"std", "tt", "at", "c10", "torch"});
}

bool isStandardLibrary(const Decl *D) { return isInNamespace(D, {"std", "__gnu_cxx"}); }

bool isTensorApi(const FunctionDecl *FD) { return isInNamespace(FD, {"tt", "at", "torch"}); }

bool isOptionsSetter(const FunctionDecl *FD) {
  const auto *MD = dyn_cast_or_null<CXXMethodDecl>(FD);
  const CXXRecordDecl *RD = MD ? MD->getParent() : nullptr;
  return RD && RD->getIdentifier() && RD->getName().ends_with("Options") && isTensorApi(FD);
}

const Stmt *parentStmt(const Stmt *S, ASTContext &Ctx) {
  DynTypedNodeList Ps = Ctx.getParents(*S);
  return Ps.empty() ? nullptr : Ps[0].get<Stmt>();
}

const FunctionDecl *enclosingFunction(const Stmt *S, ASTContext &Ctx) {
  DynTypedNodeList Parents = Ctx.getParents(*S);
  while (!Parents.empty()) {
    const DynTypedNode &N = Parents[0];
    if (const auto *L = N.get<LambdaExpr>())
      return L->getCallOperator();
    if (const auto *FD = N.get<FunctionDecl>())
      return FD;
    if (N.get<Decl>() && !N.get<VarDecl>() && !N.get<DecompositionDecl>())
      return nullptr;
    Parents = Ctx.getParents(N);
  }
  return nullptr;
}

// The LambdaExpr of a lambda's class (the parents of its body are its call
// operator, then its class, then the LambdaExpr).
static const LambdaExpr *lambdaOf(const CXXRecordDecl *RD, ASTContext &Ctx) {
  for (DynTypedNodeList Ps = Ctx.getParents(*RD); !Ps.empty(); Ps = Ctx.getParents(Ps[0]))
    if (const auto *L = Ps[0].get<LambdaExpr>())
      return L;
  return nullptr;
}

const LambdaExpr *lambdaAround(const Stmt *S, ASTContext &Ctx) {
  const auto *MD = dyn_cast_or_null<CXXMethodDecl>(enclosingFunction(S, Ctx));
  return MD && MD->getParent()->isLambda() ? lambdaOf(MD->getParent(), Ctx) : nullptr;
}

bool inTemplateInstantiation(const Stmt *S, ASTContext &Ctx) {
  for (const FunctionDecl *FD = enclosingFunction(S, Ctx); FD;) {
    if (FD->isTemplateInstantiation())
      return true;
    const auto *MD = dyn_cast<CXXMethodDecl>(FD);
    if (!MD || !MD->getParent()->isLambda())
      return false;
    const LambdaExpr *L = lambdaOf(MD->getParent(), Ctx);
    FD = L ? enclosingFunction(L, Ctx) : nullptr;
  }
  return false;
}

// V is never the target of an assignment in Body: its initializer is its value.
bool neverAssigned(const VarDecl *V, const Stmt *Body) {
  llvm::SmallVector<const Stmt *, 32> Work{Body};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    const Expr *L = assignmentSides(S).first;
    if (const auto *D = L ? dyn_cast<DeclRefExpr>(L->IgnoreParenImpCasts()) : nullptr;
        D && D->getDecl() == V)
      return false;
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
  return true;
}

bool factoryAlwaysRanked(llvm::StringRef Name) {
  return llvm::is_contained({"eye", "arange", "linspace", "randperm"}, Name);
}

bool namesIntegerData(llvm::StringRef Name) {
  // On the layout dataflow's path for every assumed input: no allocation.
  static constexpr StringRef Words[] = {
      "idx",  "index", "indices", "label", "target", "token", "ids",    "mask",  "action", "count",
      "class", "len",  "pos",     "step",  "seed",   "text",  "symbol", "visit", "prompt"};
  return llvm::any_of(Words, [&](StringRef W) { return Name.contains_insensitive(W); });
}

const Expr *FixedLocals::initializerOf(const VarDecl *V) {
  auto [It, New] = Memo.try_emplace(V, nullptr);
  if (!New)
    return It->second;
  const auto *Fn = V ? dyn_cast_or_null<FunctionDecl>(V->getParentFunctionOrMethod()) : nullptr;
  if (Fn && Fn->getBody() && V->isLocalVarDecl() && !V->isStaticLocal() &&
      !V->getType()->isReferenceType() && V->getInit() && neverAssigned(V, Fn->getBody()))
    It->second = V->getInit();
  return It->second;
}

void collectReturns(const Stmt *S, llvm::SmallVectorImpl<const ReturnStmt *> &Out) {
  if (!S || isa<LambdaExpr>(S))
    return;
  if (const auto *RS = dyn_cast<ReturnStmt>(S))
    Out.push_back(RS);
  for (const Stmt *C : S->children())
    collectReturns(C, Out);
}

bool isLoop(const Stmt *S) { return isa<ForStmt, WhileStmt, DoStmt, CXXForRangeStmt>(S); }

bool isDefaultConstructed(const Expr *E) {
  const auto *CE = dyn_cast_or_null<CXXConstructExpr>(E ? E->IgnoreImplicit() : nullptr);
  return CE && !CE->getNumArgs();
}

const Stmt *loopBody(const Stmt *Loop) {
  if (const auto *F = dyn_cast<ForStmt>(Loop))
    return F->getBody();
  if (const auto *RF = dyn_cast<CXXForRangeStmt>(Loop))
    return RF->getBody();
  if (const auto *W = dyn_cast<WhileStmt>(Loop))
    return W->getBody();
  if (const auto *D = dyn_cast<DoStmt>(Loop))
    return D->getBody();
  return nullptr;
}

CharSourceRange wholeLines(SourceLocation B, SourceLocation E, const SourceManager &SM) {
  std::pair<FileID, unsigned> BI = SM.getDecomposedLoc(B), EI = SM.getDecomposedLoc(E);
  StringRef Buf = SM.getBufferData(BI.first);
  // size_t: a last line without '\n' has LineEnd == npos (an unsigned made
  // it 4294967295 and the removal ran past the end of the file).
  size_t LineStart = Buf.rfind('\n', BI.second) + 1;
  size_t LineEnd = Buf.find('\n', EI.second);
  if (Buf.slice(LineStart, BI.second).trim().empty() && LineEnd != StringRef::npos &&
      Buf.slice(EI.second + 1, LineEnd).trim().empty())
    return CharSourceRange::getCharRange(B.getLocWithOffset(-(int)(BI.second - LineStart)),
                                         E.getLocWithOffset(LineEnd - EI.second + 1));
  return CharSourceRange::getTokenRange(SourceRange(B, E));
}

const VarDecl *initialisedVar(const Expr *E, ASTContext &Ctx) {
  const Stmt *Cur = E;
  for (int I = 0; I < 8; ++I) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    if (Ps.empty())
      return nullptr;
    if (const auto *V = Ps[0].get<VarDecl>())
      return V;
    const auto *P = Ps[0].get<Stmt>();
    if (!P || !isa<ImplicitCastExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr,
                   ExprWithCleanups, CXXConstructExpr, ParenExpr>(P))
      return nullptr;
    if (const auto *CE = dyn_cast<CXXConstructExpr>(P); CE && CE->getNumArgs() != 1)
      return nullptr;
    Cur = P;
  }
  return nullptr;
}

// The values assigned to F in S: `F = v`, of any object's F.
static void assignedValues(const Stmt *S, const FieldDecl *F,
                           llvm::SmallVectorImpl<const Expr *> &Out) {
  if (!S)
    return;
  auto [L, R] = assignmentSides(S);
  if (const auto *ME = L ? dyn_cast<MemberExpr>(stripHandle(L)) : nullptr;
      ME && ME->getMemberDecl() == F)
    Out.push_back(R);
  for (const Stmt *Child : S->children())
    assignedValues(Child, F, Out);
}

static bool isCopyOrMove(const CXXMethodDecl *M) {
  if (const auto *C = dyn_cast<CXXConstructorDecl>(M))
    return C->isCopyOrMoveConstructor();
  return M->isCopyAssignmentOperator() || M->isMoveAssignmentOperator();
}

llvm::SmallVector<const Expr *, 4> valuesOfField(const FieldDecl *F) {
  llvm::SmallVector<const Expr *, 4> Out;
  if (const Expr *Init = F->getInClassInitializer())
    Out.push_back(Init);
  const auto *RD = dyn_cast<CXXRecordDecl>(F->getParent());
  if (!RD)
    return Out;
  for (const CXXMethodDecl *M : RD->methods())
    if (const auto *Def = dyn_cast_or_null<CXXMethodDecl>(M->getDefinition())) {
      if (isCopyOrMove(Def)) // `w_(o.w_)`: a copy keeps whatever F holds
        continue;
      if (const auto *C = dyn_cast<CXXConstructorDecl>(Def))
        for (const CXXCtorInitializer *I : C->inits())
          if (I->getMember() == F && I->isWritten())
            Out.push_back(I->getInit());
      assignedValues(Def->getBody(), F, Out);
    }
  return Out;
}

bool isDetachCall(const Stmt *S) {
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(S);
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  return M && M->getIdentifier() && isTensorApi(M) &&
         llvm::is_contained({"detach", "data"}, M->getName());
}

// A torch::Device or TensorOptions (by value or reference): what a device
// argument is spelled as.
bool isDeviceLikeType(QualType T) {
  std::string N = T.getNonReferenceType().getUnqualifiedType().getAsString();
  return N.find("Device") != std::string::npos || N.find("TensorOptions") != std::string::npos;
}

} // namespace clang::tidy::tensor
