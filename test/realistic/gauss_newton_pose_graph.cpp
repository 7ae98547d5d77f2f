// 2-D pose-graph SLAM back end: poses (x, y, theta) linked by odometry and loop-closure edges,
// optimised by Levenberg-Marquardt with the residual Jacobians taken from autograd, so there
// are no hand-derived SE(2) derivatives to get wrong. Dense normal equations: the graphs are
// submaps of a few hundred poses. The edge noise (one sigma per edge type and axis) is
// calibrated by maximum likelihood on submaps already optimised, and a few gradient steps
// straighten chains whose headings come from a drifting gyro before LM starts.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

struct PoseGraph {
  torch::Tensor ii, jj; // [E] int64: edge e constrains pose jj[e] relative to pose ii[e]
  torch::Tensor meas;   // [E, 3] measured relative pose (dx, dy, dtheta) in the frame of ii
  torch::Tensor type;   // [E] int64: 0 wheel odometry, 1 scan matching, 2 loop closure
  int64_t num_poses = 0;
};

struct LmConfig {
  int64_t max_iters = 30, warm_steps = 50, calib_epochs = 300, n_edge_types = 3;
  double lambda0 = 1e-3, min_rel_decrease = 1e-6;
  double warm_lr = 1e-2, heading_weight = 2.0;
  double calib_lr = 5e-2, max_precision = 1e6;
};

struct LmResult {
  torch::Tensor poses;      // [N, 3]
  std::vector<double> cost; // after each accepted step
  int64_t iterations = 0;
};

// Relative-pose residual of every edge, in the measurement's frame: [E, 3].
torch::Tensor se2_residual(const torch::Tensor &xi, const torch::Tensor &xj, const torch::Tensor &z) {
  auto th_i = xi.select(1, 2);
  auto ci = torch::cos(th_i), si = torch::sin(th_i);
  auto dx = xj.select(1, 0) - xi.select(1, 0), dy = xj.select(1, 1) - xi.select(1, 1);
  auto lx = ci * dx + si * dy, ly = ci * dy - si * dx; // pose j seen from pose i
  auto cz = torch::cos(z.select(1, 2)), sz = torch::sin(z.select(1, 2));
  auto ex = lx - z.select(1, 0), ey = ly - z.select(1, 1);
  auto dth = xj.select(1, 2) - th_i - z.select(1, 2);
  return torch::stack({cz * ex + sz * ey, cz * ey - sz * ex, torch::atan2(torch::sin(dth), torch::cos(dth))}, 1);
}

// Diagonal edge noise per type and axis: information = exp(-2 log_sigma).
struct NoiseModelImpl : torch::nn::Module {
  NoiseModelImpl(int64_t n_types, double max_precision) : max_precision_(max_precision) {
    log_sigma_ = register_parameter("log_sigma", torch::full({n_types, 3}, std::log(0.1)));
  }
  // Information of each edge: [E, 3].
  torch::Tensor information(const torch::Tensor &type) {
    auto prec = torch::exp(-2.0 * log_sigma_);
    // FACT: ls = torch.zeros(2, 3, requires_grad=True); p = torch.exp(-2 * ls); p.clamp_max_(1e4); assert backward_fails(lambda: p.index_select(0, torch.tensor([1, 0, 1])).sum().backward())
    prec.clamp_max_(max_precision_); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward: the calibration's backward() raises
    return prec.index_select(0, type);
  }
  void reset() {
    torch::NoGradGuard no_grad;
    log_sigma_.fill_(std::log(0.1)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  torch::Tensor log_sigma_;
  double max_precision_;
};
TORCH_MODULE(NoiseModel);

class PoseGraphOptimizer {
public:
  PoseGraphOptimizer(NoiseModel noise, const LmConfig &cfg)
      : noise_(std::move(noise)), cfg_(cfg), device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU) {
    noise_->to(device_);
  }

  // Plain gradient descent on the weighted cost, headings weighted up: brings a chain with a
  // bad initial heading close enough for LM to converge in a few iterations.
  torch::Tensor warm_start(const PoseGraph &g, const torch::Tensor &init) {
    auto e = upload(g);
    auto x = init.to(device_).clone().requires_grad_(true);
    for (int64_t s = 0; s < cfg_.warm_steps; ++s) {
      auto r = se2_residual(x.index_select(0, e.ii), x.index_select(0, e.jj), e.z);
      // FACT: x = torch.randn(4, 3, requires_grad=True); r = torch.stack([x[:, 0].sin(), x[:, 1] * 2, torch.atan2(x[:, 2].sin(), x[:, 2].cos())], 1); r.select(1, 2).mul_(3.0); (r * r).sum().backward(); assert x.grad is not None
      r.select(1, 2).mul_(cfg_.heading_weight); // LOOKALIKE: tensor-inplace-on-saved -- stack saves nothing, and atan2 saved its inputs, not its result
      auto cost = 0.5 * (r * r * e.w).sum();
      auto grad = torch::autograd::grad({cost}, {x})[0];
      // FACT: x = torch.zeros(4, 3).clone().requires_grad_(True); assert raises(lambda: x.sub_(0.01 * torch.ones(4, 3)), "a leaf Variable that requires grad")
      x.sub_(cfg_.warm_lr * grad); // EXPECT: tensor-inplace-on-leaf -- x was made a leaf that requires grad above, and grad mode is on
    }
    return x.detach();
  }

  LmResult optimize(const PoseGraph &g, torch::Tensor x) {
    const auto N = g.num_poses, E = g.ii.size(0);
    auto e = upload(g);
    x = x.to(device_);
    // FACT: p = torch.rand(3, 3); w = p.index_select(0, torch.tensor([0, 2, 2, 1])); assert is_view_of(w.reshape(-1), w)
    auto w = e.w.reshape({-1}); // LOOKALIKE: tensor-reshape-non-contiguous -- index_select made a new contiguous [E, 3]: a view
    // Row 3e + k of the dense Jacobian holds d r_ek / d x; its six non-zero columns belong to
    // poses ii[e] and jj[e].
    auto row = torch::arange(3 * E, e.ii.options()).unsqueeze(1);
    auto offs = torch::arange(3, e.ii.options());
    auto cols = torch::cat({(3 * e.ii).unsqueeze(1) + offs, (3 * e.jj).unsqueeze(1) + offs}, 1).repeat_interleave(3, 0);
    double lambda = cfg_.lambda0;
    LmResult res;
    std::vector<torch::Tensor> trace;
    for (int64_t it = 0; it < cfg_.max_iters; ++it) {
      ++res.iterations;
      auto xi = x.index_select(0, e.ii).requires_grad_(true);
      auto xj = x.index_select(0, e.jj).requires_grad_(true);
      auto r = se2_residual(xi, xj, e.z);
      auto cost = 0.5 * (r.pow(2).reshape({-1}) * w).sum();
      // FACT: m = torch.randn(4, 3, requires_grad=True); c = [(m * float(k)).pow(2).sum() for k in range(3)]; assert all(t.requires_grad for t in c) and kept_nodes(c) >= 6
      trace.push_back(cost); // EXPECT: tensor-graph-kept-across-iterations -- xi and xj require grad: every iteration's residual graph stays alive until the summary
      // One backward per residual component: each edge's residual depends only on its own
      // rows of xi and xj, so the gradient rows are the Jacobian rows.
      std::vector<torch::Tensor> gi, gj;
      for (int64_t k = 0; k < 3; ++k) {
        auto d = torch::autograd::grad({r.select(1, k).sum()}, {xi, xj}, {}, /*retain_graph=*/k < 2);
        gi.push_back(d[0]);
        gj.push_back(d[1]);
      }
      // FACT: g = torch.randn(3, 5, 6); assert is_copy_of(g.transpose(0, 1).reshape(15, 6), g)
      auto J6 = torch::cat({torch::stack(gi), torch::stack(gj)}, 2).transpose(0, 1).reshape({3 * E, 6}); // EXPECT: tensor-reshape-non-contiguous -- stacked as [3, E, 6]: rows 3e + k are E * 6 values apart, reshape copies
      auto J = torch::zeros({3 * E, 3 * N}, J6.options());
      J.index_put_({row, cols}, J6);
      auto Jd = J.to(torch::kDouble); // LOOKALIKE: tensor-clone-in-loop -- a new Jacobian every iteration
      auto wd = w.to(torch::kDouble); // EXPECT: tensor-clone-in-loop -- the edge weights do not change inside the loop: converted again at every iteration
      auto rd = r.detach().reshape({-1}).to(torch::kDouble);
      auto H = Jd.t().mm(Jd * wd.unsqueeze(1));
      auto b = Jd.t().mv(wd * rd);
      // FACT: H = torch.zeros(6, 6, dtype=torch.float64); H.narrow(0, 0, 3).narrow(1, 0, 3).add_(torch.eye(3, dtype=H.dtype, device=H.device) * 1e8); assert H[2, 2].item() == 1e8 and H[3, 3].item() == 0
      H.narrow(0, 0, 3).narrow(1, 0, 3).add_(torch::eye(3, H.options()) * 1e8); // LOOKALIKE: tensor-device-mismatch -- the gauge prior on pose 0 is made with H's options
      // FACT: s = torch.linalg.solve(torch.eye(6, dtype=torch.float64) * 2, torch.ones(6, dtype=torch.float64)).to(torch.float32); assert is_view_of(s.view(2, 3), s)
      auto dx = torch::linalg_solve(H + lambda * torch::diag(H.diagonal()), -b).to(x.scalar_type()).view({N, 3}); // LOOKALIKE: tensor-view-non-contiguous -- a fresh solution vector, converted: contiguous
      auto x_trial = x.detach(); // no graph for the trial evaluation
      // FACT: x = torch.randn(5, 3); x0 = x.clone(); t = x.detach(); t.add_(torch.ones(5, 3)); assert shares_storage(t, x) and torch.equal(x, x0 + 1)
      x_trial.add_(dx); // EXPECT: tensor-inplace-on-detached -- x_trial is x: the step lands in x before the test, so a rejected step stays applied
      const double old_cost = cost.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- compared with the trial cost: it steers the loop
      double new_cost;
      {
        torch::NoGradGuard no_grad;
        auto rt = se2_residual(x_trial.index_select(0, e.ii), x_trial.index_select(0, e.jj), e.z);
        new_cost = 0.5 * (rt.pow(2).reshape({-1}) * w).sum().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the step is accepted
      }
      if (new_cost < old_cost) {
        x = x_trial;
        lambda = std::max(lambda / 10, 1e-9);
        res.cost.push_back(new_cost);
        if (old_cost - new_cost < cfg_.min_rel_decrease * old_cost)
          break;
      } else {
        lambda *= 10;
      }
    }
    auto curve = torch::stack(trace);
    std::cout << "LM: cost " << curve[0].item<double>() << " -> " << curve[-1].item<double>() << " in "
              << res.iterations << " iterations, lambda " << lambda << "\n";
    res.poses = x;
    return res;
  }

  // Maximum-likelihood noise from submaps already optimised: each residual component is taken
  // as N(0, sigma^2) of its edge type and axis. Full batch: one Adam step per epoch.
  void calibrate(const std::vector<PoseGraph> &graphs, const std::vector<torch::Tensor> &solutions) {
    std::vector<torch::Tensor> resid, types;
    {
      // The residuals at the optimum do not depend on sigma: computed once.
      torch::NoGradGuard no_grad;
      for (size_t k = 0; k < graphs.size(); ++k) {
        const auto &g = graphs[k];
        auto x = solutions[k].to(device_); // LOOKALIKE: tensor-clone-in-loop -- a different submap every iteration
        resid.push_back(se2_residual(x.index_select(0, g.ii.to(device_)), x.index_select(0, g.jj.to(device_)), g.meas.to(device_)));
        types.push_back(g.type.to(device_));
      }
    }
    torch::optim::Adam opt(noise_->parameters(), torch::optim::AdamOptions(cfg_.calib_lr));
    // FACT: p = torch.nn.Parameter(torch.zeros(2, 3)); s0 = p.clone(); exec('with torch.no_grad(): p.add_(1.0)'); assert is_copy_of(s0, p) and not torch.equal(s0, p)
    auto sigma0 = noise_->log_sigma_.clone(); // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: opt.step() rewrites log_sigma in place
    for (int64_t epoch = 0; epoch < cfg_.calib_epochs; ++epoch) {
      std::vector<torch::Tensor> nlls;
      double total = 0;
      for (size_t k = 0; k < resid.size(); ++k) {
        auto info = noise_->information(types[k]);
        auto nll = 0.5 * (resid[k].pow(2) * info - info.log()).sum(1).mean();
        nlls.push_back(nll); // LOOKALIKE: tensor-graph-kept-across-iterations -- the epoch's loss is their mean, and backward() runs through it below
        total += nll.item<double>(); // EXPECT: tensor-sync-in-loop -- one wait for the device per submap, only to print the epoch's sum
      }
      auto loss = torch::stack(nlls).mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        auto ls = noise_->log_sigma_.data();
        ls.clamp_(std::log(1e-4), std::log(10.0)); // LOOKALIKE: tensor-inplace-on-detached -- under NoGradGuard, meant for the parameter: a bound on sigma
      }
      if (epoch % 50 == 0)
        std::cout << "calibration epoch " << epoch << ": nll " << total / static_cast<double>(resid.size()) << "\n";
    }
    std::cout << "max |d log sigma| " << (noise_->log_sigma_ - sigma0).abs().max().item<double>() << "\n";
  }

  NoiseModel noise() const { return noise_; }

private:
  struct Edges {
    torch::Tensor ii, jj, z, w; // w: [E, 3] information, no grad
  };
  Edges upload(const PoseGraph &g) {
    torch::NoGradGuard no_grad;
    return {g.ii.to(device_), g.jj.to(device_), g.meas.to(device_), noise_->information(g.type.to(device_))};
  }

  NoiseModel noise_;
  LmConfig cfg_;
  torch::Device device_;
};

// A drive split into submaps: warm start, LM, then the noise is recalibrated on the results
// and every submap is optimised again with it.
std::vector<torch::Tensor> optimize_drive(const std::vector<PoseGraph> &submaps, const std::vector<torch::Tensor> &odom_init,
                                          const LmConfig &cfg) {
  PoseGraphOptimizer opt(NoiseModel(cfg.n_edge_types, cfg.max_precision), cfg);
  std::vector<torch::Tensor> first;
  for (size_t k = 0; k < submaps.size(); ++k)
    first.push_back(opt.optimize(submaps[k], opt.warm_start(submaps[k], odom_init[k])).poses);
  opt.calibrate(submaps, first);
  std::vector<torch::Tensor> out;
  for (size_t k = 0; k < submaps.size(); ++k)
    out.push_back(opt.optimize(submaps[k], first[k]).poses.cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- a new submap solution each time, kept
  return out;
}
