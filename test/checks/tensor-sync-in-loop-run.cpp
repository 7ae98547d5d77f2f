// The fix-it, applied and run against the runtime: the running sum moves to
// the device and is read once. On a CPU-only machine the hazard cannot show
// (no device to wait for); the fixed program must still build and print the
// same sum. With a GPU, the device-to-host copies drop from 10 to 1.
// REQUIRES: tidy
// RUN: %clangxx -std=c++17 %tt_include %s %tt_lib -o %t.orig
// RUN: %t.orig | FileCheck %s
// RUN: cp %s %t.cpp
// RUN: %tensor_tidy %t.cpp --fix --quiet --checks=-*,tensor-sync-in-loop -- -std=c++17 %tt_include
// RUN: grep -q "running_t = running_t + loss.detach()" %t.cpp
// RUN: %clangxx -std=c++17 %tt_include %t.cpp %tt_lib -o %t.fixed
// RUN: %t.fixed | FileCheck %s
#include "tt/tt.h"

#include <cstdio>

int main() {
  tt::manual_seed(2);
  tt::Device device = tt::cuda::is_available() ? tt::kCUDA : tt::kCPU;
  tt::Tensor w = tt::full({8, 8}, 0.25).to(device);
  double running = 0;
  for (int step = 0; step < 10; ++step) {
    tt::Tensor x = tt::full({4, 8}, 0.5 * step).to(device);
    tt::Tensor loss = x.mm(w).mean();
    running += loss.item<double>();
  }
  std::printf("running %.4f\n", running);
  return 0;
}
// 0.5 * step * 8 * 0.25 summed over steps 0..9: 45.
// CHECK: running 45.0000
