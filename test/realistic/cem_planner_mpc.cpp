// Model-predictive control of a 6-joint arm with a learned dynamics model (PETS-style): an
// ensemble of MLPs predicts the change of state, the cross-entropy method (CEM) searches action
// sequences over a short horizon on the predicted rollouts, the first action goes to the servos,
// and the plan is shifted by one tick to warm-start the next search. The model is refit between
// episodes on every transition collected so far.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <vector>

struct MpcConfig {
  int64_t goal_dim = 3, act_dim = 6, obs_dim = 15; // [tip xyz, joint positions, joint velocities]
  int64_t ensemble = 5, hidden = 200;
  int64_t horizon = 25, population = 400, n_elites = 40, cem_iters = 5;
  double init_std = 0.5, min_std = 0.02, smoothing = 0.1, discount = 0.99, ctrl_cost = 0.01;
  double action_low = -1.0, action_high = 1.0, ticks_per_unit = 2048.0;
  int64_t fit_epochs = 50, fit_batch = 250, episodes = 30, episode_ticks = 300;
  double fit_lr = 1e-3;
};

// The arm's servo bus: encoder positions in ticks, velocities, forward-kinematics tip position.
struct ServoBus {
  virtual ~ServoBus() = default;
  virtual std::vector<int32_t> read_encoders() = 0;
  virtual std::vector<float> read_velocities() = 0;
  virtual std::vector<float> read_tip() = 0;
  virtual void write_targets(const int32_t *ticks, int64_t n) = 0;
  virtual void home() = 0;
};

// E independent Linear layers run as one batched matmul: x [E, M, in] -> [E, M, out].
struct EnsembleLinearImpl : torch::nn::Module {
  EnsembleLinearImpl(int64_t members, int64_t in, int64_t out) {
    // FACT: w = torch.randn(2, 3, 4).mul_(0.5); w.requires_grad_(); assert w.is_leaf and w.requires_grad
    weight = register_parameter("weight", torch::randn({members, in, out}).mul_(1.0 / std::sqrt(static_cast<double>(in)))); // LOOKALIKE: tensor-inplace-on-leaf -- scaled before register_parameter makes it require grad
    bias = register_parameter("bias", torch::zeros({members, 1, out}));
  }
  torch::Tensor forward(const torch::Tensor &x) { return torch::baddbmm(bias, x, weight); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(EnsembleLinear);

struct DynamicsEnsembleImpl : torch::nn::Module {
  explicit DynamicsEnsembleImpl(const MpcConfig &cfg) : members_(cfg.ensemble) {
    const auto in = cfg.obs_dim + cfg.act_dim;
    l1_ = register_module("l1", EnsembleLinear(cfg.ensemble, in, cfg.hidden));
    l2_ = register_module("l2", EnsembleLinear(cfg.ensemble, cfg.hidden, cfg.hidden));
    out_ = register_module("out", EnsembleLinear(cfg.ensemble, cfg.hidden, cfg.obs_dim));
    in_mean_ = register_buffer("in_mean", torch::zeros({in}));
    in_std_ = register_buffer("in_std", torch::ones({in}));
  }

  // Predicted state change for particles [P, obs] under actions [P, act]. Particle p is always
  // propagated by member p % E (TS-infinity), so each member sees P / E particles.
  torch::Tensor forward(const torch::Tensor &state, const torch::Tensor &action) {
    auto x = (torch::cat({state, action}, 1) - in_mean_) / in_std_;
    const auto P = x.size(0), D = x.size(1);
    TORCH_CHECK(P % members_ == 0, "particle count must be a multiple of the ensemble size");
    // FACT: x = (torch.cat([torch.randn(10, 3), torch.randn(10, 2)], 1) - torch.randn(5)) / torch.rand(5); assert is_view_of(x.view(2, 5, 5), x)
    auto xe = x.view({P / members_, members_, D}).transpose(0, 1); // LOOKALIKE: tensor-view-non-contiguous -- the normalised input is contiguous; the transpose comes after the view
    auto h = torch::silu(l1_(xe));
    h = torch::silu(l2_(h));
    auto delta = out_(h);
    // FACT: d = torch.baddbmm(torch.zeros(5, 1, 3), torch.randn(5, 4, 6), torch.randn(5, 6, 3)); assert raises(lambda: d.transpose(0, 1).view(20, -1), "view size is not compatible")
    return delta.transpose(0, 1).view({P, -1}); // EXPECT: tensor-view-non-contiguous -- [P/E, E, obs] with the member dim swapped cannot merge into [P, obs]: throws
  }

  int64_t members_;
  EnsembleLinear l1_{nullptr}, l2_{nullptr}, out_{nullptr};
  torch::Tensor in_mean_, in_std_;
};
TORCH_MODULE(DynamicsEnsemble);

// Reaching reward for rows of (state, action): distance of the tip to the goal plus effort.
torch::Tensor reach_reward(const torch::Tensor &state, const torch::Tensor &action, const torch::Tensor &goal,
                           double ctrl_cost) {
  auto tip = state.narrow(1, 0, goal.size(0));
  return -(tip - goal).norm(2, 1) - ctrl_cost * action.pow(2).sum(1);
}

class CemPlanner {
public:
  CemPlanner(DynamicsEnsemble model, const MpcConfig &cfg)
      : model_(std::move(model)), cfg_(cfg), device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU) {
    model_->to(device_);
    reset();
  }

  void reset() {
    mean_ = torch::zeros({cfg_.horizon, cfg_.act_dim}, device_);
    std_ = torch::full({cfg_.horizon, cfg_.act_dim}, cfg_.init_std, torch::TensorOptions().device(device_));
  }

  // One control tick: refines the plan from the current state and returns the action to run now.
  torch::Tensor plan(const torch::Tensor &obs, const torch::Tensor &goal) {
    torch::NoGradGuard no_grad;
    model_->eval();
    const auto N = cfg_.population, H = cfg_.horizon, A = cfg_.act_dim;
    auto s0 = obs.to(device_);
    auto mu = mean_;
    auto sigma = std_;
    for (int64_t it = 0; it < cfg_.cem_iters; ++it) {
      auto g = goal.to(device_); // EXPECT: tensor-clone-in-loop -- the same goal is copied to the GPU on every CEM iteration
      auto samples = mu.unsqueeze(0) + sigma.unsqueeze(0) * torch::randn({N, H, A}, mu.options()); // LOOKALIKE: tensor-device-mismatch -- the noise is made with mu's options, on mu's device
      // FACT: mu = torch.zeros(3, 2); sg = torch.ones(3, 2); s = mu.unsqueeze(0) + sg.unsqueeze(0) * torch.randn(5, 3, 2); s.clamp_(-1, 1); assert is_contiguous(s) and is_copy_of(s, mu) and s.stride(0) == 6
      samples.clamp_(cfg_.action_low, cfg_.action_high); // LOOKALIKE: tensor-inplace-on-expanded -- the broadcast sum is a new [N, H, A] tensor with memory of its own
      auto returns = rollout(s0, samples, g);
      auto elite_idx = std::get<1>(returns.topk(cfg_.n_elites));
      auto elites = samples.index_select(0, elite_idx);
      // FACT: m = torch.zeros(4, 2); mu = m; mu.mul_(0.1).add_(torch.ones(4, 2), alpha=0.9); assert shares_storage(mu, m) and bool((m == 0.9).all())
      mu.mul_(cfg_.smoothing).add_(elites.mean(0), 1.0 - cfg_.smoothing); // EXPECT: tensor-alias-then-mutate -- mu is mean_ itself: the previous plan is overwritten, so the plan shift logged below is always 0
      // FACT: s_ = torch.ones(3); sigma = s_; sigma = 0.1 * sigma + 0.9 * torch.zeros(3); assert is_copy_of(sigma, s_) and bool((s_ == 1).all())
      sigma = cfg_.smoothing * sigma + (1.0 - cfg_.smoothing) * elites.std(0); // LOOKALIKE: tensor-alias-then-mutate -- sigma is rebound to a new tensor: std_ is not written
      if (sigma.max().item<double>() < cfg_.min_std) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the search stops early
        break;
    }
    last_shift_ = (mu - mean_).abs().max().item<double>();
    mean_ = mu;
    std_ = sigma;
    // FACT: m = torch.randn(5, 2); v = m[0]; c = m[0].clone(); m[0].copy_(m[1]); assert torch.equal(v, m[1]) and is_copy_of(c, m)
    auto action = mu[0].clone(); // LOOKALIKE: tensor-unnecessary-clone -- returned, and advance() rewrites mean_'s rows while the caller still holds the action
    return action;
  }

  // After the first action has been sent: shift the plan by one tick, repeat the last action and
  // widen the search again.
  void advance() {
    // FACT: m = torch.randn(6, 2); assert raises(lambda: m[:-1].copy_(m[1:]), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    mean_.slice(0, 0, -1).copy_(mean_.slice(0, 1)); // EXPECT: tensor-inplace-overlap -- rows [0, H-1) and [1, H) of one buffer overlap: copy_ raises
    // FACT: m = torch.randn(6, 2); m[-1].copy_(m[-2]); assert torch.equal(m[-1], m[-2])
    mean_[-1].copy_(mean_[-2]); // LOOKALIKE: tensor-inplace-overlap -- two different rows: no element is shared
    std_.fill_(cfg_.init_std);
  }

  // Predicted tip path of the current plan under each ensemble member, for the operator display.
  torch::Tensor imagine(const torch::Tensor &obs) {
    torch::NoGradGuard no_grad;
    const auto E = cfg_.ensemble, H = cfg_.horizon;
    auto s = obs.to(device_).unsqueeze(0).expand({E, -1});
    auto path = torch::empty({H + 1, E, cfg_.goal_dim}, s.options());
    path[0].copy_(s.narrow(1, 0, cfg_.goal_dim));
    for (int64_t t = 0; t < H; ++t) {
      // FACT: o = torch.randn(6); s = o.unsqueeze(0).expand(5, -1); assert raises(lambda: s.add_(torch.randn(5, 6)), "more than one element of the written-to tensor refers to a single memory location")
      s.add_(model_->forward(s, mean_[t].expand({E, -1}))); // EXPECT: tensor-inplace-on-expanded -- the E rows of s are one row in memory: add_ raises
      path[t + 1].copy_(s.narrow(1, 0, cfg_.goal_dim));
    }
    return path.cpu();
  }

  double last_shift() const { return last_shift_; }

private:
  // Discounted predicted return of each action sequence: samples [N, H, A] -> [N].
  torch::Tensor rollout(const torch::Tensor &s0, const torch::Tensor &samples, const torch::Tensor &goal) {
    const auto N = samples.size(0), H = samples.size(1), A = samples.size(2);
    auto s = s0.unsqueeze(0).expand({N, -1});
    std::vector<torch::Tensor> states;
    states.reserve(H);
    for (int64_t t = 0; t < H; ++t) {
      // FACT: s0 = torch.randn(5); s = s0.unsqueeze(0).expand(4, -1); s = s + torch.randn(4, 5); assert is_contiguous(s) and is_copy_of(s, s0)
      s = s + model_->forward(s, samples.select(1, t)); // LOOKALIKE: tensor-inplace-on-expanded -- out of place: the first step already makes a [N, obs] tensor of its own
      states.push_back(s); // LOOKALIKE: tensor-graph-kept-across-iterations -- planning runs under plan()'s NoGradGuard, and the states are read right after the loop
    }
    // FACT: st = torch.stack([torch.randn(4, 3) for _ in range(5)]); assert is_view_of(st.reshape(20, -1), st)
    auto flat_states = torch::stack(states).reshape({H * N, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- stack makes a contiguous [H, N, obs]: a view
    // FACT: x = torch.randn(4, 5, 2); assert is_copy_of(x.transpose(0, 1).reshape(20, 2), x)
    auto flat_actions = samples.transpose(0, 1).reshape({H * N, A}); // EXPECT: tensor-reshape-non-contiguous -- time-major [H, N, A] of a contiguous [N, H, A]: the whole population is copied every CEM iteration
    auto r = reach_reward(flat_states, flat_actions, goal, cfg_.ctrl_cost);
    // FACT: r = -(torch.randn(20, 3) - torch.randn(3)).norm(2, 1) - 0.1 * torch.randn(20, 2).pow(2).sum(1); assert is_view_of(r.view(5, 4), r)
    auto per_step = r.view({H, N}); // LOOKALIKE: tensor-view-non-contiguous -- the reward is a fresh contiguous [H * N] tensor
    auto discounts = torch::pow(cfg_.discount, torch::arange(H, r.options())).unsqueeze(1);
    return (discounts * per_step).sum(0);
  }

  DynamicsEnsemble model_;
  MpcConfig cfg_;
  torch::Device device_;
  torch::Tensor mean_, std_;
  double last_shift_ = 0.0;
};

torch::Tensor observe(ServoBus &bus, const MpcConfig &cfg) {
  auto obs = torch::empty({cfg.obs_dim});
  auto tip = bus.read_tip();
  auto enc = bus.read_encoders();
  auto vel = bus.read_velocities();
  obs.narrow(0, 0, cfg.goal_dim).copy_(torch::tensor(tip));
  auto ticks = torch::from_blob(enc.data(), {cfg.act_dim}, torch::kInt);
  obs.narrow(0, cfg.goal_dim, cfg.act_dim).copy_(ticks); // LOOKALIKE: tensor-copy-narrowing -- int32 ticks into float32 are exact (below 2^24); scaled next
  obs.narrow(0, cfg.goal_dim, cfg.act_dim).div_(cfg.ticks_per_unit);
  obs.narrow(0, cfg.goal_dim + cfg.act_dim, cfg.act_dim).copy_(torch::tensor(vel));
  return obs;
}

// The servo bus takes signed 32-bit position targets in encoder ticks.
void send_to_servos(ServoBus &bus, const torch::Tensor &action, const MpcConfig &cfg) {
  auto ticks = torch::empty({cfg.act_dim}, torch::kInt);
  // FACT: t = torch.empty(3, dtype=torch.int32); t.copy_(torch.tensor([0.9995, -0.7, 1.9999]) * 1.0); assert t.tolist() == [0, 0, 1]
  ticks.copy_(action.cpu() * cfg.ticks_per_unit); // EXPECT: tensor-copy-narrowing -- fractional ticks are truncated toward zero, not rounded: every target is biased toward 0
  bus.write_targets(ticks.data_ptr<int32_t>(), ticks.numel());
}

struct Transitions {
  std::vector<torch::Tensor> states, actions, next_states;
};

// Refit the ensemble on all transitions so far: S [n, obs], A [n, act], S2 [n, obs] on the host.
void fit_dynamics(DynamicsEnsemble &model, const torch::Tensor &S, const torch::Tensor &A, const torch::Tensor &S2,
                  const MpcConfig &cfg, torch::Device device) {
  auto x = torch::cat({S, A}, 1);
  model->in_mean_.copy_(x.mean(0));
  model->in_std_.copy_(x.std(0).clamp_min(1e-6));
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.fit_lr));
  const auto n = S.size(0);
  for (int64_t epoch = 0; epoch < cfg.fit_epochs; ++epoch) {
    auto perm = torch::randperm(n);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    int64_t batches = 0;
    for (int64_t i = 0; i + cfg.fit_batch <= n; i += cfg.fit_batch) {
      auto idx = perm.narrow(0, i, cfg.fit_batch);
      auto s = S.index_select(0, idx).to(device);
      auto a = A.index_select(0, idx).to(device);
      auto target = S2.index_select(0, idx).to(device) - s;
      auto loss = torch::mse_loss(model->forward(s, a), target);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();
      ++batches;
    }
    if (batches > 0 && (epoch + 1) % 10 == 0)
      std::cout << "dynamics epoch " << epoch + 1 << " mse " << epoch_loss.item<double>() / batches << "\n";
  }
  model->eval();
}

void run_mpc(ServoBus &bus, const torch::Tensor &goal, const MpcConfig &cfg) {
  DynamicsEnsemble model(cfg);
  CemPlanner planner(model, cfg);
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Transitions data;
  for (int64_t ep = 0; ep < cfg.episodes; ++ep) {
    bus.home();
    planner.reset();
    auto obs = observe(bus, cfg);
    double final_dist = 0;
    for (int64_t k = 0; k < cfg.episode_ticks; ++k) {
      auto action = planner.plan(obs, goal);
      send_to_servos(bus, action, cfg);
      planner.advance();
      auto next = observe(bus, cfg);
      data.states.push_back(obs);
      data.actions.push_back(action.cpu());
      data.next_states.push_back(next);
      final_dist = (next.narrow(0, 0, cfg.goal_dim) - goal).norm().item<double>();
      obs = next;
    }
    std::cout << "episode " << ep << " final distance " << final_dist << " last plan shift " << planner.last_shift() << "\n";
    fit_dynamics(model, torch::stack(data.states), torch::stack(data.actions), torch::stack(data.next_states), cfg, device);
  }
}
