// PPO update over a vectorised rollout: GAE, shuffled minibatches (randperm + index_select),
// per-minibatch advantage normalisation, clipped surrogate, value loss and entropy bonus.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>

struct PPOConfig {
  double gamma = 0.99;
  double lam = 0.95;
  double clip = 0.2;
  double vf_coef = 0.5;
  double ent_coef = 0.01;
  double max_grad_norm = 0.5;
  double target_kl = 0.02;
  int64_t epochs = 4;
  int64_t minibatch = 256;
};

struct ActorCriticImpl : torch::nn::Module {
  ActorCriticImpl(int64_t obs_dim, int64_t n_actions, int64_t hidden) {
    trunk = register_module("trunk", torch::nn::Sequential(torch::nn::Linear(obs_dim, hidden), torch::nn::Tanh(),
                                                           torch::nn::Linear(hidden, hidden), torch::nn::Tanh()));
    pi = register_module("pi", torch::nn::Linear(hidden, n_actions));
    v = register_module("v", torch::nn::Linear(hidden, 1));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &obs) {
    auto h = trunk->forward(obs);
    return {pi(h), v(h).squeeze(-1)};
  }
  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear pi{nullptr}, v{nullptr};
};
TORCH_MODULE(ActorCritic);

// Filled by the rollout workers under NoGradGuard: obs [T, E, D], the others [T, E].
struct Rollout {
  torch::Tensor obs, actions, logp, values, rewards, dones;
  torch::Tensor advantages, returns;
};

void compute_gae(Rollout &ro, const torch::Tensor &last_value, const PPOConfig &cfg) {
  const auto T = ro.rewards.size(0);
  ro.advantages = torch::zeros_like(ro.rewards);
  auto gae = torch::zeros_like(last_value);
  for (int64_t t = T - 1; t >= 0; --t) {
    auto next_value = t + 1 < T ? ro.values[t + 1] : last_value;
    auto not_done = 1.0 - ro.dones[t];
    auto delta = ro.rewards[t] + cfg.gamma * next_value * not_done - ro.values[t];
    gae = delta + cfg.gamma * cfg.lam * not_done * gae;
    ro.advantages[t] = gae;
  }
  // Value targets: returns = advantages + values.
  torch::Tensor returns = ro.advantages;
  // FACT: a = torch.randn(4, 3); v = torch.rand(4, 3) + 1; a0 = a.clone(); r = a; r += v; assert shares_storage(r, a) and not torch.equal(a, a0)
  returns += ro.values; // EXPECT: tensor-alias-then-mutate -- ro.advantages becomes the returns too; the policy then trains on returns
  ro.returns = returns;
}

struct UpdateStats {
  double pi_loss = 0, v_loss = 0, entropy = 0, approx_kl = 0;
};

UpdateStats ppo_update(ActorCritic &net, torch::optim::Adam &opt, const Rollout &ro, const PPOConfig &cfg) {
  net->train();
  const auto T = ro.obs.size(0), E = ro.obs.size(1), D = ro.obs.size(2);
  const auto N = T * E;
  // FACT: o = torch.zeros(5, 3, 4); assert is_view_of(o.view(15, 4), o)
  auto b_obs = ro.obs.view({N, D}); // LOOKALIKE: tensor-view-non-contiguous -- the buffer is allocated [T, E, D]: merging T and E is a view
  auto b_act = ro.actions.view({N}), b_logp = ro.logp.view({N});
  auto b_adv = ro.advantages.view({N}), b_ret = ro.returns.view({N});

  torch::Tensor pi_sum = torch::zeros({}), v_sum = torch::zeros({});
  double ent_sum = 0, kl = 0;
  int64_t n_mb = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(N, torch::kLong);
    for (int64_t start = 0; start < N; start += cfg.minibatch) {
      auto idx = perm.narrow(0, start, std::min(cfg.minibatch, N - start));
      auto obs = b_obs.index_select(0, idx);
      auto act = b_act.index_select(0, idx);
      auto old_logp = b_logp.index_select(0, idx);
      auto ret = b_ret.index_select(0, idx);
      auto adv = b_adv.index_select(0, idx);
      // FACT: a = torch.randn(12); i = torch.randperm(12)[:5]; s = a.index_select(0, i); a0 = a.clone(); s.sub_(s.mean()).div_(s.std() + 1e-8); assert is_copy_of(s, a) and torch.equal(a, a0)
      adv.sub_(adv.mean()).div_(adv.std() + 1e-8); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into a new tensor, the rollout is untouched

      auto [logits, value] = net->forward(obs);
      auto logp_all = torch::log_softmax(logits, -1);
      auto logp = logp_all.gather(1, act.unsqueeze(1)).squeeze(1);
      auto entropy = -(logp_all.exp() * logp_all).sum(-1).mean();
      auto ratio = torch::exp(logp - old_logp);
      auto surr1 = ratio * adv;
      // FACT: m = torch.nn.Linear(4, 3); lp = torch.log_softmax(m(torch.randn(6, 4)), -1)[:, 0]; r = torch.exp(lp - torch.randn(6)); adv = torch.randn(6); s1 = r * adv; s2 = r.clamp_(0.8, 1.2) * adv; assert backward_fails(lambda: (-torch.min(s1, s2).mean()).backward())
      auto surr2 = ratio.clamp_(1.0 - cfg.clip, 1.0 + cfg.clip) * adv; // EXPECT: tensor-inplace-on-saved -- exp saved its result; loss.backward() below raises
      auto pi_loss = -torch::min(surr1, surr2).mean();
      auto v_loss = (value - ret).pow(2).mean();
      auto loss = pi_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy;

      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.max_grad_norm);
      opt.step();

      // FACT: m = torch.nn.Linear(3, 2); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [l.backward() for l in ls]; s = torch.zeros(()); [s.add_(l) for l in ls]; assert s.requires_grad and kept_nodes(s) > 2 * kept_nodes(ls[0])
      pi_sum += pi_loss; // EXPECT: tensor-graph-kept-across-iterations -- only read with item() for the log
      // FACT: m = torch.nn.Linear(3, 2); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; s = torch.zeros(()); [s.add_(l.detach()) for l in ls]; assert not s.requires_grad and kept_nodes(s) == 0
      v_sum += v_loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph kept
      ent_sum += entropy.item<double>();
      kl = (old_logp - logp).mean().item<double>();
      ++n_mb;
    }
    if (kl > cfg.target_kl) {
      std::cout << "early stop at epoch " << epoch << ", kl " << kl << "\n";
      break;
    }
  }
  UpdateStats s;
  s.pi_loss = pi_sum.item<double>() / n_mb;
  s.v_loss = v_sum.item<double>() / n_mb;
  s.entropy = ent_sum / n_mb;
  s.approx_kl = kl;
  return s;
}
