// The fix-it, applied and run against the runtime: the original throws
// PyTorch's internal-overlap error, the fixed program adds into its own copy.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: not %t.orig 2>&1 | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// RUN: not %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-inplace-on-expanded -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>

int main() {
  tt::Tensor x = tt::ones({4, 3});
  tt::Tensor b = tt::zeros({3});
  auto bias = b.expand_as(x);
  bias.add_(1);
  std::printf("sum %g source %g\n", (x + bias).sum().item<float>(), b.sum().item<float>());
  // ORIG: more than one element of the written-to tensor refers to a single memory location
  // FIXED: sum 24 source 0
  return 0;
}
