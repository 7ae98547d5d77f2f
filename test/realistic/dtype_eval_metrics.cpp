// Evaluation loop collecting predictions and metrics into preallocated tensors.
#include <torch/torch.h>

struct EvalResult {
  torch::Tensor preds, losses;
};

EvalResult evaluate(torch::nn::Linear &head, const torch::Tensor &features, int64_t batch) {
  torch::NoGradGuard ng;
  auto n = features.size(0);
  EvalResult r{torch::zeros({n}, torch::kLong), torch::zeros({n}, torch::kDouble)};
  for (int64_t s = 0; s < n; s += batch) {
    auto len = std::min(batch, n - s);
    auto logits = head->forward(features.narrow(0, s, len));
    r.preds.narrow(0, s, len).copy_(logits.argmax(1)); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64
    auto per_sample = logits.logsumexp(1);
    r.losses.narrow(0, s, len).copy_(per_sample); // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens
  }
  return r;
}

torch::Tensor expected_class(const torch::Tensor &logits) {
  auto classes = torch::arange(logits.size(1)).to(torch::kFloat);
  auto expected = (torch::softmax(logits, 1) * classes).sum(1);
  auto out = torch::empty({logits.size(0)}, torch::kLong);
  // FACT: o = torch.empty(1, dtype=torch.long); o.copy_(torch.tensor([1.97])); assert o.item() == 1
  out.copy_(expected); // EXPECT: tensor-copy-narrowing
  return out;
}
