// REINFORCE with a per-step baseline shared by every environment of a rollout.
#include <torch/torch.h>

struct Rollout {
  torch::Tensor rewards; // [T, N]
  torch::Tensor values;  // [T]
};

torch::Tensor advantages(const Rollout &r, double gamma) {
  auto T = r.rewards.size(0), N = r.rewards.size(1);
  auto returns = torch::zeros_like(r.rewards);
  auto running = torch::zeros({N});
  for (int64_t t = T - 1; t >= 0; --t) {
    running = r.rewards[t] + gamma * running;
    returns[t] = running;
  }
  auto baseline = r.values.unsqueeze(1).expand({T, N});
  // FACT: b = torch.randn(5).unsqueeze(1).expand(5, 3); assert raises(lambda: b.sub_(b.mean()), "more than one element of the written-to tensor")
  baseline.sub_(baseline.mean()); // EXPECT: tensor-inplace-on-expanded
  // FACT: ret = torch.randn(5, 3); b = torch.randn(5).unsqueeze(1).expand(5, 3); assert not raises(lambda: ret.sub_(b))
  returns.sub_(baseline); // LOOKALIKE: tensor-inplace-on-expanded -- returns is written, the baseline read
  return returns;
}

torch::Tensor normalized_values(const torch::Tensor &values, int64_t n_envs) {
  auto v = values.unsqueeze(1).expand({-1, n_envs});
  auto std = v.std().clamp_min(1e-6);
  // FACT: v = torch.randn(5).unsqueeze(1).expand(-1, 3); assert raises(lambda: v.div_(2.0), "more than one element of the written-to tensor")
  v.div_(std); // EXPECT: tensor-inplace-on-expanded
  return v;
}

torch::Tensor normalized_values_ok(const torch::Tensor &values, int64_t n_envs) {
  auto v = values.unsqueeze(1).repeat({1, n_envs});
  // FACT: v = torch.randn(5).unsqueeze(1).repeat(1, 3); assert not raises(lambda: v.div_(2.0))
  v.div_(v.std().clamp_min(1e-6)); // LOOKALIKE: tensor-inplace-on-expanded -- repeat() copies
  return v;
}
