// The overlap of an in-place op's output and an input, from their layout
// facts, as at::get_overlap_status (aten/src/ATen/MemoryOverlap.cpp) decides
// it at run time: only two non-overlapping, dense tensors of one storage are
// compared (Partial when their spans intersect without being the same
// elements in the same order); anything else is TooHard, and PyTorch runs
// the op with a result that depends on the order elements are written in.
#include "analysis/LayoutAnalysis.h"

#include <optional>

namespace clang::tidy::tensor {

namespace {

using Bound = TensorFact::Bound;

// A < B for two slice bounds. Under Note [Generic symbols] a run-time size
// exceeds every constant the code slices with; two different sizes are not
// compared.
std::optional<bool> lessThan(const Bound &A, const Bound &B) {
  if (A.Base == B.Base)
    return A.Off < B.Off;
  if (A.Base.isConst() != B.Base.isConst())
    return B.Base.isConst() == false;
  return std::nullopt;
}

// Whole views of one dense storage: the same layout is the same elements in
// the same order; another permutation of them overlaps partially.
OverlapQuery::Kind wholeViews(const TensorFact &A, const TensorFact &B) {
  if (A.Strides && B.Strides)
    return *A.Strides == *B.Strides ? OverlapQuery::Full : OverlapQuery::Partial;
  if (A.Sizes || B.Sizes || A.Contig == TensorFact::Unknown || B.Contig == TensorFact::Unknown)
    return OverlapQuery::Unknown;
  return A.SwapA == B.SwapA && A.SwapB == B.SwapB ? OverlapQuery::Full : OverlapQuery::Partial;
}

// Out is a whole tensor and In a slice of it with constant bounds
// (`x.sub_(x.narrow(1, 0, 1))`, x made relative to its first row): some of
// Out's elements, not all (sizes exceed the bounds, as nearly all do). A
// slice of dim 0 is dense and PyTorch compares it (Partial: it throws);
// another leaves gaps (TooHard: the result depends on the order elements are
// written in).
OverlapQuery wholeAndSlice(const TensorFact &Out, const TensorFact &In) {
  OverlapQuery Q;
  if (Out.Contig != TensorFact::Yes || Out.SwapA >= 0 || !In.Lo.Base.isConst() ||
      !In.Hi.Base.isConst())
    return Q;
  Q.Dim = In.SliceDim;
  Q.Result = Q.Dim == 0 ? OverlapQuery::Partial : OverlapQuery::TooHard;
  Q.Assumed = true;
  return Q;
}

} // namespace

OverlapQuery LayoutAnalysis::overlap(const TensorFact &Out, const TensorFact &In) {
  OverlapQuery Q;
  if (!Out.Root || Out.Root != In.Root)
    return Q;
  Q.Assumed = Out.Assumed || In.Assumed;
  if (Out.Broadcast || In.Broadcast) {
    Q.Result = OverlapQuery::TooHard; // not dense: PyTorch does not compare
    return Q;
  }
  if (Out.SliceDim < 0 && In.SliceDim < 0) {
    Q.Result = wholeViews(Out, In);
    return Q;
  }
  if (Out.SliceDim < 0)
    return wholeAndSlice(Out, In);
  if (Out.SliceDim != In.SliceDim)
    return Q;
  Q.Dim = Out.SliceDim;
  if (Out.Lo == In.Lo && Out.Hi == In.Hi) {
    Q.Result = OverlapQuery::Full;
    return Q;
  }
  std::optional<bool> A = lessThan(Out.Lo, In.Hi), B = lessThan(In.Lo, Out.Hi);
  if (!A || !B)
    return Q;
  if (!*A || !*B)
    Q.Result = OverlapQuery::Disjoint;
  else // a slice of an inner dimension leaves gaps: not dense
    Q.Result = Q.Dim == 0 ? OverlapQuery::Partial : OverlapQuery::TooHard;
  for (const Bound *X : {&Out.Lo, &Out.Hi, &In.Lo, &In.Hi})
    Q.Assumed |= !X->Base.isConst();
  return Q;
}

} // namespace clang::tidy::tensor
