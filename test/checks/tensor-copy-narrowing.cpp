// RUN: %check_tensor_tidy --compile-fixed %s tensor-copy-narrowing %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-copy-narrowing %t.plugin
// RUN: %check_tensor_tidy --check-suffix=NOASSUME %s tensor-copy-narrowing %t.noassume -- \
// RUN:   -config="{CheckOptions: {tensor-copy-narrowing.AssumeFloatSources: false}}"
#include "tt/tt.h"

#include <cstdint>
#include <vector>

using tt::Tensor;
Tensor compute(const Tensor &);

// ===== positives ============================================================

void doubleIntoFloat() {
  Tensor d = tt::zeros({4});
  Tensor s = tt::randn({4}, tt::kDouble);
  d.copy_(s);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: copy_ silently converts float64 to float32 (the destination's dtype): precision (and range) is lost; make the conversion explicit with 's.to(d.scalar_type())' [tensor-copy-narrowing]
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:5: warning: copy_ silently converts float64 to float32
  // CHECK-FIXES: {{^}}  d.copy_(s.to(d.scalar_type()));{{$}}
}

void floatIntoLong() {
  Tensor idx = tt::zeros({4}, tt::kLong);
  idx.copy_(tt::randn({4}));
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero; make the conversion explicit with 'tt::randn({4}).to(idx.scalar_type())'
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:7: warning: copy_ silently converts float32
  // CHECK-FIXES: {{^}}  idx.copy_(tt::randn({4}).to(idx.scalar_type()));{{$}}
}

void longIntoInt() {
  Tensor small = tt::zeros({3}, tt::kInt);
  Tensor big = tt::arange(3);
  small.copy_(big);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: copy_ silently converts int64 to int32 (the destination's dtype): values out of range wrap around
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:9: warning: copy_ silently converts int64
  // CHECK-FIXES: {{^}}  small.copy_(big.to(small.scalar_type()));{{$}}
}

void intoNarrowView(int64_t n) {
  Tensor buf = tt::zeros({2 * n});
  Tensor part = tt::ones({n}, tt::kDouble);
  buf.narrow(0, 0, n).copy_(part);
  // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: copy_ silently converts float64 to float32
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:23: warning: copy_ silently converts float64
  // CHECK-FIXES: {{^}}  buf.narrow(0, 0, n).copy_(part.to(buf.scalar_type()));{{$}}
}

void intoSelectView() {
  Tensor table = tt::zeros({8, 3}, tt::kLong);
  Tensor row = tt::randn({3});
  table.select(0, 2).copy_(row);
  // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: copy_ silently converts float32 to int64
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:22: warning: copy_ silently converts float32
  // CHECK-FIXES: {{^}}  table.select(0, 2).copy_(row.to(table.scalar_type()));{{$}}
}

void intoSliceView() {
  Tensor out = tt::zeros({10});
  Tensor acc = tt::zeros({5}, tt::kDouble);
  out.slice(0, 0, 5).copy_(acc);
  // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: copy_ silently converts float64 to float32
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:22: warning: copy_ silently converts float64
  // CHECK-FIXES: {{^}}  out.slice(0, 0, 5).copy_(acc.to(out.scalar_type()));{{$}}
}

void subscriptAssign(int64_t i) {
  Tensor frames = tt::zeros({16, 4});
  Tensor sample = tt::randn({4}, tt::kDouble);
  frames[i] = sample;
  // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: assignment into a view silently converts float64 to float32 (the destination's dtype)
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:13: warning: assignment into a view
  // CHECK-FIXES: {{^}}  frames[i] = sample.to(frames.scalar_type());{{$}}
}

void indexPutInteger() {
  Tensor counts = tt::zeros({4, 2}, tt::kInt);
  Tensor avg = tt::rand({2});
  counts.index_put_({1}, avg);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: index_put_ silently converts float32 to int32
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:10: warning: index_put_ silently converts float32
  // CHECK-FIXES: {{^}}  counts.index_put_({1}, avg.to(counts.scalar_type()));{{$}}
}

void indexPutSlice() {
  using tt::indexing::Slice;
  Tensor grid = tt::zeros({4, 4}, tt::kHalf);
  Tensor vals = tt::ones({4, 2}, tt::kDouble);
  grid.index_put_({Slice(), Slice(0, 2)}, vals);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: index_put_ silently converts float64 to float16
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:8: warning: index_put_ silently converts float64
  // CHECK-FIXES: {{^}}  grid.index_put_({Slice(), Slice(0, 2)}, vals.to(grid.scalar_type()));{{$}}
}

void sigmoidIntoLong(const Tensor &logits) {
  Tensor picks = tt::zeros({8}, tt::kLong);
  picks.copy_(logits.sigmoid());
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: copy_ silently converts floating-point to int64 (the destination's dtype): fractions are truncated toward zero; make
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:9: warning: copy_ silently converts floating-point to int64
  // CHECK-FIXES: {{^}}  picks.copy_(logits.sigmoid().to(picks.scalar_type()));{{$}}
}

void trueDivisionIntoLong() {
  Tensor ids = tt::arange(10);
  Tensor halves = tt::zeros({10}, tt::kLong);
  halves.copy_(ids / 2);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: copy_ silently converts float32 to int64
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:10: warning: copy_ silently converts float32
  // CHECK-FIXES: {{^}}  halves.copy_((ids / 2).to(halves.scalar_type()));{{$}}
}

void unknownInputIntoLong(const Tensor &probs, int64_t n) {
  auto bins = tt::zeros({n}, tt::kLong);
  bins.copy_(probs);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts float32 to int64 (the destination's dtype): fractions are truncated toward zero (assuming 'probs' is float32, as nearly all such tensors are); make the conversion explicit with 'probs.to(bins.scalar_type())'
  // CHECK-FIXES: {{^}}  bins.copy_(probs.to(bins.scalar_type()));{{$}}
}

void explicitDoubleThenBack(const Tensor &x) {
  Tensor hi = x.to(tt::kDouble).mul(2.0);
  Tensor lo = tt::empty({3});
  lo.copy_(hi);
  // CHECK-MESSAGES: :[[@LINE-1]]:6: warning: copy_ silently converts float64 to float32
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:6: warning: copy_ silently converts float64
  // CHECK-FIXES: {{^}}  lo.copy_(hi.to(lo.scalar_type()));{{$}}
}

void floatIntoBool() {
  Tensor keep = tt::zeros({6}, tt::kBool);
  Tensor score = tt::rand({6});
  keep.copy_(score);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: copy_ silently converts float32 to bool (the destination's dtype): every non-zero value becomes true
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:8: warning: copy_ silently converts float32
  // CHECK-FIXES: {{^}}  keep.copy_(score.to(keep.scalar_type()));{{$}}
}

void inLoop(int64_t steps) {
  Tensor history = tt::zeros({steps, 2});
  for (int64_t t = 0; t < steps; ++t) {
    Tensor state = tt::randn({2}, tt::kDouble);
    history[t] = state;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: assignment into a view silently converts float64 to float32
    // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:16: warning: assignment into a view
    // CHECK-FIXES: {{^}}    history[t] = state.to(history.scalar_type());{{$}}
  }
}

void tempDestinationNoFix() {
  tt::zeros({3}, tt::kInt).copy_(tt::arange(3));
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: copy_ silently converts int64 to int32 (the destination's dtype): values out of range wrap around; make the conversion explicit with 'src.to(dst.scalar_type())'
  // CHECK-MESSAGES-NOASSUME: :[[@LINE-2]]:28: warning: copy_ silently converts int64
}

// ===== negatives ============================================================

void sameDtype() {
  Tensor a = tt::zeros({4});
  a.copy_(tt::randn({4}));
}

void widening() {
  Tensor d = tt::zeros({4}, tt::kDouble);
  d.copy_(tt::randn({4}));
  Tensor l = tt::zeros({4}, tt::kLong);
  l.copy_(tt::zeros({4}, tt::kInt));
}

void intIntoFloatNotReported() {
  Tensor f = tt::zeros({4});
  f.copy_(tt::arange(4));
}

void floatIntoHalfIsMixedPrecision() {
  Tensor h = tt::zeros({4}, tt::kHalf);
  h.copy_(tt::randn({4}));
  Tensor b = tt::zeros({4}, tt::kBFloat16);
  b.copy_(tt::randn({4}));
}

void destinationOfUnknownDtype(Tensor &out) {
  out.copy_(tt::randn({4}, tt::kDouble)); // out may well be float64
}

void integerNamedSource(const Tensor &labels, const Tensor &token_ids, int64_t n) {
  Tensor buf = tt::zeros({n}, tt::kLong);
  buf.copy_(labels);
  buf.copy_(token_ids);
}

void unknownInputIntoFloat(const Tensor &x) {
  Tensor y = tt::zeros({4});
  y.copy_(x);
}

void alreadyExplicit(const Tensor &src) {
  Tensor d = tt::zeros({4});
  Tensor s = src.to(tt::kDouble);
  d.copy_(s.to(d.scalar_type()));
  d.copy_(s.to(tt::kFloat));
  d.copy_(s.to(d.dtype()));
}

void comparisonIsBool() {
  Tensor x = tt::randn({5});
  Tensor flags = tt::zeros({5}, tt::kBool);
  flags.copy_(x > 0);
  Tensor f = tt::zeros({5});
  f.copy_(x.gt(0.5));
}

void argmaxIsLong() {
  Tensor scores = tt::randn({4, 10});
  Tensor best = tt::zeros({4}, tt::kLong);
  best.copy_(scores.argmax(1));
}

void integerArithmeticStaysInteger() {
  Tensor ids = tt::arange(8);
  Tensor out = tt::zeros({8}, tt::kLong);
  out.copy_(ids.mul(2));
  out.copy_(ids + ids);
}

void resultOfUnknownFunction(const Tensor &x) {
  Tensor out = tt::zeros({4}, tt::kLong);
  out.copy_(compute(x)); // what compute returns is not known
}

void tensorIndexRaisesInstead() {
  Tensor l = tt::zeros({4}, tt::kLong);
  Tensor where = tt::arange(2);
  l.index_put_({where}, tt::randn({2}));
  Tensor mask = tt::zeros({4}, tt::kBool);
  l.index_put_({mask}, tt::randn({2}));
}

void vectorElementAssignIsHandle() {
  std::vector<Tensor> outs(2);
  Tensor d = tt::randn({3}, tt::kDouble);
  outs[0] = d; // a handle assignment, not a copy
  Tensor f = tt::zeros({3});
  f = d; // rebinds f
}

void sameDtypeViews(int64_t n) {
  Tensor buf = tt::zeros({2 * n}, tt::kDouble);
  buf.narrow(0, n, n).copy_(tt::ones({n}, tt::kDouble));
  buf[0] = buf[1];
}

void dtypeDecidedAtRunTime(bool wide) {
  Tensor dst = wide ? tt::zeros({4}, tt::kDouble) : tt::zeros({4});
  dst.copy_(tt::randn({4}, tt::kDouble));
}

template <typename T> void generic(Tensor dst, const T &src) { dst.copy_(src); }
void instantiate() { generic(tt::zeros({2}), tt::zeros({2})); }
