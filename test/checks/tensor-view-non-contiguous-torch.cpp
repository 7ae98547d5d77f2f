// REQUIRES: torch
// RUN: %check_tensor_tidy %s tensor-view-non-contiguous %t -- --quiet -- %torch_include
// RUN: %check_tensor_tidy --runner=clang-tidy %s tensor-view-non-contiguous %t.plugin -- --fix-errors -- %torch_include
#include <torch/torch.h>

using torch::Tensor;

// In-place ops outside the table (index_add_, masked_fill_) return self with
// its layout: the transpose of their result is still not viewable.
Tensor gatherHeads(const Tensor &h, const Tensor &dst, const Tensor &msg, int64_t n) {
  auto agg = torch::zeros({4, n, h.size(2)}, h.options()).index_add_(1, dst, msg);
  auto nodeMajor = agg.transpose(0, 1);
  return nodeMajor.view({n, -1});
  // CHECK-MESSAGES: :[[@LINE-1]]:20: error: 'view' on the non-contiguous result of 'transpose'
}

Tensor ctcTimeMajor(const Tensor &feats, const Tensor &pad) {
  auto logProbs = torch::log_softmax(feats, 2);
  logProbs.masked_fill_(pad.unsqueeze(2), 0.0);
  auto tm = logProbs.transpose(0, 1);
  return tm.view({-1, tm.size(2)});
  // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'view' on the non-contiguous result of 'transpose'
}

// t_ transposes self back (TT_RESHAPES_SELF): its layout is not followed.
Tensor transposedBack(const Tensor &x) {
  auto y = x.transpose(0, 1);
  y.t_();
  return y.view({-1});
}
