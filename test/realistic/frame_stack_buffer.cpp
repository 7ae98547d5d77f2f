// Frame stacking for an Atari-style agent: the last k observations, oldest first.
#include <torch/torch.h>

class FrameStack {
public:
  FrameStack(int64_t k, int64_t h, int64_t w) : frames_(torch::zeros({k, h, w})) {}

  torch::Tensor push(const torch::Tensor &obs) {
    auto k = frames_.size(0);
    // FACT: f = torch.randn(4, 2, 2); assert raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3)), "some elements of the input tensor and the written-to tensor")
    frames_.narrow(0, 0, k - 1).copy_(frames_.narrow(0, 1, k - 1)); // EXPECT: tensor-inplace-overlap
    frames_[k - 1].copy_(obs); // LOOKALIKE: tensor-inplace-overlap -- the new frame is another tensor
    return frames_.unsqueeze(0);
  }

  torch::Tensor push_rolled(const torch::Tensor &obs) {
    // FACT: f = torch.randn(4, 2, 2); assert is_copy_of(torch.roll(f, -1, 0), f)
    frames_ = torch::roll(frames_, -1, 0);
    frames_[frames_.size(0) - 1].copy_(obs);
    return frames_.unsqueeze(0);
  }

  torch::Tensor push_cloned(const torch::Tensor &obs) {
    auto k = frames_.size(0);
    // FACT: f = torch.randn(4, 2, 2); assert not raises(lambda: f.narrow(0, 0, 3).copy_(f.narrow(0, 1, 3).clone()))
    frames_.narrow(0, 0, k - 1).copy_(frames_.narrow(0, 1, k - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the source is cloned first
    frames_[k - 1].copy_(obs);
    return frames_.unsqueeze(0);
  }

private:
  torch::Tensor frames_;
};
