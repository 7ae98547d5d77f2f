// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-view-non-contiguous %t -- --quiet -- %torch_include
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-view-non-contiguous %t.plugin -- --fix-errors -- %torch_include
#include <torch/torch.h>

torch::Tensor certain() {
  auto x = torch::randn({3, 4});
  return x.t().view({12});
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: 'view' on the non-contiguous result of 't' always throws at run time: sizes [4, 3] with strides [1, 4] cannot be viewed as [12]
  // CHECK-FIXES: return x.t().contiguous().view({12});
}

torch::Tensor mergeHeads(const torch::Tensor &y, int64_t B, int64_t T, int64_t nh, int64_t hs) {
  auto att = y.view({B, T, nh, hs}).transpose(1, 2); // [B, nh, T, hs]
  return att.view({B, T, nh * hs});
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'y' is contiguous, as nearly all tensors are)
  // CHECK-FIXES: return att.contiguous().view({B, T, nh * hs});
}

torch::Tensor matrix(const torch::Tensor &w) {
  return torch::transpose(w, 0, 1).view(-1);
  // CHECK-MESSAGES: :[[@LINE-1]]:36: warning: 'view' on the non-contiguous result of 'transpose' throws at run time unless the dimensions it merges have size 1 (assuming 'w' is contiguous
  // CHECK-FIXES: return torch::transpose(w, 0, 1).reshape(-1);
}

void negatives(const torch::Tensor &x, int64_t B, int64_t T, int64_t nh, int64_t hs) {
  torch::randn({3, 4}).t().view({4, 3});              // the transposed shape
  x.view({B, T, nh, hs}).transpose(1, 2).view({B, nh, T, hs}); // no merge
  x.view({B, T, nh, hs}).transpose(1, 2).contiguous().view({B, T, nh * hs});
  torch::zeros({2, 3, 4}).permute({0, 2, 1}).view({2, 12}).sum(); // merges 4 and 3: no
  // CHECK-MESSAGES: :[[@LINE-1]]:46: error: 'view' on the non-contiguous result of 'permute' always throws
}
