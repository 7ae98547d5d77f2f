// The fix-its, applied and run against the runtime: the original raises
// PyTorch's leaf error, the fixed program updates the leaves under no-grad.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// Errors: tensor-tidy exits non-zero after fixing.
// RUN: not %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-inplace-on-leaf -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>
#include <exception>

using tt::Tensor;

static void sgdStep() {
  try {
    Tensor w = tt::ones({4}, tt::requires_grad());
    (w * w).sum().backward();
    w.sub_(w.grad() * 0.5);
    std::printf("sgd %g %d\n", w.detach().sum().item<float>(), (int)w.requires_grad());
  } catch (const std::exception &e) {
    std::printf("sgd raised: %s\n", e.what());
  }
}

static void rowInit() {
  try {
    Tensor w = tt::zeros({2, 3}, tt::requires_grad());
    w[0].fill_(1.0);
    std::printf("row %g\n", w.detach().sum().item<float>());
  } catch (const std::exception &e) {
    std::printf("row raised: %s\n", e.what());
  }
}

int main() {
  sgdStep();
  rowInit();
  // ORIG: sgd raised: a leaf Variable that requires grad is being used in an in-place operation.
  // ORIG: row raised: a view of a leaf Variable that requires grad is being used in an in-place operation.
  // FIXED: sgd 0 1
  // FIXED: row 3
  return 0;
}
