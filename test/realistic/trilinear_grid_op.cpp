// Trilinear interpolation in a dense feature grid as a custom autograd op
// (CPU, accessors, backward written by hand), a two-level grid field built on
// it, and the checks we run before trusting the hand-written gradients.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace tgrid {

template <typename scalar_t>
struct Cell {
  int64_t x0, y0, z0;
  scalar_t tx, ty, tz;
};

template <typename scalar_t>
inline Cell<scalar_t> locate(scalar_t px, scalar_t py, scalar_t pz, int64_t D, int64_t H, int64_t W) {
  auto corner = [](scalar_t f, int64_t size) {
    return std::min<int64_t>(std::max<int64_t>(static_cast<int64_t>(std::floor(f)), 0), size - 2);
  };
  const scalar_t fx = px * (W - 1), fy = py * (H - 1), fz = pz * (D - 1);
  Cell<scalar_t> c;
  c.x0 = corner(fx, W), c.y0 = corner(fy, H), c.z0 = corner(fz, D);
  c.tx = fx - c.x0, c.ty = fy - c.y0, c.tz = fz - c.z0;
  return c;
}

template <typename scalar_t>
void trilinear_forward_kernel(at::TensorAccessor<scalar_t, 4> g, at::TensorAccessor<scalar_t, 2> p,
                              at::TensorAccessor<scalar_t, 2> out) {
  const int64_t D = g.size(0), H = g.size(1), W = g.size(2), C = g.size(3);
  for (int64_t n = 0; n < p.size(0); ++n) {
    const auto k = locate<scalar_t>(p[n][0], p[n][1], p[n][2], D, H, W);
    for (int64_t c = 0; c < C; ++c) {
      scalar_t acc = 0;
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          for (int e = 0; e < 2; ++e) {
            const scalar_t w = (a ? k.tz : 1 - k.tz) * (b ? k.ty : 1 - k.ty) * (e ? k.tx : 1 - k.tx);
            acc += w * g[k.z0 + a][k.y0 + b][k.x0 + e][c];
          }
      out[n][c] = acc;
    }
  }
}

template <typename scalar_t>
void trilinear_backward_kernel(at::TensorAccessor<scalar_t, 4> g, at::TensorAccessor<scalar_t, 2> p,
                               at::TensorAccessor<scalar_t, 2> go, at::TensorAccessor<scalar_t, 4> gg,
                               at::TensorAccessor<scalar_t, 2> gp) {
  const int64_t D = g.size(0), H = g.size(1), W = g.size(2), C = g.size(3);
  for (int64_t n = 0; n < p.size(0); ++n) {
    const auto k = locate<scalar_t>(p[n][0], p[n][1], p[n][2], D, H, W);
    const scalar_t wx[2] = {1 - k.tx, k.tx}, wy[2] = {1 - k.ty, k.ty}, wz[2] = {1 - k.tz, k.tz};
    scalar_t dx = 0, dy = 0, dz = 0;
    for (int64_t c = 0; c < C; ++c) {
      const scalar_t gout = go[n][c];
      if (gout == 0) continue;
      scalar_t v[2][2][2];
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b)
          for (int e = 0; e < 2; ++e) {
            v[a][b][e] = g[k.z0 + a][k.y0 + b][k.x0 + e][c];
            gg[k.z0 + a][k.y0 + b][k.x0 + e][c] += wz[a] * wy[b] * wx[e] * gout;
          }
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          dx += gout * wz[a] * wy[b] * (v[a][b][1] - v[a][b][0]);
          dy += gout * wz[a] * wx[b] * (v[a][1][b] - v[a][0][b]);
          dz += gout * wy[a] * wx[b] * (v[1][a][b] - v[0][a][b]);
        }
    }
    gp[n][0] = dx * (W - 1), gp[n][1] = dy * (H - 1), gp[n][2] = dz * (D - 1);
  }
}

// grid: channels x depth x height x width; pts: rows of (x, y, z) in [0, 1].
class TrilinearInterp : public torch::autograd::Function<TrilinearInterp> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& grid,
                               const torch::Tensor& pts) {
    TORCH_CHECK(grid.dim() == 4 && pts.dim() == 2 && pts.size(1) == 3, "trilinear_interp: bad shapes");
    TORCH_CHECK(grid.device().is_cpu() && pts.device().is_cpu(), "trilinear_interp: CPU tensors only");
    TORCH_CHECK(grid.scalar_type() == pts.scalar_type(), "trilinear_interp: dtype mismatch");
    auto grid_cl = grid.permute({1, 2, 3, 0}).contiguous();
    auto out = torch::empty({pts.size(0), grid.size(0)}, grid.options());
    AT_DISPATCH_FLOATING_TYPES(grid.scalar_type(), "trilinear_forward", [&] {
      trilinear_forward_kernel<scalar_t>(grid_cl.accessor<scalar_t, 4>(), pts.accessor<scalar_t, 2>(),
                                         out.accessor<scalar_t, 2>());
    });
    ctx->save_for_backward({grid, pts});
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto grid = saved[0], pts = saved[1];
    auto go = grad_outputs[0].contiguous().clone();  // EXPECT: tensor-unnecessary-clone
    auto grid_cl = grid.permute({1, 2, 3, 0}).contiguous();
    auto grad_cl = torch::zeros_like(grid_cl);
    auto grad_pts = torch::zeros_like(pts);
    AT_DISPATCH_FLOATING_TYPES(grid.scalar_type(), "trilinear_backward", [&] {
      trilinear_backward_kernel<scalar_t>(grid_cl.accessor<scalar_t, 4>(), pts.accessor<scalar_t, 2>(),
                                          go.accessor<scalar_t, 2>(), grad_cl.accessor<scalar_t, 4>(),
                                          grad_pts.accessor<scalar_t, 2>());
    });
    return {grad_cl.permute({3, 0, 1, 2}), grad_pts};
  }
};

torch::Tensor to_unit_cube(const torch::Tensor& pts, double lo, double hi) {
  // FACT: p = torch.rand(6, 3) * 2 - 1; u = p - (-1.0); u /= 2.0; assert is_copy_of(u, p)
  auto u = pts - lo;
  u /= (hi - lo);  // LOOKALIKE: tensor-alias-then-mutate -- pts - lo is a new tensor
  return u;
}

// Smooth colour field on [-1, 1]^3 that the grid has to learn.
torch::Tensor target_field(const torch::Tensor& x) {
  auto phase = torch::tensor({0.0, 2.1, 4.2}, x.options());
  return 0.5 + 0.5 * torch::sin(3.0 * x + phase) * torch::cos(2.0 * x.roll(1, 1));
}

struct GridConfig {
  int64_t channels = 8;
  std::vector<int64_t> resolutions{12, 40};
  int64_t hidden = 64;
};

constexpr double kEps = 1e-3;

class GridFieldImpl : public torch::nn::Module {
 public:
  explicit GridFieldImpl(const GridConfig& cfg) : cfg_(cfg) {
    for (size_t l = 0; l < cfg.resolutions.size(); ++l) {
      const int64_t r = cfg.resolutions[l];
      grids_.push_back(register_parameter("grid" + std::to_string(l), torch::randn({cfg.channels, r, r, r}) * 1e-2));
    }
    fc1_ = register_module("fc1", torch::nn::Linear(cfg.channels * static_cast<int64_t>(grids_.size()), cfg.hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(cfg.hidden, 3));
  }

  torch::Tensor forward(const torch::Tensor& u, double fine_weight) {
    const int64_t n = u.size(0);
    std::vector<torch::Tensor> feats;
    for (auto& g : grids_) feats.push_back(TrilinearInterp::apply(g, u));
    // FACT: f = torch.stack([torch.zeros(5, 8), torch.zeros(5, 8)]).permute(1, 0, 2); assert not is_contiguous(f) and is_copy_of(f.reshape(5, -1), f)
    auto feat = torch::stack(feats).permute({1, 0, 2}).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous

    // coarse-to-fine: fade the fine level in
    auto mask = torch::ones({feat.size(1)}).expand_as(feat);
    // FACT: m = torch.ones(16).expand(5, 16); assert raises(lambda: m.narrow(1, 8, 8).mul_(0.3), "more than one element")
    mask.narrow(1, cfg_.channels, feat.size(1) - cfg_.channels).mul_(fine_weight);  // EXPECT: tensor-inplace-on-expanded
    auto h = fc1_->forward(feat * mask);
    // FACT: l = torch.nn.Linear(3, 4); h = l(torch.randn(2, 3)); h.relu_(); h.sum().backward(); assert l.weight.grad is not None
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- addmm keeps its inputs, not its output
    auto rgb = torch::sigmoid(fc2_->forward(h));
    rgb.mul_(1.0 + 2.0 * kEps).sub_(kEps);  // EXPECT: tensor-inplace-on-saved
    return rgb;
  }

  // Zero the voxels whose features all fell below threshold.
  void prune(double threshold) {
    for (auto& g : grids_) {
      auto alive = g.abs().amax(0, true) > threshold;
      g.mul_(alive);  // EXPECT: tensor-inplace-on-leaf
    }
  }

  // One [1 1]/2 pass along depth on the fine level, to calm it down.
  void smooth_fine() {
    torch::NoGradGuard no_grad;
    auto& g = grids_.back();
    const int64_t D = g.size(1);
    // FACT: g = torch.arange(72.).view(2, 4, 3, 3); r = g.narrow(1, 1, 3) + g.narrow(1, 0, 3); g.narrow(1, 1, 3).add_(g.narrow(1, 0, 3)); assert not torch.equal(g.narrow(1, 1, 3), r)
    g.narrow(1, 1, D - 1).add_(g.narrow(1, 0, D - 1)).mul_(0.5);  // EXPECT: tensor-inplace-overlap
  }

  void load_level(size_t l, const torch::Tensor& volume) {
    torch::NoGradGuard no_grad;
    grids_[l].narrow(0, 0, volume.size(0)).copy_(volume);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  std::vector<torch::Tensor>& grids() { return grids_; }

 private:
  GridConfig cfg_;
  std::vector<torch::Tensor> grids_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(GridField);

// ---- checks of the hand-written op ------------------------------------------------

double check_forward_against_grid_sample() {
  namespace F = torch::nn::functional;
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto grid = torch::randn({4, 5, 6, 7}, opts);
  auto pts = torch::rand({32, 3}, opts);
  auto out = TrilinearInterp::apply(grid, pts);
  auto ref = F::grid_sample(grid.unsqueeze(0), (2.0 * pts - 1.0).view({1, 1, 1, -1, 3}),
                            F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder)
                                .align_corners(true));
  // FACT: r = torch.zeros(1, 4, 1, 1, 32); assert is_view_of(r.view(4, -1), r)
  ref = ref.view({grid.size(0), -1}).t();  // LOOKALIKE: tensor-view-non-contiguous -- grid_sample's output is contiguous
  // FACT: r = torch.zeros(1, 4, 1, 1, 32).view(4, -1).t(); assert raises(lambda: r.view(-1), "view size is not compatible")
  auto err = (out.view({-1}) - ref.view({-1})).abs();  // EXPECT: tensor-view-non-contiguous
  const int64_t worst = err.argmax().item<int64_t>();
  std::printf("forward: max |err| %.3g at element %ld\n", err[worst].item<double>(), static_cast<long>(worst));
  return err[worst].item<double>();
}

double check_grid_gradient(int64_t n_probe) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto grid = torch::randn({3, 4, 4, 4}, opts.requires_grad(true));
  auto pts = torch::rand({16, 3}, opts);
  auto out = TrilinearInterp::apply(grid, pts);
  auto w = torch::randn_like(out);
  const double eps = 1e-6;

  auto probe = grid.detach().view({-1});
  auto idx = torch::randperm(probe.numel(), torch::kLong).narrow(0, 0, n_probe);
  auto numeric = torch::empty({n_probe}, opts);
  for (int64_t k = 0; k < n_probe; ++k) {
    const int64_t i = idx[k].item<int64_t>();
    const double orig = probe[i].item<double>();
    probe[i] = orig + eps;  // EXPECT: tensor-inplace-on-detached
    const double fp = (TrilinearInterp::apply(probe.view(grid.sizes()), pts) * w).sum().item<double>();
    probe[i] = orig - eps;
    const double fm = (TrilinearInterp::apply(probe.view(grid.sizes()), pts) * w).sum().item<double>();
    probe[i] = orig;
    numeric[k] = (fp - fm) / (2.0 * eps);
  }

  (out * w).sum().backward();
  auto analytic = grid.grad().view({-1}).index_select(0, idx);
  return (analytic - numeric).abs().max().item<double>();
}

double check_point_gradient() {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto grid = torch::randn({3, 5, 5, 5}, opts);
  auto pts = (torch::rand({8, 3}, opts) * 0.8 + 0.1).requires_grad_();
  auto out = TrilinearInterp::apply(grid, pts);
  auto w = torch::randn_like(out);
  (out * w).sum().backward();

  const double eps = 1e-6;
  auto base = pts.detach();
  auto numeric = torch::zeros_like(base);
  for (int64_t i = 0; i < base.numel(); ++i) {
    auto p = base.clone();  // EXPECT: tensor-clone-in-loop
    p.view({-1})[i] += eps;
    const double fp = (TrilinearInterp::apply(grid, p) * w).sum().item<double>();
    p.view({-1})[i] -= 2.0 * eps;
    const double fm = (TrilinearInterp::apply(grid, p) * w).sum().item<double>();
    numeric.view({-1})[i] = (fp - fm) / (2.0 * eps);
  }
  return (pts.grad() - numeric).abs().max().item<double>();
}

}  // namespace tgrid

int main() {
  using namespace tgrid;
  torch::manual_seed(3);
  std::printf("grid-sample %.2e  d/dgrid %.2e  d/dpts %.2e\n", check_forward_against_grid_sample(),
              check_grid_gradient(24), check_point_gradient());

  GridConfig cfg;
  GridField model(cfg);

  // warm start: the first channels of the coarse level hold the target at the voxels
  const int64_t r = cfg.resolutions[0];
  auto lin = torch::linspace(-1.0, 1.0, r, torch::kFloat64);
  auto zyx = torch::meshgrid({lin, lin, lin}, "ij");
  // FACT: l = torch.linspace(-1, 1, 3); z, y, x = torch.meshgrid(l, l, l, indexing='ij'); s = torch.stack([x, y, z], -1); assert is_view_of(s.reshape(-1, 3), s)
  auto voxels = torch::stack({zyx[2], zyx[1], zyx[0]}, -1).reshape({-1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack writes a contiguous tensor, this is a view
  // FACT: c = torch.zeros(27, 3); v = c.t().reshape(3, 3, 3, 3); assert not is_contiguous(c.t()) and is_view_of(v, c)
  auto volume = target_field(voxels).t().reshape({3, r, r, r});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits a dimension, a view
  model->load_level(0, volume);

  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  const int64_t steps = 2000, batch = 4096;
  for (int64_t step = 0; step < steps; ++step) {
    auto x = torch::rand({batch, 3}) * 2.0 - 1.0;
    auto pred = model->forward(to_unit_cube(x, -1.0, 1.0), std::min(1.0, step / (0.5 * steps)));
    auto loss = torch::mse_loss(pred, target_field(x));
    opt.zero_grad();
    loss.backward();
    opt.step();
    for (auto& g : model->grids()) {
      g.data().clamp_(-1.0, 1.0);  // LOOKALIKE: tensor-inplace-on-detached -- bounds the parameter on purpose, between steps
    }
    if (step == steps / 2) model->prune(1e-3);
    if (step % 200 == 0) std::printf("step %4ld  mse %.5f\n", static_cast<long>(step), loss.item<double>());
  }

  auto before = model->grids().back().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- smooth_fine rewrites the grid in place next
  model->smooth_fine();
  std::printf("smoothing moved the fine grid by %.4f\n", (model->grids().back() - before).abs().mean().item<double>());

  std::vector<torch::Tensor> chunks;
  auto eval_pts = torch::rand({20000, 3}) * 2.0 - 1.0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& part : eval_pts.split(4096)) {
      chunks.push_back(model->forward(to_unit_cube(part, -1.0, 1.0), 1.0));  // LOOKALIKE: tensor-graph-kept-across-iterations -- inference under NoGradGuard
    }
  }
  auto eval_mse = torch::mse_loss(torch::cat(chunks), target_field(eval_pts));
  std::printf("eval mse %.5f\n", eval_mse.item<double>());
  return 0;
}
