// PETS: probabilistic ensemble dynamics + trajectory sampling (TS-inf) + CEM.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

namespace pets {

struct Config {
  int64_t obs_dim = 18, act_dim = 6, hidden = 200, ensemble = 5;
  int64_t horizon = 30, population = 400, num_elites = 40, particles = 20, cem_iters = 5;
  double cem_alpha = 0.1, init_var = 0.25;
  int64_t batch_size = 256, max_epochs = 100, capacity = 200000;
  double lr = 1e-3, weight_decay = 5e-5;
};

class ReplayBuffer {
 public:
  ReplayBuffer(int64_t capacity, int64_t obs_dim, int64_t act_dim)
      : capacity_(capacity),
        obs_(torch::zeros({capacity, obs_dim})),
        act_(torch::zeros({capacity, act_dim})),
        delta_(torch::zeros({capacity, obs_dim})) {}

  void add(std::vector<double>& obs, const torch::Tensor& action, std::vector<double>& next_obs) {
    auto o = torch::from_blob(obs.data(), {(int64_t)obs.size()}, torch::kFloat64);
    auto o2 = torch::from_blob(next_obs.data(), {(int64_t)next_obs.size()}, torch::kFloat64);
    obs_[ptr_].copy_(o);  // EXPECT: tensor-copy-narrowing
    act_[ptr_].copy_(action);  // LOOKALIKE: tensor-copy-narrowing -- planner actions are float32, like the buffer
    delta_[ptr_].copy_((o2 - o).to(delta_.scalar_type()));
    ptr_ = (ptr_ + 1) % capacity_;
    size_ = std::min(size_ + 1, capacity_);
  }

  std::pair<torch::Tensor, torch::Tensor> dataset() const {
    auto x = torch::cat({obs_.narrow(0, 0, size_), act_.narrow(0, 0, size_)}, 1);
    return {x, delta_.narrow(0, 0, size_)};
  }

  int64_t size() const { return size_; }

 private:
  int64_t capacity_, ptr_ = 0, size_ = 0;
  torch::Tensor obs_, act_, delta_;
};

struct Normalizer {
  torch::Tensor mean, stdev;

  void fit(const torch::Tensor& x) {
    mean = x.mean(0, true);
    stdev = x.std(0, true, true).clamp_min(1e-6);
  }

  torch::Tensor operator()(const torch::Tensor& x) const {
    auto z = x.to(mean.device());
    // FACT: x=torch.randn(6,5); z=x.narrow(1,0,3).to(x.device); z.sub_(1.0); assert is_view_of(z,x)
    z.sub_(mean).div_(stdev);  // EXPECT: tensor-alias-then-mutate
    return z;
  }
};

struct EnsembleLinearImpl : torch::nn::Module {
  EnsembleLinearImpl(int64_t ensemble, int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::empty({ensemble, in, out}));
    bias = register_parameter("bias", torch::zeros({ensemble, 1, out}));
    torch::nn::init::normal_(weight, 0.0, 1.0 / (2.0 * std::sqrt(static_cast<double>(in))));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x) { return torch::baddbmm(bias, x, weight); }

  torch::Tensor weight, bias;
};
TORCH_MODULE(EnsembleLinear);

inline torch::Tensor swish(const torch::Tensor& x) { return x * torch::sigmoid(x); }

struct EnsembleDynamicsImpl : torch::nn::Module {
  EnsembleDynamicsImpl(int64_t ensemble, int64_t in_dim, int64_t out_dim, int64_t hidden) {
    l1 = register_module("l1", EnsembleLinear(ensemble, in_dim, hidden));
    l2 = register_module("l2", EnsembleLinear(ensemble, hidden, hidden));
    l3 = register_module("l3", EnsembleLinear(ensemble, hidden, hidden));
    l4 = register_module("l4", EnsembleLinear(ensemble, hidden, 2 * out_dim));
    max_logvar = register_parameter("max_logvar", torch::full({1, 1, out_dim}, 0.5));
    min_logvar = register_parameter("min_logvar", torch::full({1, 1, out_dim}, -10.0));
    l4->weight.mul_(0.1);  // EXPECT: tensor-inplace-on-leaf
  }

  std::tuple<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    x = swish(l3(swish(l2(swish(l1(x))))));
    auto out = l4(x).chunk(2, -1);
    auto logvar = max_logvar - F::softplus(max_logvar - out[1]);
    logvar = min_logvar + F::softplus(logvar - min_logvar);
    return {out[0], logvar};
  }

  EnsembleLinear l1{nullptr}, l2{nullptr}, l3{nullptr}, l4{nullptr};
  torch::Tensor max_logvar, min_logvar;
};
TORCH_MODULE(EnsembleDynamics);

// Particles of one candidate are spread evenly over the ensemble members.
torch::Tensor to_ts(const torch::Tensor& x, int64_t ensemble, int64_t particles) {
  const int64_t d = x.size(-1);
  // FACT: x=torch.randn(40,3); assert is_copy_of(x.view(-1,5,2,3).transpose(0,1).reshape(5,-1,3), x)
  return x.view({-1, ensemble, particles / ensemble, d}).transpose(0, 1).reshape({ensemble, -1, d});  // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor from_ts(const torch::Tensor& y, int64_t ensemble, int64_t particles) {
  const int64_t d = y.size(-1);
  // FACT: o=torch.randn(5,8,6); m=o.chunk(2,-1)[0]; v=m.view(5,-1,2,3); assert is_view_of(v,o) and is_copy_of(v.transpose(0,1).reshape(-1,3),o)
  return y.view({ensemble, -1, particles / ensemble, d}).transpose(0, 1).reshape({-1, d});  // EXPECT: tensor-reshape-non-contiguous // LOOKALIKE: tensor-view-non-contiguous -- splitting one dim of the chunk() half is expressible with its strides
}

torch::Tensor cheetah_reward(const torch::Tensor& action, const torch::Tensor& next_obs) {
  // FACT: s=torch.randn(6,4); assert not is_contiguous(s.narrow(1,0,1)) and is_view_of(s.narrow(1,0,1).reshape(-1), s)
  auto forward_vel = next_obs.narrow(1, 0, 1).reshape({-1});  // LOOKALIKE: tensor-reshape-non-contiguous -- dropping a size-1 column is still a view
  return forward_vel - 0.1 * action.pow(2).sum(1);
}

class DynamicsTrainer {
 public:
  DynamicsTrainer(const Config& cfg, torch::Device device)
      : cfg_(cfg),
        device_(device),
        model_(cfg.ensemble, cfg.obs_dim + cfg.act_dim, cfg.obs_dim, cfg.hidden) {
    model_->to(device_);
    optimizer_ = std::make_unique<torch::optim::Adam>(
        model_->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  }

  torch::Tensor model_input(const torch::Tensor& x) {
    auto obs = x.narrow(-1, 0, cfg_.obs_dim);
    auto act = x.narrow(-1, cfg_.obs_dim, cfg_.act_dim);
    return torch::cat({obs_norm_(obs), act}, -1);
  }

  void train(const ReplayBuffer& buffer) {
    model_->train();
    auto [inputs, targets] = buffer.dataset();
    const int64_t n = inputs.size(0);
    const int64_t n_hold = std::min<int64_t>(n / 5, 5000);
    const int64_t n_train = n - n_hold;
    auto perm = torch::randperm(n);
    auto hold_x = inputs.index_select(0, perm.narrow(0, 0, n_hold)).to(device_);
    auto hold_y = targets.index_select(0, perm.narrow(0, 0, n_hold)).to(device_);
    auto train_idx = perm.narrow(0, n_hold, n_train);
    auto train_set = torch::cat({inputs.index_select(0, train_idx), targets.index_select(0, train_idx)}, 1);
    obs_norm_.fit(train_set.narrow(1, 0, cfg_.obs_dim).to(device_));

    const int64_t in_dim = cfg_.obs_dim + cfg_.act_dim;
    auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device_);
    auto boot = torch::randint(n_train, {cfg_.ensemble, n_train}, long_opts);
    double best = std::numeric_limits<double>::infinity();
    int64_t since_best = 0;

    for (int64_t epoch = 0; epoch < cfg_.max_epochs; ++epoch) {
      auto data = train_set.to(device_);  // EXPECT: tensor-clone-in-loop
      auto order = torch::rand({cfg_.ensemble, n_train}, data.options()).argsort(1, false);
      auto idx = boot.gather(1, order);
      double epoch_loss = 0.0;
      for (int64_t b = 0; b < n_train; b += cfg_.batch_size) {
        auto batch = data.index({idx.narrow(1, b, std::min(cfg_.batch_size, n_train - b))});
        auto xb = model_input(batch.narrow(-1, 0, in_dim));
        auto yb = batch.narrow(-1, in_dim, cfg_.obs_dim);
        auto [mean, logvar] = model_->forward(xb);
        auto var = logvar.exp();
        auto nll = ((mean - yb).pow(2) / var + logvar).mean({1, 2}).sum();
        auto loss = nll + 0.01 * (model_->max_logvar.sum() - model_->min_logvar.sum());
        optimizer_->zero_grad();
        // FACT: lv=torch.randn(4,3,requires_grad=True); v=lv.exp(); l=((torch.randn(4,3)-1).pow(2)/v+lv).mean(); v.sqrt_(); assert backward_fails(l.backward)
        model_std_ = var.sqrt_().mean().detach();  // EXPECT: tensor-inplace-on-saved
        loss.backward();
        optimizer_->step();
        epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      }

      torch::NoGradGuard no_grad;
      auto hx = model_input(hold_x).unsqueeze(0).expand({cfg_.ensemble, -1, -1});
      auto hold_mean = std::get<0>(model_->forward(hx));
      auto hold_mse = (hold_mean - hold_y).pow(2).mean({1, 2});
      holdout_hist_.push_back(hold_mse);  // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluated under NoGradGuard, no graph attached
      const double cur = hold_mse.mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- once per epoch, and the value drives early stopping
      std::cout << "epoch " << epoch << " train " << epoch_loss << " holdout " << cur << "\n";
      if (cur < best - 1e-4) {
        best = cur;
        since_best = 0;
      } else if (++since_best >= 5) {
        break;
      }
    }
  }

  torch::Tensor sample_next(const torch::Tensor& states, const torch::Tensor& actions) {
    const int64_t E = cfg_.ensemble, P = cfg_.particles;
    auto x = torch::cat({obs_norm_(states), actions}, -1);
    auto [mean, logvar] = model_->forward(to_ts(x, E, P));
    auto sigma = logvar.mul(0.5).exp_();
    auto mu = from_ts(mean, E, P);
    auto sd = from_ts(sigma, E, P);
    return states + mu + sd * torch::randn_like(sd);
  }

 private:
  Config cfg_;
  torch::Device device_;
  EnsembleDynamics model_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  Normalizer obs_norm_;
  std::vector<torch::Tensor> holdout_hist_;
  torch::Tensor model_std_;
};

class CEMPlanner {
 public:
  CEMPlanner(DynamicsTrainer& dynamics, const Config& cfg, torch::Device device)
      : dyn_(dynamics), cfg_(cfg), device_(device) {
    auto opts = torch::TensorOptions().device(device);
    lo_ = torch::full({cfg.act_dim}, -1.0, opts);
    hi_ = torch::full({cfg.act_dim}, 1.0, opts);
    plan_mean_ = torch::zeros({cfg.horizon, cfg.act_dim}, opts);
  }

  torch::Tensor act(const torch::Tensor& obs) {
    torch::NoGradGuard no_grad;
    const int64_t pop = cfg_.population, H = cfg_.horizon, A = cfg_.act_dim;
    auto obs_dev = obs.to(device_);
    auto mean = plan_mean_;
    auto var = torch::full_like(mean, cfg_.init_var);
    for (int64_t it = 0; it < cfg_.cem_iters; ++it) {
      auto lb_dist = mean - lo_, ub_dist = hi_ - mean;
      auto cvar = torch::min(torch::min(lb_dist.div(2).pow(2), ub_dist.div(2).pow(2)), var);
      auto noise = torch::randn({pop, H, A}, mean.options()).clamp_(-2.0, 2.0);
      // FACT: n=torch.randn(4,5,2); c=torch.rand(5,2).unsqueeze(0).expand_as(n); assert not raises(lambda: n.mul_(c))
      noise.mul_(cvar.sqrt().unsqueeze(0).expand_as(noise));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read; noise is a fresh buffer
      auto samples = mean.unsqueeze(0).expand_as(noise);
      // FACT: m=torch.zeros(5,2); s=m.unsqueeze(0).expand(4,5,2); assert raises(lambda: s.add_(torch.randn(4,5,2)), "more than one element")
      samples.add_(noise);  // EXPECT: tensor-inplace-on-expanded
      auto returns = rollout(obs_dev, samples);
      auto elite_idx = std::get<1>(returns.topk(cfg_.num_elites));
      auto elites = samples.index_select(0, elite_idx);
      mean = cfg_.cem_alpha * mean + (1.0 - cfg_.cem_alpha) * elites.mean(0);
      var = cfg_.cem_alpha * var + (1.0 - cfg_.cem_alpha) * elites.var(0, false);
    }
    plan_mean_ = mean;
    auto action = plan_mean_[0].clone();  // LOOKALIKE: tensor-unnecessary-clone -- plan_mean_ is shifted in place right below
    shift_plan();
    return action;
  }

 private:
  torch::Tensor rollout(const torch::Tensor& obs, const torch::Tensor& actions) {
    const int64_t P = cfg_.particles, pop = actions.size(0);
    auto states = obs.unsqueeze(0).repeat({pop * P, 1});
    auto returns = torch::zeros({pop * P}, states.options());
    for (int64_t t = 0; t < cfg_.horizon; ++t) {
      auto a_t = actions.select(1, t).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a different time slice every step
      a_t = a_t.repeat_interleave(P, 0);
      auto next = dyn_.sample_next(states, a_t);
      returns += cheetah_reward(a_t, next);  // LOOKALIKE: tensor-graph-kept-across-iterations -- planning runs under NoGradGuard
      states = next;
    }
    returns.masked_fill_(torch::isnan(returns), -1e6);
    return returns.view({pop, P}).mean(1);
  }

  void shift_plan() {
    const int64_t H = cfg_.horizon;
    // FACT: p=torch.zeros(6,2); assert raises(lambda: p.narrow(0,0,5).copy_(p.narrow(0,1,5)), "single memory location")
    plan_mean_.narrow(0, 0, H - 1).copy_(plan_mean_.narrow(0, 1, H - 1));  // EXPECT: tensor-inplace-overlap
    plan_mean_[H - 1].zero_();
  }

  DynamicsTrainer& dyn_;
  Config cfg_;
  torch::Device device_;
  torch::Tensor lo_, hi_, plan_mean_;
};

struct Env {
  virtual ~Env() = default;
  virtual std::vector<double> reset() = 0;
  virtual std::vector<double> step(const std::vector<double>& action, double* reward, bool* done) = 0;
};

void run(Env& env, const Config& cfg, int64_t total_steps, int64_t train_every) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  ReplayBuffer buffer(cfg.capacity, cfg.obs_dim, cfg.act_dim);
  DynamicsTrainer dynamics(cfg, device);
  CEMPlanner planner(dynamics, cfg, device);

  auto obs = env.reset();
  double ep_return = 0.0;
  for (int64_t step = 0; step < total_steps; ++step) {
    auto o = torch::from_blob(obs.data(), {cfg.obs_dim}, torch::kFloat64).to(torch::kFloat32);
    auto action = buffer.size() < 5000 ? torch::rand({cfg.act_dim}) * 2 - 1 : planner.act(o).to(torch::kCPU);
    std::vector<double> a(action.data_ptr<float>(), action.data_ptr<float>() + cfg.act_dim);
    double reward = 0.0;
    bool done = false;
    auto next_obs = env.step(a, &reward, &done);
    buffer.add(obs, action, next_obs);
    ep_return += reward;
    obs = next_obs;
    if (done) {
      std::cout << "episode return " << ep_return << "\n";
      ep_return = 0.0;
      obs = env.reset();
    }
    if (buffer.size() >= 5000 && step % train_every == 0) dynamics.train(buffer);
  }
}

}  // namespace pets
