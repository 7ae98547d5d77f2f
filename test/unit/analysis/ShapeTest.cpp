// The shape rules the layout analysis decides views with, against what
// PyTorch 1.13 does (each case's comment names the PyTorch result).
#include "analysis/Shape.h"

#include <gtest/gtest.h>

using namespace clang::tidy::tensor;

namespace {

Shape consts(std::initializer_list<std::int64_t> V) {
  Shape S;
  for (std::int64_t X : V)
    S.push_back(Mono::constant(X));
  return S;
}

struct Syms {
  SymTable ST;
  int Key = 0;
  Mono operator()(std::int64_t I) { return ST.sym(&Key, I); }
};

Viewability view(const SymTable &ST, const Shape &Sz, const Shape &St, const Shape &New) {
  Shape NewStride;
  return computeStride(ST, Sz, St, New, NewStride);
}

} // namespace

TEST(Shape, ContiguousStridesAndContiguity) {
  SymTable ST;
  Shape Sz = consts({2, 3, 4});
  EXPECT_EQ(contiguousStrides(ST, Sz), consts({12, 4, 1}));
  EXPECT_EQ(contigOf(ST, Sz, consts({12, 4, 1})), Contig::Yes);
  EXPECT_EQ(contigOf(ST, consts({3, 2}), consts({1, 3})), Contig::No);  // randn(2,3).t()
  EXPECT_EQ(contigOf(ST, consts({1, 5}), consts({1, 1})), Contig::Yes); // size-1 dims ignored
  EXPECT_EQ(contigOf(ST, consts({0, 5}), consts({1, 7})), Contig::Yes); // empty
}

TEST(Shape, ComputeStrideConstants) {
  SymTable ST;
  // randn(4,3).t().view(12): throws.
  EXPECT_EQ(view(ST, consts({3, 4}), consts({1, 3}), consts({12})), Viewability::NotViewable);
  // randn(2,3,4).permute(2,0,1).view(4,6): a view (keeps the permuted dims apart).
  EXPECT_EQ(view(ST, consts({4, 2, 3}), consts({1, 12, 4}), consts({4, 6})), Viewability::Viewable);
  // randn(4,6).t().view(2,3,4): splits a dim only.
  EXPECT_EQ(view(ST, consts({6, 4}), consts({1, 6}), consts({2, 3, 4})), Viewability::Viewable);
  // randn(4,4)[:, ::2].view(8): evenly strided, one chunk.
  EXPECT_EQ(view(ST, consts({4, 2}), consts({4, 2}), consts({8})), Viewability::Viewable);
}

TEST(Shape, ComputeStrideSymbols) {
  Syms S;
  Mono B = S(1), T = S(2), NH = S(3), H = S(4);
  Shape Sz{B, T, NH, H};
  Shape St = contiguousStrides(S.ST, Sz);
  // x.view(B,T,nh,hs).transpose(1,2): merging heads throws for sizes > 1.
  Shape TSz{B, NH, T, H}, TSt{St[0], St[2], St[1], St[3]};
  EXPECT_EQ(view(S.ST, TSz, TSt, {B, NH, S.ST.mul(T, H)}), Viewability::NotViewable);
  EXPECT_EQ(view(S.ST, TSz, TSt, {B, NH, T, H}), Viewability::Viewable);
  // Sizes from elsewhere (parameters): undecidable.
  int Elsewhere = 0;
  Mono P = S.ST.sym(&Elsewhere, 1), Q = S.ST.sym(&Elsewhere, 2);
  EXPECT_EQ(view(S.ST, TSz, TSt, {P, Q}), Viewability::Unknown);
  EXPECT_EQ(view(S.ST, TSz, TSt, {S.ST.mul(B, S.ST.mul(T, NH)), P}), Viewability::Unknown);
  // The tensor's own sizes, whose order is unknown: x.transpose(1, 2) of a
  // 4-D x viewed as [-1, x.size(1)] throws (NH is neither H nor T*H).
  EXPECT_EQ(view(S.ST, TSz, TSt, {S.ST.mul(B, S.ST.mul(T, H)), NH}), Viewability::NotViewable);
  // A size may equal a constant: [H, W, C] permuted to [C, H, W] and
  // reshaped to [3, -1] is a view when C is 3.
  Shape PSz{NH, B, T}, PSt{Mono::constant(1), S.ST.mul(T, NH), NH};
  Mono Rest = S.ST.div(S.ST.mul(B, S.ST.mul(T, NH)), Mono::constant(3));
  EXPECT_EQ(view(S.ST, PSz, PSt, {Mono::constant(3), Rest}), Viewability::Unknown);
  // ... and [-1, H] keeps the last dim: merging B, NH, T still throws.
  EXPECT_EQ(view(S.ST, TSz, TSt, {S.ST.mul(B, S.ST.mul(NH, T)), H}), Viewability::NotViewable);
}

TEST(Shape, Chunks) {
  Syms S;
  Mono A = S(1), B = S(2), C = S(3);
  Shape Sz{A, B, C};
  Shape St = contiguousStrides(S.ST, Sz);
  EXPECT_EQ(countChunks(S.ST, Sz, St), 1);
  // transpose(1, 2): [A][C][B], three chunks.
  EXPECT_EQ(countChunks(S.ST, {A, C, B}, {St[0], St[2], St[1]}), 3);
  // A size-1 dim is no chunk of its own.
  EXPECT_EQ(countChunks(S.ST, consts({1, 5}), consts({1, 1})), 1);
  EXPECT_TRUE(tooFewDimsForChunks(3, {S(7), S(8)}));
  EXPECT_FALSE(tooFewDimsForChunks(3, {S(7), S(8), S(9)}));
  EXPECT_FALSE(tooFewDimsForChunks(3, {S(7), Mono::constant(1), S(8), S(9)}));
  EXPECT_EQ(chunksAfterSwap(0, 1), 2);
  EXPECT_EQ(chunksAfterSwap(1, 2), 3);
  EXPECT_EQ(chunksAfterSwap(1, 3), 4);
}

TEST(Shape, Division) {
  Syms S;
  Mono C = S(1), NH = S(2);
  // C / nh is a size: C is refined to nh * H, so nh * (C / nh) == C.
  Mono H = S.ST.divSize(C, NH, &S.Key);
  EXPECT_EQ(S.ST.eq(S.ST.mul(NH, H), C), Cmp::EQ);
  EXPECT_FALSE(S.ST.exactQuotient(NH, C).has_value());
  EXPECT_EQ(S.ST.cmp(NH, S.ST.mul(NH, H)), Cmp::LT); // symbols > 1
}

TEST(Shape, ImportKeepsRelationsWithFreshSymbols) {
  Syms Callee, Caller;
  Mono A = Callee(1), B = Callee(2);
  Mono Stride = Callee.ST.mul(A, B); // a stride made of two sizes
  int Call1 = 0, Call2 = 0;
  auto NoBind = [](const void *, std::int64_t) -> std::optional<Mono> { return std::nullopt; };
  auto Import = [&](const Mono &M, int &Call) { return Caller.ST.import(M, &Call, Callee.ST, NoBind); };
  Mono IA = Import(A, Call1), IB = Import(B, Call1);
  Mono IS = Import(Stride, Call1);
  EXPECT_EQ(Caller.ST.eq(Caller.ST.mul(IA, IB), IS), Cmp::EQ);
  // Another call's sizes are other symbols, and none is a caller's own.
  EXPECT_EQ(Caller.ST.eq(Import(A, Call2), IA), Cmp::NE);
  EXPECT_EQ(Caller.ST.eq(IA, Caller(1)), Cmp::NE);
  EXPECT_EQ(Import(Mono::constant(6), Call1), Mono::constant(6));
}

TEST(Shape, ImportBindsCalleeSymbolsToTheCallSite) {
  Syms Callee, Caller;
  Mono A = Callee(1), B = Callee(2);
  int Call = 0;
  // The callee's symbol (Key, 1) is its parameter's size: the argument's at the call.
  Mono Arg = Caller(7);
  auto Bind = [&](const void *K, std::int64_t I) -> std::optional<Mono> {
    return K == &Callee.Key && I == 1 ? std::optional<Mono>(Arg) : std::nullopt;
  };
  Mono IS = Caller.ST.import(Callee.ST.mul(A, B), &Call, Callee.ST, Bind);
  Mono IB = Caller.ST.import(B, &Call, Callee.ST, Bind);
  EXPECT_EQ(Caller.ST.eq(IS, Caller.ST.mul(Arg, IB)), Cmp::EQ);
  EXPECT_EQ(Caller.ST.eq(IB, Arg), Cmp::NE);
}
