// The fix-its, applied and run against the runtime: the original changes the
// source behind autograd's back, the fixed program works on an owned copy.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// Warnings only, so exit code 0: a run that fails fails the test.
// RUN: %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-inplace-on-detached -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>

using tt::Tensor;

static void report(const char *what, const Tensor &t) {
  std::printf("%s %g\n", what, t.detach().sum().item<float>());
}

static void detached() {
  Tensor a = tt::ones({3}).requires_grad_();
  auto d = a.detach();
  d.mul_(2);
  report("detach", a);
}

static void data() {
  Tensor w = tt::ones({4}).requires_grad_();
  Tensor d = w.data();
  d.zero_();
  report("data", w);
}

int main() {
  detached();
  data();
  // ORIG: detach 6
  // ORIG: data 0
  // FIXED: detach 3
  // FIXED: data 4
  return 0;
}
