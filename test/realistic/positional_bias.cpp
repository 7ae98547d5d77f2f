// Relative position bias and ALiBi slopes added to attention scores.
#include <torch/torch.h>

struct RelPosBiasImpl : torch::nn::Module {
  RelPosBiasImpl(int64_t heads, int64_t max_dist) : max_dist_(max_dist) {
    table_ = register_parameter("table", torch::zeros({2 * max_dist + 1, heads}));
  }

  // [heads, T, T] bias from a learned table indexed by clipped relative distance.
  torch::Tensor forward(int64_t T) {
    auto pos = torch::arange(T, torch::kLong);
    auto rel = (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(-max_dist_, max_dist_) + max_dist_;
    // FACT: pos = torch.arange(4); r = (pos.unsqueeze(0) - pos.unsqueeze(1)).clamp(-2, 2) + 2; assert is_view_of(r.view(-1), r)
    auto bias = table_.index_select(0, rel.view({-1})); // LOOKALIKE: tensor-view-non-contiguous -- a fresh arithmetic result is contiguous
    return bias.view({T, T, -1}).permute({2, 0, 1});
  }

  int64_t max_dist_;
  torch::Tensor table_;
};
TORCH_MODULE(RelPosBias);

// ALiBi: one slope per head broadcast over [B, heads, T, T] scores, flattened for a fused kernel.
torch::Tensor alibi_flat(const torch::Tensor &slopes, const torch::Tensor &scores) {
  auto bias = slopes.view({1, -1, 1, 1}).expand_as(scores);
  // FACT: s = torch.randn(3).view(1, -1, 1, 1).expand(2, 3, 4, 4); assert raises(lambda: s.view(-1), "view size is not compatible")
  return scores.view({-1}) + bias.view({-1}); // EXPECT: tensor-view-non-contiguous
}
