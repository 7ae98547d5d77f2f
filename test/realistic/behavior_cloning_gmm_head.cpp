// Behaviour cloning from teleoperated demonstrations with a Gaussian-mixture action head
// (robomimic-style), a demo replay dataset, and closed-loop evaluation in a point-mass sim
// whose actuator interface takes int16 milli-unit commands like the real arm controller.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct BCConfig {
  int64_t dof = 6;
  int64_t obs_dim = 18;  // [pos, vel, goal - pos]
  int64_t action_dim = 6;
  int64_t hidden = 512;
  int64_t n_modes = 5;
  double min_std = 1e-4;
  double action_limit = 1.0;
  double lr = 3e-4;
  int64_t batch_size = 256;
  int64_t accum_steps = 4;
  int64_t epochs = 50;
};

struct GMMOutput {
  torch::Tensor logits;  // [B, K]
  torch::Tensor means;   // [B, K, A]
  torch::Tensor stds;    // [B, K, A]
};

struct GMMHeadImpl : nn::Module {
  int64_t K, A;
  nn::Linear proj{nullptr};
  GMMHeadImpl(int64_t in_features, int64_t n_modes, int64_t action_dim) : K(n_modes), A(action_dim) {
    proj = register_module("proj", nn::Linear(in_features, K * (1 + 2 * A)));
  }

  GMMOutput forward(const torch::Tensor &h, double min_std) {
    const int64_t B = h.size(0);
    // FACT: y = torch.nn.Linear(8, 3 * 9)(torch.randn(2, 8)); assert is_view_of(y.view(2, 3, 9), y)
    auto raw = proj(h).view({B, K, 1 + 2 * A});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear's output is contiguous
    auto logits = raw.select(2, 0);
    auto means = raw.narrow(2, 1, A);
    auto log_std = raw.narrow(2, 1 + A, A).clamp(-5.0, 2.0);
    auto stds = log_std.exp();
    stds.add_(min_std);  // EXPECT: tensor-inplace-on-saved
    return {logits, means, stds};
  }
};
TORCH_MODULE(GMMHead);

struct BCPolicyImpl : nn::Module {
  BCConfig cfg;
  nn::Sequential trunk{nullptr};
  GMMHead head{nullptr};
  explicit BCPolicyImpl(const BCConfig &c) : cfg(c) {
    trunk = register_module("trunk", nn::Sequential(nn::Linear(cfg.obs_dim, cfg.hidden), nn::ReLU(),
                                                    nn::Linear(cfg.hidden, cfg.hidden), nn::ReLU()));
    head = register_module("head", GMMHead(cfg.hidden, cfg.n_modes, cfg.action_dim));
  }
  GMMOutput forward(const torch::Tensor &obs) { return head->forward(trunk->forward(obs), cfg.min_std); }

  // Mean of the most likely component: the deterministic action used for evaluation.
  torch::Tensor mode_action(const torch::Tensor &obs) {
    auto out = forward(obs);
    const int64_t B = obs.size(0);
    auto best = out.logits.argmax(-1);
    // FACT: l = torch.randn(4, 5); b = l.argmax(-1); assert is_view_of(b.view(4, 1, 1), b)
    auto idx = best.view({B, 1, 1}).expand({B, 1, cfg.action_dim});  // LOOKALIKE: tensor-view-non-contiguous -- argmax returns a fresh contiguous tensor
    return out.means.gather(1, idx).squeeze(1);
  }
};
TORCH_MODULE(BCPolicy);

torch::Tensor gmm_log_prob(const GMMOutput &out, const torch::Tensor &action) {
  auto z = (action.unsqueeze(1) - out.means) / out.stds;
  auto comp = (-0.5 * z.pow(2) - out.stds.log() - 0.5 * std::log(2.0 * M_PI)).sum(-1);  // [B, K]
  return torch::logsumexp(torch::log_softmax(out.logits, -1) + comp, -1);
}

torch::Tensor sample_gmm(const GMMOutput &out) {
  auto k = torch::multinomial(torch::softmax(out.logits, -1), 1);
  const int64_t B = k.size(0), A = out.means.size(2);
  auto idx = k.view({B, 1, 1}).expand({B, 1, A});
  auto mu = out.means.gather(1, idx).squeeze(1);
  auto sd = out.stds.gather(1, idx).squeeze(1);
  return mu + sd * torch::randn_like(mu);
}

torch::Tensor bc_loss(BCPolicy &policy, const torch::Tensor &obs, const torch::Tensor &act, double limit) {
  auto out = policy->forward(obs);
  auto nll = -gmm_log_prob(out, act).mean();
  // Keep component means inside the actuator range: penalise only the part beyond the limit.
  auto inside = out.means.detach();
  // FACT: h = torch.randn(2, 5, requires_grad=True); raw = h * 3; m = raw.narrow(1, 1, 2); ls = raw.narrow(1, 3, 2).clamp(-1, 1); d = m.detach(); d.clamp_(-0.1, 0.1); assert backward_fails(lambda: (ls.sum() + (m - d).pow(2).sum()).backward())
  inside.clamp_(-limit, limit);  // EXPECT: tensor-inplace-on-detached
  auto range_penalty = (out.means - inside).pow(2).mean();
  return nll + 0.1 * range_penalty;
}

// Flattened mixture parameters, one row per observation, for the offline mode-collapse dashboard.
torch::Tensor mixture_features(BCPolicy &policy, const torch::Tensor &obs) {
  torch::NoGradGuard no_grad;
  auto out = policy->forward(obs);
  const int64_t B = obs.size(0);
  // FACT: o = torch.randn(2, 3, 9); assert raises(lambda: o.narrow(2, 1, 4).view(2, -1), "view size is not compatible")
  auto means = out.means.view({B, -1});  // EXPECT: tensor-view-non-contiguous
  // FACT: o = torch.randn(2, 3, 9); s = o.narrow(2, 5, 4).clamp(-5, 2).exp(); assert is_contiguous(s) and is_view_of(s.view(2, -1), s)
  auto stds = out.stds.view({B, -1});  // LOOKALIKE: tensor-view-non-contiguous -- exp() allocates a fresh contiguous tensor
  return torch::cat({torch::softmax(out.logits, -1), means, stds}, 1);
}

// Demonstrations stored flat as (observation, action) pairs.
class DemoDataset : public torch::data::datasets::Dataset<DemoDataset> {
 public:
  DemoDataset(torch::Tensor obs, torch::Tensor actions) : obs_(std::move(obs)), actions_(std::move(actions)) {
    obs_mean_ = obs_.mean(0);
    obs_std_ = obs_.std(0).clamp_min(1e-6);
    obs_norm_ = obs_;
    // FACT: o = torch.randn(5, 3); n = o; n.sub_(o.mean(0)).div_(o.std(0)); assert shares_storage(n, o)
    obs_norm_.sub_(obs_mean_).div_(obs_std_);  // EXPECT: tensor-alias-then-mutate
  }

  torch::data::Example<> get(size_t index) override {
    auto i = static_cast<int64_t>(index);
    return {obs_norm_[i], actions_[i]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(obs_.size(0)); }

  // Raw (unnormalized) observation, for replaying a demo in the simulator.
  torch::Tensor raw_obs(int64_t i) const { return obs_[i]; }
  torch::Tensor normalize(const torch::Tensor &o) const { return (o - obs_mean_) / obs_std_; }

 private:
  torch::Tensor obs_, actions_, obs_norm_, obs_mean_, obs_std_;
};

double validate(BCPolicy &policy, const DemoDataset &data, const torch::Tensor &obs, const torch::Tensor &actions,
                int64_t batch_size) {
  policy->eval();
  torch::Tensor total_nll = torch::zeros({});
  const int64_t N = obs.size(0);
  for (int64_t start = 0; start < N; start += batch_size) {
    const int64_t len = std::min(batch_size, N - start);
    auto out = policy->forward(data.normalize(obs.narrow(0, start, len)));
    total_nll += -gmm_log_prob(out, actions.narrow(0, start, len)).sum();  // EXPECT: tensor-graph-kept-across-iterations
  }
  policy->train();
  return (total_nll / N).item<double>();
}

void train_bc(BCPolicy &policy, DemoDataset dataset, const torch::Tensor &val_obs,
              const torch::Tensor &val_act, const BCConfig &cfg) {
  torch::Device device(torch::kCUDA);
  policy->to(device);
  auto loader = torch::data::make_data_loader(
      dataset.map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(2));
  torch::optim::Adam opt(policy->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best_val = 1e30;
  std::vector<torch::Tensor> best_weights;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double epoch_nll = 0.0;
    int64_t n = 0;
    torch::Tensor accum = torch::zeros({}, device);
    for (auto &batch : *loader) {
      auto loss = bc_loss(policy, batch.data.to(device), batch.target.to(device), cfg.action_limit);
      accum = accum + loss / static_cast<double>(cfg.accum_steps);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum is what accum.backward() differentiates
      epoch_nll += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++n % cfg.accum_steps == 0) {
        opt.zero_grad();
        accum.backward();
        opt.step();
        accum = torch::zeros({}, device);
      }
    }
    policy->to(torch::kCPU);
    const double val = validate(policy, dataset, val_obs, val_act, cfg.batch_size);
    policy->to(device);
    std::cout << "epoch " << epoch << " train nll " << epoch_nll / std::max<int64_t>(n, 1) << " val " << val << "\n";
    if (val < best_val) {
      best_val = val;
      best_weights.clear();
      for (const auto &p : policy->parameters())
        best_weights.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a kept snapshot; the live weights keep training
    }
  }
  torch::NoGradGuard no_grad;
  auto params = policy->parameters();
  for (size_t i = 0; i < params.size() && i < best_weights.size(); ++i)
    params[i].copy_(best_weights[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- restoring weights under NoGradGuard
}

// Point mass per joint: state = [pos, vel]; commands are int16 milli-newtons.
class PointMassEnv {
 public:
  PointMassEnv(int64_t dof, double dt) : dof_(dof), dt_(dt) { reset(); }

  torch::Tensor reset() {
    state_ = torch::zeros({2 * dof_});
    state_.narrow(0, 0, dof_).uniform_(-1.0, 1.0);
    goal_ = torch::rand({dof_}) * 2.0 - 1.0;
    return observe();
  }
  torch::Tensor observe() const { return torch::cat({state_, goal_ - state_.narrow(0, 0, dof_)}); }

  std::pair<torch::Tensor, double> step(const torch::Tensor &cmd) {
    auto force = cmd.to(torch::kFloat) / 1000.0;
    auto pos = state_.narrow(0, 0, dof_);
    auto vel = state_.narrow(0, dof_, dof_);
    vel.mul_(0.95).add_(force, dt_);
    // FACT: s = torch.randn(6); assert not raises(lambda: s.narrow(0, 0, 3).add_(s.narrow(0, 3, 3), alpha=0.1))
    pos.add_(vel, dt_);  // LOOKALIKE: tensor-inplace-overlap -- position and velocity are disjoint halves of the state
    return {observe(), -(goal_ - pos).norm().item<double>()};
  }

 private:
  int64_t dof_;
  double dt_;
  torch::Tensor state_, goal_;
};

torch::Tensor to_motor_command(const torch::Tensor &action, double limit) {
  auto cmd = torch::empty({action.size(0)}, torch::kInt16);
  cmd.copy_((action.clamp(-limit, limit) * 1000.0).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded whole numbers within the int16 range
  return cmd;
}

torch::Tensor evaluate(BCPolicy &policy, const DemoDataset &data, const BCConfig &cfg, int64_t episodes,
                       int64_t horizon, bool stochastic) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  policy->to(device);
  policy->eval();
  PointMassEnv env(cfg.dof, 0.05);
  const auto action_scale = torch::full({cfg.action_dim}, cfg.action_limit);
  auto returns = torch::zeros({episodes}, torch::kFloat64);
  auto cmd = torch::empty({cfg.action_dim}, torch::kInt16);
  for (int64_t ep = 0; ep < episodes; ++ep) {
    auto obs = env.reset();
    auto ep_return = torch::zeros({});
    for (int64_t t = 0; t < horizon; ++t) {
      auto in = data.normalize(obs).unsqueeze(0).to(device);
      if (stochastic) {
        auto a = (sample_gmm(policy->forward(in)) * action_scale)[0].cpu();  // EXPECT: tensor-device-mismatch
        cmd.copy_(a * 1000.0);  // EXPECT: tensor-copy-narrowing
      } else {
        cmd = to_motor_command(policy->mode_action(in)[0].cpu(), cfg.action_limit);
      }
      auto result = env.step(cmd);
      obs = result.first;
      ep_return += result.second;
    }
    returns[ep] = ep_return;  // LOOKALIKE: tensor-copy-narrowing -- float32 into float64 widens
  }
  std::cout << "mean return " << returns.mean().item<double>() << "\n";
  return returns;
}
