// Differentiable MPC for a quadrotor with a learned dynamics model. An MLP predicts the change of
// the 12-D state (position, velocity, roll/pitch/yaw, body rates) under the four rotor commands;
// the controller unrolls it over the horizon and improves the whole command sequence by gradient
// steps on the planning cost (weighted tracking error, control effort, a terminal term), sends
// the first command to the rotors and shifts the plan by one step to warm-start the next control
// step. Between episodes the model is refit on every transition collected so far.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct MpcConfig {
  int64_t state_dim = 12, act_dim = 4, hidden = 256, horizon = 20, opt_iters = 30;
  double plan_lr = 0.05, action_low = 0.0, action_high = 1.0, hover_cmd = 0.55;
  std::vector<double> state_weights = {10, 10, 20, 1, 1, 1, 2, 2, 0.5, 0.1, 0.1, 0.1};
  double ctrl_cost = 0.05, terminal_weight = 5.0, exec_noise = 0.02;
  int64_t episodes = 50, episode_steps = 400, fit_epochs = 100, fit_batch = 256, patience = 5;
  double fit_lr = 1e-3, val_fraction = 0.1;
};

struct DynamicsModelImpl : nn::Module {
  explicit DynamicsModelImpl(const MpcConfig &cfg) {
    const auto in = cfg.state_dim + cfg.act_dim;
    net_ = register_module("net", nn::Sequential(nn::Linear(in, cfg.hidden), nn::SiLU(), nn::Linear(cfg.hidden, cfg.hidden),
                                                  nn::SiLU(), nn::Linear(cfg.hidden, cfg.state_dim)));
    in_mean_ = register_buffer("in_mean", torch::zeros({in}));
    in_std_ = register_buffer("in_std", torch::ones({in}));
    delta_mean_ = register_buffer("delta_mean", torch::zeros({cfg.state_dim}));
    delta_std_ = register_buffer("delta_std", torch::ones({cfg.state_dim}));
  }

  // Normalised state change for states [N, S] under commands [N, A].
  torch::Tensor predict_delta(const torch::Tensor &s, const torch::Tensor &a) {
    auto x = torch::cat({s, a}, -1);
    // FACT: s = torch.randn(3, 4); a = torch.randn(3, 2, requires_grad=True); x = torch.cat([s, a], -1); x.sub_(torch.ones(6)).div_(torch.full((6,), 2.0)); x.sum().backward(); assert is_copy_of(x, s) and is_copy_of(x, a) and a.grad is not None
    x.sub_(in_mean_).div_(in_std_); // LOOKALIKE: tensor-alias-then-mutate -- cat made a tensor of its own: the states and the plan are untouched
    return net_->forward(x);
  }

  torch::Tensor forward(const torch::Tensor &s, const torch::Tensor &a) {
    return s + predict_delta(s, a) * delta_std_ + delta_mean_;
  }

  void set_normalizer(const torch::Tensor &s, const torch::Tensor &a, const torch::Tensor &delta) {
    auto x = torch::cat({s, a}, -1);
    // FACT: m = torch.nn.BatchNorm1d(3); m.running_mean.copy_(torch.randn(5, 3).mean(0)); assert not m.running_mean.requires_grad
    in_mean_.copy_(x.mean(0)); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer: it does not require grad
    in_std_.copy_(x.std(0).clamp_min(1e-6));
    delta_mean_.copy_(delta.mean(0));
    delta_std_.copy_(delta.std(0).clamp_min(1e-6));
  }

  nn::Sequential net_{nullptr};
  torch::Tensor in_mean_, in_std_, delta_mean_, delta_std_;
};
TORCH_MODULE(DynamicsModel);

// The command sequence is the only thing optimised; the model's weights are left alone here.
class GradientMpc {
public:
  GradientMpc(DynamicsModel model, const MpcConfig &cfg) : model_(std::move(model)), cfg_(cfg), device_(torch::kCUDA) {
    model_->to(device_);
    Q_ = torch::tensor(cfg.state_weights, torch::kFloat);
    plan_ = torch::full({cfg.horizon, cfg.act_dim}, cfg.hover_cmd, torch::TensorOptions().device(device_).requires_grad(true));
  }

  // Gradient steps on the whole plan from the current state; returns the final planning cost.
  double optimise(const torch::Tensor &state, const torch::Tensor &goal) {
    auto s0 = state.to(device_).unsqueeze(0);
    auto g = goal.to(device_).unsqueeze(0);
    auto terminal_w = torch::tensor(cfg_.terminal_weight);
    // FACT: p = torch.randn(5, 2, requires_grad=True); snap = p.detach().clone(); exec('with torch.no_grad(): p.sub_(0.1)'); assert is_copy_of(snap, p) and not torch.equal(snap, p.detach())
    auto initial = plan_.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: the gradient steps below change the plan while it lives
    mean_cost_ = 0;
    torch::Tensor cost;
    for (int64_t it = 0; it < cfg_.opt_iters; ++it) {
      auto s = s0.clone(); // EXPECT: tensor-clone-in-loop -- s is only rebound by the rollout: the same start state is copied every iteration
      cost = torch::zeros({}, s0.options());
      for (int64_t t = 0; t < cfg_.horizon; ++t) {
        auto u = plan_[t].unsqueeze(0);
        s = model_->forward(s, u);
        auto err = s - g;
        cost = cost + (err * err * Q_).sum() + cfg_.ctrl_cost * u.pow(2).sum(); // EXPECT: tensor-device-mismatch -- the state weights stayed on the host, the rollout runs on the GPU
      }
      auto err_T = s - g;
      cost = cost + err_T.pow(2).sum() * terminal_w; // LOOKALIKE: tensor-device-mismatch -- terminal_w is a 0-dim CPU tensor, which CUDA ops accept
      if (plan_.grad().defined())
        plan_.grad().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is written, not the plan
      cost.backward();
      {
        torch::NoGradGuard no_grad;
        plan_.sub_(plan_.grad(), cfg_.plan_lr); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      }
      // FACT: p = torch.full((5, 2), 0.5, requires_grad=True); assert raises(lambda: p.clamp_(0.0, 1.0), "a leaf Variable that requires grad")
      plan_.clamp_(cfg_.action_low, cfg_.action_high); // EXPECT: tensor-inplace-on-leaf -- the projection onto the rotor limits is outside the no-grad block: it throws
      mean_cost_ += cost.item<double>() / static_cast<double>(cfg_.opt_iters); // EXPECT: tensor-sync-in-loop -- waits for the GPU at every gradient step only to average the cost
    }
    moved_ = (plan_.detach() - initial).norm().item<double>();
    return cost.item<double>();
  }

  // One control step: plan from the current state, hand the first command to the caller.
  torch::Tensor act(const torch::Tensor &state, const torch::Tensor &goal) {
    optimise(state, goal);
    return plan_[0].detach().cpu();
  }

  // Warm start: drop the executed command and repeat the last one at the end of the horizon.
  void shift() {
    torch::NoGradGuard no_grad;
    const auto H = plan_.size(0);
    // FACT: p = torch.randn(6, 2); assert raises(lambda: p.narrow(0, 0, 5).copy_(p.narrow(0, 1, 5)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    plan_.narrow(0, 0, H - 1).copy_(plan_.narrow(0, 1, H - 1)); // EXPECT: tensor-inplace-overlap -- rows 0..H-2 and 1..H-1 of one buffer overlap: PyTorch refuses the shift
    // FACT: p = torch.randn(6, 2); p[5].copy_(p[4]); assert torch.equal(p[5], p[4])
    plan_[H - 1].copy_(plan_[H - 2]); // LOOKALIKE: tensor-inplace-overlap, tensor-inplace-on-leaf -- two different rows; under NoGradGuard
  }

  DynamicsModel &model() { return model_; }
  torch::Device device() const { return device_; }
  double mean_cost() const { return mean_cost_; }
  double moved() const { return moved_; }

private:
  DynamicsModel model_;
  MpcConfig cfg_;
  torch::Device device_;
  torch::Tensor Q_, plan_;
  double mean_cost_ = 0, moved_ = 0;
};

struct Transitions {
  std::vector<torch::Tensor> states, actions, next_states; // host tensors [S], [A], [S]
};

// Refit on every transition so far, early stopping on a held-out fraction. Returns the worst
// one-step error (physical units) of the last training epoch.
double fit_dynamics(DynamicsModel &model, const Transitions &data, const MpcConfig &cfg, torch::Device device) {
  auto s = torch::stack(data.states).to(device);
  auto a = torch::stack(data.actions).to(device);
  auto delta = torch::stack(data.next_states).to(device) - s;
  model->set_normalizer(s, a, delta);
  const auto N = s.size(0);
  const auto n_val = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(N) * cfg.val_fraction));
  auto perm = torch::randperm(N, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto val_idx = perm.narrow(0, 0, n_val), train_idx = perm.narrow(0, n_val, N - n_val);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.fit_lr));
  double best = std::numeric_limits<double>::infinity();
  int64_t stall = 0;
  auto worst = torch::zeros({}, s.options());
  for (int64_t epoch = 0; epoch < cfg.fit_epochs; ++epoch) {
    model->train();
    auto order = train_idx.index_select(0, torch::randperm(N - n_val, train_idx.options()));
    worst.zero_();
    for (int64_t i = 0; i + cfg.fit_batch <= N - n_val; i += cfg.fit_batch) {
      auto idx = order.narrow(0, i, cfg.fit_batch);
      auto sb = s.index_select(0, idx), ab = a.index_select(0, idx), db = delta.index_select(0, idx);
      auto pred = model->predict_delta(sb, ab);
      auto loss = F::mse_loss(pred, (db - model->delta_mean_) / model->delta_std_);
      auto phys = pred.detach();
      // FACT: m = torch.nn.Linear(3, 2); p = m(torch.randn(4, 3)); l = torch.nn.functional.mse_loss(p, torch.randn(4, 2)); d = p.detach(); d.mul_(2.0).add_(1.0); assert shares_storage(d, p) and backward_fails(lambda: l.backward())
      phys.mul_(model->delta_std_).add_(model->delta_mean_); // EXPECT: tensor-inplace-on-detached -- rescales pred itself, which mse_loss saved: loss.backward() throws
      worst = torch::maximum(worst, (phys - db).abs().max()); // LOOKALIKE: tensor-graph-kept-across-iterations -- made from a detached prediction and the data: no graph
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    double v;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      auto vs = s.index_select(0, val_idx), va = a.index_select(0, val_idx), vd = delta.index_select(0, val_idx);
      auto val_loss = F::mse_loss(model->predict_delta(vs, va), (vd - model->delta_mean_) / model->delta_std_);
      v = val_loss.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, and it decides the early stop
    }
    if (v < best - 1e-5) {
      best = v;
      stall = 0;
    } else if (++stall >= cfg.patience) {
      break;
    }
  }
  model->train();
  return worst.item<double>();
}

struct QuadrotorEnv {
  virtual ~QuadrotorEnv() = default;
  virtual torch::Tensor reset() = 0;                              // [S] host float tensor
  virtual torch::Tensor step(const torch::Tensor &rotor_cmd) = 0; // [A] in [0, 1] -> next state [S]
};

struct EpisodeReport {
  double tracking_err = 0, model_err = 0, mean_plan_cost = 0, mean_plan_change = 0;
};

EpisodeReport run_episode(GradientMpc &mpc, QuadrotorEnv &env, const torch::Tensor &goal, Transitions &data,
                          const MpcConfig &cfg) {
  EpisodeReport rep;
  std::vector<torch::Tensor> predicted, observed;
  const auto dev = mpc.device();
  auto obs = env.reset();
  for (int64_t t = 0; t < cfg.episode_steps; ++t) {
    auto cmd = (mpc.act(obs, goal) + torch::randn({cfg.act_dim}) * cfg.exec_noise).clamp(cfg.action_low, cfg.action_high);
    auto next = env.step(cmd);
    data.states.push_back(obs);
    data.actions.push_back(cmd);
    data.next_states.push_back(next);
    // One-step prediction along the executed trajectory, for the model-error report.
    auto s_dev = obs.to(dev).unsqueeze(0); // LOOKALIKE: tensor-clone-in-loop -- a new observation every control step
    predicted.push_back(mpc.model()->forward(s_dev, cmd.to(dev).unsqueeze(0))); // EXPECT: tensor-graph-kept-across-iterations -- grad mode is on: every step's forward graph and activations stay alive until the report
    observed.push_back(next);
    rep.mean_plan_cost += mpc.mean_cost() / static_cast<double>(cfg.episode_steps);
    rep.mean_plan_change += mpc.moved() / static_cast<double>(cfg.episode_steps);
    mpc.shift();
    obs = next;
  }
  auto pred = torch::cat(predicted).cpu();
  auto obs_all = torch::stack(observed);
  rep.model_err = (pred - obs_all).pow(2).sum(1).sqrt().mean().item<double>();
  rep.tracking_err = (obs_all.narrow(1, 0, 3) - goal.narrow(0, 0, 3)).pow(2).sum(1).sqrt().mean().item<double>();
  return rep;
}

void run_mpc(QuadrotorEnv &env, const std::vector<double> &goal_xyz, const MpcConfig &cfg) {
  GradientMpc mpc(DynamicsModel(cfg), cfg);
  auto goal = torch::zeros({cfg.state_dim});
  // FACT: g = torch.zeros(12); g.narrow(0, 0, 3).copy_(torch.tensor([1.0, 2.0, 0.5], dtype=torch.float32)); assert g.dtype == torch.float32 and torch.equal(g[:3], torch.tensor([1.0, 2.0, 0.5]))
  goal.narrow(0, 0, 3).copy_(torch::tensor(goal_xyz, torch::kFloat)); // LOOKALIKE: tensor-copy-narrowing -- the host values are made float32 by the options: nothing converts in copy_
  Transitions data;
  for (int64_t ep = 0; ep < cfg.episodes; ++ep) {
    auto rep = run_episode(mpc, env, goal, data, cfg);
    const auto worst = fit_dynamics(mpc.model(), data, cfg, mpc.device());
    std::cout << "episode " << ep << " tracking " << rep.tracking_err << " m, model err " << rep.model_err
              << ", plan cost " << rep.mean_plan_cost << ", plan change " << rep.mean_plan_change
              << ", worst fit err " << worst << ", transitions " << data.states.size() << "\n";
  }
}
