// Semantic segmentation: per-pixel logits [B, K, H, W] turned into rows for the loss.
#include <torch/torch.h>

torch::Tensor pixel_rows(const torch::Tensor &logits) {
  auto K = logits.size(1);
  // FACT: l = torch.randn(2, 3, 4, 5); assert raises(lambda: l.permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
  return logits.permute({0, 2, 3, 1}).view({-1, K}); // EXPECT: tensor-view-non-contiguous
}

torch::Tensor pixel_rows_ok(const torch::Tensor &logits) {
  auto K = logits.size(1);
  // FACT: l = torch.randn(2, 3, 4, 5); assert is_copy_of(l.permute(0, 2, 3, 1).reshape(-1, 3), l)
  return logits.permute({0, 2, 3, 1}).reshape({-1, K}); // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor dice_loss(const torch::Tensor &logits, const torch::Tensor &target_onehot) {
  auto probs = torch::softmax(logits, 1);
  auto B = probs.size(0), K = probs.size(1);
  // FACT: p = torch.randn(2, 3, 4, 5); assert is_view_of(p.view(2, 3, -1), p)
  auto p = probs.view({B, K, -1}); // LOOKALIKE: tensor-view-non-contiguous -- softmax output is contiguous
  auto t = target_onehot.view({B, K, -1});
  auto inter = (p * t).sum(2);
  auto denom = p.sum(2) + t.sum(2);
  return 1 - ((2 * inter + 1) / (denom + 1)).mean();
}
