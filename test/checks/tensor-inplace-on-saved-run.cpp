// The fix-its, applied and run against the runtime: the original's backward
// raises PyTorch's saved-tensor error, the fixed program computes gradients.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// Errors: tensor-tidy exits non-zero after fixing.
// RUN: not %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-inplace-on-saved -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>
#include <exception>

using tt::Tensor;

static void reluThenBias() {
  Tensor w = tt::ones({4}, tt::requires_grad());
  try {
    auto h = tt::relu(w * 2);
    h.add_(1);
    h.sum().backward();
    std::printf("relu grad %g\n", w.grad().sum().item<float>());
  } catch (const std::exception &e) {
    std::printf("relu raised: %s\n", e.what());
  }
}

static void sigmoidScaled() {
  Tensor w = tt::zeros({3}, tt::requires_grad());
  try {
    auto y = tt::sigmoid(w * 1);
    y.mul_(2);
    y.sum().backward();
    std::printf("sigmoid grad %g\n", w.grad().sum().item<float>());
  } catch (const std::exception &e) {
    std::printf("sigmoid raised: %s\n", e.what());
  }
}

static void factorOfProduct() {
  Tensor w = tt::ones({2}, tt::requires_grad());
  Tensor c = tt::full({2}, 3.0);
  try {
    auto h = w * 1;
    auto g = h * c; // saves c only: h may change
    h.mul_(2);
    auto k = h.exp();
    k.add_(1);
    (g + k).sum().backward();
    std::printf("product grad %g\n", w.grad().sum().item<float>());
  } catch (const std::exception &e) {
    std::printf("product raised: %s\n", e.what());
  }
}

int main() {
  reluThenBias();
  sigmoidScaled();
  factorOfProduct();
  // ORIG: relu raised: one of the variables needed for gradient computation has been modified by an inplace operation: [{{.*}}], which is output 0 of ReluBackward0, is at version 1; expected version 0 instead.
  // ORIG: sigmoid raised: one of the variables needed for gradient computation has been modified by an inplace operation: [{{.*}}], which is output 0 of SigmoidBackward0,
  // ORIG: product raised: one of the variables needed for gradient computation has been modified by an inplace operation: [{{.*}}], which is output 0 of ExpBackward0,
  // FIXED: relu grad 8
  // FIXED: sigmoid grad 1.5
  // FIXED: product grad 35.5562
  return 0;
}
