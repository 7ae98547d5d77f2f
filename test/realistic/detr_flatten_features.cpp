// Flattening a CNN feature map into a token sequence for a DETR-style transformer encoder.
#include <torch/torch.h>

struct BackboneTokensImpl : torch::nn::Module {
  BackboneTokensImpl(int64_t in_ch, int64_t d_model) {
    input_proj_ = register_module("input_proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_ch, d_model, 1)));
  }

  // [B, C, H, W] -> [B, H*W, C]
  torch::Tensor forward(const torch::Tensor &features) {
    auto src = input_proj_(features);
    auto B = src.size(0), C = src.size(1), H = src.size(2), W = src.size(3);
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.permute(0, 2, 3, 1).reshape(2, 20, 3), x)
    return src.permute({0, 2, 3, 1}).reshape({B, H * W, C}); // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent: a view
  }

  torch::nn::Conv2d input_proj_{nullptr};
};
TORCH_MODULE(BackboneTokens);

// Positional encodings flattened the same way; the sine table is built as [H, W, C].
torch::Tensor flatten_pos(const torch::Tensor &pos_hwc) {
  // FACT: p = torch.randn(4, 5, 3); assert is_view_of(p.flatten(0, 1), p)
  return pos_hwc.flatten(0, 1).unsqueeze(0); // LOOKALIKE: tensor-reshape-non-contiguous -- contiguous input
}
