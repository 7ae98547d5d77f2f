// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-overlap %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-overlap %t.plugin -- --fix-errors
#include "tt/tt.h"

#include <cstdint>

using tt::Tensor;

// ===== positives: PyTorch detects the partial overlap and throws ============

void transposeSquare() {
  auto x = tt::randn({3, 3});
  x.add_(x.t());
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' reads a tensor that partially overlaps the one it writes: throws at run time ('unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.') [tensor-inplace-overlap]
  // CHECK-FIXES: {{^}}  x.add_(x.t().clone());{{$}}
}

void copyTranspose() {
  auto x = tt::randn({4, 4});
  x.copy_(x.t());
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'copy_' reads a tensor that partially overlaps
  // CHECK-FIXES: {{^}}  x.copy_(x.t().clone());{{$}}
}

void compoundTranspose() {
  auto x = tt::randn({2, 2});
  x += x.t();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' reads a tensor that partially overlaps
  // CHECK-FIXES: {{^}}  x += x.t().clone();{{$}}
}

void writesTheTranspose() {
  auto x = tt::randn({3, 3});
  x.t().mul_(x);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: error: in-place 'mul_' reads a tensor that partially overlaps
}

void symmetrise(const Tensor &a) {
  a.div_(a.transpose(0, 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'div_' reads a tensor that partially overlaps the one it writes: throws at run time ('unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.'); assuming the tensor is contiguous and its sizes exceed the offsets, as nearly all do [tensor-inplace-overlap]
}

void batchedTranspose(const Tensor &z) {
  z.sub_(z.transpose(1, 2));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'sub_' reads a tensor that partially overlaps
}

void shiftDown(const Tensor &b) {
  std::int64_t n = b.size(0);
  b.narrow(0, 1, n - 1).copy_(b.narrow(0, 0, n - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:25: error: in-place 'copy_' reads a tensor that partially overlaps
  // CHECK-FIXES: {{^}}  b.narrow(0, 1, n - 1).copy_(b.narrow(0, 0, n - 1).clone());{{$}}
}

void rollLeft(const Tensor &buf) {
  auto k = buf.size(0);
  buf.narrow(0, 0, k - 1).copy_(buf.narrow(0, 1, k - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:27: error: in-place 'copy_' reads a tensor that partially overlaps
}

void slices(const Tensor &v) {
  v.slice(0, 1).copy_(v.slice(0, 0, -1));
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: in-place 'copy_' reads a tensor that partially overlaps
}

void knownLength() {
  auto v = tt::arange(10);
  v.slice(0, 2).add_(v.slice(0, 0, 8));
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: in-place 'add_' reads a tensor that partially overlaps the one it writes: throws at run time ('unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory location. Please clone() the tensor before performing the operation.') [tensor-inplace-overlap]
  v.narrow(0, 0, 6).copy_(v.narrow(0, 4, 6));
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: in-place 'copy_' reads a tensor that partially overlaps
}

void throughVariables(const Tensor &b) {
  std::int64_t n = b.size(0);
  auto dst = b.narrow(0, 1, n - 1);
  auto src = b.narrow(0, 0, n - 1);
  dst.copy_(src);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'copy_' reads a tensor that partially overlaps
  // CHECK-FIXES: {{^}}  dst.copy_(src.clone());{{$}}
}

struct FrameStack {
  Tensor frames_;
  void push(const Tensor &f) {
    auto k = frames_.size(0);
    frames_.narrow(0, 0, k - 1).copy_(frames_.narrow(0, 1, k - 1));
    // CHECK-MESSAGES: :[[@LINE-1]]:33: error: in-place 'copy_' reads a tensor that partially overlaps
    frames_[k - 1].copy_(f);
  }
};

// ===== positives: PyTorch cannot tell; the result depends on the order ======

void innerShift(const Tensor &h) {
  auto m = h.size(1);
  h.narrow(1, 1, m - 1).copy_(h.narrow(1, 0, m - 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: in-place 'copy_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension 1): PyTorch cannot detect it and the result depends on the order in which elements are written; assuming the tensor is contiguous and its sizes exceed the offsets, as nearly all do [tensor-inplace-overlap]
}

void innerShiftKnown() {
  auto g = tt::zeros({4, 6});
  g.narrow(1, 1, 5).add_(g.narrow(1, 0, 5));
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: in-place 'add_' reads a tensor that partially overlaps the one it writes (overlapping slices along dimension 1): PyTorch cannot detect it and the result depends on the order in which elements are written [tensor-inplace-overlap]
}

// ===== negatives ==============================================================

void fullOverlap(const Tensor &x) {
  x.add_(x);
  x.mul_(x);
  x.copy_(x);
  x.t().add_(x.t());
}

void disjointSlices(const Tensor &b) {
  b.narrow(0, 0, 2).copy_(b.narrow(0, 2, 2));
  auto v = tt::arange(10);
  v.slice(0, 0, 5).copy_(v.slice(0, 5, 10));
  v.slice(0, 0, 5).add_(v.slice(0, 5));
}

void sameSlice(const Tensor &b) { b.narrow(0, 1, 2).add_(b.narrow(0, 1, 2)); }

void cloneFirst(const Tensor &x, const Tensor &b) {
  x.add_(x.t().clone());
  std::int64_t n = b.size(0);
  b.narrow(0, 1, n - 1).copy_(b.narrow(0, 0, n - 1).clone());
  x.copy_(x.t().contiguous());
}

void otherTensor(const Tensor &x, const Tensor &y) {
  y.add_(x.t());
  y.narrow(0, 1, 2).copy_(x.narrow(0, 0, 2));
}

void freshResult(const Tensor &x) {
  x.add_(x.t() * 2);
  auto y = x + x.t();
  (void)y;
}

void stridedSlices() {
  auto v = tt::arange(10);
  v.slice(0, 0, 10, 2).copy_(v.slice(0, 1, 10, 2));
}

void rows(const Tensor &b) {
  b[0].copy_(b[1]);
  b.select(0, 1).add_(b.select(0, 2));
}

void reassignedBetween(const Tensor &x0) {
  Tensor x = x0;
  auto s = x.t();
  x = tt::zeros({3, 3});
  x.add_(s);
}

void differentDims(const Tensor &b) { b.narrow(0, 1, 2).copy_(b.narrow(1, 0, 2)); }

void expandedSource(const Tensor &b) { b.narrow(0, 1, 2).copy_(b[0].expand({2, 4})); }

void fillIsNotRead(const Tensor &x) { x.t().fill_(0); }
