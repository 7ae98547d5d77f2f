// ShuffleNet channel shuffle.
#include <torch/torch.h>

torch::Tensor channel_shuffle(const torch::Tensor &x, int64_t groups) {
  auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto t = x.view({B, groups, C / groups, H, W}).transpose(1, 2);
  // FACT: x = torch.randn(2, 6, 4, 5); t = x.view(2, 2, 3, 4, 5).transpose(1, 2); assert raises(lambda: t.view(2, 6, 4, 5), "view size is not compatible")
  return t.view({B, C, H, W}); // EXPECT: tensor-view-non-contiguous
}

torch::Tensor channel_shuffle_reshape(const torch::Tensor &x, int64_t groups) {
  auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto t = x.view({B, groups, C / groups, H, W}).transpose(1, 2);
  // FACT: x = torch.randn(2, 6, 4, 5); t = x.view(2, 2, 3, 4, 5).transpose(1, 2); assert is_copy_of(t.reshape(2, 6, 4, 5), x)
  return t.reshape({B, C, H, W}); // EXPECT: tensor-reshape-non-contiguous
}

// Grouped statistics: the transposed group dim is kept apart, so the reshape is a view.
torch::Tensor group_means(const torch::Tensor &x, int64_t groups) {
  auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto t = x.view({B, groups, C / groups, H, W}).transpose(1, 2);
  // FACT: x = torch.randn(2, 6, 4, 5); t = x.view(2, 2, 3, 4, 5).transpose(1, 2); assert is_view_of(t.reshape(2, 3, 2, 20), x)
  return t.reshape({B, C / groups, groups, H * W}).mean(-1); // LOOKALIKE: tensor-reshape-non-contiguous -- merges only H and W: a view
}
