#include "analysis/LayoutAnalysis.h"

#include "clang/AST/ASTContext.h"
#include "clang/AST/DeclCXX.h"
#include "clang/AST/ExprCXX.h"
#include "clang/AST/ParentMapContext.h"
#include "clang/AST/StmtCXX.h"
#include "clang/Analysis/CFG.h"
#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseSet.h"

#include <cinttypes>
#include <cstdio>
#include <deque>
#include <numeric>

namespace clang::tidy::tensor {

bool TensorFact::operator==(const TensorFact &O) const {
  return Contig == O.Contig && Assumed == O.Assumed && Sizes == O.Sizes && Strides == O.Strides &&
         ElemSize == O.ElemSize && SwapA == O.SwapA && SwapB == O.SwapB && Src == O.Src &&
         Origin == O.Origin && OriginLoc == O.OriginLoc;
}

//===----------------------------------------------------------------------===//
// Symbolic sizes
//===----------------------------------------------------------------------===//

using Shape = llvm::SmallVector<Mono, 4>;

enum class Cmp { LT, EQ, GT, NE, Unknown };

class SymTable {
public:
  Mono sym(const void *K, std::int64_t I) {
    auto [It, New] = Keys.try_emplace({K, I}, Next);
    if (New)
      ++Next;
    Mono M;
    M.Pow.push_back({It->second, 1});
    return M;
  }

  Mono mul(const Mono &A, const Mono &B) const { return combine(A, B, 1); }
  Mono div(const Mono &A, const Mono &B) const { return combine(A, B, -1); }

  // A / B for a size: when B does not divide A and A is one run-time symbol
  // S, S is refined to B * H with H fresh (keyed by Key): `C / nh` is a size.
  Mono divSize(const Mono &A, const Mono &B, const void *Key) {
    Mono NA = norm(A), NB = norm(B);
    Mono Q = div(NA, NB);
    if (Q.Top || (Q.Den == 1 && llvm::all_of(Q.Pow, [](auto P) { return P.second > 0; })))
      return Q;
    if (NA.Num == 1 && NA.Den == 1 && NA.Pow.size() == 1 && NA.Pow[0].second == 1 &&
        !Subst.count(NA.Pow[0].first) && !llvm::any_of(NB.Pow, [&](auto P) {
          return P.first == NA.Pow[0].first;
        }) && NB.Den == 1 && NB.Num > 0) {
      Mono H = sym(Key, -7);
      Subst[NA.Pow[0].first] = mul(NB, H);
      return H;
    }
    return Q;
  }

  Mono norm(const Mono &M) const {
    if (M.Top || Subst.empty())
      return M;
    Mono R = M;
    for (int Depth = 0; Depth < 8; ++Depth) {
      bool Changed = false;
      Mono Out = Mono::constant(1);
      Out.Num = R.Num;
      Out.Den = R.Den;
      for (auto [S, E] : R.Pow) {
        auto It = Subst.find(S);
        Mono F;
        if (It == Subst.end()) {
          F.Pow.push_back({S, 1});
        } else {
          F = It->second;
          Changed = true;
        }
        for (int I = 0; I < std::abs(E); ++I)
          Out = E > 0 ? mul(Out, F) : div(Out, F);
      }
      R = Out;
      if (!Changed)
        break;
    }
    return R;
  }

  // Equality is exact for constants and structural (generic) otherwise.
  Cmp eq(const Mono &A, const Mono &B) const {
    if (A.Top || B.Top)
      return Cmp::Unknown;
    return norm(A) == norm(B) ? Cmp::EQ : Cmp::NE;
  }

  // Order, assuming every symbol is > 1.
  Cmp cmp(const Mono &A, const Mono &B) const {
    Mono NA = norm(A), NB = norm(B);
    if (NA.Top || NB.Top)
      return Cmp::Unknown;
    if (NA == NB)
      return Cmp::EQ;
    Mono Q = div(NB, NA); // B / A
    if (Q.Top || NA.Num <= 0 || NB.Num <= 0)
      return Cmp::Unknown;
    bool AllPos = llvm::all_of(Q.Pow, [](auto P) { return P.second > 0; });
    bool AllNeg = llvm::all_of(Q.Pow, [](auto P) { return P.second < 0; });
    if (AllPos && Q.Num >= Q.Den)
      return Cmp::LT;
    if (AllNeg && Q.Num <= Q.Den)
      return Cmp::GT;
    return Cmp::Unknown;
  }

private:
  static Mono combine(const Mono &A, const Mono &B, int Sign) {
    if (A.Top || B.Top)
      return top();
    __int128 N = (__int128)A.Num * (Sign > 0 ? B.Num : B.Den);
    __int128 D = (__int128)A.Den * (Sign > 0 ? B.Den : B.Num);
    if (D == 0)
      return top();
    if (D < 0) {
      N = -N;
      D = -D;
    }
    __int128 G = gcd128(N < 0 ? -N : N, D);
    if (G > 1) {
      N /= G;
      D /= G;
    }
    if (N > INT64_MAX || N < INT64_MIN || D > INT64_MAX)
      return top();
    Mono R;
    R.Num = (std::int64_t)N;
    R.Den = (std::int64_t)D;
    if (R.Num == 0)
      return R;
    R.Pow = A.Pow;
    for (auto [S, E] : B.Pow) {
      auto *It = llvm::find_if(R.Pow, [&](auto P) { return P.first == S; });
      if (It == R.Pow.end())
        R.Pow.push_back({S, Sign * E});
      else
        It->second += Sign * E;
    }
    llvm::erase_if(R.Pow, [](auto P) { return P.second == 0; });
    llvm::sort(R.Pow);
    return R;
  }
  static __int128 gcd128(__int128 A, __int128 B) {
    while (B) {
      __int128 T = A % B;
      A = B;
      B = T;
    }
    return A;
  }
  static Mono top() {
    Mono M;
    M.Top = true;
    return M;
  }

  llvm::DenseMap<std::pair<const void *, std::int64_t>, unsigned> Keys;
  llvm::DenseMap<unsigned, Mono> Subst;
  unsigned Next = 0;
};

const Expr *stripHandle(const Expr *E) {
  while (E) {
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
             CE && CE->getNumArgs() == 1 && CE->getConstructor()->isCopyOrMoveConstructor())
      E = CE->getArg(0);
    else
      break;
  }
  return E;
}

namespace {

bool allConst(llvm::ArrayRef<Mono> V) {
  return llvm::all_of(V, [](const Mono &M) { return M.isConst(); });
}

Shape contiguousStrides(const SymTable &ST, llvm::ArrayRef<Mono> Sizes) {
  Shape St(Sizes.size());
  Mono Acc = Mono::constant(1);
  for (size_t I = Sizes.size(); I-- > 0;) {
    St[I] = Acc;
    // PyTorch: max(size, 1) for the next stride.
    Acc = Sizes[I].isConst(0) ? Acc : ST.mul(Acc, Sizes[I]);
  }
  return St;
}

// c10's TensorImpl::compute_contiguous, generically.
TensorFact::ContigKind contigOf(const SymTable &ST, llvm::ArrayRef<Mono> Sizes,
                                llvm::ArrayRef<Mono> Strides) {
  if (llvm::any_of(Sizes, [](const Mono &M) { return M.isConst(0); }))
    return TensorFact::Yes;
  Mono Expected = Mono::constant(1);
  for (size_t I = Sizes.size(); I-- > 0;) {
    if (Sizes[I].isConst(1))
      continue;
    Cmp C = ST.eq(Strides[I], Expected);
    if (C == Cmp::Unknown)
      return TensorFact::Unknown;
    if (C == Cmp::NE)
      return TensorFact::No;
    Expected = ST.mul(Expected, Sizes[I]);
  }
  return TensorFact::Yes;
}

// at::detail::computeStride_impl (aten/src/ATen/TensorUtils.cpp), with
// comparisons that may be undecidable on symbols.
ViewQuery::Kind computeStride(const SymTable &ST, llvm::ArrayRef<Mono> OldShape,
                              llvm::ArrayRef<Mono> OldStride, llvm::ArrayRef<Mono> NewShape,
                              Shape &NewStride) {
  NewStride.assign(NewShape.size(), Mono::constant(1));
  if (OldShape.empty())
    return ViewQuery::Viewable;
  Mono Numel = Mono::constant(1);
  for (const Mono &M : OldShape)
    Numel = ST.mul(Numel, M);
  if (Numel.isConst(0)) {
    if (OldShape.equals(NewShape)) {
      NewStride.assign(OldStride.begin(), OldStride.end());
      return ViewQuery::Viewable;
    }
    NewStride = contiguousStrides(ST, NewShape);
    return ViewQuery::Viewable;
  }
  auto IsOne = [](const Mono &M) { return M.isConst(1); };
  int64_t ViewD = (int64_t)NewShape.size() - 1;
  Mono ChunkBase = OldStride.back();
  Mono TensorNumel = Mono::constant(1), ViewNumel = Mono::constant(1);
  for (int64_t TD = (int64_t)OldShape.size() - 1; TD >= 0; --TD) {
    TensorNumel = ST.mul(TensorNumel, OldShape[TD]);
    bool Boundary = TD == 0;
    if (!Boundary && !IsOne(OldShape[TD - 1])) {
      Cmp C = ST.eq(OldStride[TD - 1], ST.mul(TensorNumel, ChunkBase));
      if (C == Cmp::Unknown)
        return ViewQuery::Unknown;
      Boundary = C == Cmp::NE;
    }
    if (!Boundary)
      continue;
    while (ViewD >= 0) {
      bool Take = IsOne(NewShape[ViewD]);
      if (!Take) {
        Cmp C = ST.cmp(ViewNumel, TensorNumel);
        if (C == Cmp::Unknown)
          return ViewQuery::Unknown;
        Take = C == Cmp::LT;
      }
      if (!Take)
        break;
      NewStride[ViewD] = ST.mul(ViewNumel, ChunkBase);
      ViewNumel = ST.mul(ViewNumel, NewShape[ViewD]);
      --ViewD;
    }
    Cmp C = ST.eq(ViewNumel, TensorNumel);
    if (C == Cmp::Unknown)
      return ViewQuery::Unknown;
    if (C == Cmp::NE)
      return ViewQuery::NotViewable;
    if (TD > 0) {
      ChunkBase = OldStride[TD - 1];
      TensorNumel = Mono::constant(1);
      ViewNumel = Mono::constant(1);
    }
  }
  return ViewD == -1 ? ViewQuery::Viewable : ViewQuery::NotViewable;
}


// The elements of an int list argument: `{2, 3}`, `-1`, an IntArrayRef or
// std::vector built from either.
bool intList(const Expr *E, llvm::SmallVectorImpl<const Expr *> &Out) {
  if (!E)
    return false;
  E = E->IgnoreParenImpCasts();
  if (const auto *M = dyn_cast<MaterializeTemporaryExpr>(E))
    return intList(M->getSubExpr(), Out);
  if (const auto *B = dyn_cast<CXXBindTemporaryExpr>(E))
    return intList(B->getSubExpr(), Out);
  if (const auto *IL = dyn_cast<CXXStdInitializerListExpr>(E))
    return intList(IL->getSubExpr(), Out);
  auto IsInt = [](const Expr *X) {
    return X->getType()->isIntegerType() && !X->getType()->isEnumeralType();
  };
  if (const auto *IL = dyn_cast<InitListExpr>(E)) {
    if (IL->getNumInits() == 1 && !IsInt(IL->getInit(0)))
      return intList(IL->getInit(0), Out);
    for (const Expr *I : IL->inits()) {
      if (!IsInt(I))
        return false;
      Out.push_back(I);
    }
    return true;
  }
  if (const auto *CE = dyn_cast<CXXConstructExpr>(E)) {
    if (CE->getNumArgs() == 1 || (CE->getNumArgs() == 2 && isa<CXXDefaultArgExpr>(CE->getArg(1))))
      return intList(CE->getArg(0), Out);
    return false;
  }
  if (IsInt(E)) {
    Out.push_back(E);
    return true;
  }
  return false;
}

std::optional<std::int64_t> constInt(const Expr *E, const ASTContext &Ctx) {
  // Through std::optional<int64_t> / Scalar built from an integer.
  for (int I = 0; E && I < 4; ++I) {
    E = E->IgnoreImplicit();
    const auto *CE = dyn_cast<CXXConstructExpr>(E);
    if (!CE || CE->getNumArgs() != 1)
      break;
    E = CE->getArg(0);
  }
  if (!E || E->isValueDependent() || E->isTypeDependent() || !E->getType()->isIntegerType())
    return std::nullopt;
  Expr::EvalResult R;
  if (E->EvaluateAsInt(R, Ctx))
    return R.Val.getInt().getSExtValue();
  return std::nullopt;
}

// Element size from a dtype named anywhere in E (kHalf, torch::kFloat64,
// ScalarType::Long, TensorOptions().dtype(kInt)...): 0 when none.
unsigned elemSizeIn(const Stmt *S) {
  if (!S)
    return 0;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(S)) {
    const ValueDecl *D = DRE->getDecl();
    if (!D->getIdentifier())
      return 0;
    llvm::StringRef N = D->getName();
    if (isa<EnumConstantDecl>(D))
      N.consume_front("");
    else if (!N.consume_front("k"))
      return 0;
    return llvm::StringSwitch<unsigned>(N)
        .Cases("Float", "Float32", "F32", "Int", "Int32", "ComplexHalf", 4)
        .Cases("Double", "Float64", "F64", "Long", "Int64", "ComplexFloat", 8)
        .Cases("Half", "Float16", "F16", "BFloat16", "Short", "Int16", 2)
        .Cases("Bool", "Byte", "UInt8", "Char", "Int8", "QInt8", "QUInt8", 1)
        .Case("ComplexDouble", 16)
        .Default(0);
  }
  for (const Stmt *C : S->children())
    if (unsigned N = elemSizeIn(C))
      return N;
  return 0;
}

TensorFact unknownFact() { return TensorFact(); }

TensorFact assumedInput(const void *Src) {
  TensorFact F;
  F.Contig = TensorFact::Yes;
  F.Assumed = true;
  F.Src = Src;
  return F;
}

TensorFact join(const TensorFact &A, const TensorFact &B) {
  if (A == B)
    return A;
  TensorFact R;
  if (A.Contig == B.Contig)
    R.Contig = A.Contig;
  R.Assumed = A.Assumed || B.Assumed;
  if (A.ElemSize == B.ElemSize)
    R.ElemSize = A.ElemSize;
  if (A.Sizes == B.Sizes && A.Strides == B.Strides) {
    R.Sizes = A.Sizes;
    R.Strides = A.Strides;
  }
  if (R.Contig == TensorFact::No && A.Origin == B.Origin)
    R.Origin = A.Origin;
  return R;
}

bool isTensorOpNamespace(const FunctionDecl *FD) {
  const DeclContext *DC = FD->getDeclContext()->getEnclosingNamespaceContext();
  const auto *NS = dyn_cast<NamespaceDecl>(DC);
  while (NS && NS->getParent() && isa<NamespaceDecl>(NS->getParent()))
    NS = cast<NamespaceDecl>(NS->getParent());
  if (!NS || !NS->getIdentifier())
    return false;
  llvm::StringRef N = NS->getName();
  return N == "tt" || N == "torch" || N == "at";
}

} // namespace

//===----------------------------------------------------------------------===//
// The analysis
//===----------------------------------------------------------------------===//

struct LayoutAnalysis::State {
  llvm::DenseMap<const VarDecl *, TensorFact> T;
  llvm::DenseMap<const VarDecl *, Mono> I;

  bool operator==(const State &O) const {
    if (T.size() != O.T.size() || I.size() != O.I.size())
      return false;
    for (const auto &[V, F] : T) {
      auto It = O.T.find(V);
      if (It == O.T.end() || !(It->second == F))
        return false;
    }
    for (const auto &[V, M] : I) {
      auto It = O.I.find(V);
      if (It == O.I.end() || It->second != M)
        return false;
    }
    return true;
  }
  void joinWith(const State &O) {
    llvm::SmallVector<const VarDecl *, 8> Drop;
    for (auto &[V, F] : T) {
      auto It = O.T.find(V);
      if (It == O.T.end())
        Drop.push_back(V);
      else
        F = join(F, It->second);
    }
    for (const VarDecl *V : Drop)
      T.erase(V);
    Drop.clear();
    for (auto &[V, M] : I) {
      auto It = O.I.find(V);
      if (It == O.I.end() || It->second != M)
        Drop.push_back(V);
    }
    for (const VarDecl *V : Drop)
      I.erase(V);
  }
};

class LayoutAnalysis::Impl {
public:
  Impl(const TensorModel &Model, ASTContext &Ctx) : Model(Model), Ctx(Ctx) {}

  void run(const FunctionDecl *FD);

  const TensorModel &Model;
  ASTContext &Ctx;
  SymTable ST;
  llvm::DenseSet<const VarDecl *> Untracked;
  bool Recording = false;
  llvm::DenseMap<const Expr *, TensorFact> Facts;
  llvm::DenseMap<const CallExpr *, ViewQuery> Queries;

  TensorFact evalTensor(const Expr *E, State &S);
  Mono evalInt(const Expr *E, State &S);
  TensorFact applyOp(const CallExpr *Call, llvm::StringRef Name, const sem::OpInfo *Op,
                     const Expr *SelfE, llvm::ArrayRef<const Expr *> Args, State &S);
  TensorFact reshapeLike(const CallExpr *Call, llvm::StringRef Name, const TensorFact &Self,
                         std::optional<Shape> NewShape, bool FlattenAll, bool Shaped);
  std::optional<Shape> shapeArg(const Expr *E, State &S, const void *Key, const TensorFact &Self);
  void setLayout(TensorFact &F, Shape Sizes, Shape Strides) {
    F.Contig = contigOf(ST, Sizes, Strides);
    F.Sizes = std::move(Sizes);
    F.Strides = std::move(Strides);
    F.SwapA = F.SwapB = -1;
  }
  void transfer(const Stmt *St, State &S);
  void prescan(const Stmt *St);
};

static std::optional<std::int64_t> normDim(std::optional<std::int64_t> D, size_t Rank) {
  if (!D)
    return std::nullopt;
  std::int64_t R = (std::int64_t)Rank;
  std::int64_t V = *D < 0 ? *D + R : *D;
  if (V < 0 || V >= R)
    return std::nullopt;
  return V;
}

Mono LayoutAnalysis::Impl::evalInt(const Expr *E, State &S) {
  if (!E)
    return ST.sym(nullptr, 0);
  E = E->IgnoreParenCasts();
  if (auto V = constInt(E, Ctx))
    return Mono::constant(*V);
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl())) {
      auto It = S.I.find(VD);
      if (It != S.I.end())
        return It->second;
    }
    return ST.sym(E, 0);
  }
  if (const auto *BO = dyn_cast<BinaryOperator>(E)) {
    if (BO->getOpcode() == BO_Mul)
      return ST.mul(evalInt(BO->getLHS(), S), evalInt(BO->getRHS(), S));
    if (BO->getOpcode() == BO_Div)
      return ST.divSize(evalInt(BO->getLHS(), S), evalInt(BO->getRHS(), S), E);
    return ST.sym(E, 0);
  }
  if (const auto *ME = dyn_cast<MemberExpr>(E)) {
    // A field read (`cfg.n_head`, `hidden_`): the same symbol throughout.
    const Expr *Base = ME->getBase()->IgnoreParenImpCasts();
    const void *BaseKey = nullptr;
    if (const auto *BD = dyn_cast<DeclRefExpr>(Base))
      BaseKey = BD->getDecl();
    else if (isa<CXXThisExpr>(Base))
      BaseKey = &Ctx;
    if (BaseKey)
      return ST.sym(ME->getMemberDecl(), (std::int64_t)(intptr_t)BaseKey);
    return ST.sym(E, 0);
  }
  // t.size(d), t.sizes()[d], t.numel(), t.dim()
  const Expr *Obj = nullptr;
  const Expr *Idx = nullptr;
  llvm::StringRef What;
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(E)) {
    // LibTorch declares size()/sizes()/dim() on TensorBase: look through the
    // derived-to-base cast.
    const auto *MD = MC->getMethodDecl();
    const Expr *O = MC->getImplicitObjectArgument();
    O = O ? O->IgnoreParenImpCasts() : nullptr;
    if (MD && MD->getIdentifier() && Model.isTensorExpr(O)) {
      What = MD->getName();
      Obj = O;
      if (MC->getNumArgs() >= 1)
        Idx = MC->getArg(0);
    }
  } else if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(E)) {
    if (OC->getOperator() == OO_Subscript && OC->getNumArgs() == 2) {
      if (const auto *In = dyn_cast<CXXMemberCallExpr>(OC->getArg(0)->IgnoreParenImpCasts())) {
        const Expr *O = In->getImplicitObjectArgument();
        O = O ? O->IgnoreParenImpCasts() : nullptr;
        if (In->getMethodDecl() && In->getMethodDecl()->getIdentifier() &&
            In->getMethodDecl()->getName() == "sizes" && Model.isTensorExpr(O)) {
          What = "size";
          Obj = O;
          Idx = OC->getArg(1);
        }
      }
    }
  }
  if (Obj) {
    TensorFact F = evalTensor(Obj, S);
    if (What == "size" && Idx) {
      auto D = constInt(Idx, Ctx);
      if (F.Sizes) {
        if (auto N = normDim(D, F.Sizes->size()))
          return (*F.Sizes)[*N];
      } else if (F.Src && D && *D >= 0) {
        std::int64_t K = *D == F.SwapA ? F.SwapB : *D == F.SwapB ? F.SwapA : *D;
        return ST.sym(F.Src, K + 1);
      }
    } else if (What == "numel" && F.Sizes) {
      Mono N = Mono::constant(1);
      for (const Mono &M : *F.Sizes)
        N = ST.mul(N, M);
      return N;
    } else if (What == "dim" && F.Sizes) {
      return Mono::constant((std::int64_t)F.Sizes->size());
    }
  }
  return ST.sym(E, 0);
}

std::optional<Shape> LayoutAnalysis::Impl::shapeArg(const Expr *E, State &S, const void *Key,
                                                    const TensorFact &Self) {
  llvm::SmallVector<const Expr *, 4> Elts;
  if (!intList(E, Elts))
    return std::nullopt;
  Shape R;
  int Infer = -1;
  for (const Expr *X : Elts) {
    Mono M = evalInt(X, S);
    if (M.isConst(-1)) {
      if (Infer >= 0)
        return std::nullopt;
      Infer = (int)R.size();
    } else if (M.isConst() && M.Num < 0) {
      return std::nullopt;
    }
    R.push_back(M);
  }
  if (Infer >= 0) {
    Mono Rest = Mono::constant(1);
    for (size_t I = 0; I < R.size(); ++I)
      if ((int)I != Infer)
        Rest = ST.mul(Rest, R[I]);
    if (Self.Sizes) {
      Mono Numel = Mono::constant(1);
      for (const Mono &M : *Self.Sizes)
        Numel = ST.mul(Numel, M);
      R[Infer] = ST.divSize(Numel, Rest, Key);
    } else {
      R[Infer] = ST.sym(Key, 1000 + Infer);
    }
  }
  return R;
}

// view / reshape / flatten and their _as forms.
TensorFact LayoutAnalysis::Impl::reshapeLike(const CallExpr *Call, llvm::StringRef Name,
                                             const TensorFact &Self, std::optional<Shape> NewShape,
                                             bool FlattenAll, bool Shaped) {
  bool IsView = Name == "view" || Name == "view_as";
  TensorFact In = Self;
  // Unknown rank after a transpose of a tensor taken as contiguous: the rank
  // follows when the new shape multiplies out to exactly its leading sizes.
  if (!In.Sizes && In.SwapA >= 0 && In.Src && NewShape) {
    Mono P = Mono::constant(1);
    for (const Mono &M : *NewShape)
      P = ST.mul(P, M);
    P = ST.norm(P);
    for (int Rank = std::max(In.SwapA, In.SwapB) + 1; Rank <= 8; ++Rank) {
      Mono Q = Mono::constant(1);
      for (int K = 0; K < Rank; ++K)
        Q = ST.mul(Q, ST.sym(In.Src, K + 1));
      if (ST.norm(Q) == P) {
        Shape Sz;
        for (int K = 0; K < Rank; ++K)
          Sz.push_back(ST.sym(In.Src, K + 1));
        Shape St = contiguousStrides(ST, Sz);
        std::swap(Sz[In.SwapA], Sz[In.SwapB]);
        std::swap(St[In.SwapA], St[In.SwapB]);
        std::string O = In.Origin;
        SourceLocation OL = In.OriginLoc;
        setLayout(In, Sz, St);
        In.Origin = O;
        In.OriginLoc = OL;
        break;
      }
    }
  }

  ViewQuery Q;
  Q.Input = In;
  Q.NewSizes = NewShape;
  TensorFact R;
  R.ElemSize = In.ElemSize;
  R.Assumed = In.Assumed;
  Shape NewStride;
  if (In.Sizes && NewShape) {
    Q.Result = computeStride(ST, *In.Sizes, *In.Strides, *NewShape, NewStride);
    Q.Certain = !In.Assumed && allConst(*In.Sizes) && allConst(*In.Strides) && allConst(*NewShape);
    if (Q.Certain && In.ElemSize) {
      std::int64_t N = 1;
      for (const Mono &M : *In.Sizes)
        N *= M.Num;
      Q.Bytes = N * In.ElemSize;
    }
  } else if (In.Contig == TensorFact::Yes) {
    Q.Result = ViewQuery::Viewable;
  } else if (!In.Sizes && In.SwapA >= 0 && FlattenAll) {
    // Flattening across two swapped dims never works unless one has size 1.
    Q.Result = ViewQuery::NotViewable;
  }
  if (Recording && Shaped)
    Queries[Call] = Q;

  if (Q.Result == ViewQuery::Viewable) {
    if (NewShape && In.Sizes)
      setLayout(R, *NewShape, NewStride);
    else if (NewShape)
      setLayout(R, *NewShape, contiguousStrides(ST, *NewShape));
    else
      R.Contig = TensorFact::Yes;
    if (R.Contig == TensorFact::No) {
      R.Origin = In.Origin;
      R.OriginLoc = In.OriginLoc;
    }
    if (!R.Sizes && In.Src && FlattenAll)
      R.Src = nullptr;
    return R;
  }
  if (Q.Result == ViewQuery::NotViewable && !IsView) {
    // reshape copies into a fresh contiguous tensor.
    R.Assumed = false;
    if (NewShape)
      setLayout(R, *NewShape, contiguousStrides(ST, *NewShape));
    else
      R.Contig = TensorFact::Yes;
    return R;
  }
  return unknownFact();
}

TensorFact LayoutAnalysis::Impl::applyOp(const CallExpr *Call, llvm::StringRef Name,
                                         const sem::OpInfo *Op, const Expr *SelfE,
                                         llvm::ArrayRef<const Expr *> Args, State &S) {
  auto Arg = [&](size_t I) -> const Expr * {
    return I < Args.size() && !isa<CXXDefaultArgExpr>(Args[I]) ? Args[I] : nullptr;
  };
  auto ArgInt = [&](size_t I) { return constInt(Arg(I), Ctx); };

  if (!SelfE) {
    // Factories.
    TensorFact F;
    F.Contig = TensorFact::Yes;
    unsigned ES = 0;
    for (const Expr *A : Args)
      if (!ES)
        ES = elemSizeIn(A);
    std::optional<Shape> Sz;
    if (Name == "zeros" || Name == "ones" || Name == "empty" || Name == "rand" ||
        Name == "randn" || Name == "full") {
      Sz = shapeArg(Arg(0), S, Call, F);
      F.ElemSize = ES ? ES : 4;
    } else if (Name == "arange" && !Args.empty()) {
      bool AllInt = true;
      llvm::SmallVector<std::int64_t, 3> V;
      for (const Expr *A : Args) {
        const Expr *X = A->IgnoreImplicit();
        if (const auto *CE = dyn_cast<CXXConstructExpr>(X); CE && CE->getNumArgs() == 1)
          X = CE->getArg(0)->IgnoreParenImpCasts(); // Scalar(3)
        if (!X->getType()->isArithmeticType())
          break;
        AllInt &= X->getType()->isIntegerType();
        if (auto C = constInt(X, Ctx))
          V.push_back(*C);
        else
          V.push_back(INT64_MIN);
      }
      F.ElemSize = ES ? ES : (AllInt ? 8 : 4);
      if (AllInt && llvm::none_of(V, [](std::int64_t X) { return X == INT64_MIN; })) {
        std::int64_t Start = V.size() >= 2 ? V[0] : 0, End = V.size() >= 2 ? V[1] : V[0];
        std::int64_t Step = V.size() >= 3 ? V[2] : 1;
        if (Step > 0 && End >= Start)
          Sz = Shape{Mono::constant((End - Start + Step - 1) / Step)};
      }
    } else if (Name == "linspace" && Args.size() >= 3) {
      Sz = Shape{evalInt(Args[2], S)};
      F.ElemSize = ES ? ES : 4;
    } else {
      F.ElemSize = ES;
    }
    if (Sz)
      setLayout(F, *Sz, contiguousStrides(ST, *Sz));
    return F;
  }

  TensorFact Self = evalTensor(SelfE, S);
  if (Recording)
    Facts[SelfE] = Self;
  TensorFact R = Self;
  auto Derived = [&](llvm::StringRef Origin) {
    if (R.Contig == TensorFact::No && Self.Contig != TensorFact::No) {
      R.Origin = Origin.str();
      R.OriginLoc = Call->getExprLoc();
    } else if (R.Contig != TensorFact::No) {
      R.Origin.clear();
      R.OriginLoc = SourceLocation();
    }
  };
  auto Unknown = [&] {
    TensorFact U;
    U.ElemSize = Self.ElemSize;
    return U;
  };
  size_t Rank = Self.Sizes ? Self.Sizes->size() : 0;

  if (Name == "view" || Name == "reshape") {
    std::optional<Shape> NS = shapeArg(Arg(0), S, Call, Self);
    bool FlattenAll = NS && NS->size() == 1 && !Self.Sizes;
    if (FlattenAll) {
      llvm::SmallVector<const Expr *, 1> E1;
      intList(Arg(0), E1);
      FlattenAll = E1.size() == 1 && constInt(E1[0], Ctx) == -1;
    }
    return reshapeLike(Call, Name, Self, NS, FlattenAll, true);
  }
  if (Name == "view_as" || Name == "reshape_as") {
    TensorFact Other = Arg(0) ? evalTensor(Arg(0), S) : unknownFact();
    return reshapeLike(Call, Name, Self, Other.Sizes, false, true);
  }
  if (Name == "flatten") {
    std::int64_t Start = ArgInt(0).value_or(Arg(0) ? INT64_MIN : 0);
    std::int64_t End = ArgInt(1).value_or(Arg(1) ? INT64_MIN : -1);
    if (Start == INT64_MIN || End == INT64_MIN)
      return Unknown();
    if (!Self.Sizes)
      return reshapeLike(Call, Name, Self, std::nullopt, Start == 0 && End == -1, true);
    if (Rank == 0)
      return Self;
    auto S0 = normDim(Start, Rank), E0 = normDim(End, Rank);
    if (!S0 || !E0 || *S0 > *E0)
      return Unknown();
    if (*S0 == *E0)
      return Self;
    Shape NS;
    Mono P = Mono::constant(1);
    for (size_t I = 0; I < Rank; ++I) {
      if ((std::int64_t)I < *S0 || (std::int64_t)I > *E0)
        NS.push_back((*Self.Sizes)[I]);
      else {
        P = ST.mul(P, (*Self.Sizes)[I]);
        if ((std::int64_t)I == *E0)
          NS.push_back(P);
      }
    }
    return reshapeLike(Call, Name, Self, NS, false, true);
  }
  if (Name == "contiguous") {
    R.Assumed = false;
    if (Self.Sizes)
      setLayout(R, *Self.Sizes, contiguousStrides(ST, *Self.Sizes));
    R.Contig = TensorFact::Yes;
    R.SwapA = R.SwapB = -1;
    R.Origin.clear();
    R.OriginLoc = SourceLocation();
    return R;
  }
  if (Name == "t" || Name == "transpose") {
    std::optional<std::int64_t> A = 0, B = 1;
    if (Name == "transpose") {
      A = ArgInt(0);
      B = ArgInt(1);
    }
    if (!A || !B)
      return Unknown();
    if (Self.Sizes) {
      if (Name == "t" && Rank < 2)
        return Self;
      auto NA = normDim(A, Rank), NB = normDim(B, Rank);
      if (!NA || !NB)
        return Unknown();
      Shape Sz = *Self.Sizes, St = *Self.Strides;
      std::swap(Sz[*NA], Sz[*NB]);
      std::swap(St[*NA], St[*NB]);
      setLayout(R, Sz, St);
      Derived(Name);
      return R;
    }
    // Unknown rank: transpose(a, b) of two distinct non-negative dims of a
    // tensor taken as contiguous.
    // t() is taken as a matrix transpose (on a vector it would be a no-op).
    if (Self.Contig == TensorFact::Yes && Self.SwapA < 0 && *A >= 0 &&
        *B >= 0 && *A != *B && *A < 8 && *B < 8) {
      R.Contig = TensorFact::No;
      R.Assumed = true;
      R.SwapA = (int)std::min(*A, *B);
      R.SwapB = (int)std::max(*A, *B);
      Derived(Name);
      return R;
    }
    return Unknown();
  }
  if (Name == "permute") {
    llvm::SmallVector<const Expr *, 4> E;
    if (!intList(Arg(0), E))
      return Unknown();
    llvm::SmallVector<std::int64_t, 4> P;
    for (const Expr *X : E) {
      auto V = constInt(X, Ctx);
      if (!V)
        return Unknown();
      P.push_back(*V);
    }
    Shape Sz, St;
    if (Self.Sizes) {
      if (P.size() != Rank)
        return Unknown();
      Sz = *Self.Sizes;
      St = *Self.Strides;
    } else if (Self.Contig == TensorFact::Yes && Self.SwapA < 0 && Self.Src) {
      // The permutation names the rank: give the sizes symbols.
      for (size_t K = 0; K < P.size(); ++K)
        Sz.push_back(ST.sym(Self.Src, (std::int64_t)K + 1));
      St = contiguousStrides(ST, Sz);
    } else {
      return Unknown();
    }
    Shape NSz, NSt;
    for (std::int64_t D : P) {
      auto N = normDim(D, Sz.size());
      if (!N)
        return Unknown();
      NSz.push_back(Sz[*N]);
      NSt.push_back(St[*N]);
    }
    setLayout(R, NSz, NSt);
    Derived(Name);
    return R;
  }
  if (Name == "select" || Name == "narrow" || Name == "slice") {
    std::optional<std::int64_t> D = Name == "slice" && !Arg(0) ? std::optional<std::int64_t>(0)
                                                                : ArgInt(0);
    if (!D)
      return Unknown();
    if (!Self.Sizes) {
      // Along dim 0 of a contiguous tensor (with step 1) the result stays
      // contiguous.
      auto Step = Name == "slice" ? (Arg(3) ? ArgInt(3) : std::optional<std::int64_t>(1))
                                  : std::optional<std::int64_t>(1);
      if (*D == 0 && Step == 1 && Self.Contig == TensorFact::Yes) {
        R.Src = nullptr;
        return R;
      }
      return Unknown();
    }
    auto N = normDim(D, Rank);
    if (!N)
      return Unknown();
    Shape Sz = *Self.Sizes, St = *Self.Strides;
    if (Name == "select") {
      Sz.erase(Sz.begin() + *N);
      St.erase(St.begin() + *N);
    } else if (Name == "narrow") {
      Sz[*N] = evalInt(Arg(2), S);
    } else {
      std::int64_t Step = Arg(3) ? ArgInt(3).value_or(0) : 1;
      if (Step <= 0)
        return Unknown();
      auto Start = Arg(1) ? ArgInt(1) : std::optional<std::int64_t>(0);
      auto End = Arg(2) ? ArgInt(2) : std::optional<std::int64_t>(INT64_MAX);
      if (Start && End && Sz[*N].isConst()) {
        std::int64_t L = Sz[*N].Num, A = *Start < 0 ? *Start + L : *Start;
        std::int64_t B = *End < 0 ? *End + L : *End;
        A = std::clamp<std::int64_t>(A, 0, L);
        B = std::clamp<std::int64_t>(B, A, L);
        Sz[*N] = Mono::constant((B - A + Step - 1) / Step);
      } else {
        Sz[*N] = ST.sym(Call, 0);
      }
      St[*N] = ST.mul(St[*N], Mono::constant(Step));
    }
    setLayout(R, Sz, St);
    Derived(Name);
    return R;
  }
  if (Name == "unsqueeze" || Name == "squeeze") {
    if (!Self.Sizes) {
      if (Self.Contig == TensorFact::Yes) {
        R.Src = nullptr;
        return R;
      }
      return Unknown();
    }
    Shape Sz = *Self.Sizes, St = *Self.Strides;
    if (Name == "unsqueeze") {
      auto D = ArgInt(0);
      auto N = D ? normDim(*D < 0 ? *D + 1 : *D, Rank + 1) : std::nullopt;
      if (!N)
        return Unknown();
      Mono NewSt = (size_t)*N < Rank ? ST.mul(Sz[*N], St[*N]) : Mono::constant(1);
      Sz.insert(Sz.begin() + *N, Mono::constant(1));
      St.insert(St.begin() + *N, NewSt);
    } else if (!Arg(0)) {
      for (size_t I = Sz.size(); I-- > 0;) {
        if (!Sz[I].isConst())
          return Unknown();
        if (Sz[I].isConst(1)) {
          Sz.erase(Sz.begin() + I);
          St.erase(St.begin() + I);
        }
      }
    } else {
      auto N = normDim(ArgInt(0), Rank);
      if (!N || !Sz[*N].isConst())
        return Unknown();
      if (Sz[*N].isConst(1)) {
        Sz.erase(Sz.begin() + *N);
        St.erase(St.begin() + *N);
      }
    }
    setLayout(R, Sz, St);
    Derived(Name);
    return R;
  }
  if (Name == "expand" || Name == "expand_as") {
    std::optional<Shape> NS;
    if (Name == "expand")
      NS = shapeArg(Arg(0), S, Call, TensorFact());
    else if (Arg(0))
      NS = evalTensor(Arg(0), S).Sizes;
    if (!NS || !Self.Sizes || NS->size() < Rank)
      return Unknown();
    Shape Sz(NS->size()), St(NS->size());
    size_t Lead = NS->size() - Rank;
    for (size_t I = 0; I < NS->size(); ++I) {
      const Mono &Want = (*NS)[I];
      if (I < Lead) {
        if (Want.isConst(-1))
          return Unknown();
        Sz[I] = Want;
        St[I] = Mono::constant(0);
        continue;
      }
      const Mono &Have = (*Self.Sizes)[I - Lead];
      if (Want.isConst(-1) || ST.eq(Want, Have) == Cmp::EQ) {
        Sz[I] = Have;
        St[I] = (*Self.Strides)[I - Lead];
      } else if (Have.isConst(1)) {
        Sz[I] = Want;
        St[I] = Mono::constant(0);
      } else {
        return Unknown();
      }
    }
    setLayout(R, Sz, St);
    Derived(Name);
    return R;
  }
  if (Name == "clone") {
    // preserve_format keeps the strides of a dense tensor; an expanded one
    // comes back contiguous.
    if (Self.Strides && llvm::any_of(*Self.Strides, [](const Mono &M) { return M.isConst(0); }))
      setLayout(R, *Self.Sizes, contiguousStrides(ST, *Self.Sizes));
    if (Arg(0) && elemSizeIn(Arg(0)) == 0) {
      // clone(MemoryFormat::Contiguous) and friends.
      if (const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(Arg(0)));
          DRE && DRE->getDecl()->getName() == "Contiguous") {
        if (Self.Sizes)
          setLayout(R, *Self.Sizes, contiguousStrides(ST, *Self.Sizes));
        R.Contig = TensorFact::Yes;
        R.Assumed = false;
      } else if (Arg(0)->getType().getAsString().find("MemoryFormat") != std::string::npos) {
        return Unknown();
      }
    }
    Derived(Name);
    return R;
  }
  if (Name == "to" || Name == "cuda" || Name == "cpu" || Name == "type") {
    for (const Expr *A : Args)
      if (unsigned ES = elemSizeIn(A))
        R.ElemSize = ES;
    return R;
  }
  if (!Op)
    return Unknown();
  switch (Op->layout) {
  case sem::Layout::Same: {
    if (Op->storage == sem::Storage::Factory) { // *_like
      R.Src = nullptr;
      if (R.Strides && llvm::any_of(*R.Strides, [](const Mono &M) { return M.isConst(0); }))
        setLayout(R, *R.Sizes, contiguousStrides(ST, *R.Sizes));
      for (const Expr *A : Args)
        if (unsigned ES = elemSizeIn(A))
          R.ElemSize = ES;
      return R;
    }
    // Elementwise: the result follows self's layout when every other tensor
    // operand has the same one.
    for (const Expr *A : Args) {
      if (!Model.isTensorExpr(A))
        continue;
      TensorFact O = evalTensor(A, S);
      if (!O.Sizes || !Self.Sizes || *O.Sizes != *Self.Sizes || *O.Strides != *Self.Strides)
        return Unknown();
    }
    if (Op->storage == sem::Storage::Fresh)
      R.Src = nullptr;
    return R;
  }
  case sem::Layout::Contiguous: {
    TensorFact F;
    F.Contig = TensorFact::Yes;
    F.ElemSize = Self.ElemSize;
    return F;
  }
  default:
    return Unknown();
  }
}

TensorFact LayoutAnalysis::Impl::evalTensor(const Expr *E, State &S) {
  E = stripHandle(E);
  if (!E)
    return unknownFact();
  if (const auto *DRE = dyn_cast<DeclRefExpr>(E)) {
    const auto *VD = dyn_cast<VarDecl>(DRE->getDecl());
    if (!VD || Untracked.count(VD))
      return unknownFact();
    auto It = S.T.find(VD);
    return It != S.T.end() ? It->second : unknownFact();
  }
  if (const auto *CO = dyn_cast<ConditionalOperator>(E))
    return join(evalTensor(CO->getTrueExpr(), S), evalTensor(CO->getFalseExpr(), S));
  if (isa<MemberExpr>(E))
    return Model.isTensorExpr(E) ? assumedInput(E->IgnoreParenImpCasts()) : unknownFact();
  const auto *Call = dyn_cast<CallExpr>(E);
  if (!Call)
    return unknownFact();
  const FunctionDecl *FD = Call->getDirectCallee();
  if (!FD)
    return unknownFact();

  const Expr *SelfE = nullptr;
  llvm::SmallVector<const Expr *, 4> Args;
  llvm::StringRef Name;
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    switch (OC->getOperator()) {
    case OO_Plus: Name = "add"; break;
    case OO_Minus: Name = OC->getNumArgs() == 1 ? "neg" : "sub"; break;
    case OO_Star: Name = "mul"; break;
    case OO_Slash: Name = "div"; break;
    default: return unknownFact();
    }
    if (!OC->getNumArgs())
      return unknownFact();
    unsigned First = Model.isTensorExpr(OC->getArg(0)) ? 0 : 1;
    if (First >= OC->getNumArgs())
      return unknownFact();
    SelfE = OC->getArg(First);
    for (unsigned I = 0; I < OC->getNumArgs(); ++I)
      if (I != First)
        Args.push_back(OC->getArg(I));
  } else if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call)) {
    if (!FD->getIdentifier() || !Model.isTensorExpr(MC->getImplicitObjectArgument()))
      return Model.isTensorExpr(E) ? assumedInput(E) : unknownFact();
    Name = FD->getName();
    SelfE = MC->getImplicitObjectArgument();
    Args.append(Call->arg_begin(), Call->arg_end());
  } else {
    if (!FD->getIdentifier())
      return unknownFact();
    Name = FD->getName();
    const sem::OpInfo *Op = sem::lookup(Name);
    if (Op && isTensorOpNamespace(FD)) {
      if (Call->getNumArgs() && Model.isTensorExpr(Call->getArg(0))) {
        SelfE = Call->getArg(0);
        Args.append(Call->arg_begin() + 1, Call->arg_end());
      } else if (Op->storage == sem::Storage::Factory) {
        Args.append(Call->arg_begin(), Call->arg_end());
        return applyOp(Call, Name, Op, nullptr, Args, S);
      } else {
        return unknownFact();
      }
    } else {
      // A function we do not model: its result is taken as contiguous.
      return Model.isTensorExpr(E) ? assumedInput(E) : unknownFact();
    }
  }
  const sem::OpInfo *Op = sem::lookup(Name);
  if (!Op && !sem::isInPlaceName(Name))
    return Model.isTensorExpr(E) ? unknownFact() : unknownFact();
  if (Op && Op->storage == sem::Storage::InPlace)
    return evalTensor(SelfE, S);
  if (!Op)
    return unknownFact();
  return applyOp(Call, Name, Op, SelfE, Args, S);
}

void LayoutAnalysis::Impl::prescan(const Stmt *St) {
  if (!St)
    return;
  auto Mark = [&](const Expr *E) {
    if (const auto *DRE = dyn_cast_or_null<DeclRefExpr>(E ? E->IgnoreParenImpCasts() : nullptr))
      if (const auto *VD = dyn_cast<VarDecl>(DRE->getDecl()))
        Untracked.insert(VD);
  };
  if (const auto *UO = dyn_cast<UnaryOperator>(St); UO && UO->getOpcode() == UO_AddrOf)
    Mark(UO->getSubExpr());
  if (const auto *L = dyn_cast<LambdaExpr>(St)) {
    for (const LambdaCapture &C : L->captures())
      if (C.capturesVariable() && C.getCaptureKind() == LCK_ByRef)
        if (const auto *VD = dyn_cast<VarDecl>(C.getCapturedVar()))
          Untracked.insert(VD);
    return; // the body is analysed on its own
  }
  if (const auto *DS = dyn_cast<DeclStmt>(St))
    for (const Decl *D : DS->decls())
      if (const auto *VD = dyn_cast<VarDecl>(D); VD && VD->getType()->isReferenceType())
        Mark(VD->getInit());
  for (const Stmt *C : St->children())
    prescan(C);
}

static const VarDecl *varOf(const Expr *E) {
  if (!E)
    return nullptr;
  if (const auto *DRE = dyn_cast<DeclRefExpr>(stripHandle(E)))
    return dyn_cast<VarDecl>(DRE->getDecl());
  return nullptr;
}

void LayoutAnalysis::Impl::transfer(const Stmt *St, State &S) {
  auto SetTensor = [&](const VarDecl *V, const Expr *Init) {
    if (Untracked.count(V))
      return;
    if (Init)
      S.T[V] = evalTensor(Init, S);
    else
      S.T.erase(V);
  };
  if (const auto *DS = dyn_cast<DeclStmt>(St)) {
    for (const Decl *D : DS->decls()) {
      const auto *VD = dyn_cast<VarDecl>(D);
      if (!VD || VD->getType()->isReferenceType())
        continue;
      if (Model.isTensorType(VD->getType()))
        SetTensor(VD, VD->getInit());
      else if (VD->getType()->isIntegerType() && !Untracked.count(VD)) {
        if (VD->getInit())
          S.I[VD] = evalInt(VD->getInit(), S);
        else
          S.I.erase(VD);
      }
    }
    return;
  }
  if (const auto *BO = dyn_cast<BinaryOperator>(St)) {
    if (!BO->isAssignmentOp())
      return;
    const VarDecl *V = varOf(BO->getLHS());
    if (!V || !V->getType()->isIntegerType() || Untracked.count(V))
      return;
    if (BO->getOpcode() == BO_Assign)
      S.I[V] = evalInt(BO->getRHS(), S);
    else if (BO->getOpcode() == BO_MulAssign && S.I.count(V))
      S.I[V] = ST.mul(S.I[V], evalInt(BO->getRHS(), S));
    else
      S.I.erase(V);
    return;
  }
  if (const auto *UO = dyn_cast<UnaryOperator>(St)) {
    if (UO->isIncrementDecrementOp())
      if (const VarDecl *V = varOf(UO->getSubExpr()))
        S.I.erase(V);
    return;
  }
  const auto *Call = dyn_cast<CallExpr>(St);
  if (!Call)
    return;
  if (Recording && Model.isTensorExpr(Call))
    (void)evalTensor(Call, S);
  if (const auto *OC = dyn_cast<CXXOperatorCallExpr>(Call)) {
    if (OC->getOperator() == OO_Equal && OC->getNumArgs() == 2) {
      if (const VarDecl *V = varOf(OC->getArg(0)); V && Model.isTensorType(V->getType()) &&
                                                   isa<DeclRefExpr>(OC->getArg(0)->IgnoreParenImpCasts())) {
        SetTensor(V, OC->getArg(1));
        return;
      }
    }
  }
  const FunctionDecl *FD = Call->getDirectCallee();
  // In-place ops that change the layout (t_, transpose_, resize_, set_...)
  // are not in the table as InPlace with layout Same: forget the handle.
  if (const auto *MC = dyn_cast<CXXMemberCallExpr>(Call)) {
    if (const VarDecl *V = varOf(MC->getImplicitObjectArgument());
        V && FD && FD->getIdentifier() && Model.isTensorType(V->getType())) {
      const sem::OpInfo *Op = sem::lookup(FD->getName());
      bool Keeps = Op && Op->layout == sem::Layout::Same &&
                   (Op->storage == sem::Storage::InPlace || Op->storage == sem::Storage::None);
      if (!Keeps && sem::isInPlaceName(FD->getName()))
        S.T.erase(V);
      if (FD->getName() == "swap" || (!FD->getIdentifier()))
        S.T.erase(V);
    }
  }
  // Arguments bound to non-const references (or moved from) may change.
  if (FD) {
    unsigned Shift = isa<CXXOperatorCallExpr>(Call) && isa<CXXMethodDecl>(FD) ? 1 : 0;
    for (unsigned I = 0; I < Call->getNumArgs(); ++I) {
      const VarDecl *V = varOf(Call->getArg(I));
      if (!V)
        continue;
      QualType PT;
      if (I >= Shift && I - Shift < FD->getNumParams())
        PT = FD->getParamDecl(I - Shift)->getType();
      bool Writes = PT.isNull() ? false
                                : (PT->isReferenceType() &&
                                   (!PT->getPointeeType().isConstQualified() ||
                                    PT->isRValueReferenceType()));
      if (Writes) {
        S.T.erase(V);
        S.I.erase(V);
      }
    }
  }
}

void LayoutAnalysis::Impl::run(const FunctionDecl *FD) {
  Stmt *Body = FD->getBody();
  if (!Body)
    return;
  prescan(Body);
  CFG::BuildOptions Opts;
  Opts.setAllAlwaysAdd();
  std::unique_ptr<CFG> G = CFG::buildCFG(FD, Body, &Ctx, Opts);
  if (!G)
    return;

  State Entry;
  for (const ParmVarDecl *P : FD->parameters()) {
    if (Untracked.count(P))
      continue;
    if (Model.isTensorType(P->getType()))
      Entry.T[P] = assumedInput(P);
    else if (P->getType()->isIntegerType())
      Entry.I[P] = ST.sym(P, 0);
  }

  unsigned N = G->getNumBlockIDs();
  std::vector<std::optional<State>> Out(N);
  std::vector<unsigned> Visits(N, 0);
  std::deque<const CFGBlock *> Work;
  llvm::BitVector Queued(N);
  auto InOf = [&](const CFGBlock *B) -> std::optional<State> {
    if (B == &G->getEntry())
      return Entry;
    std::optional<State> In;
    for (const CFGBlock *P : B->preds()) {
      if (!P || !Out[P->getBlockID()])
        continue;
      if (!In)
        In = *Out[P->getBlockID()];
      else
        In->joinWith(*Out[P->getBlockID()]);
    }
    return In;
  };
  auto Transfer = [&](const CFGBlock *B, State &S) {
    for (const CFGElement &El : *B)
      if (auto CS = El.getAs<CFGStmt>())
        transfer(CS->getStmt(), S);
  };

  Work.push_back(&G->getEntry());
  Queued.set(G->getEntry().getBlockID());
  while (!Work.empty()) {
    const CFGBlock *B = Work.front();
    Work.pop_front();
    Queued.reset(B->getBlockID());
    std::optional<State> In = InOf(B);
    if (!In)
      continue;
    State S = std::move(*In);
    if (++Visits[B->getBlockID()] > 12) {
      S.T.clear(); // give up on this block: nothing known
      S.I.clear();
    }
    Transfer(B, S);
    auto &O = Out[B->getBlockID()];
    if (O && *O == S)
      continue;
    O = std::move(S);
    for (const CFGBlock *Succ : B->succs())
      if (Succ && !Queued.test(Succ->getBlockID())) {
        Queued.set(Succ->getBlockID());
        Work.push_back(Succ);
      }
  }

  // Record what the checks ask about, at the fixpoint.
  Recording = true;
  for (const CFGBlock *B : *G) {
    std::optional<State> In = InOf(B);
    if (!In)
      continue;
    Transfer(B, *In);
  }
  Recording = false;
}

LayoutAnalysis::LayoutAnalysis(const TensorModel &Model, ASTContext &Ctx)
    : P(std::make_unique<Impl>(Model, Ctx)) {}
LayoutAnalysis::~LayoutAnalysis() = default;

void LayoutAnalysis::run(const FunctionDecl *FD) { P->run(FD); }

const TensorFact *LayoutAnalysis::factOf(const Expr *E) const {
  auto It = P->Facts.find(E);
  return It == P->Facts.end() ? nullptr : &It->second;
}

const ViewQuery *LayoutAnalysis::queryOf(const CallExpr *Call) const {
  auto It = P->Queries.find(Call);
  return It == P->Queries.end() ? nullptr : &It->second;
}

std::string LayoutAnalysis::formatShape(llvm::ArrayRef<Mono> Sizes) {
  std::string R = "[";
  for (size_t I = 0; I < Sizes.size(); ++I) {
    if (!Sizes[I].isConst())
      return "";
    R += (I ? ", " : "") + std::to_string(Sizes[I].Num);
  }
  return R + "]";
}

std::string LayoutAnalysis::formatBytes(std::int64_t Bytes) {
  char Buf[64];
  if (Bytes < 1024)
    std::snprintf(Buf, sizeof Buf, "%" PRId64 " bytes", Bytes);
  else if (Bytes < (1 << 20))
    std::snprintf(Buf, sizeof Buf, "%.1f KiB", Bytes / 1024.0);
  else if (Bytes < (1LL << 30))
    std::snprintf(Buf, sizeof Buf, "%.1f MiB", Bytes / 1048576.0);
  else
    std::snprintf(Buf, sizeof Buf, "%.1f GiB", Bytes / 1073741824.0);
  return Buf;
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

bool inTemplateInstantiation(const Stmt *S, ASTContext &Ctx) {
  for (const FunctionDecl *FD = enclosingFunction(S, Ctx); FD;) {
    if (FD->isTemplateInstantiation())
      return true;
    const auto *MD = dyn_cast<CXXMethodDecl>(FD);
    if (!MD || !MD->getParent()->isLambda())
      return false;
    // A lambda: look at the function it is written in.
    const auto *L = MD->getParent();
    DynTypedNodeList Ps = Ctx.getParents(*L);
    const Stmt *Outer = nullptr;
    for (; !Ps.empty(); Ps = Ctx.getParents(Ps[0]))
      if ((Outer = Ps[0].get<LambdaExpr>()))
        break;
    FD = Outer ? enclosingFunction(Outer, Ctx) : nullptr;
  }
  return false;
}

const LayoutAnalysis *LayoutCache::forExpr(const Expr *E, ASTContext &Ctx) {
  const FunctionDecl *FD = enclosingFunction(E, Ctx);
  if (!FD || !FD->hasBody())
    return nullptr;
  auto &Slot = Map[FD];
  if (!Slot) {
    Slot = std::make_unique<LayoutAnalysis>(Model, Ctx);
    Slot->run(FD);
  }
  return Slot.get();
}

} // namespace clang::tidy::tensor
