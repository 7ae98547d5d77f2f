// Anchor boxes for a single-stage detector: every cell centre paired with
// every anchor shape.
#include <torch/torch.h>

torch::Tensor make_anchors(const torch::Tensor &centers, const torch::Tensor &shapes) {
  // centers: [N, 2], shapes: [K, 2] -> boxes [N, K, 4] as (cx, cy, w, h)
  auto N = centers.size(0), K = shapes.size(0);
  auto c = centers.unsqueeze(1).expand({N, K, 2});
  auto s = shapes.unsqueeze(0).expand({N, K, 2});
  return torch::cat({c, s}, 2);
}

torch::Tensor jittered_centers(const torch::Tensor &centers, int64_t K, double stride) {
  auto N = centers.size(0);
  auto c = centers.unsqueeze(1).expand({N, K, 2});
  // FACT: c = torch.randn(4, 2).unsqueeze(1).expand(4, 3, 2); assert raises(lambda: c.add_(torch.rand(4, 3, 2)), "more than one element of the written-to tensor")
  c.add_(torch::rand({N, K, 2}) * stride); // EXPECT: tensor-inplace-on-expanded
  return c;
}

torch::Tensor jittered_centers_ok(const torch::Tensor &centers, int64_t K, double stride) {
  auto N = centers.size(0);
  auto c = centers.unsqueeze(1).expand({N, K, 2}) + torch::rand({N, K, 2}) * stride;
  // FACT: c = torch.randn(4, 2).unsqueeze(1).expand(4, 3, 2) + torch.rand(4, 3, 2); assert not raises(lambda: c.clamp_(0, 1))
  c.clamp_(0, 1); // LOOKALIKE: tensor-inplace-on-expanded -- the sum is a new tensor
  return c;
}

torch::Tensor clipped_shapes(const torch::Tensor &shapes, int64_t N, double max_size) {
  auto s = shapes.unsqueeze(0).expand({N, -1, -1});
  // FACT: s = torch.rand(3, 2).unsqueeze(0).expand(4, -1, -1); assert raises(lambda: s.clamp_(max=0.5), "more than one element of the written-to tensor")
  s.clamp_(0, max_size); // EXPECT: tensor-inplace-on-expanded
  return s;
}
