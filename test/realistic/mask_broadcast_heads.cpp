// Padding masks for multi-head attention implemented with bmm over [B*nh, T, T].
#include <torch/torch.h>

torch::Tensor heads_mask(const torch::Tensor &pad_mask, int64_t n_heads) {
  // pad_mask: [B, 1, T, T] -> one mask per head for bmm
  auto B = pad_mask.size(0), T = pad_mask.size(2);
  auto m = pad_mask.expand({B, n_heads, T, T});
  // FACT: m = torch.ones(2, 1, 3, 3).expand(2, 4, 3, 3); assert raises(lambda: m.view(8, 3, 3), "view size is not compatible")
  return m.view({B * n_heads, T, T}); // EXPECT: tensor-view-non-contiguous
}

torch::Tensor heads_mask_ok(const torch::Tensor &pad_mask, int64_t n_heads) {
  auto B = pad_mask.size(0), T = pad_mask.size(2);
  // FACT: m = torch.ones(2, 1, 3, 3); assert not raises(lambda: m.repeat(1, 4, 1, 1).view(8, 3, 3))
  return pad_mask.repeat({1, n_heads, 1, 1}).view({B * n_heads, T, T}); // LOOKALIKE: tensor-view-non-contiguous -- repeat() materialises
}

torch::Tensor key_padding_scores(const torch::Tensor &scores, const torch::Tensor &key_pad, int64_t n_heads) {
  // scores: [B*nh, T, S]; key_pad: [B, S]
  auto B = key_pad.size(0), S = key_pad.size(1);
  auto s = scores.view({B, n_heads, -1, S}); // LOOKALIKE: tensor-view-non-contiguous -- bmm output is contiguous
  s = s.masked_fill(key_pad.view({B, 1, 1, S}), -1e9);
  return s.view({B * n_heads, -1, S});
}
