// Kolmogorov-Arnold network with B-spline edge functions, fitted to a smooth
// two-variable target. Layers follow the "efficient KAN" formulation: a SiLU
// base branch plus a spline branch whose knots are refined from the data.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct KANConfig {
  int64_t grid_size = 5;
  int64_t spline_order = 3;
  double scale_noise = 0.1;
  double scale_base = 1.0;
  double scale_spline = 1.0;
  double grid_eps = 0.02;
  std::pair<double, double> grid_range{-1.0, 1.0};
};

struct TrainConfig {
  int64_t n_train = 1000;
  int64_t n_test = 1000;
  int64_t steps = 200;
  int64_t grid_update_every = 50;
  int64_t stop_grid_update = 150;
  double lamb = 1e-3;
  double lr = 1.0;
};

class KANLinearImpl : public torch::nn::Module {
 public:
  KANLinearImpl(int64_t in_features, int64_t out_features, KANConfig cfg)
      : in_(in_features), out_(out_features), cfg_(cfg) {
    const double h = (cfg_.grid_range.second - cfg_.grid_range.first) / cfg_.grid_size;
    auto knots = torch::arange(-cfg_.spline_order, cfg_.grid_size + cfg_.spline_order + 1,
                               torch::kFloat) * h + cfg_.grid_range.first;
    grid = register_buffer("grid", knots.expand({in_, -1}).contiguous());
    base_weight = register_parameter("base_weight", torch::empty({out_, in_}));
    spline_weight = register_parameter(
        "spline_weight", torch::empty({out_, in_, cfg_.grid_size + cfg_.spline_order}));
    spline_scaler = register_parameter("spline_scaler", torch::empty({out_, in_}));
    reset_parameters();
  }

  void reset_parameters() {
    torch::nn::init::kaiming_uniform_(base_weight, std::sqrt(5.0) * cfg_.scale_base);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
    {
      torch::NoGradGuard no_grad;
      auto noise = (torch::rand({cfg_.grid_size + 1, in_, out_}) - 0.5) * cfg_.scale_noise /
                   cfg_.grid_size;
      auto pts = grid.slice(1, cfg_.spline_order, -cfg_.spline_order).t();
      spline_weight.copy_(curve2coeff(pts, noise));
    }
    spline_scaler.fill_(cfg_.scale_spline);  // EXPECT: tensor-inplace-on-leaf
  }

  // Cox-de Boor recursion, evaluated for every input against its own knot row.
  torch::Tensor b_splines(const torch::Tensor& x) const {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == in_, "b_splines: bad input");
    auto xe = x.unsqueeze(-1);
    auto bases = ((xe >= grid.slice(1, 0, -1)) & (xe < grid.slice(1, 1))).to(x.scalar_type());
    for (int64_t k = 1; k <= cfg_.spline_order; ++k) {
      auto left = (xe - grid.slice(1, 0, -(k + 1))) /
                  (grid.slice(1, k, -1) - grid.slice(1, 0, -(k + 1))) * bases.slice(2, 0, -1);
      auto right = (grid.slice(1, k + 1) - xe) /
                   (grid.slice(1, k + 1) - grid.slice(1, 1, -k)) * bases.slice(2, 1);
      bases = left + right;
    }
    return bases;
  }

  // Least-squares spline coefficients reproducing y at the points x.
  torch::Tensor curve2coeff(const torch::Tensor& x, const torch::Tensor& y) const {
    auto A = b_splines(x).transpose(0, 1);
    auto B = y.transpose(0, 1);
    auto sol = std::get<0>(torch::linalg::lstsq(A, B, c10::nullopt, c10::nullopt));
    return sol.permute({2, 0, 1}).contiguous();
  }

  torch::Tensor scaled_spline_weight() const {
    return spline_weight * spline_scaler.unsqueeze(-1);
  }

  torch::Tensor forward(torch::Tensor x) {
    const auto batch = x.size(0);
    auto y = F::linear(torch::silu(x), base_weight);
    // FACT: x = torch.randn(4, 3, requires_grad=True) * 1; l = torch.nn.functional.silu(x).sum(); x.clamp_(-1, 1); assert backward_fails(lambda: l.backward())
    x.clamp_(cfg_.grid_range.first, cfg_.grid_range.second);  // EXPECT: tensor-inplace-on-saved
    auto bases = b_splines(x);
    // FACT: b = (torch.randn(8, 2, 1) - torch.randn(2, 11)) * torch.rand(8, 2, 11); assert is_contiguous(b) and is_view_of(b.view(8, -1), b)
    auto spline_in = bases.view({batch, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the recursion ends in out-of-place arithmetic, so bases is contiguous
    y.add_(F::linear(spline_in, scaled_spline_weight().view({out_, -1})));  // LOOKALIKE: tensor-inplace-on-saved -- linear saves its operands, not its result
    return y;
  }

  void update_grid(const torch::Tensor& x, double margin = 0.01) {
    torch::NoGradGuard no_grad;
    const auto batch = x.size(0);
    const auto G = cfg_.grid_size;
    const auto K = cfg_.spline_order;
    auto splines = b_splines(x).permute({1, 0, 2});
    auto coeff = scaled_spline_weight().permute({1, 2, 0});
    auto unreduced = torch::bmm(splines, coeff).permute({1, 0, 2});

    auto x_sorted = std::get<0>(torch::sort(x, 0)).clone();  // EXPECT: tensor-unnecessary-clone
    auto idx = torch::linspace(0, batch - 1, G + 1, torch::kFloat64).to(torch::kLong);
    auto grid_adaptive = x_sorted.index_select(0, idx.to(x.device()));
    auto lo = x_sorted.select(0, 0) - margin;
    auto step = (x_sorted.select(0, batch - 1) + margin - lo) / G;
    auto grid_uniform =
        torch::arange(G + 1, torch::dtype(torch::kFloat64).device(x.device())).unsqueeze(1) *
            step + lo;
    auto g = cfg_.grid_eps * grid_uniform + (1.0 - cfg_.grid_eps) * grid_adaptive;
    auto ext = torch::arange(1, K + 1, g.options()).unsqueeze(1) * step;
    auto new_grid = torch::cat({g.slice(0, 0, 1) - ext.flip(0), g, g.slice(0, G) + ext}, 0);
    // FACT: k = torch.arange(12.); g = k.expand(3, -1).contiguous(); assert is_copy_of(g, k) and g.stride() == (12, 1)
    // FACT: g = torch.zeros(3, 12); g.copy_(torch.randn(12, 3, dtype=torch.float64).t()); assert g.dtype == torch.float32
    grid.copy_(new_grid.t());  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-expanded -- the buffer was materialised by contiguous() in the constructor
    spline_weight.data().copy_(curve2coeff(x, unreduced));  // LOOKALIKE: tensor-inplace-on-detached -- refitting the parameter is the point, done under NoGradGuard
  }

  torch::Tensor regularization(double reg_act, double reg_entropy) const {
    auto l1 = scaled_spline_weight().abs().mean(-1);
    auto act = l1.sum();
    auto p = l1 / act;
    return reg_act * act - reg_entropy * (p * (p + 1e-12).log()).sum();
  }

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  torch::Tensor grid, base_weight, spline_weight, spline_scaler;

 private:
  int64_t in_, out_;
  KANConfig cfg_;
};
TORCH_MODULE(KANLinear);

class KANImpl : public torch::nn::Module {
 public:
  KANImpl(const std::vector<int64_t>& widths, const KANConfig& cfg) {
    for (size_t i = 0; i + 1 < widths.size(); ++i) {
      layers.push_back(register_module("layer" + std::to_string(i),
                                       KANLinear(widths[i], widths[i + 1], cfg)));
    }
  }

  torch::Tensor forward(torch::Tensor x, bool update_grid = false) {
    for (auto& layer : layers) {
      if (update_grid) layer->update_grid(x);
      x = layer->forward(x);
    }
    return x;
  }

  torch::Tensor regularization(double reg_act = 1.0, double reg_entropy = 1.0) const {
    auto total = torch::zeros({}, layers.front()->spline_weight.options());
    for (const auto& layer : layers) total = total + layer->regularization(reg_act, reg_entropy);
    return total;
  }

  std::vector<KANLinear> layers;
};
TORCH_MODULE(KAN);

// L1 mass of the edges leaving each input, used to decide which inputs to prune.
torch::Tensor input_importance(const KANLinear& layer) {
  torch::NoGradGuard no_grad;
  auto w = layer->scaled_spline_weight().abs();
  // FACT: w = torch.randn(3, 4, 8); assert is_copy_of(w.permute(1, 0, 2).reshape(4, -1), w)
  auto per_input = w.permute({1, 0, 2}).reshape({layer->in_features(), -1});  // EXPECT: tensor-reshape-non-contiguous
  return per_input.mean(1) / per_input.mean();
}

// phi_{j->i}(x_j): one learned edge function sampled at the data points of input j.
torch::Tensor edge_response(const KANLinear& layer, const torch::Tensor& x, int64_t j,
                            int64_t i) {
  torch::NoGradGuard no_grad;
  // FACT: x = torch.randn(16, 3); assert is_view_of(x.select(1, 0).reshape(-1, 1), x)
  auto xj = x.select(1, j).reshape({-1, 1});  // LOOKALIKE: tensor-reshape-non-contiguous -- adding a unit dim to a strided column keeps it a view
  auto basis = layer->b_splines(x).select(1, j);
  auto coef = layer->scaled_spline_weight().select(0, i).select(0, j);
  return layer->base_weight.select(0, i).select(0, j) * torch::silu(xj) +
         basis.matmul(coef.unsqueeze(1));
}

void export_grids(const KAN& model, const std::string& path) {
  std::ofstream out(path);
  for (size_t l = 0; l < model->layers.size(); ++l) {
    auto g = model->layers[l]->grid.to(torch::kCPU);
    // FACT: g = torch.randn(2, 12); assert raises(lambda: g.t().view(-1), "view size is not compatible")
    auto knots = g.t().view({-1});  // EXPECT: tensor-view-non-contiguous
    auto acc = knots.accessor<float, 1>();
    out << "layer " << l << " inputs " << g.size(0) << "\n";
    for (int64_t k = 0; k < knots.size(0); ++k) out << acc[k] << ((k + 1) % g.size(0) ? ' ' : '\n');
    out << "\n";
  }
}

struct Dataset {
  torch::Tensor x, y;
};

// f(x1, x2) = exp(sin(pi x1) + x2^2), sampled on [0, 1]^2 in double precision.
Dataset make_dataset(int64_t n) {
  auto x = torch::rand({n, 2}, torch::kFloat64);
  auto u = x * 2 - 1;
  auto y = torch::exp(torch::sin(M_PI * u.select(1, 0)) + u.select(1, 1).pow(2)).unsqueeze(1);
  return {x, y.to(torch::kFloat)};
}

torch::Tensor to_grid_range(const torch::Tensor& x_raw) {
  auto x = x_raw.to(torch::kFloat);
  // FACT: r = torch.rand(8, 2, dtype=torch.float64); assert is_copy_of(r.to(torch.float32), r)
  x.mul_(2).sub_(1);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) from double allocates, x_raw is untouched
  return x;
}

int main() {
  torch::manual_seed(0);
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  TrainConfig tc;
  KANConfig kc;

  auto train = make_dataset(tc.n_train);
  auto test = make_dataset(tc.n_test);
  auto x_train = to_grid_range(train.x);
  auto x_test = to_grid_range(test.x);
  auto y_train = train.y;
  auto y_mean = y_train.mean();
  auto y_std = y_train.std();
  auto y_scaled = y_train.reshape({-1, 1});
  // FACT: y = torch.randn(8, 1); s = y.reshape(-1, 1); s.sub_(1); assert is_view_of(s, y)
  y_scaled.sub_(y_mean).div_(y_std);  // EXPECT: tensor-alias-then-mutate
  auto y_dev = y_scaled.to(device);

  KAN model(std::vector<int64_t>{2, 5, 1}, kc);
  model->to(device);
  torch::optim::LBFGS opt(model->parameters(),
                          torch::optim::LBFGSOptions(tc.lr).history_size(10).line_search_fn(
                              "strong_wolfe"));

  std::vector<torch::Tensor> loss_history;
  auto x_probe = torch::linspace(-1, 1, 64).unsqueeze(1).repeat({1, 2}).to(device);
  for (int64_t step = 0; step < tc.steps; ++step) {
    const bool log_now = step % 20 == 0;
    if (step > 0 && step % tc.grid_update_every == 0 && step < tc.stop_grid_update) {
      torch::NoGradGuard no_grad;
      auto before = model->forward(x_probe.clone());  // LOOKALIKE: tensor-unnecessary-clone -- forward clamps its input in place and x_probe is reused below
      auto subset = torch::randperm(tc.n_train).slice(0, 0, 512);
      model->forward(x_train.index_select(0, subset).to(device), /*update_grid=*/true);
      auto after = model->forward(x_probe.clone());
      std::cout << "grid refined, max drift " << (after - before).abs().max().item<float>()
                << "\n";
    }
    double rmse = 0.0;
    auto closure = [&]() {
      opt.zero_grad();
      auto xb = x_train.to(device);  // EXPECT: tensor-clone-in-loop
      auto pred = model->forward(xb);
      auto loss = F::mse_loss(pred, y_dev) + tc.lamb * model->regularization();
      if (log_now) {
        auto shown = pred.detach();
        // FACT: p = torch.randn(4, 1, requires_grad=True) * 1; l = torch.nn.functional.mse_loss(p, torch.zeros(4, 1)); d = p.detach(); d.mul_(2); assert backward_fails(lambda: l.backward())
        shown.mul_(y_std.item<float>()).add_(y_mean.item<float>());  // EXPECT: tensor-inplace-on-detached
        rmse = (shown.cpu() - train.y).pow(2).mean().sqrt().item<double>();
      }
      loss.backward();
      return loss;
    };
    auto loss = opt.step(closure);
    loss_history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (log_now) {
      std::cout << "step " << step << " loss " << loss.item<float>() << " rmse " << rmse << "\n";
    }
  }

  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t bs = 256;
  auto preds = torch::empty({tc.n_test, 1}, torch::kFloat64);
  auto sq_err = torch::zeros({}, torch::kFloat64);
  for (int64_t i = 0; i < tc.n_test; i += bs) {
    const auto end = std::min(i + bs, tc.n_test);
    auto pred = model->forward(x_test.slice(0, i, end).to(device)).cpu() * y_std + y_mean;
    preds.slice(0, i, end).copy_(pred);  // LOOKALIKE: tensor-copy-narrowing -- float into a double buffer widens
    sq_err += (pred - test.y.slice(0, i, end)).pow(2).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluation runs under NoGradGuard, no graph is built
  }
  std::cout << "test rmse " << std::sqrt(sq_err.item<double>() / tc.n_test) << "\n";

  auto losses = torch::stack(loss_history).cpu();
  std::cout << "final loss " << losses[-1].item<float>() << "\n";
  for (size_t l = 0; l < model->layers.size(); ++l) {
    std::cout << "layer " << l << " importance " << input_importance(model->layers[l]) << "\n";
  }
  auto phi = edge_response(model->layers[0], x_test.to(device), 0, 0);
  std::cout << "phi_00 range [" << phi.min().item<float>() << ", " << phi.max().item<float>()
            << "]\n";
  export_grids(model, "kan_grids.txt");
  return 0;
}
