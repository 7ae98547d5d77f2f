// PPO (clip) with N vectorised CPU environments and a CUDA policy. Rollouts are written into
// preallocated [T, N, ...] CPU storage step by step, GAE is computed backwards over the
// horizon, and the update runs several epochs of shuffled minibatches.
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <random>
#include <vector>

namespace F = torch::nn::functional;

struct PPOConfig {
  int64_t num_envs = 16, horizon = 128, obs_dim = 8, num_actions = 4, hidden = 64;
  int64_t epochs = 4, minibatch = 256, iterations = 200, log_every = 10;
  double gamma = 0.99, lam = 0.95, clip = 0.2, vf_coef = 0.5, ent_coef = 0.01, lr = 2.5e-4;
};

// Toy batched environment: rewards come back as doubles, like most C++ simulators.
struct VecEnv {
  VecEnv(int64_t n, int64_t obs_dim) : n_(n), obs_dim_(obs_dim), steps_(n, 0), rng_(7) {}
  torch::Tensor reset() { return torch::randn({n_, obs_dim_}); }
  torch::Tensor step(const torch::Tensor& actions_cpu, std::vector<double>& rewards, std::vector<float>& dones) {
    auto acts = actions_cpu.accessor<int64_t, 1>();
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int64_t i = 0; i < n_; ++i) {
      rewards[i] = (acts[i] == 0 ? 1.0 : 0.1) * u(rng_);
      dones[i] = ++steps_[i] >= 200 ? 1.f : 0.f;
      if (dones[i] > 0) steps_[i] = 0;
    }
    return torch::randn({n_, obs_dim_});
  }
  int64_t n_, obs_dim_;
  std::vector<int64_t> steps_;
  std::mt19937 rng_;
};

struct RolloutStorage {
  RolloutStorage(int64_t T, int64_t N, int64_t obs_dim) {
    obs = torch::zeros({T + 1, N, obs_dim});
    actions = torch::zeros({T, N}, torch::kLong);
    log_probs = torch::zeros({T, N});
    rewards = torch::zeros({T, N});
    dones = torch::zeros({T, N});
    values = torch::zeros({T, N});
    advantages = torch::zeros({T, N});
  }
  torch::Tensor obs, actions, log_probs, rewards, dones, values, advantages;

  void compute_gae(const torch::Tensor& last_value, double gamma, double lam) {
    const int64_t T = rewards.size(0);
    auto gae = torch::zeros_like(last_value);
    for (int64_t t = T - 1; t >= 0; --t) {
      auto next_value = t == T - 1 ? last_value : values[t + 1];
      auto not_done = 1.0 - dones[t];
      auto delta = rewards[t] + gamma * next_value * not_done - values[t];
      gae = delta + gamma * lam * not_done * gae;  // LOOKALIKE: tensor-graph-kept-across-iterations -- rollout buffers carry no graph
      advantages[t] = gae;  // LOOKALIKE: tensor-copy-narrowing -- float32 into float32
    }
  }
};

struct ActorCriticImpl : torch::nn::Module {
  explicit ActorCriticImpl(const PPOConfig& c)
      : body(register_module("body", torch::nn::Sequential(
                                         torch::nn::Linear(c.obs_dim, c.hidden), torch::nn::Tanh(),
                                         torch::nn::Linear(c.hidden, c.hidden), torch::nn::Tanh()))),
        pi(register_module("pi", torch::nn::Linear(c.hidden, c.num_actions))),
        v(register_module("v", torch::nn::Linear(c.hidden, 1))) {
    torch::nn::init::orthogonal_(pi->weight, 0.01);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    torch::nn::init::orthogonal_(v->weight, 1.0);
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs) {
    auto h = body->forward(obs);
    return {pi(h), v(h).squeeze(-1)};
  }
  torch::nn::Sequential body;
  torch::nn::Linear pi, v;
};
TORCH_MODULE(ActorCritic);

// Advantages normalised for the policy loss.
torch::Tensor normalized_advantages(RolloutStorage& s) {
  torch::Tensor adv = s.advantages;
  // FACT: a = torch.randn(5, 3); adv = a; adv -= adv.mean(); assert shares_storage(a, adv) and abs(a.mean().item()) < 1e-5
  adv -= adv.mean();  // EXPECT: tensor-alias-then-mutate
  adv /= adv.std() + 1e-8;
  return adv;
}

class PPOTrainer {
 public:
  explicit PPOTrainer(const PPOConfig& cfg)
      : cfg_(cfg), device_(torch::kCUDA), policy_(cfg),
        opt_(policy_->parameters(), torch::optim::AdamOptions(cfg.lr).eps(1e-5)) {
    policy_->to(device_);
  }

  void collect(VecEnv& envs, RolloutStorage& storage, torch::Tensor& obs) {
    torch::NoGradGuard no_grad;
    std::vector<double> rewards(cfg_.num_envs);
    std::vector<float> dones(cfg_.num_envs);
    storage.obs[0].copy_(obs);
    for (int64_t step = 0; step < cfg_.horizon; ++step) {
      auto obs_dev = obs.to(device_);  // LOOKALIKE: tensor-clone-in-loop -- obs is rebound to the next observation every step
      auto out = policy_->forward(obs_dev);
      auto logp_all = torch::log_softmax(out.first, -1);
      auto action = torch::multinomial(logp_all.exp(), 1).squeeze(-1);
      auto actions_cpu = action.cpu();  // LOOKALIKE: tensor-sync-in-loop -- the environment needs the actions on the host
      obs = envs.step(actions_cpu, rewards, dones);
      storage.actions[step].copy_(actions_cpu);
      storage.log_probs[step].copy_(logp_all.gather(1, action.unsqueeze(1)).squeeze(1));
      storage.values[step].copy_(out.second);
      auto reward_t = torch::from_blob(rewards.data(), {cfg_.num_envs}, torch::kDouble);
      storage.rewards[step].copy_(reward_t);  // EXPECT: tensor-copy-narrowing
      storage.dones[step].copy_(torch::from_blob(dones.data(), {cfg_.num_envs}, torch::kFloat));  // LOOKALIKE: tensor-copy-narrowing -- float32 into float32
      storage.obs[step + 1].copy_(obs);
    }
    auto last_value = policy_->forward(obs.to(device_)).second.cpu();
    storage.compute_gae(last_value, cfg_.gamma, cfg_.lam);
  }

  void update(const RolloutStorage& s, const torch::Tensor& advantages) {
    const int64_t T = s.rewards.size(0), N = s.rewards.size(1);
    const int64_t total = T * N;
    // FACT: o = torch.randn(5, 3, 4); assert is_view_of(o.narrow(0, 0, 4).view(12, -1), o)
    auto flat_obs = s.obs.narrow(0, 0, T).view({total, -1});  // LOOKALIKE: tensor-view-non-contiguous -- a leading narrow stays contiguous
    auto flat_act = s.actions.flatten().to(device_);
    auto flat_logp = s.log_probs.flatten().to(device_);
    auto flat_adv = advantages.flatten().to(device_);
    auto flat_ret = (s.advantages + s.values).flatten().to(device_);
    auto kl_sum = torch::zeros({}, torch::TensorOptions().device(device_));
    double clip_frac_sum = 0.0;
    int64_t n_updates = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      auto perm = torch::randperm(total, torch::kLong).to(device_);
      for (int64_t start = 0; start + cfg_.minibatch <= total; start += cfg_.minibatch) {
        auto idx = perm.narrow(0, start, cfg_.minibatch);
        auto obs_dev = flat_obs.to(device_);  // EXPECT: tensor-clone-in-loop
        auto mb_obs = obs_dev.index_select(0, idx);
        auto mb_act = flat_act.index_select(0, idx);
        auto mb_old_logp = flat_logp.index_select(0, idx);
        auto mb_adv = flat_adv.index_select(0, idx);
        auto mb_ret = flat_ret.index_select(0, idx);

        auto out = policy_->forward(mb_obs);
        auto log_probs_all = torch::log_softmax(out.first, -1);
        auto probs = torch::softmax(out.first, -1);
        probs.clamp_min_(1e-8);  // EXPECT: tensor-inplace-on-saved
        auto entropy = -(probs * log_probs_all).sum(-1).mean();
        auto new_logp = log_probs_all.gather(1, mb_act.unsqueeze(1)).squeeze(1);
        auto ratio = torch::exp(new_logp - mb_old_logp);
        auto surr1 = ratio * mb_adv;
        auto surr2 = torch::clamp(ratio, 1.0 - cfg_.clip, 1.0 + cfg_.clip) * mb_adv;
        auto policy_loss = -torch::min(surr1, surr2).mean();
        auto value_loss = F::mse_loss(out.second, mb_ret);
        auto loss = policy_loss + cfg_.vf_coef * value_loss - cfg_.ent_coef * entropy;

        opt_.zero_grad();
        loss.backward();
        torch::nn::utils::clip_grad_norm_(policy_->parameters(), 0.5);
        opt_.step();

        auto approx_kl = (mb_old_logp - new_logp).mean();
        kl_sum += approx_kl;  // EXPECT: tensor-graph-kept-across-iterations
        clip_frac_sum += ((ratio - 1.0).abs() > cfg_.clip).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop
        if (++n_updates % cfg_.log_every == 0)
          std::cout << "  loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every updates
      }
    }
    std::printf("approx_kl %.4f clip_frac %.3f\n", kl_sum.item<double>() / n_updates,
                clip_frac_sum / n_updates);
  }

  void log_episode_returns(const RolloutStorage& s) {
    // per-env trajectories back to back, then cut at episode ends
    // FACT: r = torch.randn(6, 4); assert is_copy_of(r.transpose(0, 1).flatten(), r)
    auto rew_env_major = s.rewards.transpose(0, 1).flatten();  // EXPECT: tensor-reshape-non-contiguous
    // FACT: d = torch.randn(6, 4); assert is_view_of(d.transpose(0, 1).reshape(4, 6), d)
    auto done_env_major = s.dones.transpose(0, 1).reshape({s.dones.size(1), s.dones.size(0)});  // LOOKALIKE: tensor-reshape-non-contiguous -- same shape: a view
    auto ends = done_env_major.flatten().nonzero().squeeze(-1);
    auto cum = rew_env_major.cumsum(0);
    std::printf("finished episodes %ld, reward sum %.2f\n", static_cast<long>(ends.size(0)),
                cum[-1].item<double>());
  }

 private:
  PPOConfig cfg_;
  torch::Device device_;
  ActorCritic policy_;
  torch::optim::Adam opt_;
};

int main() {
  PPOConfig cfg;
  VecEnv envs(cfg.num_envs, cfg.obs_dim);
  RolloutStorage storage(cfg.horizon, cfg.num_envs, cfg.obs_dim);
  PPOTrainer trainer(cfg);
  auto obs = envs.reset();
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    trainer.collect(envs, storage, obs);
    auto adv = normalized_advantages(storage);
    trainer.update(storage, adv);
    if (it % cfg.log_every == 0) trainer.log_episode_returns(storage);
  }
}
