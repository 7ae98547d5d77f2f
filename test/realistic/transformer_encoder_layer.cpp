// Pre-norm transformer encoder layer with an explicit attention implementation.
#include <torch/torch.h>

struct EncoderLayerImpl : torch::nn::Module {
  EncoderLayerImpl(int64_t d, int64_t heads, int64_t ff) : heads_(heads) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    in_proj_ = register_module("in_proj", torch::nn::Linear(d, 3 * d));
    out_proj_ = register_module("out_proj", torch::nn::Linear(d, d));
    ff1_ = register_module("ff1", torch::nn::Linear(d, ff));
    ff2_ = register_module("ff2", torch::nn::Linear(ff, d));
  }

  torch::Tensor attention(const torch::Tensor &x) {
    auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = in_proj_(x).view({B, T, 3, heads_, C / heads_}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2]; // [B, nh, T, hs]
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(C / heads_)), -1);
    auto out = torch::matmul(att, v);
    // FACT: o = torch.randn(2, 4, 3, 5); assert raises(lambda: o.permute(0, 2, 1, 3).view(2, 3, 20), "view size is not compatible")
    return out_proj_(out.permute({0, 2, 1, 3}).view({B, T, C})); // EXPECT: tensor-view-non-contiguous
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto h = x + attention(ln1_(x));
    return h + ff2_(torch::gelu(ff1_(ln2_(h))));
  }

  int64_t heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear in_proj_{nullptr}, out_proj_{nullptr}, ff1_{nullptr}, ff2_{nullptr};
};
TORCH_MODULE(EncoderLayer);
