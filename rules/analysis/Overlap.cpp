// The overlap of an in-place op's output and an input, from their layout
// facts, as at::get_overlap_status (aten/src/ATen/MemoryOverlap.cpp) decides
// it at run time: only two non-overlapping, dense tensors of one storage are
// compared (Partial when their spans intersect without being the same
// elements in the same order); anything else is TooHard, and PyTorch runs
// the op with a result that depends on the order elements are written in.
#include "analysis/LayoutAnalysis.h"

namespace clang::tidy::tensor {

namespace {

using Bound = TensorFact::Bound;

// Under Note [Generic symbols], a length is larger than any constant the code
// slices with: a bound from the end is past every constant bound.
bool lessThan(const Bound &A, const Bound &B) {
  if (A.FromEnd != B.FromEnd)
    return B.FromEnd;
  return A.Off < B.Off;
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
  if (Out.SliceDim != In.SliceDim)
    return Q;
  Q.Dim = Out.SliceDim;
  if (Out.Lo == In.Lo && Out.Hi == In.Hi)
    Q.Result = OverlapQuery::Full;
  else if (!lessThan(Out.Lo, In.Hi) || !lessThan(In.Lo, Out.Hi))
    Q.Result = OverlapQuery::Disjoint;
  else // a slice of an inner dimension leaves gaps: not dense
    Q.Result = Q.Dim == 0 ? OverlapQuery::Partial : OverlapQuery::TooHard;
  Q.Assumed |= Out.Lo.FromEnd || Out.Hi.FromEnd || In.Lo.FromEnd || In.Hi.FromEnd;
  return Q;
}

} // namespace clang::tidy::tensor
