#include "SyncInLoopCheck.h"

#include "analysis/Finding.h"

#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/StmtCXX.h"
#include "clang/ASTMatchers/ASTMatchFinder.h"
#include "clang/Lex/Lexer.h"

using namespace clang::ast_matchers;

namespace clang::tidy::tensor {

SyncInLoopCheck::SyncInLoopCheck(StringRef Name, ClangTidyContext *Context)
    : TensorCheck(Name, Context) {}

void SyncInLoopCheck::registerMatchers(MatchFinder *Finder) {
  Finder->addMatcher(cxxMemberCallExpr(callee(cxxMethodDecl(hasAnyName("item", "cpu", "to"))),
                                       unless(isExpansionInSystemHeader()))
                         .bind("sync"),
                     this);
}

namespace {

// The statement above S, through a variable it initialises (`float l = ...`).
const Stmt *enclosingStmt(const Stmt *S, ASTContext &Ctx) {
  DynTypedNodeList Ps = Ctx.getParents(*S);
  if (!Ps.empty())
    if (const auto *V = Ps[0].get<VarDecl>())
      Ps = Ctx.getParents(*V);
  return Ps.empty() ? nullptr : Ps[0].get<Stmt>();
}

// The call runs only on some iterations, or its value steers the loop: an
// if/switch/?:/&&/|| between it and the loop, or the loop's own condition.
// An `if` whose condition has the same value on every iteration
// (`if (targets.defined())`) runs its branch on all of them or none: Fixed,
// which a sum still counts for (a log under `if (verbose)` is opted into).
// In a closure the loop runs (Note [Closures run by a loop]), the walk goes
// on from the lambda once it leaves the lambda's body.
enum class Guard { None, Fixed, Varying };
Guard underCondition(const Stmt *S, const Stmt *Loop, ASTContext &Ctx, LoopAnalysis *LA) {
  Guard G = Guard::None;
  const LambdaExpr *Closure =
      LoopAnalysis::inClosure(S, Loop, Ctx) ? lambdaAround(S, Ctx) : nullptr;
  for (const Stmt *Cur = S, *P = enclosingStmt(S, Ctx);; Cur = P, P = enclosingStmt(P, Ctx)) {
    if (!P && Closure) { // out of the closure's body: on from the lambda
      Cur = Closure;
      P = enclosingStmt(Closure, Ctx);
      Closure = nullptr;
    }
    if (!P)
      return Guard::Varying;
    if (P == Loop) {
      if (const auto *F = dyn_cast<ForStmt>(Loop))
        return Cur == F->getCond() ? Guard::Varying : G;
      if (const auto *W = dyn_cast<WhileStmt>(Loop))
        return Cur == W->getCond() ? Guard::Varying : G;
      if (const auto *D = dyn_cast<DoStmt>(Loop))
        return Cur == D->getCond() ? Guard::Varying : G;
      return G;
    }
    if (const auto *If = dyn_cast<IfStmt>(P); If && Cur != If->getCond() && !If->getInit() &&
                                               !If->getConditionVariable() && LA &&
                                               LA->isInvariant(If->getCond(), Loop)) {
      G = Guard::Fixed;
      continue;
    }
    if (isa<IfStmt, SwitchStmt, SwitchCase, AbstractConditionalOperator, LambdaExpr>(P))
      return Guard::Varying;
    if (const auto *BO = dyn_cast<BinaryOperator>(P); BO && BO->isLogicalOp())
      return Guard::Varying;
  }
}

bool contains(const Stmt *S, const Stmt *X) {
  return S == X || llvm::any_of(S->children(), [&](const Stmt *C) { return C && contains(C, X); });
}

// A call of backward() or an optimizer's step(): training.
bool isTrainingStep(const Stmt *S) {
  const auto *Call = dyn_cast<CallExpr>(S);
  const auto *MD = Call ? dyn_cast_or_null<CXXMethodDecl>(Call->getDirectCallee()) : nullptr;
  return MD && MD->getIdentifier() && llvm::is_contained({"backward", "step"}, MD->getName());
}

// A training or evaluation step: backward(), an optimizer's step(), a module call.
bool isStep(const Stmt *S) {
  const auto *Call = dyn_cast<CallExpr>(S);
  if (!Call)
    return false;
  if (isModuleCall(Call) || isTrainingStep(Call))
    return true;
  const auto *MD = dyn_cast_or_null<CXXMethodDecl>(Call->getDirectCallee());
  return MD && isModuleForward(MD);
}

// S makes a step (Training: trains), outside lambdas it writes.
bool runsStep(const Stmt *S, bool Training = false) {
  if (!S || isa<LambdaExpr>(S))
    return false;
  return (Training ? isTrainingStep(S) : isStep(S)) ||
         llvm::any_of(S->children(), [&](const Stmt *C) { return runsStep(C, Training); });
}

// `err.max().item<double>()`: a value read to the host, outside lambdas.
bool readsHost(const Stmt *S) {
  if (!S || isa<LambdaExpr>(S))
    return false;
  const auto *MC = dyn_cast<CXXMemberCallExpr>(S);
  const CXXMethodDecl *MD = MC ? MC->getMethodDecl() : nullptr;
  const CXXRecordDecl *RD = MD ? MD->getParent() : nullptr;
  if (MD && MD->getIdentifier() && MD->getName() == "item" && RD->getIdentifier() &&
      llvm::is_contained({"Tensor", "TensorBase"}, RD->getName()))
    return true;
  return llvm::any_of(S->children(), readsHost);
}

bool leavesLoop(const Stmt *S) {
  if (!S || isa<LambdaExpr>(S) || isLoop(S))
    return false;
  return isa<BreakStmt, ReturnStmt>(S) || llvm::any_of(S->children(), leavesLoop);
}

// S, in a loop, stops it on a value read from the device: an iterative
// solver's convergence test (`if (err.max().item<double>() < tol) break;`).
bool testsConvergence(const Stmt *S) {
  if (!S || isa<LambdaExpr>(S) || isLoop(S))
    return false;
  if (const auto *If = dyn_cast<IfStmt>(S); If && readsHost(If->getCond()) &&
                                            leavesLoop(If->getThen()))
    return true;
  return llvm::any_of(S->children(), testsConvergence);
}

// A loop of steps, or a solver's loop that waits for the device every pass
// to test convergence: a sync beside it is one per pass. Training: a loop
// that trains (an epoch helper's).
bool isPassLoop(const Stmt *Loop, bool Training = false) {
  if (Training)
    return runsStep(Loop, true);
  return runsStep(Loop) || testsConvergence(loopBody(Loop)) ||
         (isa<WhileStmt>(Loop) && readsHost(cast<WhileStmt>(Loop)->getCond()));
}

// S holds such a loop outside lambdas.
bool hasStepLoop(const Stmt *S, bool Training) {
  if (!S || isa<LambdaExpr>(S))
    return false;
  if (isLoop(S))
    return isPassLoop(S, Training);
  return llvm::any_of(S->children(), [&](const Stmt *C) { return hasStepLoop(C, Training); });
}

// Call runs a function of the TU whose body holds a pass loop (a tiled
// inference, an epoch helper, a solver; Training: one that trains): one
// level deep.
bool callsStepLoop(const Stmt *S, bool Training) {
  const auto *Call = dyn_cast<CallExpr>(S);
  const FunctionDecl *FD = Call && (Training || !isStep(Call)) ? Call->getDirectCallee() : nullptr;
  if (const auto *MD = dyn_cast_or_null<CXXMethodDecl>(FD);
      !Training && MD && isModuleRecord(MD->getParent()))
    return false; // a module's own loop over its layers is one step
  const FunctionDecl *Def = FD ? FD->getDefinition() : nullptr;
  return Def && !isTensorLibraryCode(Def) && hasStepLoop(Def->getBody(), Training);
}

// S makes a step (Training: trains) outside lambdas and nested loops.
bool makesStepItself(const Stmt *S, bool Training) {
  if (!S || isa<LambdaExpr>(S) || isLoop(S))
    return false;
  if (Training ? isTrainingStep(S) : isStep(S))
    return true;
  return llvm::any_of(S->children(), [&](const Stmt *C) { return makesStepItself(C, Training); });
}

// Loop runs a pass loop beside the sync (`for (epoch) { for (batch) {...}
// log(loss.item()); }`), itself or, when it makes no step itself, in a
// function it calls (a tiled inference per image, a solver per chunk): the
// sync waits once per pass over the data, not per step.
bool besideStepLoop(const Stmt *Sync, const Stmt *Loop) {
  bool OwnSteps = makesStepItself(loopBody(Loop), false);
  bool OwnTraining = makesStepItself(loopBody(Loop), true);
  llvm::SmallVector<const Stmt *, 32> Work{loopBody(Loop)};
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S || isa<LambdaExpr>(S))
      continue;
    if (isLoop(S) && !contains(S, Sync)) {
      if (isPassLoop(S))
        return true;
      continue;
    }
    if (isa<CallExpr>(S) && !contains(S, Sync) &&
        ((!OwnSteps && callsStepLoop(S, false)) || (!OwnTraining && callsStepLoop(S, true))))
      return true; // an epoch helper beside an evaluation forward counts too
    Work.append(S->child_begin(), S->child_end());
  }
  return false;
}

bool isOstream(QualType T) {
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  if (!RD || !RD->hasDefinition())
    return false;
  if (RD->getName() == "basic_ostream")
    return true;
  return llvm::any_of(RD->bases(),
                      [](const CXXBaseSpecifier &B) { return isOstream(B.getType()); });
}

bool isPrintf(const CallExpr *C) {
  const FunctionDecl *F = C->getDirectCallee();
  return F && F->getIdentifier() &&
         llvm::is_contained({"printf", "fprintf", "puts", "fputs"}, F->getName());
}

// The local variable a `+=` adds to.
const VarDecl *accumulator(const CompoundAssignOperator *CA) {
  const auto *D = dyn_cast<DeclRefExpr>(CA->getLHS()->IgnoreParenImpCasts());
  const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
  return V && V->isLocalVarDecl() && !V->isStaticLocal() && V->getType()->isFloatingType()
             ? V
             : nullptr;
}

unsigned countRefs(const Stmt *S, const VarDecl *V) {
  if (!S)
    return 0;
  unsigned N = 0;
  if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V)
    ++N;
  for (const Stmt *C : S->children())
    N += countRefs(C, V);
  return N;
}

bool leavesFunction(const Stmt *S) {
  if (!S)
    return false;
  if (isa<ReturnStmt, CXXThrowExpr, GotoStmt, CoreturnStmt>(S))
    return true;
  return llvm::any_of(S->children(), [](const Stmt *C) { return leavesFunction(C); });
}

// "float" / "double" for those types: the dtype the device sum keeps, so that
// it adds what the host accumulator added (float values into a double sum).
std::optional<std::string> floatingName(QualType T) {
  T = T.getCanonicalType().getUnqualifiedType();
  if (T->isSpecificBuiltinType(BuiltinType::Float))
    return std::string("float");
  if (T->isSpecificBuiltinType(BuiltinType::Double))
    return std::string("double");
  return std::nullopt;
}

// `item<T>()` with T float or double (plain item() gives a Scalar).
bool floatingItem(const CXXMemberCallExpr *Item) {
  const auto *MD = Item ? Item->getMethodDecl() : nullptr;
  const TemplateArgumentList *TA = MD ? MD->getTemplateSpecializationArgs() : nullptr;
  return TA && TA->size() == 1 && TA->get(0).getKind() == TemplateArgument::Type &&
         floatingName(TA->get(0).getAsType());
}

// "torch" for at::Tensor, "tt" for tt::Tensor: the namespace to spell the fix in.
std::string tensorNamespace(QualType T) {
  const auto *RD = T.getNonReferenceType()->getAsCXXRecordDecl();
  const auto *NS = RD ? dyn_cast<NamespaceDecl>(RD->getEnclosingNamespaceContext()) : nullptr;
  if (!NS)
    return "";
  return NS->getName() == "at" ? "torch" : NS->getName().str();
}

// Whether the identifier Name appears in the text of FD.
bool nameTaken(const FunctionDecl *FD, StringRef Name, const SourceManager &SM,
               const LangOptions &LO) {
  StringRef Text =
      Lexer::getSourceText(CharSourceRange::getTokenRange(FD->getSourceRange()), SM, LO);
  for (size_t P = Text.find(Name); P != StringRef::npos; P = Text.find(Name, P + 1)) {
    auto Ident = [](char C) { return isalnum(static_cast<unsigned char>(C)) || C == '_'; };
    bool Before = P > 0 && Ident(Text[P - 1]);
    bool After = P + Name.size() < Text.size() && Ident(Text[P + Name.size()]);
    if (!Before && !After)
      return true;
  }
  return Text.empty();
}

// A method call of a std::vector (`trace.push_back(v)`, `trace.back()`).
StringRef vectorMethod(const Stmt *S) {
  const auto *MC = dyn_cast_or_null<CXXMemberCallExpr>(S);
  const CXXMethodDecl *M = MC ? MC->getMethodDecl() : nullptr;
  const CXXRecordDecl *RD = M ? M->getParent() : nullptr;
  return RD && RD->getIdentifier() && RD->getName() == "vector" && RD->isInStdNamespace() &&
                 M->getIdentifier()
             ? M->getName()
             : "";
}

// P logs its operand Cur: a printf call, or `os << Cur`.
bool logs(const Stmt *P, const Stmt *Cur) {
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(P))
    return OC->getOperator() == OO_LessLess && OC->getNumArgs() == 2 && OC->getArg(0) != Cur &&
           isOstream(OC->getArg(0)->getType());
  const auto *C = dyn_cast<CallExpr>(P);
  return C && isPrintf(C);
}

// E's value goes to a log: an argument of printf, or `os << E`.
bool printed(const Expr *E, ASTContext &Ctx) {
  const Stmt *Cur = E;
  for (int I = 0; I < 8; ++I) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    const Stmt *P = Ps.empty() ? nullptr : Ps[0].get<Stmt>();
    if (!P)
      return false;
    if (isa<CallExpr>(P))
      return logs(P, Cur);
    if (!isa<ImplicitCastExpr, ParenExpr, ExplicitCastExpr, MaterializeTemporaryExpr,
             CXXBindTemporaryExpr, ExprWithCleanups, ConditionalOperator>(P))
      return false; // `t.empty() ? 0.0 : t.back()` picks what is printed
    Cur = P;
  }
  return false;
}

// Each use of V in S fills it or reads a number of it into a log; Printed:
// one use prints an element (not only the count).
bool onlyFilledAndPrinted(const Stmt *S, const VarDecl *V, ASTContext &Ctx, bool &Printed) {
  if (!S)
    return true;
  if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V) {
    DynTypedNodeList Ps = Ctx.getParents(*D);
    if (const auto *IC = Ps.empty() ? nullptr : Ps[0].get<ImplicitCastExpr>()) // to const
      Ps = Ctx.getParents(*IC);
    const auto *ME = Ps.empty() ? nullptr : Ps[0].get<MemberExpr>();
    DynTypedNodeList Calls = ME ? Ctx.getParents(*ME) : DynTypedNodeList(DynTypedNode());
    const Stmt *Call = ME && !Calls.empty() ? Calls[0].get<Stmt>() : nullptr;
    StringRef M = vectorMethod(Call);
    if (llvm::is_contained({"push_back", "emplace_back", "reserve", "clear"}, M))
      return true;
    bool Element = M == "back" || M == "front";
    if ((!Element && M != "size" && M != "empty") || !printed(cast<Expr>(Call), Ctx))
      return false;
    Printed |= Element;
    return true;
  }
  return llvm::all_of(S->children(),
                      [&](const Stmt *C) { return onlyFilledAndPrinted(C, V, Ctx, Printed); });
}

// `trace.push_back(x.item<double>())` into a local vector of numbers that the
// function only fills and prints from (`trace.back()` in a log line): a log.
// Printing only its size() keeps the numbers as data.
bool pushedToLog(const Stmt *Push, ASTContext &Ctx) {
  if (!llvm::is_contained({"push_back", "emplace_back"}, vectorMethod(Push)))
    return false;
  const auto *MC = cast<CXXMemberCallExpr>(Push);
  const auto *D = dyn_cast<DeclRefExpr>(MC->getImplicitObjectArgument()->IgnoreParenImpCasts());
  const auto *V = D ? dyn_cast<VarDecl>(D->getDecl()) : nullptr;
  const FunctionDecl *FD = enclosingFunction(MC, Ctx);
  bool Printed = false;
  return V && V->isLocalVarDecl() && !V->getType()->isReferenceType() && FD &&
         MC->getNumArgs() == 1 && MC->getArg(0)->getType()->isArithmeticType() &&
         onlyFilledAndPrinted(FD->getBody(), V, Ctx, Printed) && Printed;
}

} // namespace

// A local arithmetic variable made from the host value: every use in the loop is a sink.
SyncInLoopCheck::Sink SyncInLoopCheck::sinkOfVar(const VarDecl *V, const Stmt *Loop,
                                                 ASTContext &Ctx, unsigned Depth) {
  Sink R;
  if (!V->isLocalVarDecl() || V->isStaticLocal() || !V->getType()->isArithmeticType() ||
      V->getType()->isReferenceType())
    return R;
  llvm::SmallVector<const Stmt *, 32> Work{Loop};
  unsigned Uses = 0;
  while (!Work.empty()) {
    const Stmt *S = Work.pop_back_val();
    if (!S)
      continue;
    if (const auto *D = dyn_cast<DeclRefExpr>(S); D && D->getDecl() == V) {
      Sink U = sinkOf(D, Loop, Ctx, Depth + 1);
      if (U.What == Sink::Other)
        return Sink();
      ++Uses;
      if (R.What != Sink::Accumulate)
        R.What = U.What;
    }
    for (const Stmt *C : S->children())
      Work.push_back(C);
  }
  return Uses ? R : Sink();
}

SyncInLoopCheck::Sink SyncInLoopCheck::sinkOf(const Expr *Value, const Stmt *Loop, ASTContext &Ctx,
                                              unsigned Depth) {
  Sink R;
  const Stmt *Cur = Value;
  bool Combined = false; // the value went through arithmetic first
  for (unsigned Guard = 0; Guard < 16 && Depth < 4; ++Guard) {
    DynTypedNodeList Ps = Ctx.getParents(*Cur);
    if (Ps.empty())
      return R;
    if (const auto *V = Ps[0].get<VarDecl>())
      return sinkOfVar(V, Loop, Ctx, Depth);
    const Stmt *P = Ps[0].get<Stmt>();
    if (!P)
      return R;
    if (isa<ImplicitCastExpr, ParenExpr, ExplicitCastExpr, MaterializeTemporaryExpr,
            ExprWithCleanups, CXXBindTemporaryExpr>(P)) {
      Cur = P;
      continue;
    }
    if (const auto *CA = dyn_cast<CompoundAssignOperator>(P)) {
      if (CA->getRHS()->IgnoreParenImpCasts() != Cur && CA->getRHS() != Cur)
        return R;
      if (CA->getOpcode() != BO_AddAssign && CA->getOpcode() != BO_SubAssign)
        return R;
      R.What = Sink::Accumulate;
      if (!Combined && CA->getOpcode() == BO_AddAssign && accumulator(CA))
        R.Accum = CA;
      return R;
    }
    if (const auto *BO = dyn_cast<BinaryOperator>(P)) {
      if (!BO->isMultiplicativeOp() && !BO->isAdditiveOp())
        return R;
      Combined = true;
      Cur = P;
      continue;
    }
    if (logs(P, Cur) || pushedToLog(P, Ctx))
      R.What = Sink::Log;
    return R;
  }
  return R;
}

namespace {

struct SyncSite {
  const CXXMemberCallExpr *Sync = nullptr; // item / cpu / to(kCPU): where the wait is
  const Expr *Value = nullptr;             // what the host value is: item's result
  const Expr *Tensor = nullptr;            // the device tensor
  DeviceKnown Device = DeviceKnown::Unknown;
};

std::optional<SyncSite> syncSite(const CXXMemberCallExpr *Call, const TensorModel &Model,
                                 DeviceFacts &DF, ASTContext &Ctx) {
  SyncSite S;
  S.Sync = Call;
  S.Value = Call;
  S.Tensor = Call->getImplicitObjectArgument();
  if (!S.Tensor || !Model.isTensorExpr(S.Tensor) || cast<MemberExpr>(Call->getCallee())->isArrow())
    return std::nullopt;
  StringRef N = Call->getMethodDecl()->getName();
  if (N == "item") {
    // `t.cpu().item()`: the wait is at cpu(), reported there.
    if (const auto *O = dyn_cast<CXXMemberCallExpr>(stripHandle(S.Tensor)))
      if (O->getMethodDecl() && O->getMethodDecl()->getIdentifier() &&
          llvm::is_contained({"cpu", "to"}, O->getMethodDecl()->getName()))
        return std::nullopt;
  } else {
    if (N == "to" &&
        (!Call->getNumArgs() || DF.deviceNamed(Call->getArg(0)) != DeviceKnown::NotCUDA))
      return std::nullopt;
    if (!Model.isTensorExpr(Call))
      return std::nullopt;
    // `t.cpu().item<float>()`: the host value is item's.
    const Stmt *P = parentStmt(Call, Ctx);
    while (isa_and_nonnull<ImplicitCastExpr, MaterializeTemporaryExpr, CXXBindTemporaryExpr>(P))
      P = parentStmt(P, Ctx);
    if (const auto *ME = dyn_cast_or_null<MemberExpr>(P))
      if (const auto *Item = dyn_cast_or_null<CXXMemberCallExpr>(parentStmt(ME, Ctx));
          Item && Item->getMethodDecl() && Item->getMethodDecl()->getName() == "item")
        S.Value = Item;
  }
  S.Device = DF.deviceOf(S.Tensor);
  if (!onCuda(S.Device))
    return std::nullopt;
  return S;
}

// The fix-it: a device tensor sums the values, read once after the loop.
llvm::SmallVector<FixItHint, 3> accumulateFixes(const SyncSite &S, const CompoundAssignOperator *CA,
                                                const Stmt *Loop, ASTContext &Ctx) {
  llvm::SmallVector<FixItHint, 3> Fixes;
  const auto *Item = dyn_cast<CXXMemberCallExpr>(S.Value);
  const VarDecl *Acc = CA ? accumulator(CA) : nullptr;
  std::optional<std::string> T =
      Acc && floatingItem(Item) ? floatingName(Acc->getType()) : std::nullopt;
  const SourceManager &SM = Ctx.getSourceManager();
  const LangOptions &LO = Ctx.getLangOpts();
  DynTypedNodeList LP = Ctx.getParents(*Loop);
  const auto *Block = LP.empty() ? nullptr : LP[0].get<CompoundStmt>();
  const FunctionDecl *FD = enclosingFunction(Loop, Ctx);
  std::string NS = tensorNamespace(S.Tensor->getType());
  if (!Acc || !T || !Block || !FD || NS.empty() || S.Sync != S.Value ||
      !llvm::is_contained(Block->body(), Loop) || countRefs(Loop, Acc) != 1 ||
      leavesFunction(Loop) || CA->getBeginLoc().isMacroID() || Loop->getBeginLoc().isMacroID() ||
      inTemplateInstantiation(CA, Ctx) || isa<DoStmt>(Loop) || // a do-while ends in its condition
      !isa_and_nonnull<CompoundStmt>(loopBody(Loop)))
    return Fixes;
  std::string Name = Acc->getName().str() + "_t";
  StringRef Obj =
      Lexer::getSourceText(CharSourceRange::getTokenRange(S.Tensor->getSourceRange()), SM, LO);
  // The sum's tensor is declared next to the accumulator, in the loop's block
  // (declared further out, an outer loop would add it up twice).
  DynTypedNodeList AP = Ctx.getParents(*Acc);
  const auto *AccDecl = AP.empty() ? nullptr : AP[0].get<DeclStmt>();
  if (Obj.empty() || nameTaken(FD, Name, SM, LO) || !AccDecl ||
      !llvm::is_contained(Block->body(), AccDecl) || AccDecl->getEndLoc().isMacroID())
    return Fixes;
  std::string Indent = Lexer::getIndentationForLine(Loop->getBeginLoc(), SM).str();
  std::string DType = NS + (*T == "double" ? "::kDouble" : "::kFloat");
  Fixes.push_back(FixItHint::CreateInsertion(
      Lexer::getLocForEndOfToken(AccDecl->getEndLoc(), 0, SM, LO),
      "\n" + Indent + NS + "::Tensor " + Name + " = " + NS + "::zeros({}, " + DType + ");"));
  Fixes.push_back(FixItHint::CreateReplacement(CA->getSourceRange(), Name + " = " + Name + " + " +
                                                                         Obj.str() + ".detach()"));
  Fixes.push_back(FixItHint::CreateInsertion(
      Lexer::getLocForEndOfToken(Loop->getEndLoc(), 0, SM, LO),
      "\n" + Indent + Acc->getName().str() + " += " + Name + ".item<" + *T + ">();"));
  return Fixes;
}

} // namespace

void SyncInLoopCheck::check(const MatchFinder::MatchResult &Result) {
  const auto *Call = Result.Nodes.getNodeAs<CXXMemberCallExpr>("sync");
  ASTContext &Ctx = *Result.Context;
  const Stmt *Loop = Call ? LoopAnalysis::loopRunning(Call, Ctx) : nullptr;
  DeviceFacts *DF = Loop ? AnalysisManager::get(Model, Ctx).devicesAt(Call) : nullptr;
  const Guard G =
      Loop ? underCondition(Call, Loop, Ctx, AnalysisManager::get(Model, Ctx).loopsAt(Loop))
           : Guard::Varying;
  if (!DF || !Call->getMethodDecl() || G == Guard::Varying || besideStepLoop(Call, Loop))
    return;
  std::optional<SyncSite> S = syncSite(Call, Model, *DF, Ctx);
  if (!S)
    return;
  Sink K = sinkOf(S->Value, Loop, Ctx);
  if (K.What == Sink::Other || (G == Guard::Fixed && K.What != Sink::Accumulate) ||
      !Reported.first(reportLoc(Call)))
    return;
  const SourceManager &SM = *Result.SourceManager;
  StringRef Obj = Lexer::getSourceText(CharSourceRange::getTokenRange(S->Tensor->getSourceRange()),
                                       SM, getLangOpts());
  bool Named = Obj.size() <= 40 && !Obj.empty();
  std::string Where = S->Device == DeviceKnown::CUDA
                          ? (Named ? "CUDA tensor '" + Obj.str() + "'" : "a CUDA tensor")
                          : (Named ? "'" + Obj.str() + "'" : "a tensor") +
                                (S->Device == DeviceKnown::CallerChosen
                                     ? " (on CUDA when its caller passes a CUDA device)"
                                     : " (on CUDA whenever cuda::is_available())");
  // In a closure, a hoisted accumulator may not be among its captures: no fix-it.
  auto Fixes = K.What == Sink::Accumulate && !LoopAnalysis::inClosure(Call, Loop, Ctx)
                   ? accumulateFixes(*S, K.Accum, Loop, Ctx)
                   : llvm::SmallVector<FixItHint, 3>();
  std::string Msg =
      "'" + Call->getMethodDecl()->getName().str() + "' of " + Where +
      " copies it to the host and waits for the GPU on every iteration, only to " +
      (K.What == Sink::Accumulate ? "add the value up" : "log it") + "; " +
      (K.What == Sink::Accumulate
           ? "accumulate on the device ('sum_t = sum_t + " + (Obj.size() <= 30 ? Obj.str() : "t") +
                 ".detach()') and read the sum once after the loop"
           : "log every N steps, or accumulate on the device and read once after "
             "the loop");
  auto D = diagText(reportLoc(Call), Msg);
  for (const FixItHint &F : Fixes)
    D << F;
  Finding F;
  F.Check = getID().str();
  F.Hazard = HazardKind::DeviceSyncInLoop;
  F.Where = SourcePoint::at(reportLoc(Call), SM);
  F.Op = F.Where;
  F.OpName = Call->getMethodDecl()->getName().str();
  F.Origin = SourcePoint::at(Loop->getBeginLoc(), SM);
  if (const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(S->Tensor)))
    F.Handles.push_back(handleOf(HandleRole::Source, DRE->getDecl(), SM));
  F.Fix = Fixes.empty() ? FixKind::None : FixKind::AccumulateOnDevice;
  F.Facts.push_back(deviceFact(S->Device, Fact::DeviceCUDA));
  emitFinding(std::move(F));
}

} // namespace clang::tidy::tensor
