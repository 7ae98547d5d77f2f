// PointNet-style encoder over point clouds [B, N, 3].
#include <torch/torch.h>

struct PointNetImpl : torch::nn::Module {
  PointNetImpl(int64_t feat) {
    c1_ = register_module("c1", torch::nn::Conv1d(torch::nn::Conv1dOptions(3, 64, 1)));
    c2_ = register_module("c2", torch::nn::Conv1d(torch::nn::Conv1dOptions(64, feat, 1)));
  }

  torch::Tensor forward(const torch::Tensor &points) {
    auto x = points.transpose(1, 2);                 // [B, 3, N]
    x = torch::relu(c1_(x));
    x = c2_(x);                                      // [B, feat, N]
    return std::get<0>(x.max(2));                    // [B, feat]
  }

  // Per-point features for the segmentation head, point-major.
  torch::Tensor point_features(const torch::Tensor &points) {
    auto x = c2_(torch::relu(c1_(points.transpose(1, 2)))); // [B, feat, N]
    auto B = x.size(0);
    // FACT: x = torch.randn(2, 4, 5); assert is_copy_of(x.transpose(1, 2).reshape(10, 4), x)
    return x.transpose(1, 2).reshape({B * x.size(2), -1}); // EXPECT: tensor-reshape-non-contiguous
  }

  torch::nn::Conv1d c1_{nullptr}, c2_{nullptr};
};
TORCH_MODULE(PointNet);

torch::Tensor center_and_scale(const torch::Tensor &points) {
  auto centered = points - points.mean(1, true);
  auto scale = centered.norm(2, -1).amax(1, true).unsqueeze(-1);
  // FACT: p = torch.randn(2, 5, 3); c = p - p.mean(1, True); c.div_(2); assert is_copy_of(c, p)
  centered.div_(scale); // LOOKALIKE: tensor-alias-then-mutate -- the subtraction allocated a new tensor
  return centered;
}
