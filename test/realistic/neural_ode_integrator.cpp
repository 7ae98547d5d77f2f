// Neural ODE (Chen et al. 2018) fitted to observed trajectories of a planar dynamical system:
// dy/dt = f_theta(y), integrated with a fixed-step classical RK4 solver and trained by direct
// backpropagation through the solver steps (no adjoint). States are standardised per dimension.
// The field is warm-started on finite-difference velocities, then trained on random windows of
// batch_time points; validation integrates each held-out trajectory from its first state over
// the whole horizon, and the final rollouts extrapolate past it for the plots.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

namespace nn = torch::nn;

struct OdeConfig {
  int64_t state_dim = 2, hidden = 64;
  int64_t batch_time = 16, batch_size = 32, iters = 4000, warmup_iters = 500, substeps = 4;
  int64_t log_every = 50, val_every = 250;
  double lr = 1e-3, max_speed = 5.0, grad_clip = 1.0, horizon_factor = 2.0;
};

struct Trajectories {
  torch::Tensor states; // [N, T, D] observed states
  torch::Tensor times;  // [T] shared observation times, increasing
};

// A bounded, autonomous vector field: tanh MLP with one residual hidden layer.
struct VectorFieldImpl : nn::Module {
  explicit VectorFieldImpl(const OdeConfig &cfg) : max_speed_(cfg.max_speed) {
    in_ = register_module("in", nn::Linear(cfg.state_dim, cfg.hidden));
    hidden_ = register_module("hidden", nn::Linear(cfg.hidden, cfg.hidden));
    out_ = register_module("out", nn::Linear(cfg.hidden, cfg.state_dim));
    // Start from a nearly still field: early RK4 rollouts stay close to the data.
    torch::NoGradGuard no_grad;
    out_->weight.mul_(0.1); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    out_->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor &y) {
    auto h = torch::tanh(in_(y));
    auto r = hidden_(h);
    // FACT: a = torch.nn.Linear(2, 4); b = torch.nn.Linear(4, 4); h = torch.tanh(a(torch.randn(3, 2))); r = b(h); r.add_(h); torch.tanh(r).sum().backward(); assert a.weight.grad is not None
    r.add_(h); // LOOKALIKE: tensor-inplace-on-saved -- the write is on a Linear's output; tanh's result is only read
    h = torch::tanh(r);
    auto dy = torch::tanh(out_(h));
    // FACT: l = torch.nn.Linear(2, 2); d = torch.tanh(l(torch.randn(4, 2))); d.mul_(5.0); assert backward_fails(lambda: d.sum().backward())
    dy.mul_(max_speed_); // EXPECT: tensor-inplace-on-saved -- tanh keeps its result for backward: every backward through the solver raises
    return dy;
  }

  double max_speed_;
  nn::Linear in_{nullptr}, hidden_{nullptr}, out_{nullptr};
};
TORCH_MODULE(VectorField);

torch::Tensor rk4_step(VectorField &f, const torch::Tensor &y, const torch::Tensor &h) {
  auto k1 = f(y);
  auto k2 = f(y + h / 2 * k1);
  auto k3 = f(y + h / 2 * k2);
  auto k4 = f(y + h * k3);
  return y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4);
}

// Solution at the times t [T] with `substeps` RK4 steps between consecutive observations:
// [T, B, D], y0 [B, D] as the first point.
torch::Tensor odeint(VectorField &f, const torch::Tensor &y0, const torch::Tensor &t, int64_t substeps) {
  std::vector<torch::Tensor> ys{y0};
  torch::Tensor y = y0;
  for (int64_t i = 0; i + 1 < t.size(0); ++i) {
    auto h = (t[i + 1] - t[i]) / substeps;
    for (int64_t s = 0; s < substeps; ++s)
      y = rk4_step(f, y, h);
    ys.push_back(y); // LOOKALIKE: tensor-graph-kept-across-iterations -- the trajectory is returned: the caller differentiates it
  }
  return torch::stack(ys);
}

// Per-dimension standardisation, fitted on the training trajectories.
struct Standardizer {
  torch::Tensor mean, scale;

  void fit(const torch::Tensor &traj) {
    // FACT: s = torch.randn(4, 6, 2); assert is_view_of(s.flatten(0, 1), s)
    auto flat = traj.flatten(0, 1); // LOOKALIKE: tensor-reshape-non-contiguous -- the observations are contiguous: a view
    mean = flat.mean(0);
    scale = flat.std(0).clamp_min(1e-6);
  }
  torch::Tensor encode(const torch::Tensor &x) const {
    auto z = x.reshape({-1, x.size(-1)});
    // FACT: s = torch.randn(6, 4, 2); m = s.mean((0, 1)); z = s.reshape(-1, 2); z.sub_(m); assert is_view_of(z, s) and torch.allclose(s.mean((0, 1)), torch.zeros(2), atol=1e-6)
    z.sub_(mean).div_(scale); // EXPECT: tensor-alias-then-mutate -- reshape of contiguous states is a view: the caller's trajectories are standardised in place
    return z.view(x.sizes());
  }
  torch::Tensor decode(const torch::Tensor &z) const { return z * scale + mean; }
};

// Fits f to finite-difference velocities: much cheaper than backpropagating through RK4 from a
// random field, and it puts the solver's first trajectories near the data.
void warm_start(VectorField &f, const torch::Tensor &z, const torch::Tensor &times, const OdeConfig &cfg, torch::Device device) {
  const auto T = z.size(1);
  auto states = z.transpose(0, 1); // time-major view [T, N, D]
  auto vel = states.contiguous();
  // FACT: v = torch.randn(5, 3, 2); assert raises(lambda: v.narrow(0, 1, 4).sub_(v.narrow(0, 0, 4)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
  vel.narrow(0, 1, T - 1).sub_(vel.narrow(0, 0, T - 1)); // EXPECT: tensor-inplace-overlap -- rows 1..T-1 and 0..T-2 of one buffer overlap: PyTorch refuses
  auto dt = (times.narrow(0, 1, T - 1) - times.narrow(0, 0, T - 1)).view({-1, 1, 1});
  // FACT: z = torch.randn(3, 5, 2); v = z.transpose(0, 1).contiguous(); assert is_copy_of(v, z)
  vel.narrow(0, 1, T - 1).div_(dt); // LOOKALIKE: tensor-alias-then-mutate -- contiguous() of the transposed trajectories made a copy: z is untouched
  auto mid = ((states.narrow(0, 1, T - 1) + states.narrow(0, 0, T - 1)) / 2).to(device);
  auto target = vel.narrow(0, 1, T - 1).to(device);

  torch::optim::Adam opt(f->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int64_t it = 0; it < cfg.warmup_iters; ++it) {
    const auto i = torch::randint(T - 1, {1}).item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the value is an index
    auto loss = torch::mse_loss(f(mid[i]), target[i]);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

struct Window {
  torch::Tensor y0, target; // [B, D], [batch_time, B, D]
};

Window sample_window(const torch::Tensor &z, int64_t batch_time, int64_t batch_size) {
  const auto N = z.size(0), T = z.size(1);
  auto rows = torch::randint(N, {batch_size}, torch::kLong);
  const auto start = torch::randint(T - batch_time, {1}).item<int64_t>();
  auto seg = z.index_select(0, rows).narrow(1, start, batch_time).transpose(0, 1);
  return {seg[0], seg};
}

// Mean squared error in data units: each trajectory integrated from its first observed state.
double evaluate(VectorField &f, const Trajectories &data, const Standardizer &norm, const OdeConfig &cfg, torch::Device device) {
  f->eval();
  auto t = data.times.to(device);
  auto mean = norm.mean.to(device), scale = norm.scale.to(device);
  auto total = torch::zeros({}, device);
  const auto N = data.states.size(0);
  for (int64_t first = 0; first < N; first += cfg.batch_size) {
    const auto n = std::min(cfg.batch_size, N - first);
    auto truth = data.states.narrow(0, first, n).transpose(0, 1).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different slice every batch
    auto pred = odeint(f, (truth[0] - mean) / scale, t, cfg.substeps) * scale + mean;
    // FACT: l = torch.nn.Linear(2, 2); tot = torch.zeros(()); exec('for _ in range(3):\n tot += ((l(torch.randn(4, 2)) - 1) ** 2).sum()'); assert tot.requires_grad and kept_nodes(tot) >= 9
    total += torch::mse_loss(pred, truth, at::Reduction::Sum); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every batch's solver graph stays reachable from total
  }
  f->train();
  return total.item<double>() / static_cast<double>(data.states.numel());
}

void train(VectorField &f, const Trajectories &train_set, const Trajectories &val_set, const Standardizer &norm,
           const OdeConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  f->to(device);
  auto z = norm.encode(train_set.states);
  warm_start(f, z, train_set.times, cfg, device);

  torch::optim::Adam opt(f->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto mean = norm.mean.to(device), scale = norm.scale.to(device);
  double best_val = 1e30;
  for (int64_t it = 1; it <= cfg.iters; ++it) {
    auto w = sample_window(z, cfg.batch_time, cfg.batch_size);
    auto y0 = w.y0.to(device), target = w.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new window every iteration
    auto batch_t = train_set.times.narrow(0, 0, cfg.batch_time).to(device); // EXPECT: tensor-clone-in-loop -- the same batch_time observation times are copied to the device at every iteration
    auto pred = odeint(f, y0, batch_t, cfg.substeps);
    auto loss = torch::mse_loss(pred, target);

    if (it % cfg.log_every == 0) {
      auto shown = pred.detach();
      // FACT: l = torch.nn.Linear(2, 2); y0 = torch.randn(4, 2); tr = torch.stack([y0, y0 + l(y0), y0 + 2 * l(y0)]); loss = torch.nn.functional.mse_loss(tr, torch.randn(3, 4, 2)); s = tr.detach(); s.mul_(2.0).add_(1.0); assert backward_fails(lambda: loss.backward())
      shown.mul_(scale).add_(mean); // EXPECT: tensor-inplace-on-detached -- shown is pred's storage, which mse_loss saved: the backward() below raises
      std::cout << "iter " << it << " loss " << loss.item<float>() // LOOKALIKE: tensor-sync-in-loop -- every log_every iterations only
                << " end state " << shown[-1][0] << "\n";
    }
    opt.zero_grad();
    loss.backward();
    for (auto &p : f->parameters())
      p.grad().clamp_(-cfg.grad_clip, cfg.grad_clip); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is written, not the parameter
    opt.step();

    if (it % cfg.val_every == 0) {
      const double err = evaluate(f, val_set, norm, cfg, device);
      best_val = std::min(best_val, err);
      std::cout << "iter " << it << " val mse " << err << " (best " << best_val << ")\n";
    }
  }
}

// Rollouts from each held-out initial state to horizon_factor times the observed horizon.
std::vector<torch::Tensor> extrapolate(VectorField &f, const Trajectories &val_set, const Standardizer &norm,
                                       const OdeConfig &cfg) {
  torch::NoGradGuard no_grad;
  f->eval();
  const auto device = f->parameters().front().device();
  const auto T = val_set.times.size(0);
  const auto t_end = val_set.times[-1].item<double>() * cfg.horizon_factor;
  auto t = torch::linspace(val_set.times[0].item<double>(), t_end, static_cast<int64_t>(T * cfg.horizon_factor)).to(device);
  std::vector<torch::Tensor> out;
  for (int64_t i = 0; i < val_set.states.size(0); ++i) {
    auto y0 = ((val_set.states[i][0] - norm.mean) / norm.scale).unsqueeze(0).to(device);
    out.push_back(norm.decode(odeint(f, y0, t, cfg.substeps).squeeze(1).cpu())); // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- under NoGradGuard; every rollout is kept
  }
  return out;
}

void run(const Trajectories &train_set, const Trajectories &val_set, const OdeConfig &cfg) {
  torch::manual_seed(0);
  Standardizer norm;
  norm.fit(train_set.states);
  VectorField f(cfg);
  train(f, train_set, val_set, norm, cfg);
  const auto device = f->parameters().front().device();
  std::cout << "train mse " << evaluate(f, train_set, norm, cfg, device) << " val mse "
            << evaluate(f, val_set, norm, cfg, device) << "\n";
  auto rollouts = extrapolate(f, val_set, norm, cfg);
  torch::save(rollouts, "rollouts.pt");
}
