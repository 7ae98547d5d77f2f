#include "analysis/RnnModules.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

namespace clang::tidy::tensor {
namespace {

// LSTM, GRU, RNN (holders) and their Impls in torch::nn.
bool isRnnType(QualType T) {
  return llvm::is_contained({"LSTM", "GRU", "RNN"}, libraryModuleName(T));
}

// The recurrent module a call runs, or null.
const Expr *rnnModule(const CallExpr *Call) {
  const Expr *Obj = calledModule(Call);
  return Obj && isRnnType(Obj->getType()) ? Obj : nullptr;
}

// torch::nn::utils::rnn::pad_packed_sequence(packed, batch_first, ...).
bool isPadPacked(const CallExpr *C) {
  const FunctionDecl *FD = C->getDirectCallee();
  return FD && FD->getIdentifier() && FD->getName() == "pad_packed_sequence" &&
         C->getNumArgs() >= 2 && inNamespacePath(FD, "torch::nn::utils::rnn::");
}

const CallExpr *asRnnCall(const Expr *E) {
  const auto *C = dyn_cast_or_null<CallExpr>(E ? stripHandle(E) : nullptr);
  return C && (rnnModule(C) || isPadPacked(C)) ? C : nullptr;
}

// `std::get<0>(arg)`: arg; null for any other call.
const Expr *getZeroArg(const CallExpr *C) {
  const FunctionDecl *FD = C->getDirectCallee();
  if (!FD || !FD->getIdentifier() || FD->getName() != "get" || C->getNumArgs() != 1 ||
      !inNamespacePath(FD, "std::"))
    return nullptr;
  const TemplateArgumentList *TA = FD->getTemplateSpecializationArgs();
  if (!TA || TA->size() == 0 || TA->get(0).getKind() != TemplateArgument::Integral ||
      TA->get(0).getAsIntegral() != 0)
    return nullptr;
  return C->getArg(0);
}

// What the constructions of one module say of batch_first.
struct FlagScan {
  llvm::SmallVector<std::optional<bool>, 2> Flags; // each batch_first(v): v, if constant
  bool Builds = false;                               // options built in place
  bool Opaque = false;                               // options from elsewhere
  llvm::SmallVector<const VarDecl *, 2> OptionVars;  // local options variables used
};

bool isRnnOptionsRecord(const CXXRecordDecl *RD) {
  return RD && RD->getIdentifier() && inNamespacePath(RD, "torch::nn::") &&
         llvm::is_contained({"LSTMOptions", "GRUOptions", "RNNOptions"}, RD->getName());
}
bool isRnnOptionsType(QualType T) {
  return isRnnOptionsRecord(T.getNonReferenceType()->getAsCXXRecordDecl());
}

std::optional<bool> constantBool(const Expr *E, const ASTContext &Ctx) {
  bool B = false;
  if (E->isValueDependent() || !E->EvaluateAsBooleanCondition(B, Ctx))
    return std::nullopt;
  return B;
}

bool isBatchFirst(const CXXMemberCallExpr *MC) {
  const CXXMethodDecl *MD = MC->getMethodDecl();
  return MD && MD->getIdentifier() && MD->getName() == "batch_first" && MC->getNumArgs() == 1 &&
         isRnnOptionsRecord(MD->getParent());
}

// The flags of `V.batch_first(v)` statements in S.
void flagsSetOn(const Stmt *S, const VarDecl *V, const ASTContext &Ctx, FlagScan &R) {
  if (!S)
    return;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S); MC && isBatchFirst(MC))
    if (const auto *DRE =
            dyn_cast<DeclRefExpr>(MC->getImplicitObjectArgument()->IgnoreParenImpCasts());
        DRE && DRE->getDecl() == V)
      R.Flags.push_back(constantBool(MC->getArg(0), Ctx));
  for (const Stmt *Child : S->children())
    flagsSetOn(Child, V, Ctx, R);
}

void scanSite(const Stmt *S, const ASTContext &Ctx, FlagScan &R) {
  if (!S)
    return;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S)) {
    const CXXMethodDecl *MD = MC->getMethodDecl();
    if (isBatchFirst(MC))
      R.Flags.push_back(constantBool(MC->getArg(0), Ctx));
  }
  if (const auto *CE = dyn_cast<CXXConstructExpr>(S)) {
    bool FromOptions = llvm::any_of(CE->arguments(), [](const Expr *A) {
      return isRnnOptionsType(A->getType()) || isRnnType(A->getType());
    });
    if ((isRnnOptionsType(CE->getType()) || isRnnType(CE->getType())) && CE->getNumArgs() >= 2 &&
        !FromOptions)
      R.Builds = true; // LSTMOptions(in, hidden), LSTM(in, hidden)
  }
  if (const auto *DRE = dyn_cast<DeclRefExpr>(S); DRE && isRnnOptionsType(DRE->getType())) {
    const auto *VD = dyn_cast<VarDecl>(DRE->getDecl());
    if (VD && VD->hasLocalStorage() && !isa<ParmVarDecl>(VD))
      R.OptionVars.push_back(VD);
    else
      R.Opaque = true;
  }
  if (const auto *ME = dyn_cast<MemberExpr>(S); ME && isRnnOptionsType(ME->getType()))
    R.Opaque = true; // cfg.lstm_options, options_
  for (const Stmt *Child : S->children())
    scanSite(Child, Ctx, R);
}

// The right-hand sides of `D = rhs` in Body (D a field of this object or a variable).
void assignmentsTo(const Stmt *Body, const ValueDecl *D, llvm::SmallVectorImpl<const Expr *> &Out) {
  if (!Body)
    return;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Body);
      OC && OC->getOperator() == OO_Equal && OC->getNumArgs() == 2) {
    const Expr *L = OC->getArg(0)->IgnoreParenImpCasts();
    const ValueDecl *Target = nullptr;
    if (const auto *ME = dyn_cast<MemberExpr>(L))
      Target = ME->getMemberDecl();
    else if (const auto *DRE = dyn_cast<DeclRefExpr>(L))
      Target = DRE->getDecl();
    if (Target == D)
      Out.push_back(OC->getArg(1));
  }
  for (const Stmt *Child : Body->children())
    assignmentsTo(Child, D, Out);
}

// `LSTM lstm{nullptr}`: an empty holder, no construction.
bool isNullHolder(const Expr *E) {
  const auto *CE = dyn_cast<CXXConstructExpr>(E->IgnoreImplicit());
  return CE && CE->getNumArgs() == 1 && CE->getArg(0)->getType()->isNullPtrType();
}

// The expressions that build the module Obj names, in the code the TU has.
bool constructionSites(const Expr *Obj, llvm::SmallVectorImpl<const Expr *> &Sites) {
  if (const auto *ME = dyn_cast<MemberExpr>(Obj)) {
    const auto *FD = dyn_cast<FieldDecl>(ME->getMemberDecl());
    const auto *RD = FD ? dyn_cast<CXXRecordDecl>(FD->getParent()) : nullptr;
    if (!RD || !isa<CXXThisExpr>(ME->getBase()->IgnoreParenImpCasts()))
      return false;
    if (const Expr *Init = FD->getInClassInitializer())
      Sites.push_back(Init);
    for (const CXXMethodDecl *M : RD->methods()) {
      const FunctionDecl *Def = M->getDefinition();
      if (const auto *Ctor = dyn_cast_or_null<CXXConstructorDecl>(Def))
        for (const CXXCtorInitializer *I : Ctor->inits())
          if (I->getMember() == FD && I->isWritten())
            Sites.push_back(I->getInit());
      assignmentsTo(Def ? Def->getBody() : nullptr, FD, Sites);
    }
    return true;
  }
  const auto *DRE = dyn_cast<DeclRefExpr>(Obj);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  const auto *Fn = VD ? dyn_cast<FunctionDecl>(VD->getDeclContext()) : nullptr;
  if (!Fn || isa<ParmVarDecl>(VD) || !VD->hasLocalStorage())
    return false;
  if (VD->getInit())
    Sites.push_back(VD->getInit());
  assignmentsTo(Fn->getBody(), VD, Sites);
  return true;
}

// One construction's batch_first: the flags it sets (through local options
// variables too), false when it builds options without one.
std::optional<bool> siteFlag(const Expr *Site, const ASTContext &Ctx) {
  FlagScan R;
  scanSite(Site, Ctx, R);
  const llvm::SmallVector<const VarDecl *, 2> Vars = R.OptionVars;
  for (const VarDecl *V : Vars) { // auto opts = LSTMOptions(...); opts.batch_first(true);
    scanSite(V->getInit(), Ctx, R);
    if (const auto *Fn = dyn_cast<FunctionDecl>(V->getDeclContext()))
      flagsSetOn(Fn->getBody(), V, Ctx, R);
  }
  if (R.Opaque || llvm::is_contained(R.Flags, std::nullopt))
    return std::nullopt;
  if (!R.Flags.empty())
    return llvm::all_equal(R.Flags) ? R.Flags.front() : std::nullopt;
  return R.Builds ? std::optional<bool>(false) : std::nullopt;
}

} // namespace

const CallExpr *rnnOutputCall(const Expr *E) {
  E = E ? stripHandle(E) : nullptr;
  if (const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E)) {
    const auto *BD = dyn_cast<BindingDecl>(DRE->getDecl());
    const auto *DD = BD ? dyn_cast_or_null<DecompositionDecl>(BD->getDecomposedDecl()) : nullptr;
    if (!DD || DD->bindings().empty() || DD->bindings().front() != BD)
      return nullptr;
    return asRnnCall(DD->getInit());
  }
  const auto *C = dyn_cast_or_null<CallExpr>(E);
  const Expr *Arg = C ? getZeroArg(C) : nullptr;
  if (!Arg)
    return nullptr;
  if (const CallExpr *R = asRnnCall(Arg))
    return R;
  const auto *Ref = dyn_cast<DeclRefExpr>(stripHandle(Arg));
  const auto *VD = Ref ? dyn_cast<VarDecl>(Ref->getDecl()) : nullptr;
  if (!VD || isa<ParmVarDecl>(VD) || !VD->hasLocalStorage())
    return nullptr;
  return asRnnCall(VD->getInit()); // auto res = lstm(x); std::get<0>(res)
}

llvm::StringRef rnnKind(const CallExpr *RnnCall) {
  if (isPadPacked(RnnCall))
    return "pad_packed_sequence";
  const Expr *Obj = rnnModule(RnnCall);
  return Obj ? libraryModuleName(Obj->getType()) : "";
}

std::optional<bool> rnnBatchFirst(const CallExpr *RnnCall) {
  if (isPadPacked(RnnCall)) // its batch_first argument (false when defaulted)
    return constantBool(RnnCall->getArg(1),
                        RnnCall->getDirectCallee()->getASTContext());
  const Expr *Obj = rnnModule(RnnCall);
  llvm::SmallVector<const Expr *, 4> Sites;
  if (!Obj || !constructionSites(Obj, Sites))
    return std::nullopt;
  const ASTContext &Ctx = RnnCall->getCalleeDecl()->getASTContext();
  std::optional<bool> All;
  for (const Expr *Site : Sites) {
    if (isNullHolder(Site))
      continue;
    std::optional<bool> F = siteFlag(Site, Ctx);
    if (!F || (All && *All != *F))
      return std::nullopt;
    All = F;
  }
  return All;
}

} // namespace clang::tidy::tensor
