// Symbolic tensor shapes: sizes and strides as monomials over run-time
// symbols, and PyTorch's layout rules on them (contiguity, computeStride).
// Pure: no clang AST, unit-tested on its own (test/unit/analysis).
//
// Note [Generic symbols]
// A symbol stands for a run-time size (`x.size(0)`, a parameter, a field).
// Every symbol is taken as > 1, the default nearly all real tensors satisfy:
// comparisons are structural ("generic"), so a layout decided on symbols holds
// unless a dimension the code does not show turns out to have size 1. Callers
// say so in their messages.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>

namespace clang::tidy::tensor {

/// A product of a rational constant and integer powers of symbols: a tensor
/// size or stride. Symbols stand for run-time values, assumed > 1 ("generic").
struct Mono {
  std::int64_t Num = 1, Den = 1;
  llvm::SmallVector<std::pair<unsigned, int>, 2> Pow; // sorted by symbol
  bool Top = false;                                   // overflow: unusable

  static Mono constant(std::int64_t V) {
    Mono M;
    M.Num = V;
    return M;
  }
  bool isConst() const { return !Top && Pow.empty() && Den == 1; }
  bool isConst(std::int64_t V) const { return isConst() && Num == V; }
  bool operator==(const Mono &O) const {
    return Top == O.Top && Num == O.Num && Den == O.Den && Pow == O.Pow;
  }
  bool operator!=(const Mono &O) const { return !(*this == O); }
};

using Shape = llvm::SmallVector<Mono, 4>;

enum class Cmp { LT, EQ, GT, NE, Unknown };

/// Symbols keyed by (identity, index), with refinements `S = B * H` learnt
/// from divisions (`C / nh` is a size, so C is a multiple of nh).
class SymTable {
public:
  Mono sym(const void *K, std::int64_t I);
  Mono mul(const Mono &A, const Mono &B) const { return combine(A, B, 1); }
  Mono div(const Mono &A, const Mono &B) const { return combine(A, B, -1); }
  Mono product(llvm::ArrayRef<Mono> V) const;
  /// A / B for a size: when B does not divide A and A is one run-time symbol
  /// S, S is refined to B * H with H fresh (keyed by Key).
  Mono divSize(const Mono &A, const Mono &B, const void *Key);
  /// The symbol (K, I) stands for M (a stacked tensor's dim is its
  /// element's); a symbol already refined keeps its refinement.
  void identify(const void *K, std::int64_t I, const Mono &M);
  /// A / B when it is a size (a positive monomial), without refining.
  std::optional<Mono> exactQuotient(const Mono &A, const Mono &B) const;
  Mono norm(const Mono &M) const;
  /// The identity and index symbol S was made for.
  std::pair<const void *, std::int64_t> keyOf(unsigned S) const { return Source[S]; }
  /// What a callee's symbol (identity, index) is at a call site, if bound.
  using BindFn = llvm::function_ref<std::optional<Mono>(const void *, std::int64_t)>;
  /// M, normalised in table From, with each of its symbols S replaced by what
  /// Bind gives for S's key, else by this table's symbol (Key, S): a callee's
  /// sizes in terms of its arguments', the rest as fresh caller symbols.
  Mono import(const Mono &M, const void *Key, const SymTable &From, BindFn Bind);
  /// Equality: exact for constants, structural (generic) otherwise.
  Cmp eq(const Mono &A, const Mono &B) const;
  /// Order, assuming every symbol is > 1.
  Cmp cmp(const Mono &A, const Mono &B) const;
  /// A / B is a product of symbols of one identity, without a constant
  /// factor: sizes of one tensor, taken as different from each other unless
  /// the code relates them. A symbol from elsewhere (a parameter) may equal
  /// any of them, and a size may equal a constant (3 channels).
  bool oneSource(const Mono &A, const Mono &B) const;

private:
  static Mono combine(const Mono &A, const Mono &B, int Sign);
  static Mono top();

  llvm::DenseMap<std::pair<const void *, std::int64_t>, unsigned> Keys;
  llvm::DenseMap<unsigned, Mono> Subst;
  llvm::SmallVector<std::pair<const void *, std::int64_t>, 16> Source; // each symbol's key
  unsigned Next = 0;
};

enum class Contig : std::uint8_t { Unknown, Yes, No };
enum class Viewability : std::uint8_t { Unknown, Viewable, NotViewable };

/// Row-major strides of a contiguous tensor of these sizes (PyTorch's rule:
/// a size-0 dimension counts as 1 for the strides before it).
Shape contiguousStrides(const SymTable &ST, llvm::ArrayRef<Mono> Sizes);

/// c10's TensorImpl::compute_contiguous, generically.
Contig contigOf(const SymTable &ST, llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides);

/// at::detail::computeStride (aten/src/ATen/TensorUtils.cpp): can a tensor of
/// OldShape/OldStride be viewed as NewShape, and with which strides. Unknown
/// when a comparison on symbols cannot be decided.
Viewability computeStride(const SymTable &ST, llvm::ArrayRef<Mono> OldShape,
                          llvm::ArrayRef<Mono> OldStride, llvm::ArrayRef<Mono> NewShape,
                          Shape &NewStride);

/// The number of maximal runs of dimensions that a view can merge (the
/// "contiguous subspaces" of PyTorch's error), counting only runs whose
/// sizes are not all 1. Unknown (-1) when a boundary cannot be decided.
int countChunks(const SymTable &ST, llvm::ArrayRef<Mono> Sizes, llvm::ArrayRef<Mono> Strides);

/// Dimensions of a new shape that are not the constant 1 (symbols are > 1).
int countNonUnit(llvm::ArrayRef<Mono> Sizes);

/// A view must cover each chunk of size > 1 with at least one dimension of
/// its own: fewer non-unit new dimensions than chunks can never be a view
/// (under Note [Generic symbols]).
inline bool tooFewDimsForChunks(int Chunks, llvm::ArrayRef<Mono> NewShape) {
  return Chunks > 0 && countNonUnit(NewShape) < Chunks;
}

/// Chunks of a contiguous tensor of unknown rank after swapping dims A < B:
/// at its smallest rank (B + 1), every dim from A to B is its own chunk or
/// closes one, and dims before A form one more.
int chunksAfterSwap(int A, int B);

} // namespace clang::tidy::tensor
