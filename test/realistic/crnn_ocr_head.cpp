// CRNN text recogniser: conv features collapsed to a sequence for a bidirectional LSTM.
#include <torch/torch.h>

struct CrnnImpl : torch::nn::Module {
  CrnnImpl(int64_t channels, int64_t hidden, int64_t num_classes) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, channels, 3).padding(1)));
    rnn_ = register_module("rnn", torch::nn::LSTM(torch::nn::LSTMOptions(channels, hidden).bidirectional(true)));
    fc_ = register_module("fc", torch::nn::Linear(2 * hidden, num_classes));
  }

  torch::Tensor forward(const torch::Tensor &images) {
    auto f = torch::relu(conv_(images));           // [B, C, H, W]
    f = torch::max_pool2d(f, {f.size(2), 1});       // [B, C, 1, W]
    auto seq = f.squeeze(2).permute({2, 0, 1});     // [W, B, C]: what the LSTM wants
    auto out = std::get<0>(rnn_(seq));              // [W, B, 2H]
    auto W = out.size(0), B = out.size(1);
    // FACT: o = torch.randn(5, 2, 6); assert is_view_of(o.view(10, 6), o)
    auto logits = fc_(out.view({W * B, -1})); // LOOKALIKE: tensor-view-non-contiguous -- the LSTM output is contiguous
    return logits.view({W, B, -1}).log_softmax(2);
  }

  torch::nn::Conv2d conv_{nullptr};
  torch::nn::LSTM rnn_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(Crnn);

// The CTC loss wants [T, B, C]; the caller kept batch-first features [B, T, C] for logging.
torch::Tensor ctc_inputs(const torch::Tensor &batch_first_logits) {
  auto B = batch_first_logits.size(0), T = batch_first_logits.size(1);
  // FACT: x = torch.randn(2, 3, 4); assert is_copy_of(x.transpose(0, 1).reshape(6, -1), x)
  auto flat = batch_first_logits.transpose(0, 1).reshape({T * B, -1}); // EXPECT: tensor-reshape-non-contiguous
  return flat.log_softmax(1).view({T, B, -1});
}
