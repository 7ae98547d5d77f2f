// Soft actor-critic for continuous control: a tanh-squashed Gaussian policy, twin Q critics with
// Polyak-averaged targets, a learned temperature (alpha) tuned towards a target entropy, and a
// prioritised replay buffer on the host.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <vector>

struct SACConfig {
  int64_t obs_dim = 17, act_dim = 6, hidden = 256;
  int64_t capacity = 1000000, batch_size = 256;
  int64_t start_steps = 10000, update_after = 1000, update_every = 50, total_steps = 1000000;
  double gamma = 0.99, tau = 0.005, lr = 3e-4, per_alpha = 0.6, per_beta = 0.4, reward_scale = 5.0;
};

struct Env {
  virtual ~Env() = default;
  virtual std::vector<float> reset() = 0;
  virtual std::tuple<std::vector<float>, float, bool> step(const std::vector<float> &action) = 0;
  virtual std::vector<float> action_high() const = 0;
  virtual std::vector<float> sample_action() = 0;
};

struct GaussianActorImpl : torch::nn::Module {
  GaussianActorImpl(int64_t obs, int64_t act, int64_t hidden) {
    trunk_ = register_module("trunk", torch::nn::Sequential(torch::nn::Linear(obs, hidden), torch::nn::ReLU(),
                                                            torch::nn::Linear(hidden, hidden), torch::nn::ReLU()));
    mu_ = register_module("mu", torch::nn::Linear(hidden, act));
    log_std_ = register_module("log_std", torch::nn::Linear(hidden, act));
  }
  // Reparameterised sample in [-1, 1] and its log-probability [B, 1].
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &obs) {
    auto h = trunk_->forward(obs);
    auto mu = mu_(h);
    auto log_std = log_std_(h);
    // FACT: m = torch.nn.Linear(3, 2); l = m(torch.randn(4, 3)); l.clamp_(-20, 2); l.exp().sum().backward(); assert m.weight.grad is not None
    log_std.clamp_(-20.0, 2.0); // LOOKALIKE: tensor-inplace-on-saved -- a Linear output: addmm does not save it
    auto std = log_std.exp();
    auto u = mu + std * torch::randn_like(mu);
    auto a = torch::tanh(u);
    // FACT: u = torch.nn.Linear(3, 2)(torch.randn(4, 3)); a = torch.tanh(u); a.clamp_(-0.999999, 0.999999); assert backward_fails(lambda: torch.log(1 - a.pow(2)).sum().backward())
    a.clamp_(-1.0 + 1e-6, 1.0 - 1e-6); // EXPECT: tensor-inplace-on-saved -- keeps log(1 - a^2) finite, but tanh saved its result for the actor's backward
    auto logp = (-0.5 * ((u - mu) / std).pow(2) - log_std - 0.5 * std::log(2 * M_PI)).sum(-1, true);
    logp = logp - torch::log(1 - a.pow(2)).sum(-1, true);
    return {a, logp};
  }
  torch::nn::Sequential trunk_{nullptr};
  torch::nn::Linear mu_{nullptr}, log_std_{nullptr};
};
TORCH_MODULE(GaussianActor);

struct TwinQImpl : torch::nn::Module {
  TwinQImpl(int64_t obs, int64_t act, int64_t hidden) {
    auto mlp = [&] {
      return torch::nn::Sequential(torch::nn::Linear(obs + act, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                                   torch::nn::ReLU(), torch::nn::Linear(hidden, 1));
    };
    q1_ = register_module("q1", mlp());
    q2_ = register_module("q2", mlp());
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &obs, const torch::Tensor &act) {
    auto x = torch::cat({obs, act}, -1);
    return {q1_->forward(x), q2_->forward(x)};
  }
  torch::nn::Sequential q1_{nullptr}, q2_{nullptr};
};
TORCH_MODULE(TwinQ);

// Transitions kept on the learner's device, so sampling never leaves it.
struct ReplayBuffer {
  ReplayBuffer(int64_t cap, int64_t obs_dim, int64_t act_dim, torch::Device device)
      : obs(torch::zeros({cap, obs_dim}, device)), act(torch::zeros({cap, act_dim}, device)), rew(torch::zeros({cap, 1}, device)),
        next_obs(torch::zeros({cap, obs_dim}, device)), done(torch::zeros({cap, 1}, device)), prio(torch::ones({cap}, device)),
        cap_(cap) {}

  void add(const std::vector<float> &o, const std::vector<float> &a, float r, const std::vector<float> &o2, bool d) {
    // FACT: d = torch.zeros(4, 3); d[0].copy_(torch.tensor([1.5, 2.25, -3.75])); assert torch.tensor([1.5]).dtype == d.dtype and d[0].tolist() == [1.5, 2.25, -3.75]
    obs[ptr_].copy_(torch::tensor(o)); // LOOKALIKE: tensor-copy-narrowing -- float32 into float32
    act[ptr_].copy_(torch::tensor(a));
    rew[ptr_][0] = r;
    next_obs[ptr_].copy_(torch::tensor(o2));
    done[ptr_][0] = d ? 1.0f : 0.0f;
    prio[ptr_] = prio.narrow(0, 0, std::max<int64_t>(size_, 1)).max(); // new transitions get the highest priority
    ptr_ = (ptr_ + 1) % cap_;
    size_ = std::min(size_ + 1, cap_);
  }

  // Prioritised sampling; returns the indices and the importance weights [B, 1].
  std::pair<torch::Tensor, torch::Tensor> sample_indices(int64_t batch, double alpha, double beta) const {
    auto p = prio.narrow(0, 0, size_).pow(alpha);
    auto probs = p / p.sum();
    auto idx = torch::multinomial(probs, batch, /*replacement=*/true);
    auto w = (size_ * probs.index_select(0, idx)).pow(-beta);
    return {idx, (w / w.max()).unsqueeze(1)};
  }

  void update_priorities(const torch::Tensor &idx, const torch::Tensor &new_prio) { prio.index_put_({idx}, new_prio); }

  torch::Tensor obs, act, rew, next_obs, done, prio;
  int64_t cap_, ptr_ = 0, size_ = 0;
};

struct SACAgent {
  SACAgent(const SACConfig &cfg, torch::Device device)
      : actor(cfg.obs_dim, cfg.act_dim, cfg.hidden), q(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        q_target(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        log_alpha(torch::zeros({1}, torch::TensorOptions().device(device).requires_grad(true))),
        target_entropy(-double(cfg.act_dim)), gamma(cfg.gamma), tau(cfg.tau),
        actor_opt(actor->parameters(), torch::optim::AdamOptions(cfg.lr)), q_opt(q->parameters(), torch::optim::AdamOptions(cfg.lr)),
        alpha_opt({log_alpha}, torch::optim::AdamOptions(cfg.lr)) {
    actor->to(device); // moves the parameters in place: the optimizers keep the same tensors
    q->to(device);
    q_target->to(device);
    torch::NoGradGuard no_grad;
    auto src = q->parameters(), dst = q_target->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      // FACT: p = torch.nn.Parameter(torch.randn(3)); torch.no_grad()(p.copy_)(torch.ones(3)); assert p.is_leaf and p.requires_grad and p.sum() == 3
      dst[i].copy_(src[i]); // LOOKALIKE: tensor-inplace-on-leaf -- the initial hard copy runs under NoGradGuard
  }

  // One gradient step; returns the critic loss and the new priorities (|TD error|) of the batch.
  std::pair<torch::Tensor, torch::Tensor> update(const torch::Tensor &obs, const torch::Tensor &act, const torch::Tensor &rew,
                                                 const torch::Tensor &next_obs, const torch::Tensor &done,
                                                 const torch::Tensor &is_weights) {
    auto alpha = log_alpha.exp().detach();
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      auto [a2, logp2] = actor->forward(next_obs);
      auto [tq1, tq2] = q_target->forward(next_obs, a2);
      target = rew + gamma * (1 - done) * (torch::min(tq1, tq2) - alpha * logp2);
    }
    auto [q1, q2] = q->forward(obs, act);
    auto td1 = q1 - target;
    auto td2 = q2 - target;
    auto q_loss = (is_weights * (td1.pow(2) + td2.pow(2))).mean();
    auto new_prio = td1.detach();
    // FACT: q = torch.nn.Linear(3, 1)(torch.randn(4, 3)); e = q - torch.randn(4, 1); l = e.pow(2).mean(); p = e.detach(); p.abs_(); assert backward_fails(lambda: l.backward())
    new_prio.abs_().add_(1e-6); // EXPECT: tensor-inplace-on-detached -- td1 is the pow input the critic's backward needs
    q_opt.zero_grad();
    q_loss.backward();
    q_opt.step();

    auto [a, logp] = actor->forward(obs);
    auto [q1_pi, q2_pi] = q->forward(obs, a);
    auto actor_loss = (alpha * logp - torch::min(q1_pi, q2_pi)).mean();
    actor_opt.zero_grad();
    actor_loss.backward();
    actor_opt.step();

    auto alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean();
    alpha_opt.zero_grad();
    alpha_loss.backward();
    alpha_opt.step();
    soft_update();
    return {q_loss.detach(), new_prio.squeeze(1)};
  }

  void soft_update() {
    auto src = q->parameters(), dst = q_target->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      // FACT: p = torch.nn.Parameter(torch.randn(3)); assert raises(lambda: p.mul_(0.995), "a leaf Variable that requires grad")
      dst[i].mul_(1.0 - tau).add_(src[i], tau); // EXPECT: tensor-inplace-on-leaf -- the target's parameters still require grad, and no NoGradGuard here
  }

  GaussianActor actor;
  TwinQ q, q_target;
  torch::Tensor log_alpha;
  double target_entropy, gamma, tau;
  torch::optim::Adam actor_opt, q_opt, alpha_opt;
};

void train_sac(Env &env, const SACConfig &cfg) {
  torch::Device device(torch::kCUDA);
  SACAgent agent(cfg, device);
  ReplayBuffer buffer(cfg.capacity, cfg.obs_dim, cfg.act_dim, device);
  auto act_high = torch::tensor(env.action_high()); // the policy acts in [-1, 1]
  auto obs = env.reset();
  double episode_return = 0;
  for (int64_t step = 0; step < cfg.total_steps; ++step) {
    std::vector<float> action;
    if (step < cfg.start_steps) {
      action = env.sample_action();
    } else {
      torch::NoGradGuard no_grad;
      auto obs_t = torch::tensor(obs).unsqueeze(0).to(device);
      auto [a, logp] = agent.actor->forward(obs_t); // LOOKALIKE: tensor-device-mismatch -- the observation is moved to the actor's device
      auto scaled = (a * act_high).squeeze(0); // EXPECT: tensor-device-mismatch -- act_high was made on the CPU
      auto host = scaled.cpu(); // LOOKALIKE: tensor-sync-in-loop -- the environment needs the action on the host
      action.assign(host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
    }
    auto [next_obs, reward, done] = env.step(action);
    buffer.add(obs, action, reward, next_obs, done);
    episode_return += reward;
    obs = next_obs;
    if (done) {
      std::cout << "step " << step << " return " << episode_return << "\n";
      obs = env.reset();
      episode_return = 0;
    }

    if (step >= cfg.update_after && step % cfg.update_every == 0) {
      double q_sum = 0;
      for (int64_t g = 0; g < cfg.update_every; ++g) {
        auto [idx, w] = buffer.sample_indices(cfg.batch_size, cfg.per_alpha, cfg.per_beta);
        auto rew = buffer.rew.index_select(0, idx);
        // FACT: r = torch.randn(10, 1); i = torch.randint(0, 10, (4,)); b = r.index_select(0, i); r0 = r.clone(); b.mul_(5.0); assert is_copy_of(b, r) and torch.equal(r, r0)
        rew.mul_(cfg.reward_scale); // LOOKALIKE: tensor-alias-then-mutate -- index_select gathered a copy: the buffer keeps the raw rewards
        auto [q_loss, td] = agent.update(buffer.obs.index_select(0, idx), buffer.act.index_select(0, idx), rew,
                                         buffer.next_obs.index_select(0, idx), buffer.done.index_select(0, idx), w);
        buffer.update_priorities(idx, td);
        q_sum += q_loss.item<double>(); // EXPECT: tensor-sync-in-loop -- a wait for every gradient step, for a number that is only summed for the log
      }
      std::cout << "step " << step << " critic loss " << q_sum / cfg.update_every << " alpha "
                << agent.log_alpha.exp().item<double>() << "\n";
    }
  }
}
