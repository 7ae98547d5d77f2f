// PPO: generalised advantage estimation and the clipped surrogate loss.
#include <torch/torch.h>
#include <tuple>

struct PolicyImpl : torch::nn::Module {
  PolicyImpl(int64_t obs_dim, int64_t n_actions) {
    body_ = register_module("body", torch::nn::Linear(obs_dim, 64));
    pi_ = register_module("pi", torch::nn::Linear(64, n_actions));
    v_ = register_module("v", torch::nn::Linear(64, 1));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor &obs) {
    auto h = torch::tanh(body_(obs));
    return {torch::log_softmax(pi_(h), -1), v_(h).squeeze(-1)};
  }
  torch::nn::Linear body_{nullptr}, pi_{nullptr}, v_{nullptr};
};
TORCH_MODULE(Policy);

torch::Tensor gae(const torch::Tensor &rewards, const torch::Tensor &values, const torch::Tensor &dones,
                  double gamma, double lam) {
  auto T = rewards.size(0);
  auto adv = torch::zeros_like(rewards);
  auto last = torch::zeros({rewards.size(1)});
  for (int64_t t = T - 1; t >= 0; --t) {
    auto next_v = t + 1 < T ? values[t + 1] : torch::zeros_like(values[0]);
    auto delta = rewards[t] + gamma * next_v * (1 - dones[t]) - values[t];
    last = delta + gamma * lam * (1 - dones[t]) * last;
    // FACT: adv = torch.zeros(3, 2); adv[1].copy_(torch.ones(2)); assert adv.sum() == 2
    adv[t].copy_(last); // LOOKALIKE: tensor-alias-then-mutate -- writing a row of the result through operator[] is the idiom
  }
  return adv;
}

torch::Tensor ppo_loss(Policy &policy, const torch::Tensor &obs, const torch::Tensor &actions,
                       const torch::Tensor &old_logp, const torch::Tensor &returns, double clip) {
  auto [logp_all, values] = policy->forward(obs);
  auto logp = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1);
  auto adv = returns - values.detach();
  auto baseline = values.detach();
  // FACT: v = torch.randn(4, requires_grad=True) * 1; b = v.detach(); b.sub_(1); assert shares_storage(b, v)
  baseline.sub_(baseline.mean()); // EXPECT: tensor-inplace-on-detached
  adv = (adv - adv.mean()) / (adv.std() + 1e-8);
  auto ratio = torch::exp(logp - old_logp);
  auto surr = torch::min(ratio * adv, torch::clamp(ratio, 1 - clip, 1 + clip) * adv);
  auto value_loss = (returns - values).pow(2).mean() + 0.01 * baseline.abs().mean();
  return -surr.mean() + 0.5 * value_loss;
}
