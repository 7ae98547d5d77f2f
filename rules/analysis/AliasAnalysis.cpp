#include "analysis/AliasAnalysis.h"

#include "analysis/AstHelpers.h"
#include "analysis/Dataflow.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/RecursiveASTVisitor.h"
#include "clang/AST/StmtCXX.h"
#include "clang/Analysis/CFG.h"
#include "clang/Basic/SourceManager.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <deque>

namespace clang::tidy::tensor {

namespace {

// Bodies larger than this are skipped: the analysis stays linear in practice.
constexpr unsigned MaxBlocks = 4000;
constexpr unsigned MaxVisits = 200000;

using NodeSet = llvm::SmallVector<unsigned, 2>; // sorted, unique
using AliasState = llvm::DenseMap<const VarDecl *, NodeSet>;

struct Node {
  llvm::SmallVector<AliasEdge, 1> Parents;
  const ValueDecl *Ext = nullptr; // parameter, member, global, captured, external
  Exposure ExtWhy = Exposure::External;
  int ParamIndex = -1;
  const ValueDecl *EscapedDecl = nullptr; // set once stored / captured
  const Stmt *EscapeSite = nullptr;
  bool Permuted = false; // made by t/transpose/permute (or a handle copy of one)
  bool RequiresGrad = false;
  // Ext is a field of this local struct variable (`out.logits` of `auto out =
  // net->forward(x)`): storage of this function, seen only by later reads of it.
  const VarDecl *FieldOwner = nullptr;
};

bool addToSet(NodeSet &S, unsigned N) {
  auto It = std::lower_bound(S.begin(), S.end(), N);
  if (It != S.end() && *It == N)
    return false;
  S.insert(It, N);
  return true;
}

bool mergeInto(AliasState &Into, const AliasState &From) {
  bool Changed = false;
  for (const auto &[V, NS] : From) {
    auto [It, New] = Into.try_emplace(V, NS);
    if (New) {
      Changed = true;
      continue;
    }
    for (unsigned N : NS)
      Changed |= addToSet(It->second, N);
  }
  return Changed;
}

// Arguments of a call, without the implicit object.
llvm::ArrayRef<const Expr *> callArgs(const CallExpr *Call) {
  llvm::ArrayRef<const Expr *> Args(Call->getArgs(), Call->getNumArgs());
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call))
    if (isa_and_nonnull<CXXMethodDecl>(OC->getDirectCallee()) && !Args.empty())
      return Args.drop_front();
  return Args;
}

// `to(..., copy=true)` always copies.
bool forcesCopy(const CallExpr *Call) {
  const auto *FD = Call->getDirectCallee();
  if (!FD)
    return false;
  llvm::ArrayRef<const Expr *> Args = callArgs(Call);
  for (unsigned I = 0; I < FD->getNumParams() && I < Args.size(); ++I) {
    const ParmVarDecl *P = FD->getParamDecl(I);
    if (!P->getIdentifier() || P->getName() != "copy" || isa<CXXDefaultArgExpr>(Args[I]))
      continue;
    if (const auto *B = dyn_cast<CXXBoolLiteralExpr>(Args[I]->IgnoreImplicit()))
      return B->getValue();
    return true; // not a literal: it may copy; treat as a copy (stay silent)
  }
  return false;
}

// `requires_grad()`, `requires_grad(true)`, `requires_grad_()`: not `(false)`.
bool asksForGrad(const CallExpr *Call) {
  const auto *FD = Call->getDirectCallee();
  if (!FD || !FD->getIdentifier())
    return false;
  llvm::StringRef N = FD->getName();
  if ((N != "requires_grad" && N != "requires_grad_" && N != "set_requires_grad") ||
      Call->getType()->isBooleanType()) // the getter
    return false;
  llvm::ArrayRef<const Expr *> Args = callArgs(Call);
  if (Args.empty() || isa<CXXDefaultArgExpr>(Args[0]))
    return N != "set_requires_grad";
  if (const auto *B = dyn_cast<CXXBoolLiteralExpr>(Args[0]->IgnoreImplicit()))
    return B->getValue();
  return false;
}

// A factory call with a requires_grad(true) option somewhere in its arguments.
bool hasGradOption(const Stmt *S) {
  if (!S)
    return false;
  if (const auto *Call = dyn_cast<CallExpr>(S); Call && asksForGrad(Call))
    return true;
  for (const Stmt *C : S->children())
    if (hasGradOption(C))
      return true;
  return false;
}

// The variable E names (`v`), or null.
const ValueDecl *declOf(const Expr *E) {
  const auto *DRE = dyn_cast<DeclRefExpr>(E->IgnoreParenImpCasts());
  return DRE ? DRE->getDecl() : nullptr;
}

// St, when it is a lambda capturing V.
const Stmt *captures(const Stmt *St, const VarDecl *V) {
  if (const auto *LE = dyn_cast<LambdaExpr>(St))
    for (const LambdaCapture &C : LE->captures())
      if (C.capturesVariable() && C.getCapturedVar() == V)
        return LE;
  return nullptr;
}

// Every `v` of a `v.f` in S.
// The variable whose field ME names: `v` of `v.f`, and of `m->f` for a
// module holder m; null otherwise.
const DeclRefExpr *fieldBase(const MemberExpr *ME) {
  const Expr *B = ME->getBase()->IgnoreParenImpCasts();
  if (ME->isArrow()) {
    const auto *OC = dyn_cast<CXXOperatorCallExpr>(B);
    if (!OC || OC->getOperator() != OO_Arrow || !isModuleHolderType(OC->getArg(0)->getType()))
      return nullptr;
    B = stripHandle(OC->getArg(0));
  }
  return dyn_cast_or_null<DeclRefExpr>(B);
}

// A module made here (`auto grown = nn::Embedding(n, d)`), not a copy of
// another holder, and never rebound: its parameters are its own storage.
bool isFreshLocalModule(const VarDecl *VD, FixedLocals &Locals) {
  if (!isModuleHolderType(VD->getType()))
    return false;
  const auto *CE = dyn_cast_or_null<CXXConstructExpr>(stripHandle(Locals.initializerOf(VD)));
  return CE && llvm::none_of(CE->arguments(),
                             [](const Expr *A) { return isModuleHolderType(A->getType()); });
}

// `batch` of `for (auto &batch : *loader)`: a torch::data loader makes each
// batch anew (Stack<> stacks fresh tensors), so its fields are the
// iteration's own, as a local struct's are.
bool isTorchDataLoader(const CXXRecordDecl *RD) {
  RD = RD ? RD->getDefinition() : nullptr;
  if (!RD)
    return false;
  // The stateless and stateful loaders both derive from DataLoaderBase.
  if (RD->getIdentifier() && RD->getName() == "DataLoaderBase" && isInNamespace(RD, {"torch"}))
    return true;
  return llvm::any_of(RD->bases(), [](const CXXBaseSpecifier &B) {
    return isTorchDataLoader(B.getType()->getAsCXXRecordDecl());
  });
}

bool isLoaderBatch(const VarDecl *VD, ASTContext &Ctx) {
  for (const DynTypedNode &P : Ctx.getParents(*VD))
    if (const auto *DS = P.get<DeclStmt>())
      for (const DynTypedNode &G : Ctx.getParents(*DS))
        if (const auto *RF = G.get<CXXForRangeStmt>(); RF && RF->getLoopVariable() == VD)
          return isTorchDataLoader(RF->getRangeInit()->getType()->getAsCXXRecordDecl());
  return false;
}

void collectMemberBases(const Stmt *S, llvm::DenseSet<const DeclRefExpr *> &Out) {
  if (!S)
    return;
  if (const auto *ME = dyn_cast<MemberExpr>(S))
    if (const DeclRefExpr *B = fieldBase(ME))
      Out.insert(B);
  for (const Stmt *C : S->children())
    collectMemberBases(C, Out);
}

class FunctionAnalyzer {
public:
  FunctionAnalyzer(AliasAnalysis &AA, const TensorModel &M, const FunctionDecl *FD)
      : AA(AA), M(M), FD(FD), Ctx(AA.context()) {}

  bool run(FunctionAliasResult &Result, FunctionSummary &Summary);

  // The dataflow domain (ForwardDataflow).
  using State = AliasState;
  void transfer(const Stmt *St, State &S);
  bool join(State &Into, const State &From) { return mergeInto(Into, From); }
  void widen(State &) {}

private:
  bool isTracked(const VarDecl *VD) const {
    return VD && VD->isLocalVarDeclOrParm() && !VD->isStaticLocal() &&
           VD->getParentFunctionOrMethod() == FD && M.isTensorType(VD->getType());
  }
  const VarDecl *resolve(const VarDecl *VD) const {
    for (unsigned I = 0; I < 8; ++I) {
      auto It = RefTarget.find(VD);
      if (It == RefTarget.end())
        break;
      VD = It->second;
    }
    return VD;
  }
  const VarDecl *trackedVarOf(const Expr *E) const {
    if (const auto *DRE = dyn_cast<DeclRefExpr>(E->IgnoreParenImpCasts()))
      if (const VarDecl *VD = handleVar(DRE->getDecl()))
        if (isTracked(VD))
          return resolve(VD);
    return nullptr;
  }

  unsigned nodeFor(const void *Key) {
    auto [It, New] = NodeOf.try_emplace(Key, Nodes.size());
    if (New)
      Nodes.emplace_back();
    return It->second;
  }
  unsigned localFieldNode(const VarDecl *Owner, const FieldDecl *F) {
    auto [It, New] = LocalFields.try_emplace({Owner, F}, Nodes.size());
    if (New) {
      Nodes.emplace_back();
      Nodes.back().Ext = F;
      Nodes.back().ExtWhy = Exposure::ReadLater;
      Nodes.back().FieldOwner = Owner;
    }
    return It->second;
  }
  const VarDecl *localStructOwner(const MemberExpr *ME) const;
  unsigned extNode(const ValueDecl *D, Exposure Why) {
    unsigned N = nodeFor(D);
    Nodes[N].Ext = D;
    Nodes[N].ExtWhy = Why;
    return N;
  }
  void addParent(unsigned N, unsigned P, EdgeKind K, const Expr *Site) {
    for (const AliasEdge &E : Nodes[N].Parents)
      if (E.Parent == P && E.Kind == K)
        return;
    Nodes[N].Parents.push_back({P, K, Site});
  }
  NodeSet derived(const Expr *Key, EdgeKind K, const NodeSet &From, const Expr *Site) {
    unsigned N = nodeFor(Key);
    for (unsigned P : From)
      if (P != N)
        addParent(N, P, K, Site);
    return {N};
  }
  NodeSet fresh(const void *Key) { return {nodeFor(Key)}; }
  // `auto [logp, value] = policy(obs);`: each tuple-like binding is a handle
  // of its own, tracked through its holding variable.
  void declareBindings(const DecompositionDecl *DD, State &S) {
    bool Borrowed = DD->getType()->isReferenceType();
    for (const BindingDecl *B : DD->bindings())
      if (const VarDecl *HV = B->getHoldingVar(); isTracked(HV))
        S[HV] = Borrowed ? NodeSet{extNode(HV, Exposure::External)} : fresh(HV);
  }

  NodeSet valueNodes(const Expr *E, const State &S);
  const ValueDecl *elementContainer(const Expr *E, Exposure &Why) const;
  NodeSet namedNodes(const Expr *E, const State &S);
  NodeSet callNodes(const CallExpr *Call, const State &S);
  NodeSet opNodes(const CallExpr *Call, const sem::OpInfo &Op, const State &S);
  NodeSet copyOf(const Expr *E, const void *Key, const State &S);
  const FunctionSummary *calleeSummary(const CallExpr *Call) const;
  void markEscaped(const NodeSet &NS, const ValueDecl *D, const Stmt *Site) {
    for (unsigned N : NS)
      if (!Nodes[N].EscapeSite) {
        Nodes[N].EscapeSite = Site;
        Nodes[N].EscapedDecl = D;
      }
  }
  State entryState();
  void recordAt(const Stmt *St, const State &S, unsigned Block, unsigned Index,
                FunctionAliasResult &Result, FunctionSummary &Summary);
  void summarise(FunctionSummary &Summary);
  bool recordWrite(WriteEvent W, const State &S, unsigned Block, unsigned Index,
                   FunctionAliasResult &R, FunctionSummary &Sum);
  // A node reached from the written one: whether the path crossed an alias
  // (A) or a detach (D), and the first such edge (FA, FD).
  struct Reach {
    unsigned N;
    bool A, D;
    AliasEdge FA, FD;
    AliasEdge Last; // the edge crossed into N
  };
  void findRoot(WriteEvent &W) const;
  void buildChildren();
  using EdgeFilter = llvm::function_ref<bool(const AliasEdge &)>;
  void walkDerivations(unsigned Start, bool ViaCopy, EdgeFilter LiveFromStart,
                       FunctionSummary &Sum, std::vector<uint8_t> &Seen,
                       std::vector<Reach> &Reached);
  bool heldAnewSince(const ValueDecl *D, unsigned N, const Stmt *EdgeSite, const Stmt *Write);
  void collectAffected(WriteEvent &W, const State &S, unsigned Block, unsigned Index,
                       const std::vector<uint8_t> &Seen, const std::vector<Reach> &Reached);
  const Stmt *laterRead(const VarDecl *V, unsigned Block, unsigned Index) const;
  const Stmt *laterFieldRead(const VarDecl *Owner, const ValueDecl *Field, unsigned Block,
                             unsigned Index);
  template <typename ReadFn>
  const Stmt *firstLater(unsigned Block, unsigned Index, const VarDecl *V, ReadFn Read) const;
  bool mayRunBefore(const Stmt *Site, unsigned Block, unsigned Index);
  const std::pair<unsigned, unsigned> *positionOf(const Stmt *St);
  const CFGBlock *blockWithId(unsigned Id) const;
  void collectNonReads();

  AliasAnalysis &AA;
  const TensorModel &M;
  const FunctionDecl *FD;
  ASTContext &Ctx;
  std::unique_ptr<CFG> Cfg;
  llvm::DenseMap<const Stmt *, std::pair<unsigned, unsigned>> Positions; // block, element
  std::vector<Node> Nodes;
  llvm::DenseMap<const void *, unsigned> NodeOf;
  llvm::DenseMap<const VarDecl *, const VarDecl *> RefTarget;
  llvm::DenseSet<const DeclRefExpr *> NonReads;
  llvm::DenseMap<std::pair<const VarDecl *, const FieldDecl *>, unsigned> LocalFields;
  std::optional<llvm::DenseSet<const DeclRefExpr *>> MemberBases; // `v` of `v.f`, on first use
  mutable FixedLocals Locals; // locals' initializers, for local modules
  std::vector<std::pair<unsigned, unsigned>> Children; // flattened (child, edge index)
  std::vector<unsigned> ChildBegin;
  // Returned node sets, for the summary.
  llvm::SmallVector<NodeSet, 2> Returns;
  bool UnknownReturn = false;
};

const FunctionSummary *FunctionAnalyzer::calleeSummary(const CallExpr *Call) const {
  if (isa<CXXOperatorCallExpr>(Call))
    return nullptr;
  const FunctionDecl *Callee = Call->getDirectCallee();
  if (!Callee || Callee == FD)
    return nullptr;
  return AA.summary(Callee);
}

// `c[i]`, `c.at(i)`, `c.front()`, `c.back()` of a standard container of
// tensors: the element is storage the container holds.
const ValueDecl *FunctionAnalyzer::elementContainer(const Expr *E, Exposure &Why) const {
  const auto *Call = dyn_cast<CallExpr>(E);
  if (!Call || !Call->isLValue() || !M.isTensorExpr(Call))
    return nullptr;
  const Expr *Obj = nullptr;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    if (OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2)
      Obj = OC->getArg(0);
  } else if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call)) {
    const FunctionDecl *F = MC->getDirectCallee();
    if (F && F->getIdentifier() && llvm::is_contained({"at", "front", "back"}, F->getName()))
      Obj = MC->getImplicitObjectArgument();
  }
  if (!Obj || M.isTensorExpr(Obj))
    return nullptr;
  const auto *RD = Obj->getType().getNonReferenceType()->getAsCXXRecordDecl();
  if (!RD || !RD->isInStdNamespace())
    return nullptr;
  Obj = Obj->IgnoreParenImpCasts();
  if (const auto *ME = dyn_cast<MemberExpr>(Obj)) {
    Why = Exposure::Member;
    return dyn_cast<FieldDecl>(ME->getMemberDecl());
  }
  const auto *DRE = dyn_cast<DeclRefExpr>(Obj);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  if (!VD || VD->getType()->isPointerType())
    return nullptr;
  if (isa<ParmVarDecl>(VD) && VD->getParentFunctionOrMethod() == FD)
    Why = Exposure::Parameter;
  else if (VD->hasGlobalStorage())
    Why = Exposure::Global;
  else if (VD->getParentFunctionOrMethod() != FD)
    Why = Exposure::Captured;
  else
    return nullptr; // a local container: its later reads are not tracked
  return VD;
}

NodeSet FunctionAnalyzer::valueNodes(const Expr *E, const State &S) {
  E = stripHandle(E);
  if (isa<DeclRefExpr, MemberExpr>(E))
    return namedNodes(E, S);
  Exposure Why;
  if (const ValueDecl *C = elementContainer(E, Why))
    return {extNode(C, Why)};
  if (const auto *Call = dyn_cast<CallExpr>(E))
    return callNodes(Call, S);
  return fresh(E);
}

// A variable or member named by E.
NodeSet FunctionAnalyzer::namedNodes(const Expr *E, const State &S) {
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    const VarDecl *VD = handleVar(DRE->getDecl());
    if (!VD || !M.isTensorType(VD->getType()))
      return fresh(E);
    if (isTracked(VD)) {
      auto It = S.find(resolve(VD));
      return It == S.end() ? NodeSet{} : It->second;
    }
    if (VD->hasGlobalStorage())
      return {extNode(VD, Exposure::Global)};
    return {extNode(VD, Exposure::Captured)};
  }
  const auto *ME = cast<MemberExpr>(E);
  if (const auto *Field = dyn_cast<FieldDecl>(ME->getMemberDecl())) {
    if (const VarDecl *Owner = localStructOwner(ME))
      return {localFieldNode(Owner, Field)};
    return {extNode(Field, Exposure::Member)};
  }
  if (const auto *VD = dyn_cast<VarDecl>(ME->getMemberDecl()))
    return {extNode(VD, Exposure::Global)};
  return fresh(E);
}

NodeSet FunctionAnalyzer::callNodes(const CallExpr *Call, const State &S) {
  if (isStdMoveLike(Call))
    return valueNodes(Call->getArg(0), S);
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call);
      MC && asksForGrad(Call) && M.isTensorExpr(MC->getImplicitObjectArgument())) {
    NodeSet NS = valueNodes(MC->getImplicitObjectArgument(), S); // returns self
    for (unsigned N : NS)
      Nodes[N].RequiresGrad = true;
    return NS;
  }
  if (const Expr *T = M.inPlaceTarget(Call))
    return valueNodes(T, S); // in-place ops return self
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    // Integer indexing is a view; indexing with a tensor copies.
    if (OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2 &&
        M.isTensorExpr(OC->getArg(0)) && !M.isTensorExpr(OC->getArg(1)))
      return derived(Call, EdgeKind::View, valueNodes(OC->getArg(0), S), Call);
    return fresh(Call);
  }
  if (const sem::OpInfo *Op = M.opOf(Call))
    return opNodes(Call, *Op, S);
  if (!M.opOf(Call) && Call->getDirectCallee() && Call->getDirectCallee()->getIdentifier() &&
      sem::lookup(Call->getDirectCallee()->getName()) &&
      sem::lookup(Call->getDirectCallee()->getName())->storage == sem::Storage::Factory) {
    NodeSet NS = fresh(Call); // tt::ones({3}, ...): no tensor argument
    Nodes[NS[0]].RequiresGrad = hasGradOption(Call);
    return NS;
  }
  if (const FunctionSummary *Sum = calleeSummary(Call)) {
    llvm::ArrayRef<const Expr *> Args = callArgs(Call);
    if (Sum->ReturnsParam >= 0 && unsigned(Sum->ReturnsParam) < Args.size())
      return derived(Call, Sum->ReturnKind, valueNodes(Args[Sum->ReturnsParam], S), Call);
  }
  return fresh(Call);
}

// A call of a tabled op, by its storage behaviour.
NodeSet FunctionAnalyzer::opNodes(const CallExpr *Call, const sem::OpInfo &Op, const State &S) {
  const Expr *Self = TensorModel::selfOf(Call);
  if (!Self)
    Self = Call->getArg(0);
  switch (Op.storage) {
  case sem::Storage::View: {
    NodeSet NS = derived(Call, EdgeKind::View, valueNodes(Self, S), Call);
    Nodes[NS[0]].Permuted = Op.layout == sem::Layout::Permuted;
    return NS;
  }
  case sem::Storage::MayAlias: {
    NodeSet From = valueNodes(Self, S);
    // contiguous() of a transposed/permuted tensor copies (barring size-1
    // dims): not an alias.
    bool AllPermuted =
        !From.empty() && llvm::all_of(From, [&](unsigned N) { return Nodes[N].Permuted; });
    if (forcesCopy(Call) || (AllPermuted && Op.name == "contiguous") || AA.copies(Call))
      return fresh(Call);
    return derived(Call, EdgeKind::MayAlias, From, Call);
  }
  case sem::Storage::Detach:
    return derived(Call, Op.name == "detach" ? EdgeKind::Detach : EdgeKind::Data,
                   valueNodes(Self, S), Call);
  case sem::Storage::Factory: {
    NodeSet NS = fresh(Call);
    Nodes[NS[0]].RequiresGrad = hasGradOption(Call);
    return NS;
  }
  default:
    return fresh(Call);
  }
}

NodeSet FunctionAnalyzer::copyOf(const Expr *E, const void *Key, const State &S) {
  const Expr *Src = stripHandle(E);
  Exposure Why;
  if (isa<DeclRefExpr, MemberExpr>(Src) || elementContainer(Src, Why)) {
    unsigned N = nodeFor(Key);
    NodeSet From = valueNodes(Src, S);
    for (unsigned P : From)
      if (P != N)
        addParent(N, P, EdgeKind::Copy, Src);
    Nodes[N].Permuted =
        !From.empty() && llvm::all_of(From, [&](unsigned P) { return Nodes[P].Permuted; });
    return {N};
  }
  return valueNodes(E, S);
}

void FunctionAnalyzer::transfer(const Stmt *St, State &S) {
  if (const auto *DS = dyn_cast<DeclStmt>(St)) {
    for (const Decl *D : DS->decls()) {
      if (const auto *DD = dyn_cast<DecompositionDecl>(D))
        declareBindings(DD, S);
      const auto *VD = dyn_cast<VarDecl>(D);
      if (!isTracked(VD))
        continue;
      const Expr *Init = VD->getInit();
      if (VD->getType()->isReferenceType()) {
        if (!Init)
          continue;
        const Expr *Src = stripHandle(Init);
        if (const VarDecl *Target = trackedVarOf(Src)) {
          if (Target != VD)
            RefTarget[VD] = Target;
        } else if (isa<MemberExpr, DeclRefExpr>(Src) ||
                   isa<MaterializeTemporaryExpr>(Init->IgnoreParens()) ||
                   isa<MaterializeTemporaryExpr>(Init->IgnoreImplicit())) {
          S[VD] = valueNodes(Init, S);
        } else {
          S[VD] = {extNode(VD, Exposure::External)};
        }
        continue;
      }
      S[VD] = Init ? copyOf(Init, VD, S) : fresh(VD);
    }
    return;
  }
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(St)) {
    if (OC->getOperator() != OO_Equal || OC->getNumArgs() != 2 || !M.isTensorExpr(OC->getArg(0)) ||
        M.inPlaceTarget(OC))
      return;
    const Expr *L = OC->getArg(0)->IgnoreParenImpCasts();
    if (const VarDecl *V = trackedVarOf(L)) {
      NodeSet NS = copyOf(OC->getArg(1), OC, S);
      if (isa<ParmVarDecl>(V) && V->getType()->isReferenceType())
        markEscaped(NS, V, OC); // the caller's handle now holds it
      S[V] = std::move(NS);
      return;
    }
    if (const auto *ME = dyn_cast<MemberExpr>(L)) {
      markEscaped(valueNodes(OC->getArg(1), S), ME->getMemberDecl(), OC);
      return;
    }
    if (const auto *DRE = dyn_cast<DeclRefExpr>(L))
      markEscaped(valueNodes(OC->getArg(1), S), DRE->getDecl(), OC);
    return;
  }
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(St); MC && asksForGrad(MC)) {
    if (const VarDecl *V = trackedVarOf(MC->getImplicitObjectArgument()))
      if (auto It = S.find(V); It != S.end())
        for (unsigned N : It->second)
          Nodes[N].RequiresGrad = true;
    return;
  }
  if (const auto *LE = dyn_cast<LambdaExpr>(St)) {
    for (const LambdaCapture &C : LE->captures()) {
      if (!C.capturesVariable())
        continue;
      const auto *VD = dyn_cast<VarDecl>(C.getCapturedVar());
      if (!isTracked(VD))
        continue;
      auto It = S.find(resolve(VD));
      if (It != S.end())
        markEscaped(It->second, VD, LE);
    }
    return;
  }
}

void FunctionAnalyzer::collectNonReads() {
  for (const CFGBlock *B : *Cfg)
    for (const CFGElement &El : *B) {
      auto CS = El.getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *St = CS->getStmt();
      if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(St)) {
        if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2 && !M.inPlaceTarget(OC))
          if (const auto *DRE = dyn_cast<DeclRefExpr>(OC->getArg(0)->IgnoreParenImpCasts()))
            NonReads.insert(DRE);
      } else if (const auto *MC = dyn_cast<CXXMemberCallExpr>(St)) {
        const auto *MD = MC->getMethodDecl();
        if (MD && MD->getIdentifier() && TensorModel::isMetadataMethod(MD->getName()))
          if (const Expr *Obj = MC->getImplicitObjectArgument())
            if (const auto *DRE = dyn_cast<DeclRefExpr>(Obj->IgnoreParenImpCasts()))
              NonReads.insert(DRE);
      }
    }
}

// The first statement after element Index of Block, on some path, that Read
// accepts; V's declaration or assignment ends a path.
template <typename ReadFn>
const Stmt *FunctionAnalyzer::firstLater(unsigned Block, unsigned Index, const VarDecl *V,
                                         ReadFn Read) const {
  llvm::SmallVector<std::pair<const CFGBlock *, unsigned>, 16> Work;
  llvm::DenseSet<const CFGBlock *> Seen;
  const CFGBlock *Start = blockWithId(Block);
  if (!Start)
    return nullptr;
  Work.push_back({Start, Index + 1});
  unsigned Visits = 0;
  while (!Work.empty()) {
    auto [B, From] = Work.pop_back_val();
    bool Killed = false;
    for (unsigned I = From; I < B->size() && !Killed; ++I) {
      if (++Visits > MaxVisits)
        return nullptr;
      auto CS = (*B)[I].getAs<CFGStmt>();
      if (!CS)
        continue;
      const Stmt *St = CS->getStmt();
      if (const Stmt *R = Read(St))
        return R;
      if (const auto *DS = dyn_cast<DeclStmt>(St)) {
        for (const Decl *D : DS->decls())
          Killed |= D == V;
      } else if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(St)) {
        if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2 && !M.inPlaceTarget(OC))
          Killed |= trackedVarOf(OC->getArg(0)) == V || declOf(OC->getArg(0)) == V;
      }
    }
    if (Killed)
      continue;
    for (const CFGBlock *Succ : B->succs())
      if (Succ && Seen.insert(Succ).second)
        Work.push_back({Succ, 0});
  }
  return nullptr;
}

// The first read of V after element Index of Block, on some path, before V
// is redefined; nullptr when there is none.
const Stmt *FunctionAnalyzer::laterRead(const VarDecl *V, unsigned Block, unsigned Index) const {
  return firstLater(Block, Index, V, [&](const Stmt *St) -> const Stmt * {
    if (const auto *DRE = dyn_cast<DeclRefExpr>(St)) {
      const VarDecl *VD = handleVar(DRE->getDecl());
      if (VD && isTracked(VD) && resolve(VD) == V && !NonReads.contains(DRE))
        return DRE;
    }
    return captures(St, V);
  });
}

// A later read of Owner.Field, or a use of Owner as a whole (copied, passed,
// returned, captured); reads of its other fields do not count.
const Stmt *FunctionAnalyzer::laterFieldRead(const VarDecl *Owner, const ValueDecl *Field,
                                             unsigned Block, unsigned Index) {
  if (!MemberBases)
    collectMemberBases(FD->getBody(), MemberBases.emplace());
  return firstLater(Block, Index, Owner, [&](const Stmt *St) -> const Stmt * {
    if (const auto *ME = dyn_cast<MemberExpr>(St)) {
      const DeclRefExpr *B = fieldBase(ME);
      return B && B->getDecl() == Owner && ME->getMemberDecl() == Field ? ME : nullptr;
    }
    const auto *DRE = dyn_cast<DeclRefExpr>(St);
    if (DRE && DRE->getDecl() == Owner && !MemberBases->contains(DRE))
      return DRE;
    return captures(St, Owner);
  });
}

// `v.f` where v is a struct variable of this function, held by value, or a
// loader's batch; `m->f` of a module made in it.
const VarDecl *FunctionAnalyzer::localStructOwner(const MemberExpr *ME) const {
  const DeclRefExpr *DRE = fieldBase(ME);
  const auto *VD = DRE ? dyn_cast<VarDecl>(DRE->getDecl()) : nullptr;
  if (!VD || !VD->isLocalVarDecl() || VD->isStaticLocal() || VD->getParentFunctionOrMethod() != FD)
    return nullptr;
  if (VD->getType()->isReferenceType())
    return !ME->isArrow() && isLoaderBatch(VD, Ctx) ? VD : nullptr;
  if (ME->isArrow())
    return isFreshLocalModule(VD, Locals) ? VD : nullptr;
  return M.isTensorStruct(VD->getType()) ? VD : nullptr;
}

const CFGBlock *FunctionAnalyzer::blockWithId(unsigned Id) const {
  for (const CFGBlock *B : *Cfg)
    if (B->getBlockID() == Id)
      return B;
  return nullptr;
}

// Where St is an element of the CFG (block, index), or null.
const std::pair<unsigned, unsigned> *FunctionAnalyzer::positionOf(const Stmt *St) {
  if (Positions.empty())
    for (const CFGBlock *B : *Cfg)
      for (unsigned I = 0; I < B->size(); ++I)
        if (auto CS = (*B)[I].getAs<CFGStmt>())
          Positions.try_emplace(CS->getStmt(), B->getBlockID(), I);
  auto It = Positions.find(St);
  return It == Positions.end() ? nullptr : &It->second;
}

// Whether Site (where a node escaped) may run before element Index of Block
// on some path; true when Site is not an element of the CFG.
bool FunctionAnalyzer::mayRunBefore(const Stmt *Site, unsigned Block, unsigned Index) {
  const auto *Pos = positionOf(Site);
  if (!Pos)
    return true;
  auto [SiteBlock, SiteIndex] = *Pos;
  if (SiteBlock == Block && SiteIndex < Index)
    return true;
  llvm::SmallVector<const CFGBlock *, 16> Work{blockWithId(SiteBlock)};
  llvm::DenseSet<const CFGBlock *> Seen;
  while (!Work.empty()) {
    const CFGBlock *B = Work.pop_back_val();
    if (!B)
      continue;
    for (const CFGBlock *Succ : B->succs())
      if (Succ && Seen.insert(Succ).second) {
        if (Succ->getBlockID() == Block)
          return true;
        Work.push_back(Succ);
      }
  }
  return false;
}

// Explicit views of a handle write that handle: the written root.
void FunctionAnalyzer::findRoot(WriteEvent &W) const {
  const Expr *Root = stripHandle(W.Target);
  while (const auto *Call = dyn_cast<CallExpr>(Root)) {
    const Expr *Self = nullptr;
    if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
      if (OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2 &&
          !M.isTensorExpr(OC->getArg(1)))
        Self = OC->getArg(0);
    } else if (const Expr *T = M.inPlaceTarget(Call)) {
      Self = T; // in-place ops return self: `y.mul_(2).add_(1)` writes y twice
    } else if (const sem::OpInfo *Op = M.opOf(Call); Op && Op->storage == sem::Storage::View) {
      Self = TensorModel::selfOf(Call);
      if (!Self)
        Self = Call->getArg(0);
    }
    if (!Self)
      break;
    Root = stripHandle(Self);
  }
  W.Root = Root;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(Root)) {
    const ValueDecl *D = DRE->getDecl();
    if (const VarDecl *VD = handleVar(D); VD && isTracked(VD))
      D = resolve(VD);
    W.RootDecl = D;
  } else if (const auto *ME = dyn_cast<MemberExpr>(Root)) {
    W.RootDecl = ME->getMemberDecl();
  }
  W.Direct = W.RootDecl && Root == stripHandle(W.Target);
}

// Children lists, rebuilt when nodes were added since.
void FunctionAnalyzer::buildChildren() {
  if (ChildBegin.size() == Nodes.size() + 1)
    return;
  ChildBegin.assign(Nodes.size() + 1, 0);
  for (const Node &N : Nodes)
    for (const AliasEdge &E : N.Parents)
      ++ChildBegin[E.Parent + 1];
  for (unsigned I = 1; I < ChildBegin.size(); ++I)
    ChildBegin[I] += ChildBegin[I - 1];
  Children.assign(ChildBegin.back(), {0, 0});
  std::vector<unsigned> Fill(ChildBegin.begin(), ChildBegin.end() - 1);
  for (unsigned C = 0; C < Nodes.size(); ++C)
    for (unsigned EI = 0; EI < Nodes[C].Parents.size(); ++EI)
      Children[Fill[Nodes[C].Parents[EI].Parent]++] = {C, EI};
}

// Every node sharing storage with Start, per flag combination; Seen gets a
// bit per combination reached, Reached the items that crossed an alias or a
// detach. ViaCopy: the write lands on a copy a callee makes of Start's
// handle, so it writes no parameter itself (a helper passing its parameter
// on to such a callee writes only a copy too).
void FunctionAnalyzer::walkDerivations(unsigned Start, bool ViaCopy, EdgeFilter LiveFromStart,
                                       FunctionSummary &Sum, std::vector<uint8_t> &Seen,
                                       std::vector<Reach> &Reached) {
  Seen.assign(Nodes.size(), 0);
  std::deque<Reach> Work;
  auto Push = [&](Reach I) {
    uint8_t Bit = 1u << ((I.A ? 1 : 0) | (I.D ? 2 : 0));
    if (Seen[I.N] & Bit)
      return;
    Seen[I.N] |= Bit;
    Work.push_back(I);
  };
  Push({Start, false, false, {}, {}});
  auto Cross = [](Reach I, unsigned To, const AliasEdge &E) {
    I.N = To;
    I.Last = E;
    if (E.Kind == EdgeKind::Copy || E.Kind == EdgeKind::MayAlias) {
      if (!I.A)
        I.FA = E;
      I.A = true;
    } else if (E.Kind == EdgeKind::Detach || E.Kind == EdgeKind::Data) {
      if (!I.D)
        I.FD = E;
      I.D = true;
    }
    return I;
  };
  while (!Work.empty()) {
    Reach I = Work.front();
    Work.pop_front();
    if (int P = Nodes[I.N].ParamIndex; P >= 0) {
      Sum.MutatesParam[P] = true;
      Sum.WritesParamItself[P] = Sum.WritesParamItself[P] || (!I.A && !ViaCopy);
    }
    if (I.A || I.D)
      Reached.push_back(I);
    for (const AliasEdge &E : Nodes[I.N].Parents)
      Push(Cross(I, E.Parent, E));
    for (unsigned K = ChildBegin[I.N]; K < ChildBegin[I.N + 1]; ++K) {
      auto [C, EI] = Children[K];
      const AliasEdge &E = Nodes[C].Parents[EI];
      if (E.Kind == EdgeKind::Detach || E.Kind == EdgeKind::Data)
        continue; // writing the source of a detach is what detach is for
      if (I.N == Start && !LiveFromStart(E))
        continue;
      Push(Cross(I, C, E));
    }
  }
}

void FunctionAnalyzer::collectAffected(WriteEvent &W, const State &S, unsigned Block,
                                       unsigned Index, const std::vector<uint8_t> &Seen,
                                       const std::vector<Reach> &Reached) {
  // A node also reached by a plainer path (explicit views only, or a handle
  // copy without a detach) counts by that path: it is intended there.
  auto Plainer = [&](unsigned N, bool WantDetach) {
    return (Seen[N] & 1) || (WantDetach && (Seen[N] & 2));
  };
  auto Find = [&](unsigned N, bool WantDetach) -> const Reach * {
    if (Plainer(N, WantDetach))
      return nullptr;
    for (const Reach &I : Reached)
      if (I.N == N && I.D == WantDetach && (I.A || I.D))
        return &I;
    return nullptr;
  };
  auto Add = [&](const ValueDecl *D, Exposure Why, const Stmt *Where, const Reach &I) {
    for (const AffectedHandle &A : W.Affected)
      if (A.Decl == D && A.CrossedDetach == I.D)
        return;
    AffectedHandle A;
    A.Decl = D;
    A.Owner = Nodes[I.N].Ext == D ? Nodes[I.N].FieldOwner : nullptr;
    A.Why = Why;
    A.Where = Where;
    A.CrossedAlias = I.A;
    A.CrossedDetach = I.D;
    A.FirstAlias = I.FA;
    A.FirstDetach = I.FD;
    W.Affected.push_back(A);
  };
  for (bool WantDetach : {false, true}) {
    // Local handles that certainly hold an affected node and are read later.
    for (const auto &[V, NS] : S) {
      if (NS.empty() || V == W.RootDecl)
        continue;
      const Reach *First = nullptr;
      bool All = true;
      for (unsigned N : NS) {
        const Reach *I = Find(N, WantDetach);
        if (!I) {
          All = false;
          break;
        }
        if (!First)
          First = I;
      }
      if (!All || !First || (NS.size() == 1 && heldAnewSince(V, NS[0], First->Last.Site, W.Write)))
        continue;
      if (const Stmt *Read = laterRead(V, Block, Index))
        Add(V, Exposure::ReadLater, Read, *First);
      else if (WantDetach)
        if (const Stmt *Bwd = AA.savedUse(V, W.Write)) // autograd reads it
          Add(V, Exposure::SavedForBackward, Bwd, *First);
    }
    // Storage owned outside this function.
    for (const Reach &I : Reached) {
      if (I.D != WantDetach || Plainer(I.N, WantDetach))
        continue;
      const Node &N = Nodes[I.N];
      if (N.FieldOwner) {
        if (N.Ext != W.RootDecl)
          if (const Stmt *Read = laterFieldRead(N.FieldOwner, N.Ext, Block, Index))
            Add(N.Ext, Exposure::ReadLater, Read, I);
      } else if (N.Ext && N.Ext != W.RootDecl)
        Add(N.Ext, N.ExtWhy, nullptr, I);
      else if (N.EscapeSite && N.EscapedDecl != W.RootDecl &&
               mayRunBefore(N.EscapeSite, Block, Index)) // stored after the write: it sees it
        Add(N.EscapedDecl, Exposure::Stored, N.EscapeSite, I);
      else if (N.RequiresGrad && WantDetach)
        for (const auto &[V, NS] : S)
          if (V != W.RootDecl && llvm::is_contained(NS, I.N)) {
            Add(V, Exposure::RequiresGrad, nullptr, I);
            break;
          }
    }
  }
}

// Note [Recency of a loop's handle]: one node stands for every instance its
// site makes, but a handle holds only the newest. A handle V holding fresh
// storage N (no parents: made by an op, not copied from a handle) that is
// redefined on every path from the site of a derivation edge at N to the
// write holds an instance made after that edge: the edge related an older
// one. `auto x_euler = x_hat.clone(); x_euler.add_(...)` in a loop does not
// reach last iteration's `x_next = x_euler`; `x_cur.add_(1)` does not reach
// an `x_next` reassigned by `x_next = x_cur * 2` since `auto x_cur = x_next`.
// A handle copy (`auto v = state;`) has a parent: the same storage each time.
bool FunctionAnalyzer::heldAnewSince(const ValueDecl *D, unsigned N, const Stmt *EdgeSite,
                                     const Stmt *Write) {
  const auto *V = dyn_cast_or_null<VarDecl>(D);
  if (!V || !isTracked(V) || !EdgeSite || !Nodes[N].Parents.empty() || Nodes[N].Ext)
    return false;
  const auto *Pos = positionOf(EdgeSite);
  return Pos && !firstLater(Pos->first, Pos->second, V,
                            [&](const Stmt *St) { return St == Write ? St : nullptr; });
}

// W names the write, its target and the callee it goes through, if any.
bool FunctionAnalyzer::recordWrite(WriteEvent W, const State &S, unsigned Block, unsigned Index,
                                   FunctionAliasResult &R, FunctionSummary &Sum) {
  findRoot(W);
  NodeSet Start = valueNodes(W.Target, S);
  if (Start.size() != 1)
    return false;
  buildChildren();
  std::vector<uint8_t> Seen;
  std::vector<Reach> Reached;
  walkDerivations(
      Start[0], W.ViaCopyOnly,
      [&](const AliasEdge &E) {
        return !W.Direct || !heldAnewSince(W.RootDecl, Start[0], E.Site, W.Write);
      },
      Sum, Seen, Reached);
  if (Reached.empty())
    return false;
  collectAffected(W, S, Block, Index, Seen, Reached);
  R.Writes.push_back(std::move(W));
  return true;
}

bool FunctionAnalyzer::run(FunctionAliasResult &Result, FunctionSummary &Summary) {
  const Stmt *Body = FD->getBody();
  if (!Body)
    return false;
  CFG::BuildOptions Opts;
  Opts.AddImplicitDtors = false;
  Opts.AddTemporaryDtors = false;
  Opts.AddLifetime = false;
  Opts.AddInitializers = false;
  Opts.setAllAlwaysAdd();
  Cfg = CFG::buildCFG(FD, const_cast<Stmt *>(Body), &Ctx, Opts);
  if (!Cfg || Cfg->getNumBlockIDs() > MaxBlocks)
    return false;
  Summary.MutatesParam.assign(FD->getNumParams(), false);
  Summary.WritesParamItself.assign(FD->getNumParams(), false);
  ForwardDataflow<FunctionAnalyzer> Flow(*Cfg, *this);
  DataflowLimits Limits;
  Limits.MaxVisitsPerBlock = ~0u; // node sets only grow: no widening needed
  if (!Flow.solve(entryState(), Limits))
    return false; // not converging in reasonable time: say nothing
  collectNonReads();
  Flow.replay([&](const CFGBlock &B, unsigned I, const Stmt *St, const State &S) {
    recordAt(St, S, B.getBlockID(), I, Result, Summary);
  });
  summarise(Summary);
  return true;
}

FunctionAnalyzer::State FunctionAnalyzer::entryState() {
  State Entry;
  for (unsigned I = 0; I < FD->getNumParams(); ++I) {
    const ParmVarDecl *P = FD->getParamDecl(I);
    if (!isTracked(P))
      continue;
    unsigned N = extNode(P, Exposure::Parameter);
    Nodes[N].ParamIndex = I;
    Entry[P] = {N};
  }
  return Entry;
}

// At one statement of the fixpoint replay: the writes it makes (in place, or
// through a callee that mutates a parameter) and the value it returns.
void FunctionAnalyzer::recordAt(const Stmt *St, const State &S, unsigned Block, unsigned Index,
                                FunctionAliasResult &Result, FunctionSummary &Summary) {
  // Calls only: the casts around a call are elements of their own.
  if (const auto *E = dyn_cast<CallExpr>(St)) {
    if (const Expr *T = M.inPlaceTarget(E)) {
      WriteEvent W;
      W.Write = E;
      W.Target = T;
      recordWrite(std::move(W), S, Block, Index, Result, Summary);
    } else if (const FunctionSummary *Sum = calleeSummary(E)) {
      llvm::ArrayRef<const Expr *> Args = callArgs(E);
      for (unsigned A = 0; A < Args.size() && A < Sum->MutatesParam.size(); ++A) {
        if (!Sum->MutatesParam[A] || !M.isTensorExpr(Args[A]))
          continue;
        WriteEvent W;
        W.Write = E;
        W.Target = Args[A];
        W.Via = E->getDirectCallee();
        W.ViaCopyOnly = !Sum->WritesParamItself[A];
        recordWrite(std::move(W), S, Block, Index, Result, Summary);
      }
    }
  } else if (const auto *RS = dyn_cast<ReturnStmt>(St)) {
    if (RS->getRetValue() && M.isTensorExpr(RS->getRetValue()))
      Returns.push_back(valueNodes(RS->getRetValue(), S));
    else
      UnknownReturn = true;
  }
}

// How a path of two kinds of edge relates its ends. A detach wins (the
// result has no grad history); then an op that may return its input (a
// `flatten` after a slice: the caller did not ask for a view); then a view.
static EdgeKind pathKind(EdgeKind A, EdgeKind B) {
  auto Has = [&](EdgeKind K) { return A == K || B == K; };
  if (Has(EdgeKind::Detach))
    return EdgeKind::Detach;
  if (Has(EdgeKind::MayAlias))
    return EdgeKind::MayAlias;
  return Has(EdgeKind::View) ? EdgeKind::View : EdgeKind::Copy;
}

// The summary: every return an alias of the same parameter, and how.
void FunctionAnalyzer::summarise(FunctionSummary &Summary) {
  int Param = -1;
  EdgeKind Kind = EdgeKind::Copy;
  bool Ok = !Returns.empty() && !UnknownReturn;
  for (const NodeSet &NS : Returns) {
    if (!Ok || NS.size() != 1) {
      Ok = false;
      break;
    }
    unsigned N = NS[0];
    EdgeKind K = EdgeKind::Copy;
    for (unsigned Depth = 0; Nodes[N].ParamIndex < 0 && Depth < 64; ++Depth) {
      if (Nodes[N].Parents.size() != 1) {
        Ok = false;
        break;
      }
      const AliasEdge &E = Nodes[N].Parents[0];
      K = pathKind(K, E.Kind == EdgeKind::Data ? EdgeKind::Detach : E.Kind);
      N = E.Parent;
    }
    if (!Ok || Nodes[N].ParamIndex < 0 || (Param >= 0 && Param != Nodes[N].ParamIndex)) {
      Ok = false;
      break;
    }
    Param = Nodes[N].ParamIndex;
    Kind = pathKind(Kind, K);
  }
  if (Ok) {
    Summary.ReturnsParam = Param;
    Summary.ReturnKind = Kind;
  }
}

// Cheap pre-filter: does the body write a tensor in place, or call a
// function of this TU that may?
class WriteFinder : public RecursiveASTVisitor<WriteFinder> {
public:
  explicit WriteFinder(const TensorModel &M) : M(M) {}
  bool Found = false;
  bool shouldVisitLambdaBody() const { return false; }
  bool VisitExpr(Expr *E) {
    if (M.inPlaceTarget(E)) {
      Found = true;
      return false;
    }
    if (const auto *Call = dyn_cast<CallExpr>(E))
      if (const FunctionDecl *Callee = Call->getDirectCallee(); Callee && Callee->hasBody())
        for (const Expr *A : Call->arguments())
          if (M.isTensorExpr(A)) {
            Found = true;
            return false;
          }
    return true;
  }

private:
  const TensorModel &M;
};

} // namespace

namespace {
bool summarisable(const FunctionDecl *FD, const TensorModel &M, ASTContext &Ctx) {
  if (FD->isDependentContext() || Ctx.getSourceManager().isInSystemHeader(FD->getLocation()))
    return false;
  if (const auto *MD = dyn_cast<CXXMethodDecl>(FD)) {
    if (MD->isVirtual())
      return false;
    if (M.isTensorType(Ctx.getRecordType(MD->getParent())))
      return false;
  }
  if (isTensorLibraryCode(FD))
    return false;
  return llvm::any_of(FD->parameters(),
                      [&](const ParmVarDecl *P) { return M.isTensorType(P->getType()); });
}

} // namespace

AliasAnalysis::AliasAnalysis(const TensorModel &Model, ASTContext &Ctx) : Model(Model), Ctx(Ctx) {}
AliasAnalysis::~AliasAnalysis() = default;

AliasAnalysis::Cached &AliasAnalysis::run(const FunctionDecl *FD) {
  Cached &C = Cache[FD];
  if (C.Done)
    return C;
  InProgress[FD] = true;
  auto Result = std::make_unique<FunctionAliasResult>();
  auto Summary = std::make_unique<FunctionSummary>();
  FunctionAnalyzer FA(*this, Model, FD);
  bool Ok = FA.run(*Result, *Summary);
  InProgress.erase(FD);
  Cached &C2 = Cache[FD]; // the map may have grown during the run
  C2.Done = true;
  if (Ok) {
    C2.Result = std::move(Result);
    C2.Summary = std::move(Summary);
  }
  return C2;
}

const FunctionAliasResult *AliasAnalysis::analyze(const FunctionDecl *FD) {
  if (!FD || !FD->hasBody() || FD->isDependentContext() || !FD->doesThisDeclarationHaveABody())
    return nullptr;
  auto It = Cache.find(FD);
  if (It == Cache.end() || !It->second.Done) {
    WriteFinder WF(Model);
    WF.TraverseStmt(FD->getBody());
    if (!WF.Found)
      return nullptr;
  }
  return run(FD).Result.get();
}

const FunctionSummary *AliasAnalysis::summary(const FunctionDecl *FD) {
  const FunctionDecl *Def = nullptr;
  if (!FD || !FD->hasBody(Def) || !Def || InProgress.count(Def))
    return nullptr;
  if (!summarisable(Def, Model, Ctx))
    return nullptr;
  return run(Def).Summary.get();
}

} // namespace clang::tidy::tensor
