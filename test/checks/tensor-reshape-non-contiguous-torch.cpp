// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-reshape-non-contiguous %t -- --quiet -- %torch_include
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-reshape-non-contiguous %t.plugin -- --quiet -- %torch_include
#include <torch/torch.h>

torch::Tensor featureMap() {
  auto p = torch::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1});
  return p.reshape({64, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'permute' (196.0 MiB): the new shape cannot be a view of its strides; make the copy explicit with '.contiguous().view(...)'
  // CHECK-FIXES: return p.contiguous().view({64, -1});
}

torch::Tensor half() {
  auto h = torch::ones({512, 512}, torch::kHalf).t();
  return h.flatten();
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'flatten' silently copies the non-contiguous result of 't' (512.0 KiB)
}

torch::Tensor heads(const torch::Tensor &x, int64_t nh) {
  auto B = x.size(0), T = x.size(1), C = x.size(2);
  auto y = x.view({B, T, nh, C / nh}).transpose(1, 2);
  return y.reshape({B, T, C});
  // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'reshape' silently copies the non-contiguous result of 'transpose': the new shape cannot be a view unless
}

void negatives(const torch::Tensor &x) {
  torch::zeros({64, 256, 56, 56}).permute({0, 2, 3, 1}).reshape({64, 56, 56, 256}); // a view
  x.t().reshape(-1);                          // nothing known about x
  torch::zeros({4, 6}).narrow(0, 1, 2).reshape({12});
}
