// Soft Actor-Critic with automatic entropy tuning. Transitions live in a preallocated
// replay buffer on the training device so that sampling never crosses the PCIe bus.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

struct SACConfig {
  int64_t obs_dim = 3, act_dim = 1, hidden = 256;
  int64_t capacity = 1000000, batch_size = 256;
  int64_t total_steps = 200000, start_steps = 5000, update_every = 50;
  double gamma = 0.99, tau = 0.005, lr = 3e-4, init_alpha = 0.2;
  double max_action = 2.0, log_std_min = -20.0, log_std_max = 2.0;
};

// Classic pendulum swing-up, integrated in double precision.
class Pendulum {
 public:
  struct Step { torch::Tensor obs, reward; bool done; };

  torch::Tensor reset(std::mt19937& rng) {
    std::uniform_real_distribution<double> th(-M_PI, M_PI), thdot(-1.0, 1.0);
    state_ = torch::tensor({th(rng), thdot(rng)}, torch::kFloat64);
    t_ = 0;
    return observe();
  }

  Step step(double u) {
    u = std::clamp(u, -max_torque_, max_torque_);
    const double th = state_[0].item<double>(), thdot = state_[1].item<double>();
    const double th_n = std::remainder(th, 2.0 * M_PI);
    const double cost = th_n * th_n + 0.1 * thdot * thdot + 0.001 * u * u;
    const double new_thdot = std::clamp(thdot + (1.5 * g_ * std::sin(th) + 3.0 * u) * dt_, -8.0, 8.0);
    state_[1].fill_(new_thdot);
    state_[0].add_(new_thdot * dt_);
    return {observe(), torch::tensor(-cost, torch::kFloat64), ++t_ >= 200};
  }

  torch::Tensor observe() const {
    const double th = state_[0].item<double>();
    return torch::tensor({std::cos(th), std::sin(th), state_[1].item<double>()}, torch::kFloat32);
  }

 private:
  torch::Tensor state_;
  int64_t t_ = 0;
  double g_ = 10.0, dt_ = 0.05, max_torque_ = 2.0;
};

struct RunningNorm {
  explicit RunningNorm(int64_t dim) : mean(torch::zeros({dim})), var(torch::ones({dim})) {}

  void update(const torch::Tensor& x) {
    count += 1.0;
    auto delta = x - mean;
    mean += delta / count;
    var += (delta * (x - mean) - var) / count;
  }

  torch::Tensor normalize(const torch::Tensor& x) const {
    // FACT: x = torch.rand(3); assert x.to(torch.float32) is x and shares_storage(x.to(torch.float32), x)
    auto y = x.to(torch::kFloat32);
    y.sub_(mean).div_(torch::sqrt(var + 1e-8)).clamp_(-5.0, 5.0);  // EXPECT: tensor-alias-then-mutate
    return y;
  }

  torch::Tensor mean, var;
  double count = 0.0;
};

struct Batch { torch::Tensor obs, actions, rewards, next_obs, dones; };

class GpuReplayBuffer {
 public:
  GpuReplayBuffer(const SACConfig& cfg, torch::Device device)
      : capacity_(cfg.capacity), max_action_(cfg.max_action) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    obs_ = torch::empty({capacity_, cfg.obs_dim}, opts);
    next_obs_ = torch::empty({capacity_, cfg.obs_dim}, opts);
    actions_ = torch::empty({capacity_, cfg.act_dim}, opts);
    rewards_ = torch::empty({capacity_, 1}, opts);
    dones_ = torch::empty({capacity_, 1}, opts);
  }

  void add(const torch::Tensor& obs, const torch::Tensor& action, const torch::Tensor& reward,
           const torch::Tensor& next_obs, bool done) {
    obs_[ptr_] = obs;  // LOOKALIKE: tensor-device-mismatch -- assigning into a row is copy_, which may cross devices
    actions_[ptr_] = action;
    rewards_[ptr_].copy_(reward);  // EXPECT: tensor-copy-narrowing
    next_obs_[ptr_] = next_obs;
    dones_[ptr_] = done ? 1.0 : 0.0;  // LOOKALIKE: tensor-copy-narrowing -- a Scalar fill, not a tensor copy
    ptr_ = (ptr_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t batch_size) const {
    auto idx = torch::randint(0, size_, {batch_size},
                              torch::TensorOptions().dtype(torch::kLong).device(obs_.device()));
    Batch b;
    b.obs = obs_.index_select(0, idx);
    b.actions = actions_.index_select(0, idx);
    // FACT: buf = torch.rand(10, 1); i = torch.tensor([1, 3]); assert is_copy_of(buf.index_select(0, i), buf)
    b.actions.clamp_(-max_action_, max_action_);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathers into new storage
    b.rewards = rewards_.index_select(0, idx);
    b.next_obs = next_obs_.index_select(0, idx);
    b.dones = dones_.index_select(0, idx);
    return b;
  }

 private:
  int64_t capacity_;
  double max_action_;
  int64_t ptr_ = 0, size_ = 0;
  torch::Tensor obs_, next_obs_, actions_, rewards_, dones_;
};

struct GaussianActorImpl : torch::nn::Module {
  explicit GaussianActorImpl(const SACConfig& cfg)
      : max_action(cfg.max_action), log_std_min(cfg.log_std_min), log_std_max(cfg.log_std_max) {
    trunk = register_module("trunk", torch::nn::Sequential(
        torch::nn::Linear(cfg.obs_dim, cfg.hidden), torch::nn::ReLU(),
        torch::nn::Linear(cfg.hidden, cfg.hidden), torch::nn::ReLU()));
    mu = register_module("mu", torch::nn::Linear(cfg.hidden, cfg.act_dim));
    log_std = register_module("log_std", torch::nn::Linear(cfg.hidden, cfg.act_dim));
  }

  // Reparameterised sample squashed by tanh; returns (action, log_prob, deterministic action).
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> sample(const torch::Tensor& obs) {
    auto h = trunk->forward(obs);
    auto mean = mu->forward(h);
    auto ls = torch::clamp(log_std->forward(h), log_std_min, log_std_max);
    auto eps = torch::randn_like(mean);
    auto u = mean + ls.exp() * eps;
    auto action = torch::tanh(u);
    auto log_prob = (-0.5 * eps.pow(2) - ls - 0.5 * std::log(2.0 * M_PI)).sum(-1, true);
    log_prob = log_prob - torch::log(1.0 - action.pow(2) + 1e-6).sum(-1, true);
    // FACT: u = torch.randn(4, 1, requires_grad=True); a = torch.tanh(u); lp = torch.log(1 - a.pow(2) + 1e-6).sum(); a.mul_(2.0); assert backward_fails(lambda: (lp + a.sum()).backward())
    action.mul_(max_action);  // EXPECT: tensor-inplace-on-saved
    return {action, log_prob, torch::tanh(mean) * max_action};
  }

  torch::nn::Sequential trunk{nullptr};
  torch::nn::Linear mu{nullptr}, log_std{nullptr};
  double max_action, log_std_min, log_std_max;
};
TORCH_MODULE(GaussianActor);

struct TwinQImpl : torch::nn::Module {
  explicit TwinQImpl(const SACConfig& cfg) {
    auto make = [&] {
      return torch::nn::Sequential(
          torch::nn::Linear(cfg.obs_dim + cfg.act_dim, cfg.hidden), torch::nn::ReLU(),
          torch::nn::Linear(cfg.hidden, cfg.hidden), torch::nn::ReLU(),
          torch::nn::Linear(cfg.hidden, 1));
    };
    q1 = register_module("q1", make());
    q2 = register_module("q2", make());
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& obs, const torch::Tensor& act) {
    auto x = torch::cat({obs, act}, -1);
    return {q1->forward(x), q2->forward(x)};
  }

  torch::nn::Sequential q1{nullptr}, q2{nullptr};
};
TORCH_MODULE(TwinQ);

struct UpdateStats { torch::Tensor critic_loss, actor_loss, alpha, q_mean; };

class SACAgent {
 public:
  SACAgent(const SACConfig& cfg, torch::Device device)
      : cfg_(cfg), actor(cfg), critic(cfg), critic_target(cfg),
        log_alpha_(torch::full({1}, std::log(cfg.init_alpha),
                               torch::TensorOptions().device(device).requires_grad(true))),
        target_entropy_(torch::full({1}, -static_cast<double>(cfg.act_dim))),
        actor_opt_(actor->parameters(), torch::optim::AdamOptions(cfg.lr)),
        critic_opt_(critic->parameters(), torch::optim::AdamOptions(cfg.lr)),
        alpha_opt_(std::vector<torch::Tensor>{log_alpha_}, torch::optim::AdamOptions(cfg.lr)) {
    actor->to(device); critic->to(device); critic_target->to(device);
    torch::NoGradGuard no_grad;
    auto src = critic->parameters();
    auto dst = critic_target->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].data().copy_(src[i]);  // LOOKALIKE: tensor-inplace-on-detached -- writing the target's storage is the point
      dst[i].set_requires_grad(false);
    }
  }

  UpdateStats update(const GpuReplayBuffer& buffer) {
    auto b = buffer.sample(cfg_.batch_size);

    torch::Tensor target_q;
    {
      torch::NoGradGuard no_grad;
      auto [next_a, next_logp, next_mean] = actor->sample(b.next_obs);
      auto [tq1, tq2] = critic_target->forward(b.next_obs, next_a);
      auto alpha = log_alpha_.exp();
      target_q = b.rewards + cfg_.gamma * (1.0 - b.dones) * (torch::min(tq1, tq2) - alpha * next_logp);
    }

    auto [q1, q2] = critic->forward(b.obs, b.actions);
    auto critic_loss = torch::mse_loss(q1, target_q) + torch::mse_loss(q2, target_q);
    // FACT: q = torch.nn.Linear(3, 1)(torch.randn(4, 3)); loss = torch.nn.functional.mse_loss(q, torch.randn(4, 1)); q.detach().clamp_(-1, 1); assert backward_fails(lambda: loss.backward())
    auto q_log = q1.detach();
    q_log.clamp_(-1e3, 1e3);  // EXPECT: tensor-inplace-on-detached
    critic_opt_.zero_grad();
    critic_loss.backward();
    critic_opt_.step();

    for (auto& p : critic->parameters()) p.set_requires_grad(false);
    auto [pi, logp, pi_mean] = actor->sample(b.obs);
    auto [qp1, qp2] = critic->forward(b.obs, pi);
    auto alpha = log_alpha_.exp().detach();
    auto actor_loss = (alpha * logp - torch::min(qp1, qp2)).mean();
    actor_opt_.zero_grad();
    actor_loss.backward();
    actor_opt_.step();
    for (auto& p : critic->parameters()) p.set_requires_grad(true);

    auto entropy_gap = logp.detach() + target_entropy_;  // EXPECT: tensor-device-mismatch
    auto alpha_loss = -(log_alpha_ * entropy_gap).mean();
    alpha_opt_.zero_grad();
    alpha_loss.backward();
    alpha_opt_.step();
    // FACT: la = torch.zeros(1, requires_grad=True); assert raises(lambda: la.clamp_(-10.0, 2.0), "leaf Variable")
    log_alpha_.clamp_(-10.0, 2.0);  // EXPECT: tensor-inplace-on-leaf

    soft_update();
    return {critic_loss, actor_loss, alpha, q_log.mean()};
  }

  void soft_update() {
    torch::NoGradGuard no_grad;
    auto src = critic->parameters();
    auto dst = critic_target->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].mul_(1.0 - cfg_.tau).add_(src[i], cfg_.tau);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
    }
  }

  SACConfig cfg_;
  GaussianActor actor;
  TwinQ critic, critic_target;
  torch::Tensor log_alpha_;
  torch::Tensor target_entropy_;
  torch::optim::Adam actor_opt_, critic_opt_, alpha_opt_;
};

int main() {
  SACConfig cfg;
  torch::manual_seed(0);
  std::mt19937 rng(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  Pendulum env;
  RunningNorm obs_norm(cfg.obs_dim);
  GpuReplayBuffer buffer(cfg, device);
  SACAgent agent(cfg, device);
  const auto action_high = torch::full({cfg.act_dim}, cfg.max_action);

  std::deque<torch::Tensor> recent_losses;
  std::vector<torch::Tensor> q_trace;
  double critic_loss_sum = 0.0, episode_return = 0.0;
  int64_t n_updates = 0;

  auto obs = env.reset(rng);
  for (int64_t t = 0; t < cfg.total_steps; ++t) {
    obs_norm.update(obs);
    auto nobs = obs_norm.normalize(obs);

    torch::Tensor action;
    if (t < cfg.start_steps) {
      action = torch::rand({cfg.act_dim}) * 2.0 * cfg.max_action - cfg.max_action;
    } else {
      torch::NoGradGuard no_grad;
      auto obs_dev = nobs.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
      auto [a, lp, mean_a] = agent.actor->sample(obs_dev.unsqueeze(0));
      auto high = action_high.to(device);  // EXPECT: tensor-clone-in-loop
      a = torch::min(torch::max(a.squeeze(0), -high), high);
      action = a.to(torch::kCPU);
    }

    auto tr = env.step(action[0].item<double>());
    episode_return += tr.reward.item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the reward is a CPU tensor
    auto nnext = obs_norm.normalize(tr.obs);
    buffer.add(nobs, action, tr.reward, nnext.clone(), tr.done);  // EXPECT: tensor-unnecessary-clone
    obs = tr.obs;

    if (tr.done) {
      std::cout << "step " << t << " return " << episode_return << "\n";
      episode_return = 0.0;
      obs = env.reset(rng);
    }

    if (t >= cfg.start_steps && t % cfg.update_every == 0) {
      for (int64_t u = 0; u < cfg.update_every; ++u) {
        auto stats = agent.update(buffer);
        critic_loss_sum += stats.critic_loss.item<double>();  // EXPECT: tensor-sync-in-loop
        recent_losses.push_back(stats.actor_loss);  // EXPECT: tensor-graph-kept-across-iterations
        if (recent_losses.size() > 100) recent_losses.pop_front();
        q_trace.push_back(stats.q_mean);  // LOOKALIKE: tensor-graph-kept-across-iterations -- q_mean comes from a detached tensor
        ++n_updates;
      }
      auto actor_avg = torch::stack(std::vector<torch::Tensor>(recent_losses.begin(), recent_losses.end())).mean();
      std::cout << "critic " << critic_loss_sum / n_updates << " actor " << actor_avg.item<double>()
                << " alpha " << agent.log_alpha_.exp().item<double>() << "\n";
    }
  }
  return 0;
}
