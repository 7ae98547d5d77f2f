// Multi-head attention written the careful way: heads merged after an explicit contiguous().
#include <torch/torch.h>

struct MhaImpl : torch::nn::Module {
  MhaImpl(int64_t dim, int64_t heads) : heads_(heads) {
    q_ = register_module("q", torch::nn::Linear(dim, dim));
    k_ = register_module("k", torch::nn::Linear(dim, dim));
    v_ = register_module("v", torch::nn::Linear(dim, dim));
    out_ = register_module("out", torch::nn::Linear(dim, dim));
  }

  torch::Tensor split_heads(const torch::Tensor &t) const {
    auto B = t.size(0), T = t.size(1);
    // FACT: t = torch.randn(2, 3, 8); assert is_view_of(t.view(2, 3, 4, -1).permute(0, 2, 1, 3), t)
    return t.view({B, T, heads_, -1}).permute({0, 2, 1, 3}); // LOOKALIKE: tensor-view-non-contiguous -- the view comes before the permute
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &key_padding) {
    auto B = x.size(0), T = x.size(1), D = x.size(2);
    auto q = split_heads(q_(x)), k = split_heads(k_(x)), v = split_heads(v_(x));
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(D / heads_));
    scores = scores.masked_fill(key_padding.view({B, 1, 1, T}), -1e9);
    auto ctx = torch::matmul(torch::softmax(scores, -1), v);
    // FACT: c = torch.randn(2, 4, 3, 5).permute(0, 2, 1, 3); assert not is_contiguous(c) and not raises(lambda: c.contiguous().view(2, 3, 20))
    ctx = ctx.permute({0, 2, 1, 3}).contiguous().view({B, T, D}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
    return out_(ctx);
  }

  int64_t heads_;
  torch::nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Mha);
