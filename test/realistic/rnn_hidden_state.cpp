// Stateful GRU for streaming inference: the hidden state is carried between calls.
#include <torch/torch.h>

class StreamingGru {
public:
  StreamingGru(int64_t in, int64_t hidden) : gru_(torch::nn::GRUOptions(in, hidden)) {
    h_ = torch::zeros({1, 1, hidden});
  }

  torch::Tensor step(const torch::Tensor &frame) {
    torch::NoGradGuard no_grad;
    // FACT: f = torch.randn(5); assert is_view_of(f.view(1, 1, -1), f)
    auto [out, h] = gru_->forward(frame.view({1, 1, -1}), h_); // LOOKALIKE: tensor-view-non-contiguous -- a single frame [in] is contiguous
    h_ = h;
    return out.squeeze();
  }

  // Decays the carried state between utterances instead of resetting it.
  void soften(double factor) {
    torch::NoGradGuard no_grad;
    auto h = h_.data();
    // FACT: s = torch.randn(1, 1, 4); d = s.data; d.mul_(0.5); assert shares_storage(d, s)
    h.mul_(factor); // LOOKALIKE: tensor-inplace-on-detached -- the state is meant to change, under NoGradGuard
  }

  // Returns a snapshot for the caller to inspect; callers have written into it before.
  torch::Tensor state_for_debug() {
    auto snap = h_.detach();
    // FACT: s = torch.randn(1, 1, 4); d = s.detach(); d.zero_(); assert s.abs().sum() == 0
    snap.clamp_(-1, 1); // EXPECT: tensor-inplace-on-detached
    return snap;
  }

private:
  torch::nn::GRU gru_;
  torch::Tensor h_;
};
