// TD-MPC style agent: task-oriented latent dynamics, MPPI planning, TD learning.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

namespace tdmpc {

struct Config {
  int64_t obs_dim = 24, act_dim = 6, latent_dim = 50, mlp_dim = 512, episode_length = 500;
  int64_t horizon = 5, iterations = 6, num_samples = 512, num_elites = 64, num_pi_trajs = 24;
  double min_std = 0.05, max_std = 2.0, temperature = 0.5, momentum = 0.1;
  double discount = 0.99, rho = 0.5, tau = 0.01;
  double consistency_coef = 2.0, reward_coef = 0.5, value_coef = 0.1;
  int64_t batch_size = 512, target_every = 2;
  double lr = 1e-3, grad_clip = 10.0;
};

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ELU(),
                               torch::nn::Linear(hidden, hidden), torch::nn::ELU(),
                               torch::nn::Linear(hidden, out));
}

torch::nn::Sequential q_head(int64_t in, int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})),
                               torch::nn::Tanh(), torch::nn::Linear(hidden, hidden), torch::nn::ELU(),
                               torch::nn::Linear(hidden, 1));
}

struct TOLDImpl : torch::nn::Module {
  explicit TOLDImpl(const Config& c) {
    encoder = register_module("encoder", mlp(c.obs_dim, c.mlp_dim, c.latent_dim));
    dynamics = register_module("dynamics", mlp(c.latent_dim + c.act_dim, c.mlp_dim, c.latent_dim));
    reward = register_module("reward", mlp(c.latent_dim + c.act_dim, c.mlp_dim, 1));
    policy = register_module("policy", mlp(c.latent_dim, c.mlp_dim, c.act_dim));
    q1 = register_module("q1", q_head(c.latent_dim + c.act_dim, c.mlp_dim));
    q2 = register_module("q2", q_head(c.latent_dim + c.act_dim, c.mlp_dim));
    torch::NoGradGuard no_grad;
    for (auto& head : {reward, q1, q2}) {
      auto* last = head->ptr(head->size() - 1)->as<torch::nn::Linear>();
      last->weight.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- zero-init of the output layers under the NoGradGuard above
      last->bias.zero_();
    }
  }

  torch::Tensor h(const torch::Tensor& obs) { return encoder->forward(obs); }

  std::pair<torch::Tensor, torch::Tensor> next(const torch::Tensor& z, const torch::Tensor& a) {
    auto x = torch::cat({z, a}, -1);
    return {dynamics->forward(x), reward->forward(x)};
  }

  torch::Tensor pi(const torch::Tensor& z, double std) {
    auto mu = torch::tanh(policy->forward(z));
    if (std > 0) {
      auto eps = torch::randn_like(mu) * std;
      // FACT: x=torch.randn(4,2,requires_grad=True); m=torch.tanh(x); m.add_(0.1); assert backward_fails(lambda: m.sum().backward())
      mu.add_(eps).clamp_(-1.0, 1.0);  // EXPECT: tensor-inplace-on-saved
    }
    return mu;
  }

  std::pair<torch::Tensor, torch::Tensor> Q(const torch::Tensor& z, const torch::Tensor& a) {
    auto x = torch::cat({z, a}, -1);
    return {q1->forward(x), q2->forward(x)};
  }

  void track_q_grad(bool enable) {
    for (auto& head : {q1, q2})
      for (auto& p : head->parameters()) p.set_requires_grad(enable);
  }

  torch::nn::Sequential encoder{nullptr}, dynamics{nullptr}, reward{nullptr}, policy{nullptr}, q1{nullptr}, q2{nullptr};
};
TORCH_MODULE(TOLD);

struct RunningScale {
  torch::Tensor value;
  double tau = 0.01;
  void update(const torch::Tensor& q) {
    auto v = q.detach();
    // FACT: q=torch.randn(4,1,requires_grad=True)*1.0; v=q.detach(); v.abs_(); assert shares_storage(v,q) and bool((q>=0).all())
    v.abs_();  // EXPECT: tensor-inplace-on-detached
    auto p95 = torch::quantile(v.flatten(), 0.95).clamp_min(1.0);
    value = value.defined() ? torch::lerp(value, p95, tau) : p95;
  }
};

struct Batch { torch::Tensor obs, action, reward; };

class EpisodeBuffer {
 public:
  EpisodeBuffer(int64_t max_episodes, int64_t ep_len, int64_t obs_dim, int64_t act_dim)
      : capacity_(max_episodes), ep_len_(ep_len),
        obs_(torch::zeros({max_episodes, ep_len + 1, obs_dim})),
        act_(torch::zeros({max_episodes, ep_len, act_dim})),
        rew_(torch::zeros({max_episodes, ep_len})) {}

  void add_episode(const torch::Tensor& obs, const torch::Tensor& act, const torch::Tensor& rew) {
    obs_[idx_].copy_(obs);
    act_[idx_].copy_(act);
    rew_[idx_].copy_(rew);
    idx_ = (idx_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  Batch sample(int64_t batch_size, int64_t horizon) const {
    auto rows = torch::randint(size_, {batch_size, 1}, torch::kLong);
    auto start = torch::randint(ep_len_ - horizon, {batch_size, 1}, torch::kLong);
    auto steps = start + torch::arange(horizon + 1, torch::kLong);
    return {obs_.index({rows, steps}), act_.index({rows, steps.narrow(1, 0, horizon)}),
            rew_.index({rows, steps.narrow(1, 0, horizon)})};
  }

 private:
  int64_t capacity_, ep_len_, idx_ = 0, size_ = 0;
  torch::Tensor obs_, act_, rew_;
};

class TDMPC {
 public:
  TDMPC(const Config& cfg, torch::Device device)
      : cfg_(cfg), device_(device), model_(make(cfg, device)), target_(make(cfg, device)),
        optim_(model_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        pi_optim_(model_->policy->parameters(), torch::optim::AdamOptions(cfg.lr)) {
    auto src = model_->parameters(), dst = target_->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].copy_(src[i]);  // EXPECT: tensor-inplace-on-leaf
      dst[i].set_requires_grad(false);
    }
  }

  torch::Tensor plan(const torch::Tensor& obs, bool eval_mode, bool t0) {
    torch::NoGradGuard no_grad;
    const int64_t H = cfg_.horizon, N = cfg_.num_samples, Np = cfg_.num_pi_trajs, A = cfg_.act_dim;
    auto opts = torch::TensorOptions().device(device_);
    auto z0 = model_->h(obs.unsqueeze(0));
    std::vector<torch::Tensor> pi_actions;
    auto z = z0.expand({Np, cfg_.latent_dim});
    for (int64_t t = 0; t < H; ++t) {
      pi_actions.push_back(model_->pi(z, cfg_.min_std));
      z = model_->next(z, pi_actions.back()).first;
    }
    auto pi_acts = torch::stack(pi_actions);
    auto mean = torch::zeros({1, A}, opts).expand({H, A});
    auto sigma = torch::full({H, A}, cfg_.max_std, opts);
    if (!t0 && prev_mean_.defined()) {
      // FACT: m=torch.zeros(1,2).expand(5,2); p=torch.randn(5,2); assert raises(lambda: m.narrow(0,0,4).copy_(p.narrow(0,1,4)), "more than one element")
      // FACT: m=torch.zeros(5,2); p=torch.randn(5,2); m.narrow(0,0,4).copy_(p.narrow(0,1,4)); assert not shares_storage(m,p)
      mean.narrow(0, 0, H - 1).copy_(prev_mean_.narrow(0, 1, H - 1));  // EXPECT: tensor-inplace-on-expanded // LOOKALIKE: tensor-inplace-overlap -- the shifted plan is read from another buffer
    }
    z = z0.repeat({N + Np, 1});
    for (int64_t i = 0; i < cfg_.iterations; ++i) {
      auto noise = torch::randn({H, N, A});
      auto samples = (mean.unsqueeze(1) + sigma.unsqueeze(1) * noise).clamp(-1.0, 1.0);  // EXPECT: tensor-device-mismatch
      auto actions = torch::cat({samples, pi_acts}, 1);
      auto value = estimate_value(z, actions).nan_to_num(0.0);
      auto elite_idx = std::get<1>(value.squeeze(1).topk(cfg_.num_elites));
      auto elite_value = value.index_select(0, elite_idx);
      auto elite_actions = actions.index_select(1, elite_idx);
      auto score = torch::exp(cfg_.temperature * (elite_value - elite_value.max()));
      score.div_(score.sum(0));  // LOOKALIKE: tensor-inplace-on-saved -- planning runs under NoGradGuard, no graph is recorded
      auto w = score.unsqueeze(0);
      auto new_mean = (w * elite_actions).sum(1);
      auto new_std = (w * (elite_actions - new_mean.unsqueeze(1)).pow(2)).sum(1).sqrt();
      mean = cfg_.momentum * mean + (1.0 - cfg_.momentum) * new_mean;
      sigma = new_std.clamp(cfg_.min_std, cfg_.max_std);
    }
    prev_mean_ = mean;
    auto a = prev_mean_[0];
    if (!eval_mode) {
      // FACT: m=torch.zeros(5,2); a=m[0]; a.add_(torch.ones(2)); assert is_view_of(a,m) and bool(m[0,0]==1)
      a.add_(sigma[0] * torch::randn({A}, opts));  // EXPECT: tensor-alias-then-mutate
    }
    return a.clamp(-1.0, 1.0);
  }

  torch::Tensor update(const EpisodeBuffer& buffer, int64_t step) {
    const int64_t H = cfg_.horizon, B = cfg_.batch_size, L = cfg_.latent_dim;
    auto batch = buffer.sample(B, H);
    auto obs = batch.obs.to(device_);
    auto action = batch.action.to(device_).transpose(0, 1);
    // FACT: r=torch.randn(4,5); assert is_view_of(r.t().view(5,4,1), r)
    auto reward = batch.reward.to(device_).t().view({H, B, 1});  // LOOKALIKE: tensor-view-non-contiguous -- only a trailing size-1 dim is added to the transposed rewards

    torch::Tensor next_z, td_targets;
    {
      torch::NoGradGuard no_grad;
      auto next_obs = obs.narrow(1, 1, H).transpose(0, 1);
      // FACT: o=torch.randn(4,6,3); assert raises(lambda: o.narrow(1,1,5).transpose(0,1).view(-1,3), "view size is not compatible")
      next_z = target_->h(next_obs.view({-1, cfg_.obs_dim})).view({H, B, L});  // EXPECT: tensor-view-non-contiguous
      auto [tq1, tq2] = target_->Q(next_z, model_->pi(next_z, cfg_.min_std));
      td_targets = reward.clone().add_(cfg_.discount * torch::min(tq1, tq2));  // EXPECT: tensor-unnecessary-clone
    }

    auto rho = torch::pow(cfg_.rho, torch::arange(H, torch::kFloat32));
    // FACT: o=torch.randn(4,6,3); assert is_view_of(o.narrow(1,0,1).reshape(-1,3), o)
    auto z = model_->h(obs.narrow(1, 0, 1).reshape({B, cfg_.obs_dim}));  // LOOKALIKE: tensor-reshape-non-contiguous -- the narrowed time dim has size 1, so this is a view
    std::vector<torch::Tensor> zs{z.detach()}, step_losses;
    auto consistency = torch::zeros({B, 1}, z.options());
    for (int64_t t = 0; t < H; ++t) {
      auto [q1, q2] = model_->Q(z, action[t]);
      auto [z_next, r_pred] = model_->next(z, action[t]);
      z = z_next;
      zs.push_back(z.detach());
      consistency = consistency + rho.to(device_)[t] * (z - next_z[t]).pow(2).mean(1, true);  // EXPECT: tensor-clone-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- summed over the horizon of one update, backpropagated below
      auto reward_loss = F::mse_loss(r_pred, reward[t], F::MSELossFuncOptions().reduction(torch::kNone));
      auto value_loss = F::mse_loss(q1, td_targets[t], F::MSELossFuncOptions().reduction(torch::kNone)) +
                        F::mse_loss(q2, td_targets[t], F::MSELossFuncOptions().reduction(torch::kNone));
      auto step_loss = rho[t] * (cfg_.reward_coef * reward_loss + cfg_.value_coef * value_loss);  // LOOKALIKE: tensor-device-mismatch -- rho[t] is a 0-dim CPU tensor, accepted next to CUDA tensors
      step_losses.push_back(step_loss);  // LOOKALIKE: tensor-graph-kept-across-iterations -- one update's per-step terms, backpropagated together below
    }
    auto total = (cfg_.consistency_coef * consistency + torch::stack(step_losses).sum(0)).mean() / H;
    optim_.zero_grad();
    total.backward();
    torch::nn::utils::clip_grad_norm_(model_->parameters(), cfg_.grad_clip);
    optim_.step();

    update_pi(zs);
    if (step % cfg_.target_every == 0) update_target();
    return total;
  }

 private:
  static TOLD make(const Config& cfg, torch::Device device) {
    TOLD m(cfg);
    m->to(device);
    return m;
  }

  torch::Tensor estimate_value(torch::Tensor z, const torch::Tensor& actions) {
    auto G = torch::zeros({z.size(0), 1}, z.options());
    double discount = 1.0;
    for (int64_t t = 0; t < cfg_.horizon; ++t) {
      auto [z_next, r] = model_->next(z, actions[t]);
      G = G + discount * r;
      discount *= cfg_.discount;
      z = z_next;
    }
    auto [q1, q2] = model_->Q(z, model_->pi(z, cfg_.min_std));
    return G + discount * torch::min(q1, q2);
  }

  void update_pi(const std::vector<torch::Tensor>& zs) {
    model_->track_q_grad(false);
    auto z = torch::stack(zs);
    auto [q1, q2] = model_->Q(z, model_->pi(z, cfg_.min_std));
    auto q = torch::min(q1, q2);
    scale_.update(q);
    auto rho = torch::pow(cfg_.rho, torch::arange(static_cast<int64_t>(zs.size()), z.options()));
    auto pi_loss = -((q / scale_.value).mean({1, 2}) * rho).mean();
    pi_optim_.zero_grad();
    pi_loss.backward();
    torch::nn::utils::clip_grad_norm_(model_->policy->parameters(), cfg_.grad_clip);
    pi_optim_.step();
    model_->track_q_grad(true);
  }

  void update_target() {
    torch::NoGradGuard no_grad;
    auto src = model_->parameters(), dst = target_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].data().lerp_(src[i].data(), cfg_.tau);  // LOOKALIKE: tensor-inplace-on-detached -- Polyak update meant to write the target weights, under NoGradGuard
  }

  Config cfg_;
  torch::Device device_;
  TOLD model_, target_;
  torch::optim::Adam optim_, pi_optim_;
  torch::Tensor prev_mean_;
  RunningScale scale_;
};

struct Env {
  virtual ~Env() = default;
  virtual std::vector<float> reset() = 0;
  virtual std::vector<float> step(const torch::Tensor& action, float* reward) = 0;
};

void train(Env& env, const Config& cfg, int64_t total_steps, int64_t seed_steps) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  TDMPC agent(cfg, device);
  EpisodeBuffer buffer(1000, cfg.episode_length, cfg.obs_dim, cfg.act_dim);
  auto running_loss = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t updates = 0;

  for (int64_t step = 0; step < total_steps;) {
    auto obs = env.reset();
    std::vector<torch::Tensor> ep_obs{torch::tensor(obs)}, ep_act;
    std::vector<float> ep_rew;
    for (int64_t t = 0; t < cfg.episode_length; ++t, ++step) {
      auto a = step < seed_steps ? torch::rand({cfg.act_dim}) * 2 - 1
                                 : agent.plan(ep_obs.back().to(device), false, t == 0).to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the environment needs the action on the host every step
      float r = 0.f;
      obs = env.step(a, &r);
      ep_obs.push_back(torch::tensor(obs));
      ep_act.push_back(a);
      ep_rew.push_back(r);
    }
    buffer.add_episode(torch::stack(ep_obs), torch::stack(ep_act), torch::tensor(ep_rew));
    if (step < seed_steps) continue;
    const int64_t n_updates = step == seed_steps ? seed_steps : cfg.episode_length;
    for (int64_t i = 0; i < n_updates; ++i) {
      running_loss += agent.update(buffer, step + i);  // EXPECT: tensor-graph-kept-across-iterations
      ++updates;
    }
    std::cout << "step " << step << " loss " << (running_loss / updates).item<float>() << "\n";
  }
}

}  // namespace tdmpc
