// The fix-its, applied and run against the runtime: the original writes 'a'
// through its alias, the fixed program leaves it alone.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// Warnings only, so exit code 0: a run that fails fails the test.
// RUN: %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-alias-then-mutate -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>

using tt::Tensor;

static void report(const char *what, const Tensor &t) {
  std::printf("%s %g\n", what, t.sum().item<float>());
}

static void oneWrite() {
  Tensor a = tt::ones({3});
  Tensor b = a;
  b.add_(1);
  report("one", a);
}

static void severalWrites(const Tensor &mean) {
  Tensor a = tt::ones({3});
  Tensor b = a;
  b -= mean;
  b *= 4;
  report("several", a);
}

static Tensor scaled(const Tensor &x) {
  Tensor y = x.contiguous();
  y.mul_(2);
  y.add_(1);
  return y;
}

static void mayAlias() {
  Tensor a = tt::ones({3});
  Tensor y = scaled(a);
  report("contiguous", a);
  report("result", y);
}

static void reshapeZero() {
  Tensor a = tt::ones({2, 3});
  auto flat = a.reshape({-1});
  flat.zero_();
  report("reshape", a);
}

int main() {
  oneWrite();
  severalWrites(tt::full({3}, 0.5));
  mayAlias();
  reshapeZero();
  // ORIG: one 6
  // ORIG: several 6
  // ORIG: contiguous 9
  // ORIG: result 9
  // ORIG: reshape 0
  // FIXED: one 3
  // FIXED: several 3
  // FIXED: contiguous 3
  // FIXED: result 9
  // FIXED: reshape 6
  return 0;
}
