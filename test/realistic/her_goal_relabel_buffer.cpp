// Goal-conditioned DDPG with Hindsight Experience Replay (Andrychowicz et al., 2017),
// "future" strategy, for the Fetch-style robotics tasks (sparse -1/0 reward).
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct HerConfig {
  int64_t obs_dim = 25, goal_dim = 3, action_dim = 4, hidden = 256;
  int64_t max_steps = 50, buffer_episodes = 20000;  // T, 1e6 transitions
  int64_t replay_k = 4;                              // future_p = 1 - 1 / (1 + k)
  int64_t batch_size = 256, n_batches = 40;
  double gamma = 0.98, polyak = 0.95, action_l2 = 1.0, max_u = 1.0;
  double clip_range = 5.0, distance_threshold = 0.05, noise_eps = 0.2, random_eps = 0.3;
  double lr_actor = 1e-3, lr_critic = 1e-3;
};

// What the simulator hands back each step (MuJoCo works in double).
struct EnvStep { std::vector<double> observation, achieved_goal, desired_goal; };

struct GoalEnv {
  virtual ~GoalEnv() = default;
  virtual EnvStep reset() = 0;
  virtual EnvStep step(const std::vector<float>& action) = 0;
};

// Sparse reward, recomputed for relabelled goals: 0 when within the threshold, else -1.
torch::Tensor compute_reward(const torch::Tensor& achieved, const torch::Tensor& goal, double threshold) {
  auto dist = torch::norm(achieved - goal, 2, {-1});
  return -(dist > threshold).to(torch::kFloat).unsqueeze(-1);
}

// Running mean / std of everything the agent has seen, as in baselines' Normalizer.
class Normalizer {
 public:
  Normalizer(int64_t size, double clip_range, double eps = 1e-2)
      : clip_range_(clip_range), eps_(eps), local_sum_(torch::zeros({size})), local_sumsq_(torch::zeros({size})),
        total_sum_(torch::zeros({size})), total_sumsq_(torch::zeros({size})), mean_(torch::zeros({size})),
        std_(torch::ones({size})) {}

  void update(const torch::Tensor& v) {  // [N, size]
    local_sum_ += v.sum(0);
    local_sumsq_ += v.pow(2).sum(0);
    local_count_ += v.size(0);
  }

  void recompute_stats() {
    auto local_sum = local_sum_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- local_sum_ is reset below while the copy is still read
    auto local_sumsq = local_sumsq_.clone();
    const int64_t local_count = local_count_;
    local_sum_.zero_();
    local_sumsq_.zero_();
    local_count_ = 0;
    total_sum_ += local_sum;
    total_sumsq_ += local_sumsq;
    total_count_ += local_count;
    mean_ = total_sum_ / static_cast<double>(total_count_);
    std_ = torch::sqrt(torch::clamp_min(total_sumsq_ / static_cast<double>(total_count_) - mean_.pow(2), eps_ * eps_));
  }

  torch::Tensor normalize(const torch::Tensor& v) const {
    // FACT: v = torch.randn(3, 4); x = v.to(torch.float); x.sub_(1.0); assert shares_storage(x, v)
    auto x = v.to(torch::kFloat);
    x.sub_(mean_).div_(std_);  // EXPECT: tensor-alias-then-mutate
    return x.clamp(-clip_range_, clip_range_);
  }

 private:
  double clip_range_, eps_;
  torch::Tensor local_sum_, local_sumsq_, total_sum_, total_sumsq_, mean_, std_;
  int64_t local_count_ = 0, total_count_ = 0;
};

struct Transitions { torch::Tensor o, g, u, r, o2; };

class HerReplayBuffer {
 public:
  explicit HerReplayBuffer(const HerConfig& cfg)
      : T_(cfg.max_steps), capacity_(cfg.buffer_episodes), future_p_(1.0 - 1.0 / (1.0 + cfg.replay_k)),
        threshold_(cfg.distance_threshold) {
    obs_ = torch::zeros({capacity_, T_ + 1, cfg.obs_dim});
    ag_ = torch::zeros({capacity_, T_ + 1, cfg.goal_dim});
    g_ = torch::zeros({capacity_, T_, cfg.goal_dim});
    u_ = torch::zeros({capacity_, T_, cfg.action_dim});
  }

  // obs/ag: [R, T + 1, .], g/u: [R, T, .]
  void store_episodes(const torch::Tensor& obs, const torch::Tensor& ag, const torch::Tensor& g, const torch::Tensor& u) {
    const int64_t R = obs.size(0);
    auto idx = (torch::arange(R) + next_) % capacity_;
    obs_.index_copy_(0, idx, obs);
    ag_.index_copy_(0, idx, ag);
    // FACT: g = torch.randn(2, 3).unsqueeze(1).expand(2, 5, 3); b = torch.zeros(4, 5, 3); b.index_copy_(0, torch.tensor([1, 2]), g); assert torch.equal(b[1], g[0])
    g_.index_copy_(0, idx, g);  // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast goals are only read
    u_.index_copy_(0, idx, u);
    next_ = (next_ + R) % capacity_;
    size_ = std::min(size_ + R, capacity_);
  }

  // Uniform transitions; with probability future_p the goal is replaced by one
  // achieved later in the same episode, and the reward recomputed for it.
  Transitions sample(int64_t batch) const {
    auto ep = torch::randint(size_, {batch}, torch::kLong);
    auto t = torch::randint(T_, {batch}, torch::kLong);
    auto o = obs_.index({ep, t});
    auto o2 = obs_.index({ep, t + 1});
    auto ag2 = ag_.index({ep, t + 1});
    auto u = u_.index({ep, t});
    // FACT: buf = torch.randn(5, 4, 3); ep = torch.tensor([0, 2]); t = torch.tensor([1, 3]); g = buf[ep, t]; g[0] = 0.0; assert is_copy_of(g, buf)
    auto g = g_.index({ep, t});
    auto her = torch::rand({batch}) < future_p_;
    auto offset = (torch::rand({batch}) * (T_ - t).to(torch::kFloat)).to(torch::kLong);
    auto future_ag = ag_.index({ep, t + 1 + offset});
    g.index_put_({her}, future_ag.index({her}));  // LOOKALIKE: tensor-alias-then-mutate -- advanced indexing copied the goals out of the buffer
    return {o, g, u, compute_reward(ag2, g, threshold_), o2};
  }

 private:
  int64_t T_, capacity_;
  double future_p_, threshold_;
  int64_t next_ = 0, size_ = 0;
  torch::Tensor obs_, ag_, g_, u_;
};

struct ActorImpl : nn::Module {
  explicit ActorImpl(const HerConfig& c)
      : fc1(c.obs_dim + c.goal_dim, c.hidden), fc2(c.hidden, c.hidden), fc3(c.hidden, c.action_dim), max_u(c.max_u) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
    nn::init::uniform_(fc3->weight, -3e-3, 3e-3);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
  }
  torch::Tensor forward(const torch::Tensor& o, const torch::Tensor& g) {
    auto x = fc1(torch::cat({o, g}, -1));
    x.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output
    x = F::relu(fc2(x));
    return torch::tanh(fc3(x)) * max_u;
  }
  nn::Linear fc1, fc2, fc3;
  double max_u;
};
TORCH_MODULE(Actor);

struct CriticImpl : nn::Module {
  explicit CriticImpl(const HerConfig& c)
      : fc1(c.obs_dim + c.goal_dim + c.action_dim, c.hidden), fc2(c.hidden, c.hidden), q_out(c.hidden, 1) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("q_out", q_out);
    q_out->weight.uniform_(-3e-3, 3e-3);  // EXPECT: tensor-inplace-on-leaf
    q_out->bias.data().uniform_(-3e-3, 3e-3);  // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- data() is the idiom for initialising a parameter
  }
  torch::Tensor forward(const torch::Tensor& o, const torch::Tensor& g, const torch::Tensor& u) {
    auto x = F::relu(fc1(torch::cat({o, g, u}, -1)));
    return q_out(F::relu(fc2(x)));
  }
  nn::Linear fc1, fc2, q_out;
};
TORCH_MODULE(Critic);

class HerDDPGAgent {
 public:
  explicit HerDDPGAgent(const HerConfig& cfg)
      : cfg_(cfg), actor_(cfg), critic_(cfg), actor_target_(cfg), critic_target_(cfg),
        o_norm_(cfg.obs_dim, cfg.clip_range), g_norm_(cfg.goal_dim, cfg.clip_range),
        actor_opt_(actor_->parameters(), torch::optim::AdamOptions(cfg.lr_actor)),
        critic_opt_(critic_->parameters(), torch::optim::AdamOptions(cfg.lr_critic)) {
    soft_update_targets(/*tau_keep=*/0.0);
  }

  torch::Tensor act(const torch::Tensor& obs, const torch::Tensor& goal, bool explore) {
    torch::NoGradGuard no_grad;
    auto u = actor_(o_norm_.normalize(obs), g_norm_.normalize(goal));
    if (explore) {
      u = (u + cfg_.noise_eps * cfg_.max_u * torch::randn_like(u)).clamp(-cfg_.max_u, cfg_.max_u);
      auto random_u = torch::empty_like(u).uniform_(-cfg_.max_u, cfg_.max_u);
      auto use_random = (torch::rand({u.size(0), 1}) < cfg_.random_eps).to(torch::kFloat);
      u = u + use_random * (random_u - u);
    }
    return u;
  }

  void update_normalizers(const torch::Tensor& o, const torch::Tensor& g) {
    o_norm_.update(o);
    g_norm_.update(g);
    o_norm_.recompute_stats();
    g_norm_.recompute_stats();
  }

  // One cycle of n_batches DDPG updates, then Polyak-average the targets.
  double train(const HerReplayBuffer& buffer) {
    const double clip_return = 1.0 / (1.0 - cfg_.gamma);
    std::vector<torch::Tensor> critic_losses;
    double actor_loss_sum = 0.0;
    for (int64_t b = 0; b < cfg_.n_batches; ++b) {
      Transitions tr = buffer.sample(cfg_.batch_size);
      auto o = o_norm_.normalize(tr.o);
      auto o2 = o_norm_.normalize(tr.o2);
      auto g = g_norm_.normalize(tr.g);
      torch::Tensor target;
      {
        torch::NoGradGuard no_grad;
        auto q2 = critic_target_(o2, g, actor_target_(o2, g) / cfg_.max_u);
        target = (tr.r + cfg_.gamma * q2).clamp(-clip_return, 0.0);
      }
      auto critic_loss = (target - critic_(o, g, tr.u / cfg_.max_u)).pow(2).mean();
      critic_opt_.zero_grad();
      critic_loss.backward();
      critic_opt_.step();

      auto pi = actor_(o, g);
      // FACT: x = torch.randn(4, 2, requires_grad=True); pi = torch.tanh(x) * 2.0; a = pi.detach(); a.abs_(); assert bool((pi >= 0).all())
      auto pi_mag = pi.detach();
      pi_mag.abs_();  // EXPECT: tensor-inplace-on-detached
      mean_abs_action_ = pi_mag.mean().item<double>();
      auto actor_loss = -critic_(o, g, pi / cfg_.max_u).mean() + cfg_.action_l2 * (pi / cfg_.max_u).pow(2).mean();
      actor_opt_.zero_grad();
      actor_loss.backward();
      actor_opt_.step();

      critic_losses.push_back(critic_loss);  // EXPECT: tensor-graph-kept-across-iterations
      actor_loss_sum += actor_loss.item<double>();  // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- a host double, and the agent runs on the CPU
    }
    soft_update_targets(cfg_.polyak);
    last_critic_loss_ = torch::stack(critic_losses).mean().item<double>();
    return actor_loss_sum / static_cast<double>(cfg_.n_batches);
  }

 private:
  // target = tau_keep * target + (1 - tau_keep) * online; tau_keep = 0 copies.
  void soft_update_targets(double tau_keep) {
    torch::NoGradGuard no_grad;
    auto at = actor_target_->parameters(), as = actor_->parameters();
    for (size_t i = 0; i < at.size(); ++i) {
      auto w = at[i].data();
      w.mul_(tau_keep).add_(as[i], 1.0 - tau_keep);  // LOOKALIKE: tensor-inplace-on-detached -- Polyak averaging of the target is meant to write it, under NoGradGuard
    }
    auto ct = critic_target_->parameters(), cs = critic_->parameters();
    for (size_t i = 0; i < ct.size(); ++i) {
      ct[i].mul_(tau_keep).add_(cs[i], 1.0 - tau_keep);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
  }

  HerConfig cfg_;
  Actor actor_, actor_target_;
  Critic critic_, critic_target_;
  Normalizer o_norm_, g_norm_;
  torch::optim::Adam actor_opt_, critic_opt_;
  double mean_abs_action_ = 0.0, last_critic_loss_ = 0.0;
};

// Runs R environments for one episode each and stores the result.
void collect_rollouts(std::vector<std::unique_ptr<GoalEnv>>& envs, HerDDPGAgent& agent, HerReplayBuffer& buffer,
                      const HerConfig& cfg) {
  const int64_t R = static_cast<int64_t>(envs.size()), T = cfg.max_steps;
  auto obs_t = torch::empty({R, cfg.obs_dim});
  auto ag_t = torch::empty({R, cfg.goal_dim});
  auto g64 = torch::empty({R, cfg.goal_dim}, torch::kFloat64);
  auto as_tensor = [](std::vector<double>& v) { return torch::from_blob(v.data(), {(int64_t)v.size()}, torch::kFloat64); };
  for (int64_t e = 0; e < R; ++e) {
    EnvStep s = envs[e]->reset();
    obs_t[e].copy_(as_tensor(s.observation).to(torch::kFloat));
    ag_t[e].copy_(as_tensor(s.achieved_goal).to(torch::kFloat));
    g64[e].copy_(as_tensor(s.desired_goal));
  }
  std::vector<torch::Tensor> obs_steps, ag_steps, u_steps;
  for (int64_t t = 0; t < T; ++t) {
    auto u = agent.act(obs_t, g64.to(torch::kFloat), /*explore=*/true);  // EXPECT: tensor-clone-in-loop
    obs_steps.push_back(obs_t.clone());  // LOOKALIKE: tensor-clone-in-loop -- obs_t is rewritten below; every copy is kept
    ag_steps.push_back(ag_t.clone());
    u_steps.push_back(u);  // LOOKALIKE: tensor-graph-kept-across-iterations -- act() runs the actor under NoGradGuard
    for (int64_t e = 0; e < R; ++e) {
      auto row = u[e].contiguous();
      std::vector<float> action(row.data_ptr<float>(), row.data_ptr<float>() + cfg.action_dim);
      EnvStep s = envs[e]->step(action);
      obs_t[e].copy_(as_tensor(s.observation));  // EXPECT: tensor-copy-narrowing
      ag_t[e].copy_(as_tensor(s.achieved_goal).to(torch::kFloat));  // LOOKALIKE: tensor-copy-narrowing -- explicit conversion
    }
  }
  obs_steps.push_back(obs_t.clone());
  ag_steps.push_back(ag_t.clone());

  auto obs = torch::stack(obs_steps).transpose(0, 1);  // [R, T + 1, obs_dim]
  auto ag = torch::stack(ag_steps).transpose(0, 1);    // [R, T + 1, goal_dim]
  auto u = torch::stack(u_steps).transpose(0, 1);      // [R, T, action_dim]
  auto g = g64.to(torch::kFloat).unsqueeze(1).expand({R, T, cfg.goal_dim});
  buffer.store_episodes(obs, ag, g, u);

  // Normalisers see every visited state; achieved goals stand in for the goal distribution.
  // FACT: s = torch.stack([torch.randn(3, 5) for _ in range(4)]).transpose(0, 1); assert raises(lambda: s.view(-1, 5), "view size is not compatible")
  auto flat_obs = obs.view({-1, cfg.obs_dim});  // EXPECT: tensor-view-non-contiguous
  // FACT: s = torch.stack([torch.randn(3, 5) for _ in range(4)]).transpose(0, 1); assert is_copy_of(s.reshape(-1, 5), s)
  auto flat_ag = ag.reshape({-1, cfg.goal_dim});  // EXPECT: tensor-reshape-non-contiguous
  agent.update_normalizers(flat_obs, flat_ag);
}
