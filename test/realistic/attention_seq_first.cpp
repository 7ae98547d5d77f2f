// Attention over sequence-first inputs [T, B, C] (the layout torch::nn::MultiheadAttention uses).
#include <torch/torch.h>

torch::Tensor seq_first_attention(const torch::Tensor &query, const torch::Tensor &key,
                                  const torch::Tensor &value, int64_t num_heads) {
  auto T = query.size(0), B = query.size(1), C = query.size(2);
  auto hd = C / num_heads;
  // FACT: q = torch.randn(3, 2, 8); assert is_view_of(q.view(3, 8, 2).transpose(0, 1), q)
  auto q = query.contiguous().view({T, B * num_heads, hd}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- view of a contiguous [T, B, C]
  auto k = key.contiguous().view({-1, B * num_heads, hd}).transpose(0, 1);
  auto v = value.contiguous().view({-1, B * num_heads, hd}).transpose(0, 1);
  auto attn = torch::softmax(torch::bmm(q, k.transpose(1, 2)) / std::sqrt(double(hd)), -1);
  auto out = torch::bmm(attn, v); // [B*nh, T, hd]
  // FACT: o = torch.randn(6, 3, 4); assert is_copy_of(o.transpose(0, 1).reshape(3, 2, 12), o)
  return out.transpose(0, 1).reshape({T, B, C}); // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor to_batch_first(const torch::Tensor &enc_out, int64_t n_heads) {
  auto T = enc_out.size(0), B = enc_out.size(1), C = enc_out.size(2);
  // FACT: e = torch.randn(3, 2, 8); assert is_view_of(e.transpose(0, 1).view(2, 3, 4, 2), e)
  return enc_out.transpose(0, 1).view({B, T, n_heads, C / n_heads}); // LOOKALIKE: tensor-view-non-contiguous -- only the last dim is split
}
