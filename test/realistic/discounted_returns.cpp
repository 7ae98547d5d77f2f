// Discounted returns for a rollout of T steps, batched over N environments.
#include <torch/torch.h>

torch::Tensor returns_loop(const torch::Tensor &rewards, double gamma) {
  auto T = rewards.size(0);
  auto ret = rewards.clone();
  // FACT: r = torch.rand(5, 3); assert not raises(lambda: r[1].add_(r[2], alpha=0.9))
  for (int64_t t = T - 2; t >= 0; --t)
    ret[t].add_(ret[t + 1], gamma); // LOOKALIKE: tensor-inplace-overlap -- rows t and t+1 are disjoint
  return ret;
}

// A "vectorised" attempt: one shifted add per pass.
torch::Tensor returns_shifted(const torch::Tensor &rewards, double gamma, int passes) {
  auto T = rewards.size(0);
  auto ret = rewards.clone();
  for (int p = 0; p < passes; ++p) {
    // FACT: r = torch.rand(5, 3); assert raises(lambda: r.narrow(0, 0, 4).add_(r.narrow(0, 1, 4), alpha=0.9), "some elements of the input tensor and the written-to tensor")
    ret.narrow(0, 0, T - 1).add_(ret.narrow(0, 1, T - 1), gamma); // EXPECT: tensor-inplace-overlap
  }
  return ret;
}

torch::Tensor returns_shifted_ok(const torch::Tensor &rewards, double gamma, int passes) {
  auto T = rewards.size(0);
  auto ret = rewards.clone();
  for (int p = 0; p < passes; ++p) {
    auto next = ret.narrow(0, 1, T - 1).clone();
    // FACT: r = torch.rand(5, 3); n = r.narrow(0, 1, 4).clone(); assert not raises(lambda: r.narrow(0, 0, 4).add_(n, alpha=0.9))
    ret.narrow(0, 0, T - 1).add_(next, gamma); // LOOKALIKE: tensor-inplace-overlap -- the next rows were cloned
  }
  return ret;
}

torch::Tensor td_errors(const torch::Tensor &values, const torch::Tensor &rewards, double gamma) {
  auto T = rewards.size(0);
  auto delta = rewards.clone();  // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: rewards.add(values.narrow(0, 1, T), gamma) makes the same tensor in one pass
  // FACT: d = torch.rand(4, 2); v = torch.rand(5, 2); assert not raises(lambda: d.add_(v.narrow(0, 1, 4), alpha=0.9).sub_(v.narrow(0, 0, 4)))
  delta.add_(values.narrow(0, 1, T), gamma).sub_(values.narrow(0, 0, T)); // LOOKALIKE: tensor-inplace-overlap -- values is another tensor
  return delta;
}
