// PPO rollout: policy on the GPU, environment observations on the host.
#include <torch/torch.h>

#include <vector>

struct Policy : torch::nn::Module {
  Policy(int64_t obs, int64_t act) {
    body = register_module("body", torch::nn::Linear(obs, 64));
    head = register_module("head", torch::nn::Linear(64, act));
  }
  torch::Tensor forward(torch::Tensor x) { return head->forward(torch::tanh(body->forward(x))); }
  torch::nn::Linear body{nullptr}, head{nullptr};
};

std::vector<torch::Tensor> rollout(int64_t steps, int64_t obs_dim, int64_t n_act) {
  auto policy = std::make_shared<Policy>(obs_dim, n_act);
  policy->to(torch::Device(torch::kCUDA, 0));
  std::vector<torch::Tensor> actions;
  auto obs = torch::zeros({1, obs_dim});
  for (int64_t t = 0; t < steps; ++t) {
    torch::NoGradGuard ng;
    // FACT: assert raises(lambda: torch.zeros(1, 4) @ torch.randn(4, 2, device='meta') + torch.zeros(1, 2), 'same device')
    auto logits = policy->forward(obs); // EXPECT: tensor-device-mismatch
    actions.push_back(logits.argmax(1));
    obs = torch::randn({1, obs_dim});
  }
  return actions;
}

torch::Tensor advantages(const torch::Tensor &rewards, const torch::Tensor &values) {
  auto adv = torch::zeros_like(rewards);
  auto gae = torch::zeros({1});
  for (int64_t t = rewards.size(0) - 1; t >= 0; --t) {
    auto delta = rewards[t] - values[t];
    gae = delta + 0.95 * gae; // LOOKALIKE: tensor-device-mismatch -- rewards/values devices not shown
    adv[t] = gae;
  }
  return adv;
}

torch::Tensor normalize_returns(int64_t n) {
  auto returns = torch::randn({n}).cuda();
  auto mean = returns.mean();
  auto stdv = returns.std().cpu();
  // FACT: assert (torch.randn(3, device='meta') / torch.tensor(2.0)).shape == (3,)
  return (returns - mean) / stdv; // LOOKALIKE: tensor-device-mismatch -- std() is 0-dim: a CPU scalar is allowed
}
