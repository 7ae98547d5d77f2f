// Token-mixing block of an MLP-Mixer style model, split into small helpers.
#include <torch/torch.h>

// [B, T, C] -> [B, C, T]: mix along the tokens.
torch::Tensor tokens_last(const torch::Tensor &x) { return x.transpose(1, 2); }

// [B, T, C] -> [B, C, T], materialised once for the kernels that want it.
torch::Tensor tokens_last_packed(const torch::Tensor &x) { return x.transpose(1, 2).contiguous(); }

struct MixerBlockImpl : torch::nn::Module {
  MixerBlockImpl(int64_t tokens, int64_t channels)
      : norm1(torch::nn::LayerNormOptions({channels})), norm2(torch::nn::LayerNormOptions({channels})),
        token_mlp(tokens, tokens), channel_mlp(channels, channels) {
    register_module("norm1", norm1);
    register_module("norm2", norm2);
    register_module("token_mlp", token_mlp);
    register_module("channel_mlp", channel_mlp);
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto B = x.size(0);
    auto mixed = token_mlp(tokens_last(norm1(x)));        // [B, C, T]
    // FACT: m = torch.randn(2, 3, 4); assert is_copy_of(m.transpose(1, 2).reshape(2, -1), m)
    auto flat = tokens_last(mixed).reshape({B, -1});      // EXPECT: tensor-reshape-non-contiguous
    auto packed = tokens_last_packed(mixed);
    // FACT: m = torch.randn(2, 3, 4); p = m.transpose(1, 2).contiguous(); assert is_view_of(p.reshape(2, -1), p)
    auto rows = packed.reshape({B, -1});                  // LOOKALIKE: tensor-reshape-non-contiguous -- the helper returned a contiguous copy
    auto y = x + tokens_last(mixed);
    return y + channel_mlp(norm2(y)) + 0 * (flat.sum() + rows.sum());
  }

  torch::nn::LayerNorm norm1, norm2;
  torch::nn::Linear token_mlp, channel_mlp;
};
TORCH_MODULE(MixerBlock);

// Patches of an image as rows: back-to-back windows.
torch::Tensor patch_rows(const torch::Tensor &img, int64_t p) {
  auto B = img.size(0);
  auto patches = img.unfold(2, p, p).unfold(3, p, p);     // [B, C, H/p, W/p, p, p]
  // FACT: i = torch.randn(2, 3, 4, 4); q = i.unfold(2, 2, 2).unfold(3, 2, 2); assert is_copy_of(q.permute(0, 2, 3, 1, 4, 5).reshape(2, 4, -1), i)
  return patches.permute({0, 2, 3, 1, 4, 5}).reshape({B, -1, img.size(1) * p * p}); // EXPECT: tensor-reshape-non-contiguous
}
