// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-expanded %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-expanded %t.plugin -- --fix-errors
#include "tt/tt.h"

#include <cstdint>

using tt::Tensor;

// ===== positives: the layout is shown ========================================

void expandThenAdd() {
  auto b = tt::randn({3});
  auto e = b.expand({4, 3});
  // CHECK-FIXES: {{^}}  auto e = b.expand({4, 3}).clone();{{$}}
  e.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on a tensor expanded by 'expand' throws at run time: its elements along a stride-0 dimension share one memory location ('unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.') [tensor-inplace-on-expanded]
  // CHECK-MESSAGES: :[[@LINE-4]]:14: note: expanded here; '.clone()' gives the tensor memory of its own
}

void direct() {
  tt::ones({3, 1}).expand({3, 4}).mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:35: error: in-place 'mul_' on a tensor expanded by 'expand' throws
  // CHECK-FIXES: {{^}}  tt::ones({3, 1}).expand({3, 4}).clone().mul_(2);{{$}}
}

void compound() {
  auto e = tt::zeros({1, 5}).expand({2, 5});
  // CHECK-FIXES: {{^}}  auto e = tt::zeros({1, 5}).expand({2, 5}).clone();{{$}}
  e += 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on a tensor expanded by 'expand' throws
}

void copyInto(const Tensor &src) {
  auto e = tt::zeros({3}).expand({4, 3});
  e.copy_(src);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'copy_' on a tensor expanded by 'expand' throws
}

void throughTranspose() {
  auto e = tt::randn({3}).expand({4, 3}).t();
  e.sub_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'sub_' on a tensor expanded by 'expand' throws
}

void throughNarrow() {
  tt::randn({3}).expand({4, 3}).narrow(0, 0, 2).div_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:49: error: in-place 'div_' on a tensor expanded by 'expand' throws
}

void selectKeepsStrideZero(const Tensor &src) {
  auto e = tt::randn({3}).expand({4, 3});
  e.select(1, 0).copy_(src);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: in-place 'copy_' on a tensor expanded by 'expand' throws
}

void unaryOps() {
  auto a = tt::randn({1, 3}).expand({4, 3});
  a.clamp_(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'clamp_' on a tensor expanded by 'expand' throws
  auto b = tt::randn({1, 3}).expand({4, 3});
  b.relu_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'relu_' on a tensor expanded by 'expand' throws
  auto c = tt::randn({1, 3}).expand({4, 3});
  c.sigmoid_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'sigmoid_' on a tensor expanded by 'expand' throws
  auto d = tt::randn({1, 3}).expand({4, 3});
  d.exp_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'exp_' on a tensor expanded by 'expand' throws
}

// The first write raises; the later ones on the same expand are not reported
// again (the clone at the expand fixes them all).
void secondWriteOnOneExpand(const Tensor &off) {
  auto pos = tt::arange(5).unsqueeze(0).expand({3, 5});
  pos -= off;
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'sub_' on a tensor expanded by 'expand' throws
  pos.clamp_(0, 4);
  pos.mul_(2);
}

void detachedStillExpanded() {
  tt::randn({3}).expand({2, 3}).detach().neg_();
  // CHECK-MESSAGES: :[[@LINE-1]]:42: error: in-place 'neg_' on a tensor expanded by 'expand' throws
}

void unsqueezeThenExpand() {
  auto row = tt::arange(5).unsqueeze(0).expand({3, 5});
  row.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'mul_' on a tensor expanded by 'expand' throws
}

void inLoop(int steps) {
  auto e = tt::zeros({1, 4}).expand({8, 4});
  for (int i = 0; i < steps; ++i)
    e.add_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' on a tensor expanded by 'expand' throws
}

// ===== positives: resting on the defaults ====================================

void biasExpandAs(const Tensor &b, const Tensor &x) {
  auto bias = b.expand_as(x);
  // CHECK-FIXES: {{^}}  auto bias = b.expand_as(x).clone();{{$}}
  bias.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'add_' on a tensor expanded by 'expand_as' throws at run time: its elements along a stride-0 dimension share one memory location ('unsupported operation: more than one element of the written-to tensor refers to a single memory location. Please clone() the tensor before performing the operation.'); assuming 'expand_as' broadcasts a dimension to a size > 1, as nearly all do [tensor-inplace-on-expanded]
}

void positionsScaled(const Tensor &pos, std::int64_t n, double scale) {
  pos.expand({n, -1}).mul_(scale);
  // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: in-place 'mul_' on a tensor expanded by 'expand' throws
  // CHECK-FIXES: {{^}}  pos.expand({n, -1}).clone().mul_(scale);{{$}}
}

void runtimeSize(std::int64_t n) {
  auto e = tt::zeros({1}).expand({n});
  e.pow_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'pow_' on a tensor expanded by 'expand' throws
}

void maskExpanded(const Tensor &m, std::int64_t b, std::int64_t h, std::int64_t t) {
  auto mask = m.unsqueeze(1).expand({b, h, t, t});
  mask.mul_(-1e9);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'mul_' on a tensor expanded by 'expand' throws
}

// ===== negatives =============================================================

void fillAccepted() {
  auto e = tt::randn({3}).expand({4, 3});
  e.fill_(1); // PyTorch writes the one shared element
  e.zero_();
}

void indexPutOnlyWarns() {
  auto e = tt::randn({3}).expand({4, 3});
  e.index_put_({0}, 1.0);
}

void cloneFirst() {
  tt::randn({3}).expand({4, 3}).clone().add_(1);
  auto c = tt::randn({3}).expand({4, 3}).contiguous();
  c.add_(1);
}

void outOfPlaceResult() {
  auto e = tt::randn({3}).expand({4, 3});
  auto y = e * 2;
  y.add_(1);
  auto z = e.add(1);
  z.mul_(3);
}

void expandToSameShape() {
  tt::zeros({4, 3}).expand({4, 3}).add_(1);
  tt::zeros({3, 1}).expand({3, 1}).add_(1);
}

void selectDropsTheExpandedDim() {
  auto e = tt::randn({3}).expand({4, 3});
  e[0].add_(1);
  e.select(0, 2).mul_(2);
}

void reassigned() {
  auto e = tt::randn({3}).expand({4, 3});
  e = e.clone();
  e.add_(1);
}

void reshapeCopies() {
  auto e = tt::randn({3}).expand({4, 3});
  e.reshape({12}).add_(1);
}

void expandOnOnePathOnly(bool c) {
  Tensor e = tt::zeros({4, 3});
  if (c)
    e = tt::zeros({3}).expand({4, 3});
  e.add_(1);
}

void writesTheSource() {
  auto b = tt::randn({3});
  auto e = b.expand({4, 3});
  b.add_(1);
  (void)e;
}

void keepEveryDim(const Tensor &x) {
  x.expand({-1, -1}).add_(1);
}

void readOnly(const Tensor &b, const Tensor &x) {
  auto y = x + b.expand_as(x);
  y.relu_();
}

void flagOnly() {
  auto e = tt::randn({3}).expand({4, 3});
  e.requires_grad_();
}

void narrowToOneRow() {
  auto e = tt::randn({3, 1}).expand({3, 4});
  e.narrow(1, 0, 1).add_(1);
}

void unrelatedTensor(const Tensor &x) {
  auto e = x.expand({4, 3});
  auto w = tt::zeros({4, 3});
  w.add_(e);
}
