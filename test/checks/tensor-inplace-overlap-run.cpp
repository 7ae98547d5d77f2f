// The fix-it, applied and run against the runtime: the original throws
// PyTorch's partial-overlap error, the fixed program shifts a copy.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: not %t.orig 2>&1 | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// RUN: not %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-inplace-overlap -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>

int main() {
  tt::Tensor h = tt::arange(4).to(tt::kFloat);
  std::int64_t n = h.size(0);
  h.narrow(0, 1, n - 1).copy_(h.narrow(0, 0, n - 1));
  std::printf("%g %g %g %g\n", h[0].item<float>(), h[1].item<float>(), h[2].item<float>(),
              h[3].item<float>());
  // ORIG: some elements of the input tensor and the written-to tensor refer to a single memory location
  // FIXED: 0 0 1 2
  return 0;
}
