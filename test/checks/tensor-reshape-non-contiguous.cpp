// RUN: %check_tensor_tidy --compile-fixed %s tensor-reshape-non-contiguous %t
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-reshape-non-contiguous %t.plugin
#include "tt/tt.h"

#include <cstdint>
#include <vector>

using tt::Tensor;

// ---- flagged: the new shape cannot be a view, so reshape copies --------------

void transposedLiteral() {
  auto y = tt::randn({3, 4}).t().reshape({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:34: warning: 'reshape' silently copies the non-contiguous result of 't' (48 bytes): the new shape cannot be a view of its strides; make the copy explicit with '.contiguous().view(...)' [tensor-reshape-non-contiguous]
  // CHECK-FIXES: auto y = tt::randn({3, 4}).t().contiguous().view({12});
}

void featureMap() {
  auto p = tt::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1});
  auto q = p.reshape({64, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'reshape' silently copies the non-contiguous result of 'permute' (196.0 MiB): the new shape cannot be a view of its strides
  // CHECK-FIXES: auto q = p.contiguous().view({64, -1});
}

void halfPrecision() {
  auto h = tt::zeros({1024, 1024}, tt::kHalf).t().reshape({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:51: warning: 'reshape' silently copies the non-contiguous result of 't' (2.0 MiB)
}

void flattenAll() {
  auto f = tt::ones({8, 16}).transpose(0, 1).flatten();
  // CHECK-MESSAGES: :[[@LINE-1]]:46: warning: 'flatten' silently copies the non-contiguous result of 'transpose' (512 bytes): the new shape cannot be a view of its strides; make the copy explicit with '.contiguous().flatten(...)'
  // CHECK-FIXES: auto f = tt::ones({8, 16}).transpose(0, 1).contiguous().flatten();
}

void flattenRange() {
  // [2, 4, 3] with strides [12, 1, 4]: dims 1 and 2 cannot merge.
  auto f = tt::ones({2, 3, 4}).transpose(1, 2).flatten(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:48: warning: 'flatten' silently copies the non-contiguous result of 'transpose' (96 bytes)
}

// A parameter of unknown rank: merging a swapped dim with another copies
// whatever the rank (sizes > 1); merging two dims the transpose left alone
// is not decided.
void flattenSwappedUnknownRank(const tt::Tensor &logProbs) {
  auto f = logProbs.transpose(0, 1).flatten(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'flatten' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'logProbs' is contiguous, as nearly all tensors are)
  auto g = logProbs.transpose(1, 2).flatten(2, 3);
  // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'flatten' silently copies the non-contiguous result of 'transpose'
  auto h = logProbs.transpose(2, 3).flatten(0, 1);
}

void reshapeAs() {
  auto a = tt::ones({4, 6}).narrow(1, 0, 3);
  auto b = a.reshape_as(tt::zeros({12}));
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'reshape_as' silently copies the non-contiguous result of 'narrow' (48 bytes)
  // CHECK-FIXES: auto b = a.contiguous().reshape_as(tt::zeros({12}));
}

void stridedSlice() {
  auto s = tt::arange(20).reshape({4, 5}).slice(1, 0, 5, 2).reshape({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:61: warning: 'reshape' silently copies the non-contiguous result of 'slice' (96 bytes)
}

void expanded() {
  auto e = tt::ones({3, 1}).expand({3, 4}).reshape({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:44: warning: 'reshape' silently copies the non-contiguous result of 'expand'
}

float everyStep(int steps) {
  auto w = tt::ones({32, 32}).t();
  float s = 0;
  for (int i = 0; i < steps; ++i) {
    s += w.reshape({-1}).sum().item<float>();
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 't' (4.0 KiB)
  }
  while (steps-- > 0)
    s += w.flatten().sum().item<float>();
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'flatten' silently copies the non-contiguous result of 't' (4.0 KiB)
  return s;
}

void bothBranches(bool c) {
  auto x = tt::zeros({4, 5});
  Tensor z = c ? x.t() : x.transpose(0, 1);
  z.reshape({20});
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: 'reshape' silently copies its non-contiguous input (80 bytes)
}

void reassigned() {
  auto y = tt::zeros({4, 4});
  y = y.permute({1, 0});
  y = y.reshape({16});
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'reshape' silently copies the non-contiguous result of 'permute'
}

void inLambda() {
  auto f = [](int n) {
    auto q = tt::zeros({2, 3}).t();
    return q.reshape({6}).mul(n);
    // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'reshape' silently copies the non-contiguous result of 't'
  };
  f(2);
}

template <typename T> T scaled(T k) {
  auto a = tt::zeros({2, 3}).t();
  return a.reshape({6}).sum().template item<T>() * k;
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 't'
}
template float scaled<float>(float);

template <typename T> void uninstantiated(T) {
  tt::ones({3, 5}).permute({1, 0}).reshape({15});
  // CHECK-MESSAGES: :[[@LINE-1]]:36: warning: 'reshape' silently copies the non-contiguous result of 'permute'
}

struct Head {
  std::int64_t heads = 4;
  // The classic: merging heads after a transpose with run-time sizes.
  Tensor merge(const Tensor &x) const {
    auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto y = x.view({B, T, heads, C / heads}).transpose(1, 2);
    return y.reshape({B, T, C});
    // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'x' is contiguous, as nearly all tensors are); make the copy explicit with '.contiguous().view(...)'
    // CHECK-FIXES: return y.contiguous().view({B, T, C});
  }
};

Tensor mergeParam(const Tensor &x) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  return x.permute({0, 2, 1}).reshape({B, T * C});
  // CHECK-MESSAGES: :[[@LINE-1]]:31: warning: 'reshape' silently copies the non-contiguous result of 'permute': the new shape cannot be a view unless
}

#define FLAT(t) (t).reshape({-1})
void inMacro() {
  auto m = FLAT(tt::zeros({2, 3}).t());
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 't'
}

// ---- inputs of unknown origin: taken as contiguous, sizes > 1 ------------------

void assumedInputs(Tensor p, std::int64_t n) {
  p.t().reshape({-1});
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'reshape' silently copies the non-contiguous result of 't': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'p' is contiguous, as nearly all tensors are); make the copy explicit with '.contiguous().view(...)'
  // CHECK-FIXES: p.t().contiguous().view({-1});
  p.transpose(1, 2).reshape({n, -1}); // two dims cannot cover three chunks
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1 (assuming 'p' is contiguous
  p.transpose(1, 2).reshape({p.size(0), -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'reshape' silently copies the non-contiguous result of 'transpose'
}

Tensor unknownRank(const Tensor &a, const Tensor &b) {
  return a.matmul(b).transpose(1, 2).reshape({2, 12}); // the result of an op: contiguous
  // CHECK-MESSAGES: :[[@LINE-1]]:38: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless the dimensions it merges have size 1; make
}

void unknownRankViews(const Tensor &x, std::int64_t n) {
  x.transpose(1, 2).reshape({x.size(0), x.size(2), x.size(1), -1}); // splits only
  x.transpose(0, 1).reshape({x.size(1), x.size(0), -1});            // keeps the swapped dims apart
  x.unsqueeze(1).transpose(0, 1).reshape({-1});                     // swaps a size-1 dim
  x.transpose(1, 2).reshape({n, -1, 2, 3});                         // enough dims: cannot tell
}

// ---- not flagged -------------------------------------------------------------

struct Fake {
  Fake t() const;
  Fake reshape(int) const;
};

void negatives(bool c, Tensor p, std::int64_t n, Fake f, std::vector<Tensor> &out) {
  f.t().reshape(1);                                        // not a tensor type
  tt::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1}).reshape({64, 56, 56, 256}); // a view
  tt::zeros({2, 3, 4}).permute({2, 0, 1}).reshape({4, 6}); // keeps the permuted dims apart
  tt::zeros({4, 6}).t().reshape({2, 3, 4});                // splits a dim only
  tt::zeros({1, 5}).t().reshape({5});                      // a size-1 dim moved
  tt::zeros({4, 6}).narrow(0, 1, 2).reshape({12});         // narrow on dim 0
  tt::zeros({4, 6}).contiguous().reshape({-1});            // contiguous input
  tt::zeros({4, 4}).slice(1, 0, 4, 2).reshape({8});        // evenly strided: one chunk
  tt::zeros({4, 4}).t().contiguous().view({16});           // the explicit copy
  tt::zeros({3, 4}).t().reshape({4, 3});                   // the same shape

  auto a = tt::zeros({4, 4}).t();
  a = tt::zeros({4, 4});                                   // reassignment kills the fact
  a.reshape({16});

  Tensor b = tt::zeros({4, 4});
  if (c)
    b = b.t();
  b.reshape({16});                                         // only on one path

  auto d = tt::zeros({4, 4}).t();
  for (int i = 0; i < 3; ++i)
    d = d.contiguous();
  d.reshape({16});                                         // may be contiguous here

  auto g = tt::zeros({4, 4}).t();
  auto fix = [&] { g = g.contiguous(); };
  fix();
  g.reshape({16});                                         // captured by reference

  auto h = tt::zeros({4, 4}).t();
  out.push_back(h);
  h = tt::ones({16});
  h.flatten();                                             // reassigned
}

template <typename T> void dependent(T x) {
  x.t().reshape({-1}); // the instantiation: reported without a fix-it
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'reshape' silently copies the non-contiguous result of 't'
}
template void dependent<Tensor>(Tensor);
