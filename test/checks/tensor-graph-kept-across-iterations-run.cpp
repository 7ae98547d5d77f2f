// The fix-its, applied and run against the runtime: the original keeps every
// iteration's autograd graph alive (the live node count grows per iteration),
// the fixed program keeps none of it (flat), and prints the same numbers.
// Here the kept tensors' grad_fn says it; test/verify shows the live counts.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s --check-prefix=ORIG
// RUN: cp %s %t.cpp
// Warnings only, so exit code 0: a run that fails fails the test.
// RUN: %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-graph-kept-across-iterations -- -std=c++17 %tt_include
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s --check-prefix=FIXED
#include "tt/tt.h"

#include <cstdio>
#include <vector>

int main() {
  tt::manual_seed(5);
  tt::Tensor w = tt::randn({16, 4}, tt::requires_grad());
  tt::Tensor total = tt::zeros({});
  std::vector<tt::Tensor> kept;
  for (int i = 0; i < 4; ++i) {
    tt::Tensor loss = tt::randn({8, 16}).matmul(w).pow(2).mean();
    total += loss;
    kept.push_back(loss);
  }
  std::printf("total %.4f has a graph: %d, first kept has a graph: %d\n", total.item<float>(),
              total.grad_fn() != nullptr, kept[0].grad_fn() != nullptr);
  return 0;
}
// ORIG: has a graph: 1, first kept has a graph: 1
// FIXED: has a graph: 0, first kept has a graph: 0
