// Sequence tagger: embedding -> GRU -> per-token classifier, batch-first tensors.
#include <torch/torch.h>

struct TaggerImpl : torch::nn::Module {
  TaggerImpl(int64_t vocab, int64_t emb, int64_t hidden, int64_t tags) {
    embed_ = register_module("embed", torch::nn::Embedding(vocab, emb));
    gru_ = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(emb, hidden).batch_first(true)));
    out_ = register_module("out", torch::nn::Linear(hidden, tags));
  }

  torch::Tensor forward(const torch::Tensor &tokens) {
    auto e = embed_(tokens);              // [B, T, E]
    auto h = std::get<0>(gru_(e));        // [B, T, H]
    auto logits = out_(h);                // [B, T, tags]
    // FACT: l = torch.randn(2, 3, 4); assert is_view_of(l.view(6, 4), l)
    return logits.view({-1, logits.size(-1)}); // LOOKALIKE: tensor-view-non-contiguous -- linear output is contiguous
  }

  // The CRF layer downstream wants time-major emissions, one row per time step.
  torch::Tensor emissions_time_major(const torch::Tensor &tokens) {
    auto logits = out_(std::get<0>(gru_(embed_(tokens)))); // [B, T, tags]
    auto T = logits.size(1);
    // FACT: l = torch.randn(2, 3, 4); assert raises(lambda: l.transpose(0, 1).view(3, -1), "view size is not compatible")
    return logits.transpose(0, 1).view({T, -1}); // EXPECT: tensor-view-non-contiguous
  }

  torch::nn::Embedding embed_{nullptr};
  torch::nn::GRU gru_{nullptr};
  torch::nn::Linear out_{nullptr};
};
TORCH_MODULE(Tagger);
