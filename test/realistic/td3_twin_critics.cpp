// TD3 (Fujimoto et al. 2018) for continuous control: a deterministic tanh actor, twin critics
// whose minimum forms the bootstrap target, clipped Gaussian noise on the target action (target
// policy smoothing), and actor / target-network updates only every `policy_freq` critic steps.
// Transitions live in a host ring buffer; the learner runs on the GPU and trains for as many
// iterations as the finished episode had steps, as in the authors' original code.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

struct TD3Config {
  int64_t obs_dim = 17, act_dim = 6, hidden = 256;
  int64_t buffer_size = 1000000, batch_size = 256;
  int64_t start_timesteps = 25000, max_timesteps = 1000000, eval_freq = 5000, eval_episodes = 10;
  int64_t policy_freq = 2, log_every = 5000;
  double max_action = 1.0, discount = 0.99, tau = 0.005, lr = 3e-4, reward_scale = 1.0;
  double policy_noise = 0.2, noise_clip = 0.5, expl_noise = 0.1;
  std::string out_path = "td3_actor.pt";
};

struct StepResult {
  std::vector<float> obs;
  double reward = 0.0;
  bool terminal = false;  // the MDP ended: no bootstrap
  bool truncated = false; // time limit: bootstrap through it
};

struct Env {
  virtual ~Env() = default;
  virtual std::vector<float> reset() = 0;
  virtual StepResult step(const std::vector<float> &action) = 0;
  virtual std::vector<float> sample_action() = 0;
};

struct ActorImpl : torch::nn::Module {
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden, double max_action) : max_action_(max_action) {
    l1_ = register_module("l1", torch::nn::Linear(obs_dim, hidden));
    l2_ = register_module("l2", torch::nn::Linear(hidden, hidden));
    l3_ = register_module("l3", torch::nn::Linear(hidden, act_dim));
    // Small last layer (DDPG's trick): the initial policy outputs actions near zero.
    // FACT: l = torch.nn.Linear(4, 2); torch.nn.init.uniform_(l.weight, -3e-3, 3e-3); assert l.weight.is_leaf and l.weight.requires_grad and l.weight.abs().max() <= 3e-3
    torch::nn::init::uniform_(l3_->weight, -3e-3, 3e-3); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor &state) {
    auto h = torch::relu(l1_(state));
    h = torch::relu(l2_(h));
    return max_action_ * torch::tanh(l3_(h));
  }

  torch::nn::Linear l1_{nullptr}, l2_{nullptr}, l3_{nullptr};
  double max_action_;
};
TORCH_MODULE(Actor);

struct QPair {
  torch::Tensor q1, q2;
};

struct TwinCriticImpl : torch::nn::Module {
  TwinCriticImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    a1_ = register_module("a1", torch::nn::Linear(obs_dim + act_dim, hidden));
    a2_ = register_module("a2", torch::nn::Linear(hidden, hidden));
    a3_ = register_module("a3", torch::nn::Linear(hidden, 1));
    b1_ = register_module("b1", torch::nn::Linear(obs_dim + act_dim, hidden));
    b2_ = register_module("b2", torch::nn::Linear(hidden, hidden));
    b3_ = register_module("b3", torch::nn::Linear(hidden, 1));
  }

  QPair forward(const torch::Tensor &state, const torch::Tensor &action) {
    auto sa = torch::cat({state, action}, 1);
    auto q1 = a3_(torch::relu(a2_(torch::relu(a1_(sa)))));
    auto q2 = b3_(torch::relu(b2_(torch::relu(b1_(sa)))));
    return {q1, q2};
  }

  // The actor follows the first critic only.
  torch::Tensor Q1(const torch::Tensor &state, const torch::Tensor &action) {
    auto sa = torch::cat({state, action}, 1);
    return a3_(torch::relu(a2_(torch::relu(a1_(sa)))));
  }

  torch::nn::Linear a1_{nullptr}, a2_{nullptr}, a3_{nullptr}, b1_{nullptr}, b2_{nullptr}, b3_{nullptr};
};
TORCH_MODULE(TwinCritic);

struct Batch {
  torch::Tensor state, action, next_state, reward, not_done;
};

class ReplayBuffer {
public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t act_dim)
      : state_(torch::zeros({capacity, obs_dim})), action_(torch::zeros({capacity, act_dim})),
        next_state_(torch::zeros({capacity, obs_dim})), reward_(torch::zeros({capacity, 1})),
        not_done_(torch::zeros({capacity, 1})), capacity_(capacity) {}

  void add(const std::vector<float> &s, const std::vector<float> &a, const std::vector<float> &s2, double r, bool terminal) {
    state_[ptr_].copy_(torch::tensor(s)); // LOOKALIKE: tensor-copy-narrowing -- torch::tensor of floats is float32, like the buffer
    action_[ptr_].copy_(torch::tensor(a));
    next_state_[ptr_].copy_(torch::tensor(s2));
    reward_[ptr_] = r;
    not_done_[ptr_] = terminal ? 0.0 : 1.0;
    ptr_ = (ptr_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t n, torch::Device device) const {
    auto idx = torch::randint(0, size_, {n});
    return {state_.index_select(0, idx).to(device), action_.index_select(0, idx).to(device),
            next_state_.index_select(0, idx).to(device), reward_.index_select(0, idx).to(device),
            not_done_.index_select(0, idx).to(device)};
  }

  int64_t size() const { return size_; }

private:
  torch::Tensor state_, action_, next_state_, reward_, not_done_;
  int64_t capacity_, ptr_ = 0, size_ = 0;
};

// Target networks start as exact copies of the online ones.
void hard_copy(torch::nn::Module &target, const torch::nn::Module &source) {
  torch::NoGradGuard no_grad;
  auto dst = target.named_parameters();
  // FACT: t = torch.nn.Linear(3, 2); s = torch.nn.Linear(3, 2); torch.no_grad()(t.weight.copy_)(s.weight); assert t.weight.is_leaf and t.weight.requires_grad and torch.equal(t.weight, s.weight)
  for (const auto &item : source.named_parameters())
    dst[item.key()].copy_(item.value()); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Polyak averaging: theta' <- tau * theta + (1 - tau) * theta'.
void soft_update(torch::nn::Module &target, const torch::nn::Module &source, double tau) {
  auto src = source.parameters();
  auto dst = target.parameters();
  // FACT: t = torch.nn.Linear(3, 2); s = torch.nn.Linear(3, 2); assert raises(lambda: t.weight.mul_(0.995).add_(s.weight, alpha=0.005), "a leaf Variable that requires grad")
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].mul_(1.0 - tau).add_(src[i], tau); // EXPECT: tensor-inplace-on-leaf -- the target networks' parameters require grad and grad mode is on: this raises
}

struct TrainStats {
  double critic_loss = 0, actor_loss = 0, mean_q = 0, max_td = 0;
  int64_t actor_updates = 0;
};

class TD3Agent {
public:
  explicit TD3Agent(const TD3Config &cfg)
      : cfg_(cfg), device_(torch::kCUDA), actor_(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.max_action),
        actor_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden, cfg.max_action), critic_(cfg.obs_dim, cfg.act_dim, cfg.hidden),
        critic_target_(cfg.obs_dim, cfg.act_dim, cfg.hidden), actor_opt_(actor_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        critic_opt_(critic_->parameters(), torch::optim::AdamOptions(cfg.lr)) {
    hard_copy(*actor_target_, *actor_);
    hard_copy(*critic_target_, *critic_);
    actor_->to(device_);
    actor_target_->to(device_);
    critic_->to(device_);
    critic_target_->to(device_);
  }

  std::vector<float> select_action(const std::vector<float> &obs, double expl_noise) {
    torch::NoGradGuard no_grad;
    auto state = torch::tensor(obs).unsqueeze(0).to(device_);
    auto action = actor_->forward(state).squeeze(0).cpu();
    if (expl_noise > 0)
      action = (action + torch::randn({cfg_.act_dim}) * (expl_noise * cfg_.max_action)) // LOOKALIKE: tensor-device-mismatch -- the action was brought to the host first
                   .clamp(-cfg_.max_action, cfg_.max_action);
    return std::vector<float>(action.data_ptr<float>(), action.data_ptr<float>() + action.numel());
  }

  TrainStats train(const ReplayBuffer &buffer, int64_t iterations) {
    TrainStats stats;
    double q_sum = 0;
    auto critic_ema = torch::zeros({}, device_);
    auto td_max = torch::zeros({}, device_);
    std::vector<torch::Tensor> actor_losses;
    for (int64_t it = 0; it < iterations; ++it) {
      ++total_it_;
      auto b = buffer.sample(cfg_.batch_size, device_);
      // FACT: r = torch.randn(8, 1); c = r.clone(); c.mul_(5.0); assert torch.equal(c, r.mul(5.0)) and is_copy_of(c, r)
      auto reward = b.reward.clone(); // EXPECT: tensor-unnecessary-clone -- scaled in place right away: b.reward.mul(scale) makes it in one pass
      reward.mul_(cfg_.reward_scale);

      // Target policy smoothing: clipped noise on the target actor's action.
      torch::Tensor target_q;
      {
        torch::NoGradGuard no_grad;
        auto noise = (torch::randn({cfg_.batch_size, cfg_.act_dim}) * cfg_.policy_noise).clamp(-cfg_.noise_clip, cfg_.noise_clip);
        auto next_action = (actor_target_->forward(b.next_state) + noise).clamp(-cfg_.max_action, cfg_.max_action); // EXPECT: tensor-device-mismatch -- the noise is a host tensor, the target actor's action is on the GPU
        auto next_q = critic_target_->forward(b.next_state, next_action);
        target_q = reward + cfg_.discount * b.not_done * torch::min(next_q.q1, next_q.q2);
      }

      auto q = critic_->forward(b.state, b.action);
      auto td = q.q1.detach();
      // FACT: q1 = torch.nn.Linear(3, 1)(torch.randn(4, 3)); y = torch.randn(4, 1); q0 = q1.detach().clone(); td = q1.detach(); td.sub_(y).abs_(); assert shares_storage(td, q1) and torch.equal(q1.detach(), (q0 - y).abs())
      td.sub_(target_q).abs_(); // EXPECT: tensor-inplace-on-detached -- detach shares q1's storage: the critic loss below is computed on |q1 - y| instead of q1
      td_max = torch::max(td_max, td.max());
      auto critic_loss = torch::mse_loss(q.q1, target_q) + torch::mse_loss(q.q2, target_q);
      critic_opt_.zero_grad();
      critic_loss.backward();
      critic_opt_.step();
      // FACT: m = torch.nn.Linear(3, 1); ls = [m(torch.randn(4, 3)).pow(2).mean() for _ in range(3)]; [l.backward() for l in ls]; e = torch.zeros(()); e = 0.99 * (0.99 * (0.99 * e + 0.01 * ls[0]) + 0.01 * ls[1]) + 0.01 * ls[2]; assert e.requires_grad and kept_nodes(e) >= 3 * 5
      critic_ema = 0.99 * critic_ema + 0.01 * critic_loss; // EXPECT: tensor-graph-kept-across-iterations -- the smoothed loss chains every iteration's graph until train() returns
      q_sum += q.q1.mean().item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU on every iteration just to add up the Q estimate

      // Delayed policy updates: the actor and both targets move every policy_freq critic steps.
      if (total_it_ % cfg_.policy_freq == 0) {
        auto actor_loss = -critic_->Q1(b.state, actor_->forward(b.state)).mean();
        actor_opt_.zero_grad();
        actor_loss.backward();
        actor_opt_.step();
        actor_losses.push_back(actor_loss.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
        soft_update(*critic_target_, *critic_, cfg_.tau);
        soft_update(*actor_target_, *actor_, cfg_.tau);
        ++stats.actor_updates;
      }
      if (total_it_ % cfg_.log_every == 0)
        std::cout << "it " << total_it_ << " critic loss " << critic_loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every iterations
    }
    stats.critic_loss = critic_ema.item<double>();
    stats.max_td = td_max.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per call, after the loop
    stats.mean_q = iterations > 0 ? q_sum / static_cast<double>(iterations) : 0.0;
    if (!actor_losses.empty())
      stats.actor_loss = torch::stack(actor_losses).mean().item<double>();
    return stats;
  }

  Actor &actor() { return actor_; }

private:
  TD3Config cfg_;
  torch::Device device_;
  Actor actor_, actor_target_;
  TwinCritic critic_, critic_target_;
  torch::optim::Adam actor_opt_, critic_opt_;
  int64_t total_it_ = 0;
};

double evaluate(TD3Agent &agent, Env &env, int64_t episodes) {
  double total = 0;
  for (int64_t ep = 0; ep < episodes; ++ep) {
    auto obs = env.reset();
    bool done = false;
    while (!done) {
      auto step = env.step(agent.select_action(obs, 0.0));
      total += step.reward;
      obs = step.obs;
      done = step.terminal || step.truncated;
    }
  }
  return total / static_cast<double>(episodes);
}

void run_td3(Env &env, Env &eval_env, const TD3Config &cfg, uint64_t seed) {
  torch::manual_seed(seed);
  TD3Agent agent(cfg);
  ReplayBuffer buffer(cfg.buffer_size, cfg.obs_dim, cfg.act_dim);
  auto obs = env.reset();
  double episode_return = 0, best_return = -std::numeric_limits<double>::infinity();
  int64_t episode_steps = 0, episode = 0;
  std::vector<torch::Tensor> best_actor;

  for (int64_t t = 0; t < cfg.max_timesteps; ++t) {
    ++episode_steps;
    auto action = t < cfg.start_timesteps ? env.sample_action() : agent.select_action(obs, cfg.expl_noise);
    auto step = env.step(action);
    buffer.add(obs, action, step.obs, step.reward, step.terminal);
    obs = step.obs;
    episode_return += step.reward;

    if (step.terminal || step.truncated) {
      if (t >= cfg.start_timesteps) {
        auto s = agent.train(buffer, episode_steps);
        std::cout << "episode " << episode << " return " << episode_return << " critic " << s.critic_loss << " actor "
                  << s.actor_loss << " Q " << s.mean_q << " max|td| " << s.max_td << "\n";
      }
      obs = env.reset();
      episode_return = 0;
      episode_steps = 0;
      ++episode;
    }

    if ((t + 1) % cfg.eval_freq == 0) {
      const double ret = evaluate(agent, eval_env, cfg.eval_episodes);
      std::cout << "t " << t + 1 << " eval return " << ret << "\n";
      if (ret > best_return) {
        best_return = ret;
        best_actor.clear();
        for (const auto &p : agent.actor()->parameters())
          best_actor.push_back(p.detach().clone()); // LOOKALIKE: tensor-clone-in-loop -- a snapshot of weights that train() keeps changing, kept past the loop
      }
    }
  }

  // Ship the best evaluated policy, not the last one.
  auto params = agent.actor()->parameters();
  // FACT: p = torch.nn.Linear(3, 2).weight; p.detach().copy_(torch.ones(2, 3)); assert p.is_leaf and p.requires_grad and bool((p == 1).all())
  for (size_t i = 0; i < params.size() && i < best_actor.size(); ++i)
    params[i].detach().copy_(best_actor[i]); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- a direct detach() chain: writing the weights is the intent, and it is allowed
  torch::save(agent.actor(), cfg.out_path);
}
