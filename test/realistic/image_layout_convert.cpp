// Converting decoded images between HWC (OpenCV) and CHW (the model) layouts.
#include <torch/torch.h>

// [H, W, 3] float -> [3, H*W] for a per-channel colour transform
torch::Tensor pixels_by_channel(const torch::Tensor &hwc) {
  // FACT: x = torch.randn(4, 5, 3); assert is_view_of(x.permute(2, 0, 1).reshape(3, -1), x)
  return hwc.permute({2, 0, 1}).reshape({3, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent with their strides: a view
}

torch::Tensor apply_color_matrix(const torch::Tensor &hwc, const torch::Tensor &ccm) {
  auto H = hwc.size(0), W = hwc.size(1);
  auto px = pixels_by_channel(hwc);                 // [3, H*W]
  return torch::matmul(ccm, px).view({3, H, W});
}

// [B, 3, H, W] model output -> [B, H, W, 3] for saving with OpenCV
torch::Tensor to_hwc_batch(const torch::Tensor &bchw) {
  auto B = bchw.size(0);
  // FACT: x = torch.randn(2, 3, 4, 5); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(2, -1), x)
  auto rows = bchw.permute({0, 2, 3, 1}).reshape({B, -1}); // EXPECT: tensor-reshape-non-contiguous
  return rows.mul(255).clamp(0, 255).to(torch::kByte);
}

torch::Tensor to_hwc_contiguous(const torch::Tensor &bchw) {
  // FACT: x = torch.randn(2, 3, 4, 5); assert is_contiguous(x.permute(0, 2, 3, 1).contiguous())
  return bchw.permute({0, 2, 3, 1}).contiguous().view({bchw.size(0), -1}); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- the copy is explicit
}
