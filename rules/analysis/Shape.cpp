#include "analysis/Shape.h"

#include "llvm/ADT/STLExtras.h"

#include <cstdlib>

namespace clang::tidy::tensor {

//===----------------------------------------------------------------------===//
// SymTable
//===----------------------------------------------------------------------===//

Mono SymTable::sym(const void *K, std::int64_t I) {
  auto [It, New] = Keys.try_emplace({K, I}, Next);
  if (New) {
    ++Next;
    Source.push_back({K, I});
  }
  Mono M;
  M.Pow.push_back({It->second, 1});
  return M;
}

bool SymTable::oneSource(const Mono &A, const Mono &B) const {
  const Mono Q = div(norm(A), norm(B));
  if (Q.Top || Q.Num != Q.Den)
    return false;
  const void *K = nullptr;
  for (const Mono &M : {norm(A), norm(B)}) {
    for (auto [S, E] : M.Pow) {
      if (K && Source[S].first != K)
        return false;
      K = Source[S].first;
    }
  }
  return K != nullptr;
}

Mono SymTable::product(llvm::ArrayRef<Mono> V) const {
  Mono P = Mono::constant(1);
  for (const Mono &M : V)
    P = mul(P, M);
  return P;
}

static bool isSize(const Mono &Q) {
  return !Q.Top && Q.Den == 1 && Q.Num > 0 &&
         llvm::all_of(Q.Pow, [](auto P) { return P.second > 0; });
}

std::optional<Mono> SymTable::exactQuotient(const Mono &A, const Mono &B) const {
  Mono Q = div(norm(A), norm(B));
  if (!isSize(Q))
    return std::nullopt;
  return Q;
}

Mono SymTable::divSize(const Mono &A, const Mono &B, const void *Key) {
  Mono NA = norm(A), NB = norm(B);
  Mono Q = div(NA, NB);
  if (Q.Top || (Q.Den == 1 && llvm::all_of(Q.Pow, [](auto P) { return P.second > 0; })))
    return Q;
  bool OneSymbol = NA.Num == 1 && NA.Den == 1 && NA.Pow.size() == 1 && NA.Pow[0].second == 1 &&
                   !Subst.count(NA.Pow[0].first);
  bool Disjoint = !llvm::any_of(NB.Pow, [&](auto P) { return P.first == NA.Pow[0].first; });
  if (OneSymbol && Disjoint && NB.Den == 1 && NB.Num > 0) {
    Mono H = sym(Key, -7);
    Subst[NA.Pow[0].first] = mul(NB, H);
    return H;
  }
  return Q;
}

void SymTable::identify(const void *K, std::int64_t I, const Mono &M) {
  const unsigned S = sym(K, I).Pow[0].first;
  auto Mentions = [&](auto P) { return P.first == S; };
  if (!M.Top && !Subst.count(S) && llvm::none_of(norm(M).Pow, Mentions))
    Subst[S] = M;
}

Mono SymTable::import(const Mono &M, const void *Key, const SymTable &From, BindFn Bind) {
  if (M.Top)
    return M;
  Mono R = Mono::constant(M.Num);
  R.Den = M.Den;
  for (auto [S, E] : M.Pow) {
    auto [K, I] = From.keyOf(S);
    std::optional<Mono> Bound = Bind(K, I);
    Mono F = Bound ? *Bound : sym(Key, S);
    for (int I = 0; I < std::abs(E); ++I)
      R = E > 0 ? mul(R, F) : div(R, F);
  }
  return R;
}

Mono SymTable::norm(const Mono &M) const {
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

Cmp SymTable::eq(const Mono &A, const Mono &B) const {
  if (A.Top || B.Top)
    return Cmp::Unknown;
  return norm(A) == norm(B) ? Cmp::EQ : Cmp::NE;
}

Cmp SymTable::cmp(const Mono &A, const Mono &B) const {
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

static __int128 gcd128(__int128 A, __int128 B) {
  while (B) {
    __int128 T = A % B;
    A = B;
    B = T;
  }
  return A;
}

Mono SymTable::top() {
  Mono M;
  M.Top = true;
  return M;
}

Mono SymTable::combine(const Mono &A, const Mono &B, int Sign) {
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

//===----------------------------------------------------------------------===//
// Layout rules
//===----------------------------------------------------------------------===//

Shape contiguousStrides(const SymTable &ST, llvm::ArrayRef<Mono> Sizes) {
  Shape St(Sizes.size());
  Mono Acc = Mono::constant(1);
  for (size_t I = Sizes.size(); I-- > 0;) {
    St[I] = Acc;
    Acc = Sizes[I].isConst(0) ? Acc : ST.mul(Acc, Sizes[I]);
  }
  return St;
}

Contig contigOf(const SymTable &ST, llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides) {
  if (llvm::any_of(Sizes, [](const Mono &M) { return M.isConst(0); }))
    return Contig::Yes;
  Mono Expected = Mono::constant(1);
  for (size_t I = Sizes.size(); I-- > 0;) {
    if (Sizes[I].isConst(1))
      continue;
    Cmp C = ST.eq(Strides[I], Expected);
    if (C == Cmp::Unknown)
      return Contig::Unknown;
    if (C == Cmp::NE)
      return Contig::No;
    Expected = ST.mul(Expected, Sizes[I]);
  }
  return Contig::Yes;
}

static bool isOne(const Mono &M) { return M.isConst(1); }

// Consume new dims (from the back) for the chunk of TensorNumel elements.
// PyTorch takes them while their product is below the chunk's (and any size-1
// dims after): the chunk matches iff a product equals it. With every symbol
// > 1 the products grow strictly, so equality decides where the order of two
// sizes of one tensor is unknown (`[B, C, T]` transposed and viewed as
// `[-1, C]`, at rank 4 too); a size from elsewhere may equal any of them.
static Cmp takeNewDims(const SymTable &ST, llvm::ArrayRef<Mono> NewShape, int64_t &ViewD,
                       Mono &ViewNumel, const Mono &TensorNumel, const Mono &ChunkBase,
                       Shape &NewStride) {
  auto Take = [&] {
    NewStride[ViewD] = ST.mul(ViewNumel, ChunkBase);
    ViewNumel = ST.mul(ViewNumel, NewShape[ViewD]);
    --ViewD;
  };
  for (;;) {
    Cmp C = ST.eq(ViewNumel, TensorNumel);
    if (C == Cmp::Unknown)
      return Cmp::Unknown;
    if (C == Cmp::EQ)
      break;
    Cmp Order = ViewD < 0 ? Cmp::GT : ST.cmp(ViewNumel, TensorNumel);
    if (Order == Cmp::Unknown && !ST.oneSource(ViewNumel, TensorNumel))
      return Cmp::Unknown;
    if (Order == Cmp::GT)
      return Cmp::NE;
    Take();
  }
  while (ViewD >= 0 && isOne(NewShape[ViewD]))
    Take();
  return Cmp::EQ;
}

Viewability computeStride(const SymTable &ST, llvm::ArrayRef<Mono> OldShape,
                          llvm::ArrayRef<Mono> OldStride, llvm::ArrayRef<Mono> NewShape,
                          Shape &NewStride) {
  NewStride.assign(NewShape.size(), Mono::constant(1));
  if (OldShape.empty())
    return Viewability::Viewable;
  if (ST.product(OldShape).isConst(0)) {
    if (OldShape.equals(NewShape))
      NewStride.assign(OldStride.begin(), OldStride.end());
    else
      NewStride = contiguousStrides(ST, NewShape);
    return Viewability::Viewable;
  }
  int64_t ViewD = (int64_t)NewShape.size() - 1;
  Mono ChunkBase = OldStride.back();
  Mono TensorNumel = Mono::constant(1), ViewNumel = Mono::constant(1);
  for (int64_t TD = (int64_t)OldShape.size() - 1; TD >= 0; --TD) {
    TensorNumel = ST.mul(TensorNumel, OldShape[TD]);
    bool Boundary = TD == 0;
    if (!Boundary && !isOne(OldShape[TD - 1])) {
      Cmp C = ST.eq(OldStride[TD - 1], ST.mul(TensorNumel, ChunkBase));
      if (C == Cmp::Unknown)
        return Viewability::Unknown;
      Boundary = C == Cmp::NE;
    }
    if (!Boundary)
      continue;
    Cmp C = takeNewDims(ST, NewShape, ViewD, ViewNumel, TensorNumel, ChunkBase, NewStride);
    if (C == Cmp::Unknown)
      return Viewability::Unknown;
    if (C == Cmp::NE)
      return Viewability::NotViewable;
    if (TD > 0) {
      ChunkBase = OldStride[TD - 1];
      TensorNumel = Mono::constant(1);
      ViewNumel = Mono::constant(1);
    }
  }
  return ViewD == -1 ? Viewability::Viewable : Viewability::NotViewable;
}

int countChunks(const SymTable &ST, llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides) {
  int Chunks = 0;
  bool OpenHasSize = false; // the chunk being scanned has a dim of size > 1
  const Mono *Prev = nullptr, *PrevStride = nullptr;
  for (size_t I = Sizes.size(); I-- > 0;) {
    if (isOne(Sizes[I]))
      continue;
    if (Sizes[I].isConst(0))
      return 0;
    if (Prev) {
      Cmp C = ST.eq(Strides[I], ST.mul(*Prev, *PrevStride));
      if (C == Cmp::Unknown)
        return -1;
      if (C == Cmp::NE) {
        Chunks += OpenHasSize;
        OpenHasSize = false;
      }
    }
    OpenHasSize = true;
    Prev = &Sizes[I];
    PrevStride = &Strides[I];
  }
  return Chunks + OpenHasSize;
}

int countNonUnit(llvm::ArrayRef<Mono> Sizes) {
  return (int)llvm::count_if(Sizes, [](const Mono &M) { return !isOne(M); });
}

int chunksAfterSwap(int A, int B) { return (A > 0) + 1 + (B > A + 1) + 1; }

} // namespace clang::tidy::tensor
