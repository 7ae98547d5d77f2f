// The fix-its, applied and run against the runtime: the original copies each
// batch (clone) and then rewrites or only reads the copy; the fixed program
// makes no clone copy and prints the same values.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// RUN: %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-unnecessary-clone -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>

using tt::Tensor;

static Tensor centred(const Tensor &x, const Tensor &mean) {
  Tensor y = x.clone();
  y.sub_(mean);
  return y;
}

static float spread(const Tensor &x) {
  Tensor c = x.clone();
  return (c.max() - c.min()).item<float>();
}

int main() {
  tt::manual_seed(1);
  Tensor mean = tt::full({8}, 0.5);
  float total = 0;
  for (int i = 0; i < 10; ++i) {
    Tensor b = tt::rand({4, 8});
    total += centred(b, mean).sum().item<float>() + spread(b);
  }
  long clones = tt::memory_stats().copies[static_cast<int>(tt::CopyKind::Clone)];
  std::printf("total %.4f clones %ld\n", total, clones);
  return 0;
}
// ORIG: total 6.4290 clones 20
// FIXED: total 6.4290 clones 0
