// Layout (shape / stride / contiguity) analysis: flow-sensitive over the clang
// CFG of one function body. Tracks, per local tensor handle and per local
// integer, what is known about sizes and strides, symbolically when they come
// from run-time values, and decides with PyTorch's own rule (computeStride)
// whether a view/reshape can alias its input. Layout sources come only from the
// op table (tt/ops.def); ops it models precisely refine the table by arguments.
#pragma once

#include "analysis/TensorModel.h"

#include "clang/AST/Decl.h"
#include "clang/AST/Expr.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

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

/// What is known about one tensor value.
struct TensorFact {
  enum ContigKind : std::uint8_t { Unknown, Yes, No };
  ContigKind Contig = Unknown;
  /// The fact relies on a guess: an input of unknown layout taken as
  /// contiguous, or run-time sizes taken as > 1. Never an error then.
  bool Assumed = false;
  /// Sizes and strides, when the rank is known.
  std::optional<llvm::SmallVector<Mono, 4>> Sizes, Strides;
  /// Element size in bytes, when the dtype is known.
  unsigned ElemSize = 0;
  /// Unknown rank: the (normalised) dims a transpose swapped on a tensor taken
  /// as contiguous; -1 when none.
  int SwapA = -1, SwapB = -1;
  /// Identity of the value the sizes of an unknown-rank tensor belong to.
  const void *Src = nullptr;
  /// The op that made it non-contiguous (for messages) and where.
  std::string Origin;
  SourceLocation OriginLoc;

  bool hasShape() const { return Sizes.has_value(); }
  bool operator==(const TensorFact &O) const;
};

/// Whether a view/reshape of a tensor to a new shape can alias it.
struct ViewQuery {
  enum Kind : std::uint8_t { Unknown, Viewable, NotViewable };
  Kind Result = Unknown;
  /// Decided from concrete sizes and a known input: holds on every run.
  bool Certain = false;
  /// Bytes a copy of the input takes, when sizes and dtype are concrete.
  std::optional<std::int64_t> Bytes;
  /// The input's fact and the requested shape (when known).
  TensorFact Input;
  std::optional<llvm::SmallVector<Mono, 4>> NewSizes;
};

class SymTable;

class LayoutAnalysis {
public:
  LayoutAnalysis(const TensorModel &Model, ASTContext &Ctx);
  ~LayoutAnalysis();

  /// Analyses the body of a function (or a lambda's call operator).
  void run(const FunctionDecl *FD);

  /// The fact about a tensor expression that is the object (or first
  /// argument) of a recorded call, at that program point; null if unknown.
  const TensorFact *factOf(const Expr *E) const;
  /// For view, view_as, reshape, reshape_as and flatten calls: can the result alias.
  const ViewQuery *queryOf(const CallExpr *Call) const;

  /// Text for a byte count: "512 bytes", "3.0 KiB", "4.0 MiB", "1.5 GiB".
  static std::string formatBytes(std::int64_t Bytes);
  /// "[2, 3]" when every size is a constant, else "".
  static std::string formatShape(llvm::ArrayRef<Mono> Sizes);

  struct State;

private:
  class Impl;
  std::unique_ptr<Impl> P;
};

/// Lazily analysed functions, for checks that ask about calls inside them.
class LayoutCache {
public:
  LayoutCache(const TensorModel &Model) : Model(Model) {}
  /// The analysis of the function or lambda enclosing E (null if none).
  const LayoutAnalysis *forExpr(const Expr *E, ASTContext &Ctx);
  void clear() { Map.clear(); }

private:
  const TensorModel &Model;
  llvm::DenseMap<const Decl *, std::unique_ptr<LayoutAnalysis>> Map;
};

/// E without the implicit nodes around a tensor value (casts, temporaries,
/// handle copy/move construction).
const Expr *stripHandle(const Expr *E);

/// The function or lambda call operator whose body contains S (null if none).
const FunctionDecl *enclosingFunction(const Stmt *S, ASTContext &Ctx);

/// S is in code instantiated from a template: a fix-it there would edit the
/// template for every instantiation (the pattern itself is checked too).
bool inTemplateInstantiation(const Stmt *S, ASTContext &Ctx);

} // namespace clang::tidy::tensor
