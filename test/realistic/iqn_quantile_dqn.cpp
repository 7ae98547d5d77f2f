// Implicit Quantile Network (IQN) agent for discrete-action control.
//
// The network maps (state, tau) pairs to quantile values Z_tau(s, a) through a
// cosine embedding of the sampled quantile fractions; training minimises the
// quantile Huber loss against a target network, with double-DQN action
// selection for the bootstrap. Acting is epsilon-greedy on the mean over a
// fixed grid of taus (or on CVaR_alpha for the risk-averse variant).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>
#include <tuple>

namespace nn = torch::nn;

struct IQNConfig {
  int64_t obs_dim = 8, num_actions = 4, hidden = 256;
  int64_t n_cos = 64;                                      // cosine basis size
  int64_t n_tau = 32, n_tau_target = 32, k_act = 32;       // N, N', K
  double kappa = 1.0, gamma = 0.99, lr = 5e-5;
  double obs_scale = 10.0, reward_scale = 1.0;
  double cvar_alpha = 1.0;                                 // < 1: risk-averse acting
  double polyak = 0.0;                                     // 0: hard target sync
  int64_t batch_size = 32, buffer_capacity = 100000, total_steps = 500000, warmup = 5000;
  int64_t train_every = 4, gradient_steps = 1, target_sync_every = 2000, log_every = 1000;
  double eps_start = 1.0, eps_end = 0.01;
  int64_t eps_decay_steps = 100000;
  uint32_t seed = 7;
};

struct StepResult {
  torch::Tensor next_obs;
  double reward = 0.0;
  bool done = false;
};

class Env {
 public:
  virtual ~Env() = default;
  virtual torch::Tensor reset() = 0;
  virtual StepResult step(int64_t action) = 0;
};

class IQNNetImpl : public nn::Module {
 public:
  explicit IQNNetImpl(const IQNConfig& cfg) : num_actions_(cfg.num_actions) {
    phi_ = register_module("phi", nn::Linear(cfg.obs_dim, cfg.hidden));
    cos_embed_ = register_module("cos_embed", nn::Linear(cfg.n_cos, cfg.hidden));
    fc_ = register_module("fc", nn::Linear(cfg.hidden, cfg.hidden));
    head_ = register_module("head", nn::Linear(cfg.hidden, cfg.num_actions));
    // i * pi, i = 0..n_cos-1: a buffer so that it follows the module to the device
    pis_ = register_buffer("pis", torch::arange(cfg.n_cos, torch::kFloat) * M_PI);
  }
  // obs: [B, obs_dim], taus: [B, N] -> quantile values [B, N, A]
  torch::Tensor forward(const torch::Tensor& obs, const torch::Tensor& taus) {
    const auto B = obs.size(0);
    const auto N = taus.size(1);
    auto psi = torch::relu(phi_->forward(obs));                            // [B, H]
    auto cos = torch::cos(taus.unsqueeze(-1) * pis_.view({1, 1, -1}));    // [B, N, n_cos]
    auto emb = torch::relu(cos_embed_->forward(cos));                      // [B, N, H]
    torch::Tensor h = psi.unsqueeze(1) * emb;
    h = torch::relu(fc_->forward(h));
    // FACT: h = torch.relu(torch.nn.Linear(6, 6)(torch.randn(3, 5, 6))); assert is_view_of(h.view(15, -1), h)
    auto q = head_->forward(h.view({B * N, -1}));  // LOOKALIKE: tensor-view-non-contiguous -- relu(fc(h)) is a fresh contiguous tensor
    return q.view({B, N, num_actions_});
  }

 private:
  int64_t num_actions_;
  nn::Linear phi_{nullptr}, cos_embed_{nullptr}, fc_{nullptr}, head_{nullptr};
  torch::Tensor pis_;
};
TORCH_MODULE(IQNNet);

struct Batch {
  torch::Tensor obs, actions, rewards, next_obs, dones;
};

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, double obs_scale)
      : capacity_(capacity), obs_scale_(obs_scale) {
    obs_ = torch::zeros({capacity, obs_dim});
    next_obs_ = torch::zeros({capacity, obs_dim});
    actions_ = torch::zeros({capacity}, torch::kLong);
    rewards_ = torch::zeros({capacity});
    dones_ = torch::zeros({capacity});
  }
  void push(const torch::Tensor& obs, int64_t action, double reward,
            const torch::Tensor& next_obs, bool done) {
    auto nxt = next_obs.to(torch::kFloat);
    // FACT: a = torch.randn(3, 8); b = a.to(torch.float32); b.div_(10.0); assert shares_storage(a, b)
    nxt.div_(obs_scale_);  // EXPECT: tensor-alias-then-mutate
    obs_[pos_].copy_(obs / obs_scale_);
    next_obs_[pos_].copy_(nxt);
    actions_[pos_] = action;
    rewards_[pos_] = reward;
    dones_[pos_] = done ? 1.0 : 0.0;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }
  Batch sample(int64_t batch_size, double reward_scale) const {
    auto idx = torch::randint(0, size_, {batch_size}, torch::kLong);
    Batch b;
    b.obs = obs_.index_select(0, idx);
    b.next_obs = next_obs_.index_select(0, idx);
    b.actions = actions_.index_select(0, idx);
    auto r = rewards_.index_select(0, idx);
    // FACT: a = torch.randn(10); i = torch.tensor([1, 3, 3]); r = a.index_select(0, i); assert is_copy_of(r, a)
    r.mul_(reward_scale);  // LOOKALIKE: tensor-alias-then-mutate -- index_select returns new storage
    b.rewards = r;
    b.dones = dones_.index_select(0, idx);
    return b;
  }
  int64_t size() const { return size_; }

 private:
  int64_t capacity_;
  double obs_scale_;
  int64_t pos_ = 0;
  int64_t size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_;
};

torch::Tensor scale_obs(const torch::Tensor& raw, double scale) {
  auto x = raw.clone();  // EXPECT: tensor-unnecessary-clone
  x.div_(scale);
  return x;
}

// Quantile Huber loss. current: [B, N] at fractions taus [B, N]; target: [B, N'].
torch::Tensor quantile_huber_loss(const torch::Tensor& current, const torch::Tensor& target,
                                  const torch::Tensor& taus, double kappa) {
  auto td = target.unsqueeze(1) - current.unsqueeze(2);  // [B, N, N']
  auto abs_td = td.abs();
  auto huber = torch::where(abs_td <= kappa, 0.5 * td.pow(2), kappa * (abs_td - 0.5 * kappa));
  auto below = (td.detach() < 0).to(torch::kFloat);
  auto weight = (taus.unsqueeze(2) - below).abs();
  return (weight * huber / kappa).sum(1).mean(1).mean();
}

// CVaR_alpha of each action: the mean of its lowest alpha fraction of quantiles.
torch::Tensor cvar_values(const torch::Tensor& q, double alpha) {
  const auto B = q.size(0);
  const auto N = q.size(1);
  const auto A = q.size(2);
  // FACT: q = torch.randn(4, 8, 3); assert raises(lambda: q.permute(0, 2, 1).view(-1, 8), "view size is not compatible")
  auto per_action = q.permute({0, 2, 1}).view({-1, N});  // EXPECT: tensor-view-non-contiguous
  auto sorted = std::get<0>(per_action.sort(1));
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(alpha * static_cast<double>(N)));
  // FACT: s = torch.randn(12, 8); m = s.narrow(1, 0, 3).mean(1); assert is_contiguous(m) and is_view_of(m.view(4, 3), m)
  return sorted.narrow(1, 0, k).mean(1).view({B, A});  // LOOKALIKE: tensor-view-non-contiguous -- mean(1) returns a contiguous tensor
}

int64_t select_action(IQNNet& net, const torch::Tensor& obs, const torch::Tensor& taus,
                      double eps, const IQNConfig& cfg, std::mt19937& rng) {
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  if (coin(rng) < eps) {
    std::uniform_int_distribution<int64_t> pick(0, cfg.num_actions - 1);
    return pick(rng);
  }
  torch::NoGradGuard no_grad;
  auto x = scale_obs(obs, cfg.obs_scale).unsqueeze(0).to(taus.device());
  auto q = net->forward(x, taus);  // [1, K, A]
  auto values = cfg.cvar_alpha < 1.0 ? cvar_values(q, cfg.cvar_alpha) : q.mean(1);
  return values.argmax(1).item<int64_t>();
}

void hard_update(IQNNet& target, IQNNet& online) {
  auto src = online->named_parameters();
  for (auto& item : target->named_parameters()) {
    item.value().copy_(src[item.key()]);  // EXPECT: tensor-inplace-on-leaf
  }
}

void soft_update(IQNNet& target, IQNNet& online, double tau) {
  torch::NoGradGuard no_grad;
  auto src = online->parameters();
  auto dst = target->parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    dst[i].mul_(1.0 - tau).add_(src[i], tau);  // LOOKALIKE: tensor-inplace-on-leaf -- polyak update under NoGradGuard
  }
}

void log_quantile_spread(IQNNet& net, const torch::Tensor& obs, const torch::Tensor& taus) {
  torch::NoGradGuard no_grad;
  auto q = net->forward(obs, taus);  // [B, N, A]
  const auto A = q.size(2);
  // FACT: q = torch.randn(4, 8, 3); r = q.transpose(1, 2).flatten(0, 1); assert is_copy_of(r, q)
  auto rows = q.transpose(1, 2).flatten(0, 1);  // EXPECT: tensor-reshape-non-contiguous
  auto spread = std::get<0>(rows.max(1)) - std::get<0>(rows.min(1));
  // FACT: q = torch.randn(4, 8, 3); r = q.permute(2, 0, 1).reshape(3, -1); assert is_view_of(r, q)
  auto by_action = q.permute({2, 0, 1}).reshape({A, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- batch and quantile dims stay in order: a view
  auto mean_q = by_action.mean(1);
  std::cout << "  quantile spread " << spread.mean().item<double>() << "  mean Q per action "
            << mean_q << "\n";
}

double epsilon_at(int64_t step, const IQNConfig& cfg) {
  const double frac = std::min(1.0, static_cast<double>(step) / cfg.eps_decay_steps);
  return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start);
}

void train_iqn(Env& env, const IQNConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  IQNNet online(cfg), target(cfg);
  online->to(device);
  target->to(device);
  hard_update(target, online);
  torch::optim::Adam opt(online->parameters(),
                         torch::optim::AdamOptions(cfg.lr).eps(0.01 / cfg.batch_size));
  ReplayBuffer buffer(cfg.buffer_capacity, cfg.obs_dim, cfg.obs_scale);
  std::mt19937 rng(cfg.seed);
  // evenly spaced fractions for acting: their mean estimates Q(s, a)
  const double half = 0.5 / static_cast<double>(cfg.k_act);
  auto act_taus = torch::linspace(half, 1.0 - half, cfg.k_act).unsqueeze(0);
  torch::Tensor q_monitor = torch::zeros({}, torch::TensorOptions().device(device));
  double running_loss = 0.0;
  int64_t updates = 0;
  double episode_return = 0.0;
  auto obs = env.reset();
  for (int64_t step = 0; step < cfg.total_steps; ++step) {
    auto taus_act = act_taus.to(device);  // EXPECT: tensor-clone-in-loop
    const int64_t action = select_action(online, obs, taus_act, epsilon_at(step, cfg), cfg, rng);
    auto tr = env.step(action);
    episode_return += tr.reward;
    buffer.push(obs, action, tr.reward, tr.next_obs, tr.done);
    if (tr.done) {
      std::cout << "step " << step << " return " << episode_return << "\n";
      episode_return = 0.0;
      obs = env.reset();
    } else {
      obs = tr.next_obs;
    }
    if (step < cfg.warmup || step % cfg.train_every != 0) continue;
    for (int64_t g = 0; g < cfg.gradient_steps; ++g) {
      auto batch = buffer.sample(cfg.batch_size, cfg.reward_scale);
      auto states = batch.obs.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
      auto next_states = batch.next_obs.to(device);
      auto actions = batch.actions.to(device);
      auto rewards = batch.rewards.to(device);
      auto not_done = 1.0 - batch.dones.to(device);
      const auto B = states.size(0);
      torch::Tensor target_quantiles;
      {
        torch::NoGradGuard no_grad;
        auto taus_next = torch::rand({B, cfg.n_tau_target}, torch::TensorOptions().device(device));
        auto next_actions = online->forward(next_states, taus_act.expand({B, -1})).mean(1).argmax(1);
        auto tq = target->forward(next_states, taus_next);  // [B, N', A]
        auto idx = next_actions.view({B, 1, 1}).expand({B, cfg.n_tau_target, 1});
        target_quantiles = tq.gather(2, idx).squeeze(2);  // [B, N']
        target_quantiles.mul_(cfg.gamma * not_done.unsqueeze(1)).add_(rewards.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-saved -- computed under NoGradGuard, nothing recorded
      }
      auto taus = torch::rand({B, cfg.n_tau}, torch::TensorOptions().device(device));
      auto q = online->forward(states, taus);  // [B, N, A]
      auto chosen = q.gather(2, actions.view({B, 1, 1}).expand({B, cfg.n_tau, 1})).squeeze(2);
      auto loss = quantile_huber_loss(chosen, target_quantiles, taus, cfg.kappa);
      opt.zero_grad();
      loss.backward();
      opt.step();
      ++updates;
      running_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() keeps no graph
      q_monitor += chosen.mean();  // EXPECT: tensor-graph-kept-across-iterations
      if (updates % cfg.log_every == 0) {
        std::cout << "update " << updates << std::fixed << std::setprecision(4)
                  << " loss " << running_loss / cfg.log_every
                  << " mean Q " << q_monitor.item<double>() / cfg.log_every << "\n";  // LOOKALIKE: tensor-sync-in-loop -- once every log_every updates, under a condition
        q_monitor.zero_();
        running_loss = 0.0;
        log_quantile_spread(online, states, taus);
      }
      if (updates % cfg.target_sync_every == 0) {
        if (cfg.polyak > 0.0) {
          soft_update(target, online, cfg.polyak);
        } else {
          hard_update(target, online);
        }
      }
    }
  }
}
