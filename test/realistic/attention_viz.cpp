// Attention layer that also exports normalised attention maps for a dashboard.
#include <torch/torch.h>
#include <vector>

struct VisAttentionImpl : torch::nn::Module {
  explicit VisAttentionImpl(int64_t dim) {
    qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto parts = qkv_(x).chunk(3, -1);
    auto attn = torch::softmax(torch::matmul(parts[0], parts[1].transpose(1, 2)), -1);
    auto heat = attn.detach();
    // FACT: a = torch.softmax(torch.randn(2, 3, requires_grad=True), -1); h = a.detach(); h.div_(2); assert backward_fails(lambda: (a * 2).sum().backward())
    heat.div_(heat.amax({1, 2}, true)); // EXPECT: tensor-inplace-on-detached
    maps_.push_back(heat);
    return torch::matmul(attn, parts[2]);
  }

  torch::nn::Linear qkv_{nullptr};
  std::vector<torch::Tensor> maps_;
};
TORCH_MODULE(VisAttention);
