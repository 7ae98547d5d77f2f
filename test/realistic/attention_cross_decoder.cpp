// Cross-attention of a seq2seq decoder over encoder memory (batch-first tensors).
#include <torch/torch.h>

struct CrossAttentionImpl : torch::nn::Module {
  CrossAttentionImpl(int64_t d_model, int64_t n_heads) : n_heads_(n_heads), d_head_(d_model / n_heads) {
    wq_ = register_module("wq", torch::nn::Linear(d_model, d_model));
    wkv_ = register_module("wkv", torch::nn::Linear(d_model, 2 * d_model));
    wo_ = register_module("wo", torch::nn::Linear(d_model, d_model));
  }

  torch::Tensor heads(const torch::Tensor &t) {
    return t.view({t.size(0), t.size(1), n_heads_, d_head_}).transpose(1, 2);
  }

  torch::Tensor forward(const torch::Tensor &tgt, const torch::Tensor &memory) {
    auto B = tgt.size(0), T = tgt.size(1);
    auto kv = wkv_(memory).chunk(2, -1);
    auto q = heads(wq_(tgt));
    auto k = heads(kv[0]);
    auto v = heads(kv[1]);
    auto w = torch::softmax(torch::matmul(q, k.transpose(2, 3)) / std::sqrt(double(d_head_)), -1);
    auto o = torch::matmul(w, v);
    // FACT: o = torch.randn(2, 4, 3, 5); assert is_copy_of(o.transpose(1, 2).reshape(2, 3, -1), o)
    auto merged = o.transpose(1, 2).reshape({B, T, n_heads_ * d_head_}); // EXPECT: tensor-reshape-non-contiguous
    return wo_(merged);
  }

  int64_t n_heads_, d_head_;
  torch::nn::Linear wq_{nullptr}, wkv_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(CrossAttention);
