// NOLINT comments silence the checks' error-level diagnostics as they do their
// warnings (clang-tidy itself never suppresses an error), with the notes that
// go with them; a NOLINT naming another check does not.
// RUN: not %tensor_tidy %s -- -std=c++17 %tt_include 2>&1 | FileCheck %s --implicit-check-not=error: --implicit-check-not=note:
// RUN: not %clang_tidy_plugin -checks='-*,tensor-*' %s -- -std=c++17 %tt_include 2>&1 | FileCheck %s --implicit-check-not=error: --implicit-check-not=note:
#include "tt/tt.h"

float use(const tt::Tensor &t) { return t.sum().item<float>(); }

float named() {
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24}); // NOLINT(tensor-view-non-contiguous)
  return use(c);
}

float bare() {
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24}); // NOLINT
  return use(c);
}

float globbed() {
  // NOLINTNEXTLINE(tensor-*)
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24});
  return use(c);
}

// NOLINTBEGIN(tensor-view-non-contiguous)
float block() {
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24});
  return use(c);
}
// NOLINTEND(tensor-view-non-contiguous)

float leaf() {
  auto w = tt::ones({3}).requires_grad_();
  w.add_(1); // NOLINT(tensor-inplace-on-leaf)
  return use(w);
}

float other() {
  auto c = tt::zeros({2, 3, 4}).transpose(0, 2).view({24}); // NOLINT(tensor-reshape-non-contiguous)
  // CHECK: nolint-error-level.cpp:[[@LINE-1]]:{{[0-9]+}}: error: 'view' on the non-contiguous result of 'transpose' always throws{{.*}}[tensor-view-non-contiguous]
  return use(c);
}
