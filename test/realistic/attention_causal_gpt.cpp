// Causal self-attention block of a small GPT-style language model.
#include <torch/torch.h>
#include <cmath>

struct GptConfig {
  int64_t n_embd = 256;
  int64_t n_head = 8;
  int64_t block_size = 128;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig &cfg) : n_head_(cfg.n_head), n_embd_(cfg.n_embd) {
    c_attn_ = register_module("c_attn", torch::nn::Linear(cfg.n_embd, 3 * cfg.n_embd));
    c_proj_ = register_module("c_proj", torch::nn::Linear(cfg.n_embd, cfg.n_embd));
    bias_ = register_buffer("bias", torch::ones({cfg.block_size, cfg.block_size}).tril());
  }

  torch::Tensor forward(const torch::Tensor &x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = c_attn_(x).split(n_embd_, /*dim=*/2);
    // FACT: y = torch.randn(2, 3, 24); q = y.split(8, 2)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 3, 4, 2), y)
    auto q = qkv[0].view({B, T, n_head_, C / n_head_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- a split along the last dim only splits that dim again
    auto k = qkv[1].view({B, T, n_head_, C / n_head_}).transpose(1, 2);
    auto v = qkv[2].view({B, T, n_head_, C / n_head_}).transpose(1, 2);

    auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(k.size(-1))));
    auto mask = bias_.index({torch::indexing::Slice(0, T), torch::indexing::Slice(0, T)});
    att = att.masked_fill(mask == 0, -std::numeric_limits<float>::infinity());
    att = torch::softmax(att, -1);
    auto y = torch::matmul(att, v); // [B, nh, T, hs]
    // FACT: y = torch.randn(2, 4, 3, 5); assert raises(lambda: y.transpose(1, 2).view(2, 3, 20), "view size is not compatible")
    y = y.transpose(1, 2).view({B, T, C}); // EXPECT: tensor-view-non-contiguous
    return c_proj_(y);
  }

  int64_t n_head_, n_embd_;
  torch::nn::Linear c_attn_{nullptr}, c_proj_{nullptr};
  torch::Tensor bias_;
};
TORCH_MODULE(CausalSelfAttention);
