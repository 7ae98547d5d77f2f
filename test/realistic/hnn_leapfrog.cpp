// Hamiltonian neural network (Greydanus et al., 2019) in separable form,
// H(q, p) = 1/2 p^T M^-1 p + V_theta(q), learned from noisy observations of the
// Henon-Heiles system and rolled out with a kick-drift-kick leapfrog integrator.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

struct HNNConfig {
  int64_t dof = 2;
  int64_t hidden = 200;
  int64_t n_traj = 64;
  int64_t sim_steps = 20000;
  int64_t record_every = 10;
  double dt_sim = 0.01;
  double noise = 0.01;
  double lr = 1e-3;
  int64_t epochs = 2000;
  int64_t batch_size = 512;
  int64_t log_every = 50;
  double plateau_tol = 1e-7;
  int64_t n_eval = 8;
  double dt_eval = 0.05;
};

struct HenonHeiles {
  torch::Tensor inv_mass = torch::tensor({1.0, 0.5}, torch::kFloat64);
  double lambda = 1.0;

  torch::Tensor potential(const torch::Tensor& q) const {
    auto x = q.select(-1, 0), y = q.select(-1, 1);
    return 0.5 * (x * x + y * y) + lambda * (x * x * y - y * y * y / 3.0);
  }
  torch::Tensor kinetic(const torch::Tensor& p) const {
    return 0.5 * (p * p * inv_mass).sum(-1);  // EXPECT: tensor-device-mismatch
  }
  torch::Tensor energy(const torch::Tensor& q, const torch::Tensor& p) const { return kinetic(p) + potential(q); }
  torch::Tensor force(const torch::Tensor& q) const {
    auto x = q.select(-1, 0), y = q.select(-1, 1);
    return torch::stack({-(x + 2.0 * lambda * x * y), -(y + lambda * (x * x - y * y))}, -1);
  }
  torch::Tensor time_derivative(const torch::Tensor& z) const {
    return torch::cat({z.narrow(-1, 2, 2) * inv_mass, force(z.narrow(-1, 0, 2))}, -1);
  }
};

torch::Tensor sample_initial_states(const HenonHeiles& sys, int64_t n) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto energy = 0.02 + 0.1 * torch::rand({n}, opts);
  auto q = (torch::rand({n, 2}, opts) - 0.5) * 0.6;
  auto dir = torch::randn({n, 2}, opts);
  auto ke = (energy - sys.potential(q)).clamp_min(1e-3);
  auto p = dir * torch::sqrt(2.0 * ke / (dir * dir * sys.inv_mass).sum(-1)).unsqueeze(-1);
  return torch::cat({q, p}, -1);
}

// Reference trajectories: velocity Verlet on the true system, in double precision.
torch::Tensor simulate(const HenonHeiles& sys, const torch::Tensor& z0, double dt, int64_t steps, int64_t every) {
  auto z = z0.clone();
  auto q = z.narrow(-1, 0, 2), p = z.narrow(-1, 2, 2);
  std::vector<torch::Tensor> frames{z.clone()};
  for (int64_t s = 1; s <= steps; ++s) {
    p.add_(sys.force(q), 0.5 * dt);
    // FACT: z=torch.randn(3,4); q=z[:,:2]; p=z[:,2:]; m=torch.tensor([1.,.5]); e=q+0.1*p*m; q.addcmul_(p, m, value=0.1); assert shares_storage(q,p) and torch.allclose(z[:,:2], e)
    q.addcmul_(p, sys.inv_mass, dt);  // LOOKALIKE: tensor-inplace-overlap -- q and p are disjoint halves of the state buffer
    p.add_(sys.force(q), 0.5 * dt);
    if (s % every == 0) frames.push_back(z.clone());
  }
  return torch::stack(frames);
}

struct HNNDataset {
  torch::Tensor samples;   // observed state next to its time derivative
  torch::Tensor ref_traj;  // clean trajectories for long-horizon evaluation
};

HNNDataset make_dataset(const HenonHeiles& sys, const HNNConfig& cfg) {
  auto traj = simulate(sys, sample_initial_states(sys, cfg.n_traj), cfg.dt_sim, cfg.sim_steps, cfg.record_every);
  auto x = traj.flatten(0, 1);
  auto dxdt = sys.time_derivative(x);
  // FACT: t=torch.randn(5,3,4,dtype=torch.float64); x=t.flatten(0,1); x.add_(1.0); assert is_view_of(x, t)
  x.add_(torch::randn_like(x), cfg.noise);  // EXPECT: tensor-alias-then-mutate
  HNNDataset ds;
  ds.samples = torch::empty({x.size(0), 4 * cfg.dof});
  ds.samples.copy_(torch::cat({x, dxdt}, 1));  // EXPECT: tensor-copy-narrowing
  ds.ref_traj = traj;
  return ds;
}

struct SeparableHNNImpl : torch::nn::Module {
  SeparableHNNImpl(int64_t dof, int64_t hidden) : dof_(dof) {
    fc1 = register_module("fc1", torch::nn::Linear(dof, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", torch::nn::Linear(hidden, 1));
    log_mass = register_parameter("log_mass", torch::zeros({dof}));
    q_scale = register_buffer("q_scale", torch::ones({dof}));
    for (auto& fc : {fc1, fc2, fc3}) torch::nn::init::orthogonal_(fc->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no_grad
    fc3->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  void set_input_scale(const torch::Tensor& scale) { q_scale.copy_(scale); }

  torch::Tensor potential(const torch::Tensor& q) {
    auto h = torch::tanh(fc1(q / q_scale));  // LOOKALIKE: tensor-device-mismatch -- q_scale is a registered buffer and moves with the module
    h = torch::tanh(fc2(h));
    return fc3(h).squeeze(-1);
  }

  torch::Tensor inverse_mass() {
    auto inv_m = torch::exp(-log_mass);
    // FACT: lm=torch.zeros(2,requires_grad=True); assert backward_fails(lambda: (torch.randn(3,2)*torch.exp(-lm).clamp_(1e-2,1e2)).sum().backward())
    inv_m.clamp_(1e-2, 1e2);  // EXPECT: tensor-inplace-on-saved
    return inv_m;
  }

  torch::Tensor hamiltonian(const torch::Tensor& q, const torch::Tensor& p) {
    return 0.5 * (p * p * inverse_mass()).sum(-1) + potential(q);
  }

  torch::Tensor grad_potential(const torch::Tensor& q, bool create_graph) {
    auto qg = q.detach().requires_grad_(true);
    auto V = potential(qg).sum();
    return torch::autograd::grad({V}, {qg}, {}, /*retain_graph=*/create_graph, create_graph)[0];
  }

  // Hamilton's equations: dq/dt = M^-1 p, dp/dt = -dV/dq.
  torch::Tensor time_derivative(const torch::Tensor& z) {
    auto q = z.narrow(-1, 0, dof_), p = z.narrow(-1, dof_, dof_);
    auto dqdt = p * inverse_mass();
    // FACT: W=torch.randn(8,2,requires_grad=True); q=torch.randn(5,2).requires_grad_(); g=torch.autograd.grad(torch.tanh(torch.nn.functional.linear(q/torch.ones(2),W)).sum(),q,create_graph=True)[0]; g.neg_(); assert not backward_fails(lambda: g.pow(2).sum().backward())
    auto dpdt = grad_potential(q, /*create_graph=*/true).neg_();  // LOOKALIKE: tensor-inplace-on-saved -- the input gradient comes out of a matmul, which does not save its result
    return torch::cat({dqdt, dpdt}, -1);
  }

  int64_t dof_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::Tensor log_mass, q_scale;
};
TORCH_MODULE(SeparableHNN);

void train(SeparableHNN& model, const HNNDataset& data, const HNNConfig& cfg, torch::Device device) {
  model->set_input_scale(data.samples.narrow(1, 0, cfg.dof).std(0));
  model->to(device);
  model->train();
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-5));
  const int64_t n = data.samples.size(0), dim = 2 * cfg.dof, W = 20;
  auto loss_window = torch::full({W}, std::numeric_limits<float>::infinity(), torch::TensorOptions().device(device));

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    std::vector<torch::Tensor> epoch_losses;
    for (int64_t lo = 0; lo + cfg.batch_size <= n; lo += cfg.batch_size) {
      auto idx = perm.slice(0, lo, lo + cfg.batch_size);
      auto batch = data.samples.to(device).index_select(0, idx);  // EXPECT: tensor-clone-in-loop
      auto x = batch.narrow(1, 0, dim), dxdt = batch.narrow(1, dim, dim);
      auto loss = torch::mse_loss(model->time_derivative(x), dxdt);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    auto epoch_loss = torch::stack(epoch_losses).mean().detach();
    // FACT: w=torch.arange(5.); assert raises(lambda: w.narrow(0,0,4).copy_(w.narrow(0,1,4)), "single memory location")
    loss_window.narrow(0, 0, W - 1).copy_(loss_window.narrow(0, 1, W - 1));  // EXPECT: tensor-inplace-overlap
    loss_window[W - 1] = epoch_loss;
    if (epoch % cfg.log_every == 0) {
      const double spread = (loss_window.max() - loss_window.min()).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every epochs, and it decides the early stop
      std::printf("epoch %5lld  loss %.3e  spread %.2e\n", static_cast<long long>(epoch), epoch_loss.item<double>(), spread);
      if (epoch >= W && spread < cfg.plateau_tol) break;
    }
  }
}

struct Rollout {
  torch::Tensor states;
  std::vector<double> learned_energy;
};

// Kick-drift-kick leapfrog on the learned Hamiltonian; dV/dq comes from autograd.
Rollout leapfrog_rollout(SeparableHNN& model, const torch::Tensor& z0, double dt, int64_t steps, int64_t record_every) {
  model->eval();
  const int64_t d = z0.size(-1) / 2;
  torch::Tensor inv_m;
  {
    torch::NoGradGuard no_grad;
    inv_m = model->inverse_mass();
  }
  auto z = z0.clone();  // LOOKALIKE: tensor-unnecessary-clone -- z is advanced in place and z0 is still read as the first frame
  auto q = z.narrow(-1, 0, d), p = z.narrow(-1, d, d);
  std::vector<torch::Tensor> frames{z0};
  Rollout out;
  auto force = model->grad_potential(q, false).neg_();
  for (int64_t s = 1; s <= steps; ++s) {
    // FACT: z=torch.zeros(2,4); p=z.narrow(-1,2,2); p.add_(1.0); assert is_view_of(p, z) and bool(z[:,2:].eq(1).all())
    p.add_(force, 0.5 * dt);  // LOOKALIKE: tensor-alias-then-mutate -- p is a view of the state buffer z and writing z is the point
    q.addcmul_(p, inv_m, dt);
    force = model->grad_potential(q, false).neg_();
    p.add_(force, 0.5 * dt);
    out.learned_energy.push_back(model->hamiltonian(q, p).mean().item<double>());  // EXPECT: tensor-sync-in-loop
    if (s % record_every == 0) frames.push_back(z.clone());  // LOOKALIKE: tensor-graph-kept-across-iterations -- the gradients are taken without create_graph, z carries no graph
  }
  out.states = torch::stack(frames);
  return out;
}

void evaluate_long_horizon(SeparableHNN& model, const HenonHeiles& sys, const HNNDataset& data, const HNNConfig& cfg,
                           torch::Device device) {
  auto ref = data.ref_traj.slice(1, 0, cfg.n_eval);
  const double frame_dt = cfg.dt_sim * static_cast<double>(cfg.record_every);
  const auto sub = static_cast<int64_t>(frame_dt / cfg.dt_eval + 0.5);
  auto z0 = ref.select(0, 0).to(device, torch::kFloat32);  // LOOKALIKE: tensor-copy-narrowing -- the double to float conversion is explicit
  auto rollout = leapfrog_rollout(model, z0.clone(), cfg.dt_eval, (ref.size(0) - 1) * sub, sub);  // EXPECT: tensor-unnecessary-clone

  const int64_t T = std::min(rollout.states.size(0), ref.size(0));
  auto states = rollout.states.slice(0, 0, T);
  auto mse = (states - ref.slice(0, 0, T).to(device, torch::kFloat32)).pow(2).mean({1, 2});
  auto true_energy = sys.energy(states.narrow(-1, 0, 2), states.narrow(-1, 2, 2));
  auto drift = ((true_energy - true_energy[0]) / true_energy[0]).abs().mean(1);
  const auto learned = torch::tensor(rollout.learned_energy, torch::kFloat64);
  std::printf("state MSE  t=%.0f: %.3e   t=%.0f: %.3e\n", frame_dt * (T / 10), mse[T / 10].item<double>(),
              frame_dt * (T - 1), mse[T - 1].item<double>());
  std::printf("true energy drift (max over time) %.3e\n", drift.max().item<double>());
  std::printf("learned energy spread %.3e\n", (learned.max() - learned.min()).item<double>());
}

int main() {
  torch::manual_seed(0);
  HNNConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  HenonHeiles sys;
  auto data = make_dataset(sys, cfg);
  SeparableHNN model(cfg.dof, cfg.hidden);
  train(model, data, cfg, device);
  evaluate_long_horizon(model, sys, data, cfg, device);
  return 0;
}
