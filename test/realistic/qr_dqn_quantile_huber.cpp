// QR-DQN (Dabney et al. 2017): the network outputs N quantiles of the return for every action
// and is trained with the quantile Huber loss against a periodically synchronised target network.
// Transitions are replayed with proportional prioritisation.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

struct QRConfig {
  int64_t obs_dim = 4, num_actions = 4, num_quantiles = 51, hidden = 256;
  int64_t capacity = 100000, batch_size = 64, total_steps = 500000, learning_starts = 10000;
  int64_t train_freq = 4, target_update = 8000, log_every = 5000, eval_every = 50000;
  double gamma = 0.99, kappa = 1.0, lr = 5e-5, adam_eps = 0.01 / 64;
  double eps_start = 1.0, eps_end = 0.01, eps_decay_steps = 250000;
  double per_alpha = 0.6, per_beta = 0.4, cvar_alpha = 0.25, obs_scale = 10.0;
};

// Point mass pushed towards the origin, with rare heavy gusts that make returns bimodal.
class PointMass {
 public:
  struct Step { double reward; bool done; };
  explicit PointMass(uint64_t seed) : rng_(seed) { reset(); }

  void reset() {
    std::uniform_real_distribution<float> u(-10.f, 10.f);
    state_ = torch::tensor({u(rng_), u(rng_), 0.f, 0.f});
    t_ = 0;
  }

  Step step(int64_t a) {
    static const float ax[4] = {1.f, -1.f, 0.f, 0.f}, ay[4] = {0.f, 0.f, 1.f, -1.f};
    const float gust = std::bernoulli_distribution(0.05)(rng_) ? 4.f : 0.f;
    auto vel = state_.narrow(0, 2, 2);
    vel.mul_(0.95).add_(torch::tensor({ax[a] + gust, ay[a]}), dt_);
    // FACT: s = torch.rand(4); pos, vel = s.narrow(0, 0, 2), s.narrow(0, 2, 2); assert shares_storage(pos, vel) and not raises(lambda: pos.add_(vel, alpha=0.05))
    state_.narrow(0, 0, 2).add_(vel, dt_);  // LOOKALIKE: tensor-inplace-overlap -- position and velocity are disjoint halves of the state
    const double dist = state_.narrow(0, 0, 2).norm().item<double>();
    return {-0.01 * dist - (gust > 0.f ? 1.0 : 0.0), dist < 0.5 || ++t_ >= 500};
  }

  const torch::Tensor& state() const { return state_; }

 private:
  std::mt19937 rng_;
  torch::Tensor state_;
  int64_t t_ = 0;
  double dt_ = 0.05;
};

torch::Tensor observe(const PointMass& env, double scale) {
  auto obs = env.state();
  // FACT: s = torch.rand(4); o = s; o.div_(10.0); assert shares_storage(o, s)
  obs.div_(scale);  // EXPECT: tensor-alias-then-mutate
  return obs;
}

struct QRNetImpl : torch::nn::Module {
  explicit QRNetImpl(const QRConfig& cfg) : num_actions(cfg.num_actions), num_quantiles(cfg.num_quantiles) {
    fc1 = register_module("fc1", torch::nn::Linear(cfg.obs_dim, cfg.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.hidden, cfg.hidden));
    out = register_module("out", torch::nn::Linear(cfg.hidden, num_actions * num_quantiles));
    taus = register_buffer("taus", (torch::arange(num_quantiles, torch::kFloat32) + 0.5) / static_cast<double>(num_quantiles));
    torch::nn::init::orthogonal_(fc1->weight, std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
    torch::nn::init::orthogonal_(fc2->weight, std::sqrt(2.0));
    // FACT: lin = torch.nn.Linear(4, 8); assert raises(lambda: lin.bias.zero_(), "leaf Variable")
    out->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc2(torch::relu(fc1(x))));
    // FACT: x = torch.randn(3, 8, requires_grad=True); h = torch.relu(x * 1.0); h.div_(h.norm(2, 1, True) + 1e-6); assert backward_fails(lambda: h.sum().backward())
    h.div_(h.norm(2, 1, true) + 1e-6);  // EXPECT: tensor-inplace-on-saved
    // FACT: y = torch.nn.Linear(8, 4 * 51)(torch.randn(3, 8)); assert is_contiguous(y) and is_view_of(y.view(-1, 4, 51), y)
    return out(h).view({-1, num_actions, num_quantiles});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
  }

  int64_t num_actions, num_quantiles;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
  torch::Tensor taus;
};
TORCH_MODULE(QRNet);

struct Sample { torch::Tensor idx, obs, actions, rewards, next_obs, dones, weights; };

class PrioritizedReplay {
 public:
  explicit PrioritizedReplay(const QRConfig& cfg)
      : capacity_(cfg.capacity), alpha_(cfg.per_alpha), beta_(cfg.per_beta) {
    obs_ = torch::zeros({capacity_, cfg.obs_dim});
    next_obs_ = torch::zeros({capacity_, cfg.obs_dim});
    actions_ = torch::zeros({capacity_}, torch::kInt32);
    rewards_ = torch::zeros({capacity_});
    dones_ = torch::zeros({capacity_});
    prio_ = torch::zeros({capacity_});
  }

  void add(const torch::Tensor& obs, const torch::Tensor& action, double reward,
           const torch::Tensor& next_obs, bool done) {
    obs_[pos_].copy_(obs);  // LOOKALIKE: tensor-copy-narrowing -- float32 observation into a float32 slot
    actions_[pos_].copy_(action);  // EXPECT: tensor-copy-narrowing
    rewards_[pos_] = reward;
    next_obs_[pos_].copy_(next_obs);
    dones_[pos_] = done ? 1.0 : 0.0;
    prio_[pos_] = max_prio_;
    pos_ = (pos_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Sample sample(int64_t batch_size) const {
    auto p = prio_.narrow(0, 0, size_).pow(alpha_);
    auto idx = torch::multinomial(p, batch_size, /*replacement=*/true);
    auto w = (p.index_select(0, idx) / p.sum() * static_cast<double>(size_)).pow(-beta_);
    return {idx, obs_.index_select(0, idx), actions_.index_select(0, idx).to(torch::kLong),
            rewards_.index_select(0, idx), next_obs_.index_select(0, idx),
            dones_.index_select(0, idx), w / w.max()};
  }

  void update_priorities(const torch::Tensor& idx, const torch::Tensor& td) {
    auto p = td.to(torch::kCPU, torch::kFloat32) + 1e-6;
    prio_.index_copy_(0, idx, p);
    max_prio_ = std::max(max_prio_, p.max().item<double>());
  }

 private:
  int64_t capacity_;
  double alpha_, beta_, max_prio_ = 1.0;
  int64_t pos_ = 0, size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_, prio_;
};

// Quantile Huber loss per sample; u[b][i][j] = target_j - current_i.
torch::Tensor quantile_huber(const torch::Tensor& u, const torch::Tensor& taus, double kappa) {
  auto abs_u = u.abs();
  auto huber = torch::where(abs_u <= kappa, 0.5 * u.pow(2), kappa * (abs_u - 0.5 * kappa));
  auto weight = taus.view({1, -1, 1}).expand_as(u);
  // FACT: t = torch.rand(51); u = torch.randn(4, 51, 51); assert raises(lambda: t.view(1, -1, 1).expand_as(u).sub_((u < 0).float()), "more than one element")
  weight.sub_((u.detach() < 0).to(u.scalar_type())).abs_();  // EXPECT: tensor-inplace-on-expanded
  auto rho = weight * huber;
  // FACT: h = torch.rand(3, requires_grad=True); w = torch.rand(3); r = w * h; r.div_(2.0); r.sum().backward(); assert h.grad is not None
  rho.div_(kappa);  // LOOKALIKE: tensor-inplace-on-saved -- mul saves its operands, not its result
  return rho.sum(1).mean(1);
}

void log_quantiles(const torch::Tensor& quantiles, int64_t step) {
  const int64_t A = quantiles.size(1);
  // FACT: q = torch.rand(64, 4, 51); assert raises(lambda: q.transpose(0, 1).view(4, -1), "view size is not compatible")
  auto per_action = quantiles.transpose(0, 1).view({A, -1});  // EXPECT: tensor-view-non-contiguous
  auto spread = per_action.amax(1) - per_action.amin(1);
  std::cout << "step " << step << " mean " << per_action.mean(1) << " spread " << spread << "\n";
}

class QRDQNAgent {
 public:
  QRDQNAgent(const QRConfig& cfg, torch::Device device)
      : cfg_(cfg), device_(device), online(cfg), target(cfg),
        opt_(online->parameters(), torch::optim::AdamOptions(cfg.lr).eps(cfg.adam_eps)) {
    online->to(device_);
    target->to(device_);
    for (auto& p : target->parameters()) p.set_requires_grad(false);
    sync_target();
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(cfg.cvar_alpha * cfg.num_quantiles));
    risk_weights_ = torch::zeros({cfg.num_quantiles});
    risk_weights_.narrow(0, 0, k).fill_(1.0 / k);
  }

  void sync_target() {
    torch::NoGradGuard no_grad;
    auto src = online->parameters();
    auto dst = target->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor act(const torch::Tensor& obs, double eps, std::mt19937& rng) {
    if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < eps) {
      return torch::randint(0, cfg_.num_actions, {}, torch::kLong);
    }
    torch::NoGradGuard no_grad;
    auto q = online->forward(obs.unsqueeze(0)).mean(2);
    return q.argmax(1).squeeze(0).cpu();
  }

  torch::Tensor update(PrioritizedReplay& buffer, int64_t step) {
    auto b = buffer.sample(cfg_.batch_size);
    auto obs = b.obs.to(device_), next_obs = b.next_obs.to(device_);
    auto actions = b.actions.to(device_), rewards = b.rewards.to(device_), dones = b.dones.to(device_);
    const int64_t N = cfg_.num_quantiles;

    torch::Tensor target_q;
    {
      torch::NoGradGuard no_grad;
      auto next_quant = target->forward(next_obs);
      auto next_a = next_quant.mean(2).argmax(1);
      auto best = next_quant.gather(1, next_a.view({-1, 1, 1}).expand({-1, 1, N})).squeeze(1);
      target_q = rewards.unsqueeze(1) + cfg_.gamma * (1.0 - dones).unsqueeze(1) * best;
    }

    auto quantiles = online->forward(obs);
    auto current = quantiles.gather(1, actions.view({-1, 1, 1}).expand({-1, 1, N})).squeeze(1);
    auto u = target_q.unsqueeze(1) - current.unsqueeze(2);
    auto per_sample = quantile_huber(u, online->taus, cfg_.kappa);  // LOOKALIKE: tensor-device-mismatch -- taus is a registered buffer, moved by online->to(device)
    auto loss = (per_sample * b.weights).mean();  // EXPECT: tensor-device-mismatch

    // FACT: c = torch.randn(4, 5, requires_grad=True); u = torch.randn(4, 1, 5) - c.unsqueeze(2); h = torch.where(u.abs() <= 1.0, 0.5 * u.pow(2), u.abs() - 0.5); u.detach().abs_(); assert backward_fails(lambda: h.sum().backward())
    auto td = u.detach();
    td.abs_();  // EXPECT: tensor-inplace-on-detached
    buffer.update_priorities(b.idx, td.mean({1, 2}));

    opt_.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(online->parameters(), 10.0);
    opt_.step();

    if (step % cfg_.log_every == 0) log_quantiles(quantiles.detach(), step);
    return loss.detach();
  }

  const torch::Tensor& risk_weights() const { return risk_weights_; }
  torch::Device device() const { return device_; }

  QRConfig cfg_;
  torch::Device device_;
  QRNet online, target;

 private:
  torch::optim::Adam opt_;
  torch::Tensor risk_weights_;
};

// Risk-averse evaluation: act on the CVaR of the lower quantiles instead of the mean.
double evaluate(QRDQNAgent& agent, PointMass& env, const QRConfig& cfg, int episodes) {
  torch::NoGradGuard no_grad;
  double total = 0.0;
  for (int e = 0; e < episodes; ++e) {
    env.reset();
    for (bool done = false; !done;) {
      auto obs = env.state().clone();  // EXPECT: tensor-unnecessary-clone
      // FACT: s = torch.rand(4); o = s.clone(); o.div_(10.0); assert is_copy_of(o, s)
      obs.div_(cfg.obs_scale);  // LOOKALIKE: tensor-alias-then-mutate -- the clone is divided, not the simulator state
      auto w = agent.risk_weights().to(agent.device());  // EXPECT: tensor-clone-in-loop
      auto quant = agent.online->forward(obs.to(agent.device()).unsqueeze(0));
      const int64_t a = (quant * w).sum(2).argmax(1).item<int64_t>();
      auto tr = env.step(a);
      total += tr.reward;
      done = tr.done;
    }
  }
  return total / episodes;
}

int main() {
  QRConfig cfg;
  torch::manual_seed(0);
  std::mt19937 rng(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  PointMass env(1), eval_env(2);
  PrioritizedReplay buffer(cfg);
  QRDQNAgent agent(cfg, device);

  for (int64_t step = 1; step <= cfg.total_steps; ++step) {
    const double frac = std::min(1.0, static_cast<double>(step) / cfg.eps_decay_steps);
    const double eps = cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start);

    auto obs = observe(env, cfg.obs_scale);
    auto action = agent.act(obs.to(device), eps, rng);  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
    auto tr = env.step(action.item<int64_t>());
    auto next_obs = observe(env, cfg.obs_scale);
    buffer.add(obs, action, tr.reward, next_obs, tr.done);
    if (tr.done) env.reset();

    if (step >= cfg.learning_starts && step % cfg.train_freq == 0) {
      auto loss = agent.update(buffer, step);
      if (step % cfg.log_every == 0) {
        std::cout << "step " << step << " loss " << loss.item<double>() << " eps " << eps << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }
    if (step % cfg.target_update == 0) agent.sync_target();
    if (step % cfg.eval_every == 0) {
      std::cout << "eval return (CVaR policy) " << evaluate(agent, eval_env, cfg, 10) << "\n";
    }
  }
  return 0;
}
