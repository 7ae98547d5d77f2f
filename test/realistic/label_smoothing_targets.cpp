// Label-smoothed one-hot targets for a classifier trained with a soft cross entropy.
#include <torch/torch.h>

torch::Tensor smooth_targets(const torch::Tensor &labels, int64_t C, double eps) {
  auto B = labels.size(0);
  auto targets = torch::full({1, C}, eps / (C - 1)).expand({B, C});
  // FACT: t = torch.full((1, 5), 0.1).expand(3, 5); assert raises(lambda: t.scatter_(1, torch.zeros(3, 1, dtype=torch.long), 0.9), "more than one element of the written-to tensor")
  targets.scatter_(1, labels.unsqueeze(1), 1.0 - eps); // EXPECT: tensor-inplace-on-expanded
  return targets;
}

torch::Tensor smooth_targets_ok(const torch::Tensor &labels, int64_t C, double eps) {
  auto B = labels.size(0);
  auto targets = torch::full({B, C}, eps / (C - 1));
  // FACT: t = torch.full((3, 5), 0.1); assert not raises(lambda: t.scatter_(1, torch.zeros(3, 1, dtype=torch.long), 0.9))
  targets.scatter_(1, labels.unsqueeze(1), 1.0 - eps); // LOOKALIKE: tensor-inplace-on-expanded -- full() of the whole shape
  return targets;
}

torch::Tensor class_weights(const torch::Tensor &freq, int64_t B) {
  auto w = freq.reciprocal().unsqueeze(0).expand({B, -1});
  // FACT: w = torch.rand(5).unsqueeze(0).expand(3, -1); assert not raises(lambda: w.fill_(1.0))
  w.fill_(1.0); // LOOKALIKE: tensor-inplace-on-expanded -- fill_ is accepted on expanded tensors
  return w;
}

torch::Tensor soft_ce(const torch::Tensor &logits, const torch::Tensor &labels, double eps) {
  auto C = logits.size(1);
  auto t = smooth_targets_ok(labels, C, eps);
  return -(t * torch::log_softmax(logits, 1)).sum(1).mean();
}
