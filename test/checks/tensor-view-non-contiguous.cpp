// RUN: %check_tensor_tidy --compile-fixed %s tensor-view-non-contiguous %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-view-non-contiguous %t.plugin -- --fix-errors
#include "tt/tt.h"

#include <cstdint>

using tt::Tensor;

// ---- certain errors: every size is known ------------------------------------

void transposedLiteral() {
  auto y = tt::randn({3, 4}).t().view({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:34: error: 'view' on the non-contiguous result of 't' always throws at run time: sizes [4, 3] with strides [1, 4] cannot be viewed as [12] ('view size is not compatible with input tensor's size and stride'); make the copy explicit with '.contiguous().view(...)' or use 'reshape' [tensor-view-non-contiguous]
  // CHECK-FIXES: auto y = tt::randn({3, 4}).t().contiguous().view({12});
}

void throughVariable() {
  auto a = tt::zeros({2, 3, 4});
  auto b = a.transpose(0, 2);
  auto c = b.view({24});
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'view' on the non-contiguous result of 'transpose' always throws
  // CHECK-FIXES: auto c = b.contiguous().view({24});
}

void permuteMergesSplitDims() {
  // [4, 2, 3] with strides [1, 12, 4]: 4 and 2 are not adjacent in memory.
  auto p = tt::zeros({2, 3, 4}).permute({2, 0, 1}).view({8, 3});
  // CHECK-MESSAGES: :[[@LINE-1]]:52: error: 'view' on the non-contiguous result of 'permute' always throws
}

void narrowInnerDim() {
  auto n = tt::zeros({4, 6}).narrow(1, 0, 3).view({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:46: error: 'view' on the non-contiguous result of 'narrow' always throws
}

void sliceInnerDim() {
  auto s = tt::zeros({4, 6}).slice(1, 0, 4).view({16});
  // CHECK-MESSAGES: :[[@LINE-1]]:45: error: 'view' on the non-contiguous result of 'slice' always throws
}

void expanded() {
  auto e = tt::ones({3, 1}).expand({3, 4}).view({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:44: error: 'view' on the non-contiguous result of 'expand' always throws
}

void inLoop(int n) {
  auto w = tt::zeros({4, 4}).t();
  for (int i = 0; i < n; ++i) {
    auto f = w.view({16});
    // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'view' on the non-contiguous result of 't' always throws
  }
  int k = 0;
  do {
    auto g = w.view({2, 8});
    // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'view' on the non-contiguous result of 't' always throws
  } while (++k < n);
}

void bothBranches(bool c) {
  auto x = tt::zeros({4, 5});
  Tensor z;
  if (c)
    z = x.t();
  else
    z = x.transpose(1, 0);
  z.view({20});
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: 'view' on a non-contiguous tensor always throws
}

void reassigned() {
  auto y = tt::zeros({4, 4});
  y = y.t();
  y.view({16});
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: 'view' on the non-contiguous result of 't' always throws
}

void viewAs() {
  auto a = tt::zeros({4, 4});
  auto b = a.t().view_as(tt::zeros({16}));
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: 'view_as' on the non-contiguous result of 't' always throws{{.*}}use 'reshape_as'
}

void inLambda() {
  auto f = [] {
    auto q = tt::zeros({2, 3}).t();
    return q.view({6});
    // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'view' on the non-contiguous result of 't' always throws
  };
  f();
}

template <typename T> void inTemplate(T) {
  auto a = tt::zeros({2, 3}).t();
  a.view({6});
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: 'view' on the non-contiguous result of 't' always throws
}
template void inTemplate<int>(int);

template <typename T> void uninstantiated(T) {
  tt::ones({3, 5}).permute({1, 0}).view({15});
  // CHECK-MESSAGES: :[[@LINE-1]]:36: error: 'view' on the non-contiguous result of 'permute' always throws
}

struct Model {
  Tensor forward(const Tensor &) const {
    auto h = tt::zeros({8, 2}).t();
    return h.view({-1});
    // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'view' on the non-contiguous result of 't' always throws
  }
};

// ---- run-time sizes: throws unless the dims it merges have size 1 -------------

Tensor attention(const Tensor &x, std::int64_t nh) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto q = x.view({B, T, nh, C / nh}).transpose(1, 2); // [B, nh, T, hs]
  return q.view({B, T, C});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'x' is contiguous, as nearly all tensors are) ('view size is not compatible with input tensor's size and stride'); make the copy explicit with '.contiguous().view(...)' or use 'reshape' [tensor-view-non-contiguous]
  // CHECK-FIXES: return q.contiguous().view({B, T, C});
}

Tensor mergeAfterTranspose(Tensor x) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  return x.transpose(1, 2).view({B, T * C});
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless
}

Tensor flattenAfterTranspose(Tensor x) {
  return x.transpose(0, 1).view(-1);
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'x' is contiguous, as nearly all tensors are) ('view size is not compatible with input tensor's size and stride'); use 'reshape' (which copies only when it must) or make the copy explicit with '.contiguous().view(...)'
  // CHECK-FIXES: return x.transpose(0, 1).reshape(-1);
}

Tensor flattenMatrix(const Tensor &w) {
  // t() is taken as a matrix transpose.
  return w.t().view({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'view' on the non-contiguous result of 't' throws at run time unless the dimensions it merges have size 1 (assuming 'w' is contiguous
  // CHECK-FIXES: return w.t().reshape({-1});
}

#define FLAT(t) (t).view({-1})
void inMacro() {
  auto m = FLAT(tt::zeros({2, 3}).t());
  // CHECK-MESSAGES: :[[@LINE-1]]:12: error: 'view' on the non-contiguous result of 't' always throws
}

// A view needs a dim per contiguous chunk: after a transpose of dims 1 and 2 a
// tensor has at least three, whatever its sizes.
void tooFewDims(const Tensor &p, std::int64_t n, std::int64_t m) {
  p.transpose(1, 2).view({n, m});
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'p' is contiguous
}

// What shows the layout is an error; an input taken as contiguous, a warning.
Tensor shownLayout(const Tensor &x, std::int64_t nh) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto y = x.view({B, T, nh, C / nh}).transpose(1, 2).matmul(x.view({B, T, nh, C / nh}).permute({0, 2, 3, 1}));
  return y.transpose(1, 2).view({B, T, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:28: error: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 ('view size
}

// A parameter of unknown rank, unsqueezed then expanded: the new dim is the
// broadcast one, the others keep their sizes (> 1).
tt::Tensor expandedDirections(const tt::Tensor &dirs, int64_t R, int64_t S) {
  auto per_sample = dirs.unsqueeze(1).expand({R, S, 3});
  return per_sample.view({-1, 3});
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'view' on the non-contiguous result of 'expand' throws at run time unless the dimensions it merges have size 1 (assuming 'dirs' is contiguous, as nearly all tensors are)
}

// ---- not flagged --------------------------------------------------------------

// Merges the kept dims only: [S, R, 3] with strides [0, 3, 1] views as [S, 3 * R].
tt::Tensor expandedRows(const tt::Tensor &dirs, int64_t R, int64_t S) {
  return dirs.unsqueeze(0).expand({S, R, 3}).view({S, R * 3});
}

struct Fake {
  Fake t() const;
  Fake view(int) const;
};

void negatives(bool c, Tensor p, std::int64_t n, std::int64_t m, Fake f) {
  f.t().view(1);                                    // not a tensor type
  tt::randn({3, 4}).t().view({4, 3});               // the transposed shape itself
  tt::zeros({2, 3, 4}).permute({2, 0, 1}).view({4, 6}); // keeps the permuted dims apart
  tt::zeros({4, 6}).t().view({2, 3, 4});            // only splits a dim
  tt::zeros({1, 5}).t().view({5});                  // transposing a size-1 dim
  tt::zeros({4, 6}).narrow(0, 1, 2).view({12});     // narrow on dim 0
  tt::zeros({4, 2, 3}).select(0, 1).view({6});      // select on dim 0
  tt::zeros({4, 4}).slice(1, 0, 4, 2).view({8});    // evenly strided: still one chunk
  tt::zeros({4, 4}).t().contiguous().view({16});    // the explicit copy
  p.transpose(1, 2).view({n, m, 2});                // enough dims: cannot tell

  auto a = tt::zeros({4, 4}).t();
  a = tt::zeros({4, 4});                            // reassignment kills the fact
  a.view({16});

  Tensor b = tt::zeros({4, 4});
  if (c)
    b = b.t();
  b.view({16});                                     // only on one path

  auto d = tt::zeros({4, 4});
  d.add_(1);                                        // in place: layout unchanged
  d.view({16});

  auto e = tt::zeros({4, 4}).t();
  for (int i = 0; i < 3; ++i) {
    e.view({4, 4});                                 // same shape: fine
    e = e.contiguous();
  }
  e.view({16});                                     // contiguous on every path that reaches here? no: silent

  auto g = tt::zeros({4, 4}).t();
  auto fix = [&] { g = g.contiguous(); };
  fix();
  g.view({16});                                     // captured by reference: unknown

  auto h = tt::zeros({2, 3});
  h.view(tt::kInt);                                 // dtype view
}

template <typename T> void dependent(T x) {
  x.t().view({-1}); // flagged in the instantiation with a tensor (no fix-it)
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'view' on the non-contiguous result of 't' throws at run time unless
  // CHECK-FIXES: x.t().view({-1}); // flagged in the instantiation with a tensor (no fix-it)
}
template void dependent<Tensor>(Tensor);
template void dependent<Fake>(Fake);
