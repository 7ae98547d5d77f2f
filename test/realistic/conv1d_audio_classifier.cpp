// 1-D conv audio classifier: [B, C, T] features pooled into a vector per clip.
#include <torch/torch.h>

struct AudioNetImpl : torch::nn::Module {
  AudioNetImpl(int64_t n_mels, int64_t hidden, int64_t frames, int64_t classes) {
    conv1_ = register_module("conv1", torch::nn::Conv1d(torch::nn::Conv1dOptions(n_mels, hidden, 5).padding(2)));
    conv2_ = register_module("conv2", torch::nn::Conv1d(torch::nn::Conv1dOptions(hidden, hidden, 5).padding(2)));
    head_ = register_module("head", torch::nn::Linear(hidden * frames, classes));
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1_(x));
    x = torch::relu(conv2_(x)); // [B, hidden, frames]
    // time-major features, then one vector per clip
    auto frames_first = x.transpose(1, 2);
    // FACT: x = torch.randn(2, 3, 4); assert is_copy_of(x.transpose(1, 2).flatten(1), x)
    auto flat = frames_first.flatten(1); // EXPECT: tensor-reshape-non-contiguous
    return head_(flat);
  }

  torch::nn::Conv1d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(AudioNet);

torch::Tensor frame_energies(const torch::Tensor &spec) {
  // spec: [B, n_mels, frames]; per-frame energy over mels
  auto e = spec.pow(2).sum(1); // [B, frames]
  // FACT: e = torch.randn(2, 3, 4).pow(2).sum(1); assert is_view_of(e.view(-1), e)
  return e.view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- a reduction result is contiguous
}
