// Truncated back-propagation through time for an LSTM language model.
#include <torch/torch.h>
#include <vector>

struct LmImpl : torch::nn::Module {
  LmImpl(int64_t vocab, int64_t hidden) : hidden_(hidden) {
    emb_ = register_module("emb", torch::nn::Embedding(vocab, hidden));
    lstm_ = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(hidden, hidden)));
    dec_ = register_module("dec", torch::nn::Linear(hidden, vocab));
  }
  torch::nn::Embedding emb_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear dec_{nullptr};
  int64_t hidden_;
};
TORCH_MODULE(Lm);

void train_bptt(Lm &lm, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &chunks,
                const torch::Tensor &init_h, const torch::Tensor &init_c) {
  auto h = init_h, c = init_c;
  for (const auto &chunk : chunks) {
    auto input = chunk.narrow(0, 0, chunk.size(0) - 1);
    auto target = chunk.narrow(0, 1, chunk.size(0) - 1);
    auto [out, state] = lm->lstm_(lm->emb_(input), std::make_tuple(h, c));
    h = std::get<0>(state).detach();
    c = std::get<1>(state).detach();
    auto logits = lm->dec_(out);
    // FACT: l = torch.randn(3, 2, 5); assert is_view_of(l.view(6, 5), l)
    // FACT: c = torch.arange(12).view(4, 3); t = c.narrow(0, 1, 3); assert is_contiguous(t) and is_view_of(t.reshape(-1), c)
    auto loss = torch::nn::functional::cross_entropy(logits.view({-1, logits.size(2)}), target.reshape({-1})); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- decoder output is contiguous; narrowing dim 0 keeps contiguity
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// Resets the hidden state between documents by zeroing the carried tensors.
void reset_state(torch::Tensor &h, torch::Tensor &c) {
  h.detach().zero_(); // LOOKALIKE: tensor-inplace-on-detached -- a direct chain: zeroing the carried state is the intent
  c.detach().zero_();
}
