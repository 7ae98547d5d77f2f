// Munchausen-DQN: soft Bellman targets from a Boltzmann target policy, plus the
// scaled and clipped log-policy of the taken action added to the reward.
// Dueling Q-network, proportional prioritized replay, periodic hard target sync.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

struct MDQNConfig {
  int64_t obs_dim = 8;
  int64_t num_actions = 4;
  int64_t hidden = 256;
  int64_t capacity = 100000;
  int64_t batch_size = 64;
  int64_t warmup = 2000;
  int64_t total_steps = 500000;
  int64_t target_period = 8000;
  int64_t log_every = 5000;
  double gamma = 0.99;
  double tau = 0.03;     // entropy temperature
  double alpha = 0.9;    // munchausen scaling
  double l0 = -1.0;      // lower clip of tau * log pi
  double lr = 5e-5;
  double per_alpha = 0.6;
  double per_beta0 = 0.4;
  double per_eps = 1e-6;
  double grad_clip = 10.0;
  double eps_start = 1.0;
  double eps_end = 0.01;
  int64_t eps_decay_steps = 250000;
};

struct DuelingQNetImpl : torch::nn::Module {
  DuelingQNetImpl(int64_t obs_dim, int64_t num_actions, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(obs_dim, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        value(register_module("value", torch::nn::Linear(hidden, 1))),
        advantage(register_module("advantage", torch::nn::Linear(hidden, num_actions))) {}

  torch::Tensor forward(const torch::Tensor& obs) {
    auto h = torch::relu(fc1(obs));
    auto r = fc2(h);
    r.add_(h);  // LOOKALIKE: tensor-inplace-on-saved -- fc2's output is saved by no node (addmm keeps its inputs, add keeps nothing)
    h = torch::relu(norm(r));
    auto v = value(h);
    auto a = advantage(h);
    // FACT: assert backward_fails(lambda: (lambda a: (a.sub_(a.mean(1, keepdim=True)), a.sum().backward()))(torch.nn.Linear(3, 4)(torch.randn(5, 3))))
    a -= a.mean({1}, /*keepdim=*/true);  // EXPECT: tensor-inplace-on-saved
    return v + a;
  }

  torch::nn::Linear fc1, fc2;
  torch::nn::LayerNorm norm;
  torch::nn::Linear value, advantage;
};
TORCH_MODULE(DuelingQNet);

struct Batch {
  torch::Tensor idx, obs, actions, rewards, next_obs, dones, weights;
};

class PrioritizedReplay {
 public:
  PrioritizedReplay(int64_t capacity, int64_t obs_dim, double alpha)
      : capacity_(capacity),
        alpha_(alpha),
        obs_(torch::zeros({capacity, obs_dim})),
        next_obs_(torch::zeros({capacity, obs_dim})),
        actions_(torch::zeros({capacity}, torch::kInt32)),
        rewards_(torch::zeros({capacity})),
        dones_(torch::zeros({capacity})),
        priorities_(torch::zeros({capacity})) {}

  void add(const torch::Tensor& obs, const torch::Tensor& action, double reward,
           const torch::Tensor& next_obs, bool done) {
    obs_[pos_].copy_(obs.to(obs_.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- converted to the buffer's dtype on purpose first
    next_obs_[pos_].copy_(next_obs.to(next_obs_.scalar_type()));
    // FACT: a = torch.zeros(4, dtype=torch.int32); a[1] = torch.tensor(2**33 + 5); assert a[1].item() == 5
    actions_.index_put_({pos_}, action);  // EXPECT: tensor-copy-narrowing
    rewards_[pos_] = reward;
    dones_[pos_] = done ? 1.0 : 0.0;
    priorities_[pos_] = max_priority_;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t n, double beta, torch::Device device) const {
    auto probs = priorities_.narrow(0, 0, size_);
    auto idx = torch::multinomial(probs, n, /*replacement=*/true);
    auto w = (probs.index_select(0, idx) * static_cast<double>(size_) / probs.sum()).pow(-beta);
    w /= w.max();

    Batch b;
    b.idx = idx;
    // FACT: o = torch.randn(10, 8).index_select(0, torch.tensor([1, 4, 4])); assert is_view_of(o.reshape(3, -1), o)
    b.obs = obs_.index_select(0, idx).reshape({n, -1}).to(device);  // LOOKALIKE: tensor-reshape-non-contiguous -- index_select returns a fresh contiguous tensor, reshape is a view
    b.next_obs = next_obs_.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- different rows on every call
    b.actions = actions_.index_select(0, idx).to(device, torch::kLong);
    b.rewards = rewards_.index_select(0, idx);
    b.dones = dones_.index_select(0, idx).to(device);
    b.weights = w.to(device);
    return b;
  }

  void update_priorities(const torch::Tensor& idx, const torch::Tensor& td_abs) {
    max_priority_ = std::max(max_priority_, std::pow(td_abs.max().item<double>(), alpha_));
    priorities_.index_put_({idx}, td_abs.clone().pow_(alpha_));  // EXPECT: tensor-unnecessary-clone
  }

  int64_t size() const { return size_; }

 private:
  int64_t capacity_;
  double alpha_;
  int64_t pos_ = 0;
  int64_t size_ = 0;
  double max_priority_ = 1.0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_, priorities_;
};

// Environments hand back observations from a buffer they overwrite on the next step.
class DiscreteEnv {
 public:
  virtual ~DiscreteEnv() = default;
  virtual torch::Tensor reset() = 0;
  virtual torch::Tensor step(int64_t action, double& reward, bool& done) = 0;
  virtual torch::Tensor legal_actions() const = 0;
  virtual torch::Tensor observation_scale() const = 0;
};

torch::Tensor munchausen_target(DuelingQNet& target_net, const Batch& b, const MDQNConfig& cfg) {
  torch::NoGradGuard no_grad;

  // Soft value of the next state under the target network's Boltzmann policy.
  auto q_next = target_net->forward(b.next_obs);
  torch::Tensor z = q_next;
  // FACT: q = torch.randn(4, 3); q0 = q.clone(); z = q; z -= q.amax(1, keepdim=True); assert not torch.equal(q, q0)
  z -= q_next.amax({1}, /*keepdim=*/true);  // EXPECT: tensor-alias-then-mutate
  z /= cfg.tau;
  auto log_pi_next = z - z.logsumexp({1}, /*keepdim=*/true);
  auto v_next = (log_pi_next.exp() * (q_next - cfg.tau * log_pi_next)).sum(1);

  // Munchausen term: alpha * clip(tau * log pi(a|s), l0, 0).
  auto log_pi = torch::log_softmax(target_net->forward(b.obs) / cfg.tau, 1);
  auto log_pi_a = log_pi.gather(1, b.actions.unsqueeze(1)).squeeze(1);
  auto alpha = torch::tensor(cfg.alpha);
  auto bonus = alpha * (cfg.tau * log_pi_a).clamp(cfg.l0, 0.0);  // LOOKALIKE: tensor-device-mismatch -- alpha is a 0-dim CPU tensor, which may mix with CUDA operands

  return b.rewards + bonus + cfg.gamma * (1.0 - b.dones) * v_next;  // EXPECT: tensor-device-mismatch
}

torch::Tensor train_step(DuelingQNet& online, DuelingQNet& target, torch::optim::Adam& opt,
                         PrioritizedReplay& replay, const Batch& b, const MDQNConfig& cfg) {
  auto y = munchausen_target(target, b, cfg);
  auto q = online->forward(b.obs).gather(1, b.actions.unsqueeze(1)).squeeze(1);

  auto td = q - y;
  auto abs_td = td.abs();
  auto huber = torch::where(abs_td < 1.0, 0.5 * td.pow(2), abs_td - 0.5);
  auto loss = (b.weights * huber).mean();

  auto prio = td.detach();
  prio.abs_().add_(cfg.per_eps);  // EXPECT: tensor-inplace-on-detached
  replay.update_priorities(b.idx, prio.to(torch::kCPU));

  opt.zero_grad();
  loss.backward();
  for (auto& p : online->parameters()) {
    auto g = p.grad();
    if (g.defined()) {
      g.clamp_(-cfg.grad_clip, cfg.grad_clip);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, which does not require grad itself
    }
  }
  opt.step();
  return loss;
}

void hard_update(DuelingQNet& target, const DuelingQNet& online) {
  auto tp = target->parameters();
  auto op = online->parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    tp[i].copy_(op[i]);  // EXPECT: tensor-inplace-on-leaf
  }
}

int64_t select_action(DuelingQNet& net, const torch::Tensor& obs, const torch::Tensor& legal,
                      const torch::Tensor& obs_scale, double eps, std::mt19937& rng,
                      torch::Device device) {
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  if (coin(rng) < eps) {
    auto choices = legal.nonzero().view({-1});
    std::uniform_int_distribution<int64_t> pick(0, choices.size(0) - 1);
    return choices[pick(rng)].item<int64_t>();
  }
  torch::NoGradGuard no_grad;
  // FACT: o = torch.randn(8, dtype=torch.float64); assert is_copy_of(o.to(torch.float32), o)
  auto x = obs.to(torch::kFloat32);
  x.mul_(obs_scale);  // LOOKALIKE: tensor-alias-then-mutate -- the env emits float64, so to(kFloat32) made a new tensor
  auto q = net->forward(x.unsqueeze(0).to(device)).squeeze(0);
  q = q.masked_fill(legal.logical_not(), -std::numeric_limits<float>::infinity());
  return q.argmax().item<int64_t>();
}

double epsilon_at(int64_t step, const MDQNConfig& cfg) {
  double frac = std::min(1.0, static_cast<double>(step) / cfg.eps_decay_steps);
  return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start);
}

void train(DiscreteEnv& env, const MDQNConfig& cfg) {
  torch::manual_seed(0);
  std::mt19937 rng(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  DuelingQNet online(cfg.obs_dim, cfg.num_actions, cfg.hidden);
  DuelingQNet target(cfg.obs_dim, cfg.num_actions, cfg.hidden);
  online->to(device);
  target->to(device);
  hard_update(target, online);

  torch::optim::Adam opt(online->parameters(),
                         torch::optim::AdamOptions(cfg.lr).eps(0.01 / cfg.batch_size));
  PrioritizedReplay replay(cfg.capacity, cfg.obs_dim, cfg.per_alpha);

  const auto legal = env.legal_actions();
  const auto obs_scale = env.observation_scale();
  std::vector<torch::Tensor> loss_hist;
  double loss_ema = 0.0;
  double episode_return = 0.0;
  std::vector<double> returns;

  auto obs = env.reset().clone();
  for (int64_t step = 1; step <= cfg.total_steps; ++step) {
    auto mask = legal.to(device);  // EXPECT: tensor-clone-in-loop
    int64_t a = select_action(online, obs, mask, obs_scale, epsilon_at(step, cfg), rng, device);

    double reward = 0.0;
    bool done = false;
    auto next_obs = env.step(a, reward, done);
    replay.add(obs, torch::tensor(a), reward, next_obs, done);
    episode_return += reward;
    if (done) {
      returns.push_back(episode_return);
      episode_return = 0.0;
      obs = env.reset().clone();
    } else {
      obs = next_obs.clone();  // LOOKALIKE: tensor-unnecessary-clone -- env.step() overwrites its buffer next step; the clone keeps this observation
    }

    if (replay.size() < cfg.warmup) continue;

    double frac = std::min(1.0, static_cast<double>(step) / cfg.total_steps);
    double beta = cfg.per_beta0 + frac * (1.0 - cfg.per_beta0);
    auto batch = replay.sample(cfg.batch_size, beta, device);
    auto loss = train_step(online, target, opt, replay, batch, cfg);

    loss_ema = 0.99 * loss_ema + 0.01 * loss.item<double>();  // EXPECT: tensor-sync-in-loop
    loss_hist.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept

    if (step % cfg.target_period == 0) {
      hard_update(target, online);
    }

    if (step % cfg.log_every == 0) {
      double mean_loss = torch::stack(loss_hist).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- one read per logging period
      loss_hist.clear();
      double mean_ret = 0.0;
      size_t k = std::min<size_t>(returns.size(), 20);
      for (size_t i = returns.size() - k; i < returns.size(); ++i) mean_ret += returns[i];
      if (k > 0) mean_ret /= static_cast<double>(k);
      std::cout << "step " << step << std::fixed << std::setprecision(4)
                << " loss " << mean_loss << " ema " << loss_ema
                << " return(20) " << mean_ret << '\n';
    }
  }
}
