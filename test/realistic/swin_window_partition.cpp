// Swin-Transformer window partition / reverse on [B, H, W, C] feature maps.
#include <torch/torch.h>

torch::Tensor window_partition(const torch::Tensor &x, int64_t ws) {
  auto B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  auto t = x.view({B, H / ws, ws, W / ws, ws, C});
  // FACT: x = torch.randn(2, 4, 4, 3); t = x.view(2, 2, 2, 2, 2, 3).permute(0, 1, 3, 2, 4, 5); assert raises(lambda: t.view(-1, 2, 2, 3), "view size is not compatible")
  return t.permute({0, 1, 3, 2, 4, 5}).view({-1, ws, ws, C}); // EXPECT: tensor-view-non-contiguous
}

torch::Tensor window_reverse(const torch::Tensor &windows, int64_t ws, int64_t H, int64_t W) {
  auto B = windows.size(0) / (H * W / ws / ws);
  auto x = windows.view({B, H / ws, W / ws, ws, ws, -1});
  // FACT: w = torch.randn(8, 2, 2, 3); x = w.view(2, 2, 2, 2, 2, 3).permute(0, 1, 3, 2, 4, 5); assert not raises(lambda: x.contiguous().view(2, 4, 4, -1))
  return x.permute({0, 1, 3, 2, 4, 5}).contiguous().view({B, H, W, -1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() before merging
}

// Cyclic shift for shifted windows: roll allocates, so the later view is fine.
torch::Tensor shifted_windows(const torch::Tensor &x, int64_t ws) {
  auto shifted = torch::roll(x, {-ws / 2, -ws / 2}, {1, 2});
  auto B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  // FACT: x = torch.randn(2, 4, 4, 3); assert is_contiguous(torch.roll(x, (-1, -1), (1, 2)))
  return shifted.view({B, H / ws, ws, W / ws, ws, C}); // LOOKALIKE: tensor-view-non-contiguous -- roll() returns a contiguous tensor
}
