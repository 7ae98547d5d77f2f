// Super-resolution head: sub-pixel convolution written by hand (depth-to-space).
#include <torch/torch.h>

torch::Tensor depth_to_space(const torch::Tensor &x, int64_t r) {
  auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto oc = C / (r * r);
  auto t = x.view({B, oc, r, r, H, W}).permute({0, 1, 4, 2, 5, 3});
  // FACT: x = torch.randn(2, 8, 3, 5); t = x.view(2, 2, 2, 2, 3, 5).permute(0, 1, 4, 2, 5, 3); assert is_copy_of(t.reshape(2, 2, 6, 10), x)
  return t.reshape({B, oc, H * r, W * r}); // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor space_to_depth(const torch::Tensor &x, int64_t r) {
  auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto t = x.view({B, C, H / r, r, W / r, r}).permute({0, 1, 3, 5, 2, 4});
  // FACT: x = torch.randn(2, 3, 4, 6); t = x.view(2, 3, 2, 2, 3, 2).permute(0, 1, 3, 5, 2, 4); assert is_contiguous(t.contiguous())
  return t.contiguous().view({B, C * r * r, H / r, W / r}); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- the copy is explicit
}

// Channel split for a grouped block: narrow keeps H and W adjacent.
torch::Tensor first_group_rows(const torch::Tensor &x, int64_t groups) {
  auto B = x.size(0), C = x.size(1);
  auto g = x.narrow(1, 0, C / groups);
  // FACT: x = torch.randn(2, 6, 4, 5); assert is_view_of(x.narrow(1, 0, 2).flatten(2), x)
  return g.flatten(2).view({B, C / groups, -1}); // LOOKALIKE: tensor-reshape-non-contiguous, tensor-view-non-contiguous -- only H and W are merged, and they are contiguous within a channel
}
