// Weakly compressible SPH in 2-D (Tait equation of state, poly6 / spiky /
// viscosity kernels, cell-list neighbour search) with a small MLP that learns
// an acceleration correction so that a coarse time step tracks a fine-step
// double-precision reference of a two-phase dam break.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct SPHParams {
  double h = 0.04;
  double spacing = 0.02;
  double domain = 1.0;
  double rest_density = 1000.0;
  double stiffness = 200.0;
  double viscosity = 0.05;
  double particle_mass = 0.4;
  double density_ratio = 1.5;
  double wall_damping = 0.5;
  double dt = 2e-3;
  double cfl = 0.4;
  int64_t ref_substeps = 8;
  int64_t max_per_cell = 16;
};

struct State {
  torch::Tensor pos, vel;
};

struct Pairs {
  torch::Tensor i, j;
};

struct Forces {
  torch::Tensor acc, rho, press;
};

torch::Tensor lattice(int64_t nx, int64_t ny, double spacing, torch::TensorOptions opts) {
  auto xs = (torch::arange(nx, opts) + 0.5) * spacing;
  auto ys = (torch::arange(ny, opts) + 0.5) * spacing;
  auto mesh = torch::stack(torch::meshgrid({xs, ys}, "ij"), -1);
  // FACT: d = torch.arange(4.); m = torch.stack(torch.meshgrid(d, d, indexing="ij"), -1); assert is_view_of(m.reshape(-1, 2), m)
  return mesh.reshape({-1, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack already materialised the expanded meshgrid outputs
}

Pairs find_pairs(const torch::Tensor& pos, const SPHParams& p) {
  const auto n = pos.size(0);
  const auto m = p.max_per_cell;
  const auto nc = static_cast<int64_t>(std::ceil(p.domain / p.h));
  auto cell = torch::floor(pos / p.h).to(torch::kLong);
  // FACT: x = torch.rand(6, 2); c = x.to(torch.long); assert is_copy_of(c, x)
  cell.clamp_(0, nc - 1);  // LOOKALIKE: tensor-alias-then-mutate -- to(kLong) from floating point allocates new storage
  auto cell_id = cell.select(1, 0) * nc + cell.select(1, 1);
  auto order = torch::argsort(cell_id);
  auto sorted_id = cell_id.index_select(0, order);
  auto counts = torch::bincount(sorted_id, {}, nc * nc);
  auto cell_start = torch::zeros_like(counts);
  // FACT: c = torch.tensor([2, 0, 3, 1]); s = torch.zeros_like(c); s[1:].copy_(c.cumsum(0)[:-1]); assert s.tolist() == [0, 2, 2, 5]
  cell_start.slice(0, 1).copy_(counts.cumsum(0).slice(0, 0, -1));  // LOOKALIKE: tensor-inplace-overlap -- the source is a fresh cumsum, not cell_start
  auto slot = torch::arange(n, cell_id.options()) - cell_start.index_select(0, sorted_id);
  auto keep = slot < m;
  auto table = torch::full({nc * nc, m}, -1, cell_id.options());
  table.index_put_({sorted_id.masked_select(keep), slot.masked_select(keep)},
                   order.masked_select(keep));

  auto d = torch::arange(-1, 2, cell_id.options());
  auto offs = torch::stack({d.repeat_interleave(3), d.repeat({3})}, 1);
  auto nb = cell.unsqueeze(0) + offs.unsqueeze(1);
  auto inside = ((nb >= 0) & (nb < nc)).all(-1);
  auto nb_id = (nb.select(2, 0) * nc + nb.select(2, 1)).clamp(0, nc * nc - 1);
  auto cand = table.index_select(0, nb_id.flatten()).view({9, n, m});
  cand.masked_fill_(~inside.unsqueeze(-1), -1);
  // FACT: c = torch.randn(9, 5, 4); assert is_copy_of(c.permute(1, 0, 2).reshape(5, -1), c)
  cand = cand.permute({1, 0, 2}).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous
  auto ii = torch::arange(n, cand.options()).unsqueeze(1).expand_as(cand);
  auto valid = (cand >= 0) & (cand != ii);
  auto i = ii.masked_select(valid);
  auto j = cand.masked_select(valid);
  auto r = (pos.index_select(0, i) - pos.index_select(0, j)).norm(2, 1);
  auto close = r < p.h;
  return {i.masked_select(close), j.masked_select(close)};
}

struct Kernels {
  double h;
  double poly6_norm() const { return 4.0 / (M_PI * std::pow(h, 8)); }
  torch::Tensor poly6(const torch::Tensor& r) const {
    return poly6_norm() * (h * h - r * r).clamp_min(0).pow(3);
  }
  torch::Tensor spiky_grad(const torch::Tensor& r) const {
    return -30.0 / (M_PI * std::pow(h, 5)) * (h - r).clamp_min(0).pow(2);
  }
  torch::Tensor visc_lap(const torch::Tensor& r) const {
    return 40.0 / (M_PI * std::pow(h, 5)) * (h - r).clamp_min(0);
  }
};

torch::Tensor equation_of_state(torch::Tensor density, const SPHParams& p) {
  auto pressure = density;
  // FACT: d = torch.rand(6) + 1; q = d; q.div_(1000.0).pow_(7); assert shares_storage(q, d) and d.max() < 1e-3
  pressure.div_(p.rest_density).pow_(7).sub_(1).mul_(p.stiffness);  // EXPECT: tensor-alias-then-mutate
  return pressure.clamp_min(0);
}

struct Simulator {
  SPHParams p;
  Kernels k{p.h};
  torch::Tensor gravity = torch::tensor({0.0, -9.81});

  Forces forces(const State& s, const torch::Tensor& mass, const Pairs& pr) const {
    const auto n = s.pos.size(0);
    auto d = s.pos.index_select(0, pr.i) - s.pos.index_select(0, pr.j);
    auto r = d.norm(2, 1, true).clamp_min(1e-9);
    auto mj = mass.index_select(0, pr.j).unsqueeze(1);
    auto rho = (mass * k.poly6_norm() * std::pow(p.h, 6))
                   .index_add(0, pr.i, (mj * k.poly6(r)).squeeze(1));
    auto press = equation_of_state(rho, p);
    auto rho_i = rho.index_select(0, pr.i).unsqueeze(1);
    auto rho_j = rho.index_select(0, pr.j).unsqueeze(1);
    auto p_term = press.index_select(0, pr.i).unsqueeze(1) / rho_i.pow(2) +
                  press.index_select(0, pr.j).unsqueeze(1) / rho_j.pow(2);
    auto f_press = -mj * p_term * k.spiky_grad(r) * d / r;
    auto dv = s.vel.index_select(0, pr.j) - s.vel.index_select(0, pr.i);
    auto f_visc = p.viscosity * mj * dv / (rho_i * rho_j) * k.visc_lap(r);
    auto acc = gravity.to(s.pos.scalar_type()).expand({n, 2}).clone();
    // FACT: g = torch.tensor([0., -9.81]).expand(5, 2).clone(); g.index_add_(0, torch.tensor([0, 0]), torch.ones(2, 2)); assert g.stride() == (2, 1)
    acc.index_add_(0, pr.i, f_press + f_visc);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-expanded -- clone() gave the broadcast gravity its own dense storage
    return {acc, rho, press};
  }
};

State symplectic_euler(const State& s, const torch::Tensor& acc, double dt, const SPHParams& p) {
  auto vel = s.vel + dt * acc;
  auto pos = s.pos + dt * vel;
  auto outside = (pos < 0) | (pos > p.domain);
  vel = torch::where(outside, -p.wall_damping * vel, vel);
  return {pos.clamp(0, p.domain), vel};
}

class CorrectorImpl : public torch::nn::Module {
 public:
  CorrectorImpl(int64_t hist_len, int64_t hidden, double max_corr) : max_corr_(max_corr) {
    fc1 = register_module("fc1", torch::nn::Linear(2 * hist_len + 4, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
    out = register_module("out", torch::nn::Linear(hidden, 2));
    torch::NoGradGuard no_grad;
    out->weight.mul_(1e-2);  // LOOKALIKE: tensor-inplace-on-leaf -- shrinking the last layer's init under NoGradGuard
    out->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& feats) {
    auto h = fc1(feats);
    // FACT: l = torch.nn.Linear(4, 5); h = l(torch.randn(3, 4)); h.relu_(); h.sum().backward(); assert l.weight.grad is not None
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- linear does not save its output, relu_ saves its own result
    h = torch::relu(fc2(h));
    auto g = torch::tanh(out(h));
    // FACT: z = torch.randn(3, 2, requires_grad=True) * 1; g = torch.tanh(z); l = g.sum(); g.mul_(5.0); assert backward_fails(lambda: l.backward())
    g.mul_(max_corr_);  // EXPECT: tensor-inplace-on-saved
    return g;
  }

 private:
  double max_corr_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Corrector);

torch::Tensor make_features(const State& s, const Forces& f, const torch::Tensor& vel_hist,
                            const torch::Tensor& speed_scale, const SPHParams& p) {
  const auto n = s.pos.size(0);
  // FACT: h = torch.randn(4, 6, 2); assert raises(lambda: h.permute(1, 0, 2).view(6, -1), "view size is not compatible")
  auto hist = vel_hist.permute({1, 0, 2}).view({n, -1});  // EXPECT: tensor-view-non-contiguous
  auto rho = (f.rho / p.rest_density - 1).unsqueeze(1);
  auto press = (f.press / p.stiffness).unsqueeze(1);
  return torch::cat({s.vel / speed_scale, rho, press, hist / speed_scale}, 1);  // LOOKALIKE: tensor-device-mismatch -- speed_scale is a 0-dim CPU tensor, which mixes with CUDA operands
}

struct Trajectory {
  torch::Tensor pos, vel;
};

Trajectory make_reference(const State& init, const torch::Tensor& mass, const Simulator& sim,
                          int64_t frames) {
  torch::NoGradGuard no_grad;
  State s{init.pos.to(torch::kFloat64), init.vel.to(torch::kFloat64)};
  auto m = mass.to(torch::kFloat64);
  const double dt = sim.p.dt / sim.p.ref_substeps;
  std::vector<torch::Tensor> ps, vs;
  for (int64_t f = 0; f < frames; ++f) {
    for (int64_t k = 0; k < sim.p.ref_substeps; ++k) {
      auto pairs = find_pairs(s.pos, sim.p);
      s = symplectic_euler(s, sim.forces(s, m, pairs).acc, dt, sim.p);
    }
    ps.push_back(s.pos);
    vs.push_back(s.vel);
  }
  return {torch::stack(ps).cpu(), torch::stack(vs).cpu()};
}

int main() {
  torch::manual_seed(0);
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  const auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  Simulator sim;
  const SPHParams& p = sim.p;
  const int64_t hist_len = 4, rollout_len = 5, frames = 200, iters = 500;

  State init{lattice(20, 30, p.spacing, opts), torch::zeros({600, 2}, opts)};
  const auto n = init.pos.size(0);
  auto mass = torch::full({1}, p.particle_mass, opts).expand({n});
  // FACT: m = torch.full((1,), 0.4).expand(10); assert raises(lambda: m[:4].mul_(1.5), "more than one element")
  mass.slice(0, 0, n / 3).mul_(p.density_ratio);  // EXPECT: tensor-inplace-on-expanded

  auto ref = make_reference(init, mass, sim, frames);
  auto speed_scale = ref.vel.norm(2, -1).max().to(torch::kFloat) + 1e-3;

  Corrector model(hist_len, 64, 5.0);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  auto running = torch::zeros({}, opts);
  for (int64_t it = 0; it < iters; ++it) {
    auto target = ref.pos.to(device, torch::kFloat);  // EXPECT: tensor-clone-in-loop
    const auto t0 = torch::randint(hist_len, frames - rollout_len - 1, {1}).item<int64_t>();
    State s{target[t0], ref.vel[t0].to(device, torch::kFloat)};
    auto vel_hist = ref.vel.slice(0, t0 - hist_len + 1, t0 + 1).to(device, torch::kFloat);
    std::vector<torch::Tensor> rollout;
    for (int64_t k = 0; k < rollout_len; ++k) {
      auto pairs = find_pairs(s.pos.detach(), p);
      auto f = sim.forces(s, mass, pairs);
      auto corr = model->forward(make_features(s, f, vel_hist, speed_scale, p));
      s = symplectic_euler(s, f.acc + corr, p.dt, p);
      rollout.push_back(s.pos);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the vector lives for one iteration and is this step's loss graph
      vel_hist = torch::cat({vel_hist.slice(0, 1), s.vel.unsqueeze(0)}, 0);
    }
    auto loss = F::mse_loss(torch::stack(rollout), target.slice(0, t0 + 1, t0 + 1 + rollout_len));
    opt.zero_grad();
    loss.backward();
    opt.step();
    running += loss;  // EXPECT: tensor-graph-kept-across-iterations
    if ((it + 1) % 50 == 0) {
      std::cout << "iter " << it + 1 << " rollout mse " << running.item<float>() / 50 << "\n";
      running = torch::zeros({}, opts);
    }
  }

  torch::NoGradGuard no_grad;
  model->eval();
  State s = init;
  auto vel_hist = torch::zeros({hist_len, n, 2}, opts);
  std::vector<torch::Tensor> saved_frames;
  double total_ke = 0.0, t = 0.0;
  for (int64_t step = 0; step < 2000; ++step) {
    const double vmax = s.vel.norm(2, 1).max().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the CFL bound needs the value on the host to pick dt
    const double dt = std::min(p.dt, p.cfl * p.h / (vmax + 1e-6));
    auto f = sim.forces(s, mass, find_pairs(s.pos, p));
    auto corr = model->forward(make_features(s, f, vel_hist, speed_scale, p));
    s = symplectic_euler(s, f.acc + corr, dt, p);
    t += dt;
    // FACT: h = torch.zeros(4, 6, 2); assert raises(lambda: h[:-1].copy_(h[1:]), "refer to a single memory location")
    vel_hist.slice(0, 0, hist_len - 1).copy_(vel_hist.slice(0, 1));  // EXPECT: tensor-inplace-overlap
    vel_hist[hist_len - 1].copy_(s.vel);
    total_ke += 0.5 * (mass * s.vel.pow(2).sum(1)).sum().item<double>();  // EXPECT: tensor-sync-in-loop
    if (step % 10 == 0) {
      saved_frames.push_back(s.pos.to(torch::kCPU));  // LOOKALIKE: tensor-clone-in-loop -- s.pos is a new tensor every step; the host copy is the recorded frame
    }
  }
  std::cout << "simulated " << t << " s, mean kinetic energy " << total_ke / 2000 << ", "
            << saved_frames.size() << " frames\n";
  return 0;
}
