// D4PG on a batched point-mass reaching task: a pool of exploring actors with
// their own noise scales, n-step returns, and a C51-style distributional critic
// trained against the categorical projection of the target distribution.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace d4pg {

struct Config {
  int64_t n_actors = 8;
  int64_t obs_dim = 6;
  int64_t act_dim = 2;
  int64_t hidden = 256;
  int64_t n_atoms = 51;
  double v_min = -150.0;
  double v_max = 0.0;
  double gamma = 0.99;
  int64_t n_step = 5;
  int64_t horizon = 100;
  int64_t capacity = 200000;
  int64_t batch_size = 256;
  int64_t updates_per_episode = 50;
  int64_t episodes = 300;
  double tau = 5e-3;
  double base_sigma = 0.4;
  double sigma_alpha = 7.0;
  double actor_lr = 1e-4;
  double critic_lr = 1e-4;
};

// One point mass per actor; state kept in double for the integrator.
class PointMassEnv {
 public:
  explicit PointMassEnv(int64_t n) : n_(n) {}

  torch::Tensor reset() {
    auto opts = torch::TensorOptions().dtype(torch::kFloat64);
    pos_ = torch::rand({n_, 2}, opts) * 2.0 - 1.0;
    vel_ = torch::zeros({n_, 2}, opts);
    goal_ = torch::rand({n_, 2}, opts) * 2.0 - 1.0;
    return observe();
  }

  torch::Tensor observe() const { return torch::cat({pos_, vel_, goal_ - pos_}, 1).to(torch::kFloat); }

  // Returns the reward of the step; the new observation is observe().
  torch::Tensor step(const torch::Tensor& action) {
    auto prev = pos_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- pos_ is advanced in place just below
    vel_ = 0.9 * vel_ + dt_ * action;  // EXPECT: tensor-device-mismatch
    pos_.add_(vel_, dt_).clamp_(-1.5, 1.5);
    auto dist = (goal_ - pos_).norm(2, 1);
    auto progress = (goal_ - prev).norm(2, 1) - dist;
    return -dist + 5.0 * progress;
  }

 private:
  int64_t n_;
  double dt_ = 0.05;
  torch::Tensor pos_, vel_, goal_;
};

class ActorImpl : public torch::nn::Module {
 public:
  ActorImpl(int64_t obs_dim, int64_t act_dim, int64_t hidden) {
    net_ = register_module("net", torch::nn::Sequential(
        torch::nn::Linear(obs_dim, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
        torch::nn::ReLU(), torch::nn::Linear(hidden, act_dim), torch::nn::Tanh()));
  }
  torch::Tensor forward(const torch::Tensor& obs) { return net_->forward(obs); }

 private:
  torch::nn::Sequential net_{nullptr};
};
TORCH_MODULE(Actor);

class DistributionalCriticImpl : public torch::nn::Module {
 public:
  DistributionalCriticImpl(const Config& c) {
    net_ = register_module("net", torch::nn::Sequential(
        torch::nn::Linear(c.obs_dim + c.act_dim, c.hidden), torch::nn::ReLU(),
        torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU(), torch::nn::Linear(c.hidden, c.n_atoms)));
    support_ = register_buffer("support", torch::linspace(c.v_min, c.v_max, c.n_atoms));
  }

  torch::Tensor forward(const torch::Tensor& obs, const torch::Tensor& act) {
    return net_->forward(torch::cat({obs, act}, 1));
  }

  torch::Tensor expected_q(const torch::Tensor& obs, const torch::Tensor& act) {
    return (torch::softmax(forward(obs, act), -1) * support_).sum(-1);
  }

  const torch::Tensor& support() const { return support_; }

 private:
  torch::nn::Sequential net_{nullptr};
  torch::Tensor support_;
};
TORCH_MODULE(DistributionalCritic);

void hard_update(torch::nn::Module& target, const torch::nn::Module& online) {
  auto tp = target.parameters();
  auto op = online.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].copy_(op[i]);  // EXPECT: tensor-inplace-on-leaf
}

void soft_update(torch::nn::Module& target, const torch::nn::Module& online, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters();
  auto op = online.parameters();
  for (size_t i = 0; i < tp.size(); ++i) tp[i].mul_(1.0 - tau).add_(op[i], tau);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Projects the distribution over support z, shifted to r + d * z, back onto z.
torch::Tensor categorical_projection(const torch::Tensor& next_probs, const torch::Tensor& returns,
                                     const torch::Tensor& discounts, const torch::Tensor& support,
                                     double v_min, double v_max) {
  const int64_t B = next_probs.size(0);
  const int64_t N = support.size(0);
  const double dz = (v_max - v_min) / static_cast<double>(N - 1);

  auto tz = returns.unsqueeze(1) + discounts.unsqueeze(1) * support.unsqueeze(0);
  // FACT: z = torch.linspace(-1, 1, 5); tz = torch.rand(3).unsqueeze(1) + 0.9 * z.unsqueeze(0); assert tz.stride() == (5, 1) and not raises(lambda: tz.clamp_(-1, 1))
  tz.clamp_(v_min, v_max);  // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast sum is a full, freshly allocated tensor
  auto b = (tz - v_min) / dz;
  auto l = b.floor().to(torch::kLong);
  auto u = b.ceil().to(torch::kLong);
  // keep the mass when b falls exactly on an atom
  l = torch::where((u > 0) & (l == u), l - 1, l);
  u = torch::where((l < N - 1) & (l == u), u + 1, u);

  auto offset = (torch::arange(B, l.options()) * N).unsqueeze(1);
  auto proj = torch::zeros({B * N}, next_probs.options());
  proj.index_add_(0, (l + offset).view(-1), (next_probs * (u.to(b.scalar_type()) - b)).view(-1));
  proj.index_add_(0, (u + offset).view(-1), (next_probs * (b - l.to(b.scalar_type()))).view(-1));
  return proj.view({B, N});
}

// Discounted n-step sums along the time axis (dim 1); the tail is truncated.
torch::Tensor n_step_returns(const torch::Tensor& rewards, double gamma, int64_t n) {
  const int64_t T = rewards.size(1);
  auto ret = rewards.clone();
  for (int64_t k = 1; k < n && k < T; ++k) {
    // FACT: r = torch.arange(8.).view(2, 4); g = r.clone(); g.narrow(1, 0, 3).add_(r.narrow(1, 1, 3), alpha=0.9); assert is_copy_of(g, r) and torch.allclose(g[:, 0], r[:, 0] + 0.9 * r[:, 1])
    ret.narrow(1, 0, T - k).add_(rewards.narrow(1, k, T - k), std::pow(gamma, k));  // LOOKALIKE: tensor-inplace-overlap -- the source is the untouched rewards tensor
  }
  return ret;
}

// Return of one actor's episode, for the log: G_t = r_t + gamma * G_{t+1}, run backwards.
double discounted_episode_return(const torch::Tensor& rewards, double gamma) {
  const int64_t T = rewards.size(0);
  auto g = rewards.flip(0);
  // FACT: g = torch.arange(6.).flip(0); assert raises(lambda: g.narrow(0, 1, 5).add_(g.narrow(0, 0, 5), alpha=0.9), "single memory location")
  g.narrow(0, 1, T - 1).add_(g.narrow(0, 0, T - 1), gamma);  // EXPECT: tensor-inplace-overlap
  return g[-1].item<double>();
}

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t act_dim)
      : capacity_(capacity),
        obs_(torch::zeros({capacity, obs_dim})),
        act_(torch::zeros({capacity, act_dim})),
        ret_(torch::zeros({capacity})),
        disc_(torch::zeros({capacity})),
        next_obs_(torch::zeros({capacity, obs_dim})) {}

  void add(const torch::Tensor& obs, const torch::Tensor& act, const torch::Tensor& ret,
           const torch::Tensor& disc, const torch::Tensor& next_obs) {
    const int64_t n = obs.size(0);
    TORCH_CHECK(capacity_ % n == 0, "capacity must be a multiple of the rollout size");
    obs_.narrow(0, pos_, n).copy_(obs);
    act_.narrow(0, pos_, n).copy_(act);
    ret_.narrow(0, pos_, n).copy_(ret);  // EXPECT: tensor-copy-narrowing
    disc_.narrow(0, pos_, n).copy_(disc);
    next_obs_.narrow(0, pos_, n).copy_(next_obs);
    pos_ = (pos_ + n) % capacity_;
    size_ = std::min(size_ + n, capacity_);
  }

  struct Batch { torch::Tensor obs, act, ret, disc, next_obs; };

  Batch sample(int64_t b, torch::Device device) const {
    auto idx = torch::randint(size_, {b}, torch::kLong);
    return {obs_.index_select(0, idx).to(device), act_.index_select(0, idx).to(device),
            ret_.index_select(0, idx).to(device), disc_.index_select(0, idx).to(device),
            next_obs_.index_select(0, idx).to(device)};
  }

  int64_t size() const { return size_; }

 private:
  int64_t capacity_, pos_ = 0, size_ = 0;
  torch::Tensor obs_, act_, ret_, disc_, next_obs_;
};

// Per-actor exploration scales, sigma^(1 + alpha * i / (A - 1)) as in Ape-X.
torch::Tensor actor_noise_scales(const Config& c) {
  auto ids = torch::arange(c.n_actors, torch::kFloat) / static_cast<double>(std::max<int64_t>(c.n_actors - 1, 1));
  auto sigmas = torch::full({1, c.act_dim}, c.base_sigma).expand({c.n_actors, c.act_dim});
  // FACT: s = torch.full((1, 2), 0.4).expand(4, 2); assert raises(lambda: s.pow_(1 + 7 * torch.linspace(0, 1, 4).unsqueeze(1)), "more than one element")
  sigmas.pow_(1.0 + c.sigma_alpha * ids.unsqueeze(1));  // EXPECT: tensor-inplace-on-expanded
  return sigmas;
}

// Runs one episode on every actor and stores its n-step transitions.
double collect(Actor& actor, PointMassEnv& env, const torch::Tensor& sigmas, ReplayBuffer& replay,
               const Config& c, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto obs = env.reset();
  std::vector<torch::Tensor> obs_list{obs}, act_list, rew_list;
  for (int64_t t = 0; t < c.horizon; ++t) {
    auto obs_dev = obs.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new observation every step
    auto scale = sigmas.to(device);  // EXPECT: tensor-clone-in-loop
    auto action = (actor->forward(obs_dev) + scale * torch::randn_like(scale)).clamp(-1.0, 1.0);  // LOOKALIKE: tensor-device-mismatch -- randn_like follows scale onto the device
    rew_list.push_back(env.step(action));
    act_list.push_back(action);
    obs = env.observe();
    obs_list.push_back(obs);
  }

  const int64_t T = c.horizon;
  auto observations = torch::stack(obs_list);   // time-major
  auto actions = torch::stack(act_list, 1);      // actor-major
  auto rewards = torch::stack(rew_list, 1);      // actor-major
  auto returns = n_step_returns(rewards, c.gamma, c.n_step);

  auto t_idx = torch::arange(T);
  auto boot = (t_idx + c.n_step).clamp_max(T);
  auto disc = torch::pow(c.gamma, (boot - t_idx).to(torch::kFloat)).repeat({c.n_actors});

  // FACT: o = torch.zeros(5, 3, 4); assert raises(lambda: o.narrow(0, 0, 4).transpose(0, 1).view(-1, 4), "view size is not compatible")
  auto obs_rows = observations.narrow(0, 0, T).transpose(0, 1).view({-1, c.obs_dim});  // EXPECT: tensor-view-non-contiguous
  auto next_rows = observations.transpose(0, 1).index_select(1, boot).reshape({-1, c.obs_dim});
  // FACT: a = torch.zeros(3, 4, 2); assert is_view_of(a.reshape(-1, 2), a)
  auto act_rows = actions.reshape({-1, c.act_dim});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack along dim 1 gives a contiguous tensor, this is a view
  replay.add(obs_rows, act_rows, returns.reshape({-1}), disc, next_rows);

  return discounted_episode_return(rewards[0], c.gamma);
}

}  // namespace d4pg

int main() {
  using namespace d4pg;
  torch::manual_seed(7);
  Config c;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  Actor actor(c.obs_dim, c.act_dim, c.hidden), target_actor(c.obs_dim, c.act_dim, c.hidden);
  DistributionalCritic critic(c), target_critic(c);
  actor->to(device); target_actor->to(device);
  critic->to(device); target_critic->to(device);
  hard_update(*target_actor, *actor);
  hard_update(*target_critic, *critic);

  torch::optim::Adam actor_opt(actor->parameters(), torch::optim::AdamOptions(c.actor_lr));
  torch::optim::Adam critic_opt(critic->parameters(), torch::optim::AdamOptions(c.critic_lr));

  PointMassEnv env(c.n_actors);
  ReplayBuffer replay(c.capacity, c.obs_dim, c.act_dim);
  auto sigmas = actor_noise_scales(c);

  std::vector<torch::Tensor> critic_history;
  for (int64_t episode = 0; episode < c.episodes; ++episode) {
    const double ep_return = collect(actor, env, sigmas, replay, c, device);
    if (replay.size() < 10 * c.batch_size) continue;

    double critic_loss_sum = 0.0;
    auto actor_loss_total = torch::zeros({}, device);
    for (int64_t u = 0; u < c.updates_per_episode; ++u) {
      auto batch = replay.sample(c.batch_size, device);

      torch::Tensor target_dist;
      {
        torch::NoGradGuard no_grad;
        auto next_act = target_actor->forward(batch.next_obs);
        auto next_probs = torch::softmax(target_critic->forward(batch.next_obs, next_act), -1);
        next_probs.clamp_min_(1e-6);  // LOOKALIKE: tensor-inplace-on-saved -- computed under NoGradGuard, nothing is saved
        target_dist = categorical_projection(next_probs, batch.ret, batch.disc, target_critic->support(),
                                             c.v_min, c.v_max);
      }

      auto logp = torch::log_softmax(critic->forward(batch.obs, batch.act), -1);
      logp.mul_(target_dist);  // EXPECT: tensor-inplace-on-saved
      auto critic_loss = -logp.sum(-1).mean();
      critic_opt.zero_grad();
      critic_loss.backward();
      critic_opt.step();
      if (!torch::isfinite(critic_loss).item<bool>()) {  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether training goes on
        std::fprintf(stderr, "critic diverged at episode %ld\n", static_cast<long>(episode));
        return 1;
      }
      critic_loss_sum += critic_loss.item<double>();  // EXPECT: tensor-sync-in-loop
      critic_history.push_back(critic_loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept

      auto actor_loss = -critic->expected_q(batch.obs, actor->forward(batch.obs)).mean();
      actor_opt.zero_grad();
      actor_loss.backward();
      actor_opt.step();
      actor_loss_total += actor_loss;  // EXPECT: tensor-graph-kept-across-iterations

      soft_update(*target_actor, *actor, c.tau);
      soft_update(*target_critic, *critic, c.tau);
    }

    if (episode % 10 == 0) {
      std::printf("ep %4ld  return(actor0) %8.2f  critic %.4f  actor %.4f\n", static_cast<long>(episode), ep_return,
                  critic_loss_sum / c.updates_per_episode,
                  actor_loss_total.item<double>() / c.updates_per_episode);
    }
  }
  return 0;
}
