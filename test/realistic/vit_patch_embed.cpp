// Patch embedding of a Vision Transformer without a strided conv (manual patchify).
#include <torch/torch.h>

struct PatchEmbedImpl : torch::nn::Module {
  PatchEmbedImpl(int64_t in_ch, int64_t patch, int64_t dim) : patch_(patch) {
    proj_ = register_module("proj", torch::nn::Linear(in_ch * patch * patch, dim));
    cls_ = register_parameter("cls", torch::zeros({1, 1, dim}));
  }

  torch::Tensor forward(const torch::Tensor &img) {
    auto B = img.size(0), C = img.size(1), H = img.size(2), W = img.size(3);
    auto p = patch_;
    auto grid = img.view({B, C, H / p, p, W / p, p}).permute({0, 2, 4, 1, 3, 5});
    // FACT: x = torch.randn(2, 3, 4, 4); g = x.view(2, 3, 2, 2, 2, 2).permute(0, 2, 4, 1, 3, 5); assert is_copy_of(g.reshape(2, 4, 12), x)
    auto patches = grid.reshape({B, (H / p) * (W / p), C * p * p}); // EXPECT: tensor-reshape-non-contiguous
    auto tokens = proj_(patches);
    return torch::cat({cls_.expand({B, -1, -1}), tokens}, 1);
  }

  int64_t patch_;
  torch::nn::Linear proj_{nullptr};
  torch::Tensor cls_;
};
TORCH_MODULE(PatchEmbed);
