// GRU encoder-decoder with teacher forcing; per-step decoder outputs and losses.
#include <torch/torch.h>
#include <vector>

struct Seq2SeqImpl : torch::nn::Module {
  Seq2SeqImpl(int64_t vocab, int64_t hidden) {
    emb = register_module("emb", torch::nn::Embedding(vocab, hidden));
    cell = register_module("cell", torch::nn::GRUCell(hidden, hidden));
    out = register_module("out", torch::nn::Linear(hidden, vocab));
  }

  // Teacher-forced decoding: the per-step logits are returned for the loss.
  torch::Tensor decode(const torch::Tensor &tgt, torch::Tensor h) {
    std::vector<torch::Tensor> steps;
    for (int64_t t = 0; t < tgt.size(1); ++t) {
      h = cell(emb(tgt.select(1, t)), h);
      steps.push_back(out(h)); // LOOKALIKE: tensor-graph-kept-across-iterations -- returned: the caller differentiates it
    }
    return torch::stack(steps, 1);
  }

  torch::nn::Embedding emb{nullptr};
  torch::nn::GRUCell cell{nullptr};
  torch::nn::Linear out{nullptr};
};
TORCH_MODULE(Seq2Seq);

// Sequence loss summed over time steps, then one backward.
void train_step(Seq2Seq &model, torch::optim::Optimizer &opt, const torch::Tensor &tgt, const torch::Tensor &h0) {
  torch::Tensor h = h0;
  torch::Tensor loss = torch::zeros({});
  for (int64_t t = 0; t + 1 < tgt.size(1); ++t) {
    h = model->cell(model->emb(tgt.select(1, t)), h);
    auto logits = model->out(h);
    // FACT: m = torch.nn.Linear(3, 4); l = torch.zeros(()); l = l + m(torch.randn(2, 3)).sum(); l.backward(); assert m.weight.grad is not None
    loss = loss + torch::cross_entropy_loss(logits, tgt.select(1, t + 1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- summed for one backward after the loop
  }
  opt.zero_grad();
  loss.backward();
  opt.step();
}

// Validation perplexity: no NoGradGuard, the summed loss is a tensor.
double val_perplexity(Seq2Seq &model, const std::vector<torch::Tensor> &batches, const torch::Tensor &h0) {
  torch::Tensor total = torch::zeros({});
  int64_t n = 0;
  for (const auto &tgt : batches) {
    auto logits = model->decode(tgt.narrow(1, 0, tgt.size(1) - 1), h0);
    auto loss = torch::cross_entropy_loss(logits.transpose(1, 2), tgt.narrow(1, 1, tgt.size(1) - 1));
    // FACT: m = torch.nn.Linear(3, 4); t = torch.zeros(()); [t.__iadd__(m(torch.randn(2, 3)).sum()) for _ in range(4)]; assert kept_nodes(t) > 4
    total += loss; // EXPECT: tensor-graph-kept-across-iterations
    ++n;
  }
  return std::exp(total.item<double>() / n);
}
