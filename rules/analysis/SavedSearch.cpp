#include "analysis/SavedSearch.h"

#include "analysis/AstHelpers.h"

#include "clang/AST/ExprCXX.h"
#include "clang/Analysis/CFG.h"
#include "llvm/ADT/SmallPtrSet.h"

#include <optional>

namespace clang::tidy::tensor {

bool isBackwardCall(const Stmt *S, const TensorModel &Model) {
  const auto *Call = dyn_cast<CallExpr>(S);
  const FunctionDecl *FD = Call ? Call->getDirectCallee() : nullptr;
  if (!FD || !FD->getIdentifier())
    return false;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call))
    return FD->getName() == "backward" && Model.isTensorExpr(MC->getImplicitObjectArgument());
  return (FD->getName() == "backward" || FD->getName() == "grad") &&
         llvm::StringRef(FD->getQualifiedNameAsString()).contains("autograd::");
}

namespace {
bool namesDecl(const Expr *E, const ValueDecl *V) {
  const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? stripHandle(E) : nullptr);
  return DRE && DRE->getDecl() == V;
}

// nullopt: S does not define V; else the value it gives V (null: none).
std::optional<const Expr *> definitionOf(const Stmt *S, const ValueDecl *V) {
  if (const auto *DS = dyn_cast<DeclStmt>(S)) {
    for (const Decl *D : DS->decls())
      if (D == V)
        return cast<VarDecl>(D)->getInit();
    return std::nullopt;
  }
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(S))
    if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2 &&
        isa<DeclRefExpr>(OC->getArg(0)->IgnoreParenImpCasts()) && namesDecl(OC->getArg(0), V))
      return OC->getArg(1);
  return std::nullopt;
}

// The op-table name of a call: `a * b` is mul, `a / b` div.
llvm::StringRef opName(const CallExpr *Call, const TensorModel &Model) {
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    bool Tensors = false;
    for (const Expr *A : OC->arguments())
      Tensors |= passedTensor(A, Model) != nullptr;
    if (!Tensors || OC->getNumArgs() != 2)
      return "";
    return OC->getOperator() == OO_Star ? "mul" : OC->getOperator() == OO_Slash ? "div" : "";
  }
  const sem::OpInfo *Op = Model.opOf(Call);
  return Op ? llvm::StringRef(Op->name.data(), Op->name.size()) : "";
}

// What Call saves: its table row's TT_SAVES, or, for an in-place op, what
// op_semantics' savesOfInPlace derives (`exp_` saves its result).
sem::Saves savesOfCall(const CallExpr *Call, const TensorModel &Model) {
  llvm::StringRef Name = opName(Call, Model);
  sem::Saves S = sem::savesOf(Name);
  return S != sem::Saves::Nothing ? S : sem::savesOfInPlace(Name);
}

// The call's tensor inputs, self first.
llvm::SmallVector<const Expr *, 3> tensorInputs(const CallExpr *Call, const TensorModel &Model) {
  llvm::SmallVector<const Expr *, 3> In;
  if (const Expr *Self = TensorModel::selfOf(Call); Self && !isa<CXXOperatorCallExpr>(Call))
    In.push_back(Self);
  for (const Expr *A : Call->arguments())
    if (const Expr *T = passedTensor(A, Model))
      In.push_back(T);
  return In;
}

bool requiresGrad(const GradFacts &G, const Expr *E) {
  return G.factOf(E).requiresGrad() == Tri::Yes;
}

// Call saved (the value of) V as one of its inputs, autograd recording it.
bool savesInputV(const GradFacts &G, const TensorModel &Model, const CallExpr *Call,
                 const ValueDecl *V) {
  sem::Saves Saves = savesOfCall(Call, Model);
  if (Saves == sem::Saves::Nothing || !requiresGrad(G, Call))
    return false;
  auto In = tensorInputs(Call, Model);
  bool SelfRG = !In.empty() && requiresGrad(G, In[0]);
  bool OtherRG = In.size() > 1 && requiresGrad(G, In[1]);
  for (unsigned I = 0; I < In.size() && I < 2; ++I)
    if (namesDecl(Model.viewRoot(In[I]), V) && sem::savesInput(Saves, I, SelfRG, OtherRG))
      return true;
  return false;
}

// The TT_MODULE row of the library module Call runs (what it saves); null
// when Call is no library module's call.
const sem::ModuleInfo *calledLibraryModule(const CallExpr *Call) {
  const Expr *M = calledModule(Call);
  return M ? libraryModule(M->getType()) : nullptr;
}

// The argument of Call that its callee's parameter I receives (a holder's
// `m(x)` passes the module first).
const Expr *calleeArg(const CallExpr *Call, unsigned I) {
  unsigned Skip = isModuleCall(Call) ? 1 : 0;
  return I + Skip < Call->getNumArgs() ? Call->getArg(I + Skip) : nullptr;
}

bool savesParamFirst(const TensorModel &Model, const FunctionDecl *FD, const ParmVarDecl *P,
                     CalleeGrads Callees, unsigned Depth);

// Call, recorded, saved what V holds as its input: a library module by its
// TT_MODULE row (its weights taken to require grad, as a trained module's do);
// a user module, or a function of the TU (`masked_bce(logits, y)`), whose
// body saves that parameter first.
bool callSavesInput(const GradFacts &G, const TensorModel &Model, const CallExpr *Call,
                    const ValueDecl *V, CalleeGrads Callees, unsigned Depth) {
  const Expr *M = calledModule(Call);
  if ((!M && (isa<CXXOperatorCallExpr>(Call) || Model.opOf(Call))) || !requiresGrad(G, Call) ||
      Depth >= 2)
    return false;
  const Expr *In = calleeArg(Call, 0);
  if (const sem::ModuleInfo *Row = calledLibraryModule(Call))
    return In && namesDecl(Model.viewRoot(In), V) && Row->savesInput();
  const FunctionDecl *FD = readableBodyOf(Call);
  if (!FD)
    return false;
  for (unsigned I = 0; I < FD->getNumParams(); ++I)
    if (const Expr *A = calleeArg(Call, I); A && namesDecl(Model.viewRoot(A), V))
      return savesParamFirst(Model, FD, FD->getParamDecl(I), Callees, Depth + 1);
  return false;
}

// Call saved (the value of) V: an op of the table, a module call or a call of
// a function of the TU.
bool savesV(const GradFacts &G, const TensorModel &Model, const CallExpr *Call, const ValueDecl *V,
            CalleeGrads Callees, unsigned Depth) {
  return savesInputV(G, Model, Call, V) || callSavesInput(G, Model, Call, V, Callees, Depth);
}

// FD's body saves parameter P's value on every path before anything
// redefines or writes P (a forward whose first layer saves its input).
bool savesParamFirst(const TensorModel &Model, const FunctionDecl *FD, const ParmVarDecl *P,
                     CalleeGrads Callees, unsigned Depth) {
  const GradFacts *G = Callees(FD);
  const CFG *Cfg = G ? G->cfg() : nullptr;
  if (!Cfg)
    return false;
  llvm::SmallVector<const CFGBlock *, 8> Work{&Cfg->getEntry()};
  llvm::SmallPtrSet<const CFGBlock *, 16> Seen{&Cfg->getEntry()};
  while (!Work.empty()) {
    const CFGBlock *B = Work.pop_back_val();
    if (B == &Cfg->getExit())
      return false; // a path that never saved P
    bool Saved = false;
    for (const CFGElement &El : *B)
      if (auto CS = El.getAs<CFGStmt>()) {
        const Stmt *S = CS->getStmt();
        const auto *E = dyn_cast<Expr>(S);
        const Expr *T = E ? Model.inPlaceTarget(E) : nullptr;
        if (definitionOf(S, P) || (T && namesDecl(Model.viewRoot(T), P)))
          return false;
        const auto *C = dyn_cast<CallExpr>(S);
        if ((Saved = C && savesV(*G, Model, C, P, Callees, Depth)))
          break;
      }
    if (Saved)
      continue;
    for (const CFGBlock *Succ : B->succs())
      if (Succ && Seen.insert(Succ).second)
        Work.push_back(Succ);
  }
  return true;
}

// The variables a statement names (`ctx->save_for_backward({x, out})`).
void namedVars(const Stmt *S, llvm::SmallPtrSetImpl<const ValueDecl *> &Out) {
  if (!S)
    return;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(S))
    Out.insert(DRE->getDecl());
  for (const Stmt *C : S->children())
    namedVars(C, Out);
}

// A custom Function's forward saves what it returns: every return names a
// variable given to ctx->save_for_backward (autograd then checks its version).
bool forwardSavesResult(const CXXMethodDecl *Fwd) {
  llvm::SmallPtrSet<const ValueDecl *, 4> Saved;
  llvm::SmallVector<const Stmt *, 32> Work{Fwd->getBody()};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    if (const auto *MC = dyn_cast<CXXMemberCallExpr>(S);
        MC && MC->getMethodDecl() && MC->getMethodDecl()->getIdentifier() &&
        MC->getMethodDecl()->getName() == "save_for_backward")
      for (const Expr *A : MC->arguments())
        namedVars(A, Saved);
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
  llvm::SmallVector<const ReturnStmt *, 2> Returns;
  collectReturns(Fwd->getBody(), Returns);
  return !Returns.empty() && llvm::all_of(Returns, [&](const ReturnStmt *R) {
    const auto *DRE = dyn_cast_or_null<DeclRefExpr>(stripHandle(R->getRetValue()));
    return DRE && Saved.contains(DRE->getDecl());
  });
}

// Init is an op call (or a view of one) that saved its result, recorded; or
// a custom Function's apply() whose forward saved it.
const CallExpr *savesResult(const GradFacts &G, const TensorModel &Model, const Expr *Init) {
  const auto *Call = dyn_cast_or_null<CallExpr>(Init ? Model.viewRoot(Init) : nullptr);
  if (!Call || !requiresGrad(G, Call))
    return nullptr;
  const sem::ModuleInfo *Row = calledLibraryModule(Call);
  if (sem::savesResult(savesOfCall(Call, Model)) || (Row && Row->savesResult()))
    return Call;
  const CXXMethodDecl *Fwd = customFunctionForward(Call);
  return Fwd && forwardSavesResult(Fwd) ? Call : nullptr;
}

// The saving op whose result every return of Call's callee gives (a function
// of the TU with one body to read).
SavedBy returnedSaver(const TensorModel &Model, const Expr *Def, CalleeGrads Callees,
                      unsigned Depth) {
  const auto *Call = dyn_cast_or_null<CallExpr>(Def ? Model.viewRoot(Def) : nullptr);
  const FunctionDecl *FD = Call ? readableBodyOf(Call) : nullptr;
  if (!FD || Depth >= 2)
    return {};
  const GradFacts *G = Callees(FD);
  llvm::SmallVector<const ReturnStmt *, 2> Returns;
  collectReturns(FD->getBody(), Returns);
  SavedBy Out;
  for (const ReturnStmt *RS : Returns) {
    const Expr *V = RS->getRetValue();
    SavedBy One;
    One.Op = G && V ? savesResult(*G, Model, V) : nullptr;
    One.Result = One.Op != nullptr;
    const auto *DRE = dyn_cast_or_null<DeclRefExpr>(V ? stripHandle(V) : nullptr);
    if (!One.Op && G && DRE && isa<VarDecl>(DRE->getDecl()))
      One = findSaver(*G, Model, DRE->getDecl(), RS, Callees, Depth + 1);
    if (!One.Op)
      return {};
    if (!Out.Op)
      Out = One;
  }
  Out.Via = Out.Op ? FD : nullptr;
  return Out;
}

enum class Step { Continue, StopPath, Found };

Step visitBack(const GradFacts &G, const TensorModel &Model, const ValueDecl *V, const Stmt *S,
               SavedBy &Out, CalleeGrads Callees, unsigned Depth) {
  if (std::optional<const Expr *> Def = definitionOf(S, V)) {
    Out.Op = savesResult(G, Model, *Def);
    Out.Result = Out.Op != nullptr;
    if (!Out.Op && *Def && G.gradEnabledAt(*Def)) // else the callee's ops record nothing
      Out = returnedSaver(Model, *Def, Callees, Depth);
    return Out.Op ? Step::Found : Step::StopPath;
  }
  if (const auto *E = dyn_cast<Expr>(S))
    if (const Expr *T = Model.inPlaceTarget(E); T && namesDecl(Model.viewRoot(T), V)) {
      // An earlier write: reported there, unless it saved what it wrote
      // (`msg.relu_();` then `msg.mul_(keep)`).
      const auto *Call = dyn_cast<CallExpr>(E);
      Out.Op = Call && namesDecl(T, V) ? savesResult(G, Model, Call) : nullptr;
      Out.Result = Out.Op != nullptr;
      return Out.Op ? Step::Found : Step::StopPath;
    }
  if (const auto *Call = dyn_cast<CallExpr>(S); Call && savesV(G, Model, Call, V, Callees, Depth)) {
    Out.Op = Call;
    return Step::Found;
  }
  return Step::Continue;
}
} // namespace

SavedBy findSaver(const GradFacts &G, const TensorModel &Model, const ValueDecl *V,
                  const Stmt *Write, CalleeGrads Callees, unsigned Depth) {
  auto [Start, Index] = G.position(Write);
  SavedBy Out;
  if (!Start)
    return Out;
  llvm::SmallVector<std::pair<const CFGBlock *, unsigned>, 8> Work{{Start, Index}};
  llvm::SmallPtrSet<const CFGBlock *, 16> Seen;
  while (!Work.empty()) {
    auto [B, End] = Work.pop_back_val();
    Step St = Step::Continue;
    for (unsigned I = End; I-- > 0 && St == Step::Continue;)
      if (auto CS = (*B)[I].getAs<CFGStmt>())
        St = visitBack(G, Model, V, CS->getStmt(), Out, Callees, Depth);
    if (St == Step::Found)
      return Out;
    if (St == Step::StopPath)
      continue;
    for (const CFGBlock *P : B->preds())
      if (P && Seen.insert(P).second)
        Work.push_back({P, P->size()});
  }
  return {};
}

const CallExpr *findBackwardAfter(const GradFacts &G, const TensorModel &Model, const Stmt *Write,
                                  const Stmt *Op) {
  auto [Start, Index] = G.position(Write);
  if (!Start)
    return nullptr;
  llvm::SmallVector<std::pair<const CFGBlock *, unsigned>, 8> Work{{Start, Index + 1}};
  llvm::SmallPtrSet<const CFGBlock *, 16> Seen;
  while (!Work.empty()) {
    auto [B, Begin] = Work.pop_back_val();
    bool Stop = false;
    for (unsigned I = Begin; I < B->size() && !Stop; ++I)
      if (auto CS = (*B)[I].getAs<CFGStmt>()) {
        if (CS->getStmt() == Op)
          Stop = true;
        else if (isBackwardCall(CS->getStmt(), Model))
          return cast<CallExpr>(CS->getStmt());
      }
    if (Stop)
      continue;
    for (const CFGBlock *S : B->succs())
      if (S && Seen.insert(S).second)
        Work.push_back({S, 0});
  }
  return nullptr;
}

} // namespace clang::tidy::tensor
