// Exact GP regression with an ARD squared-exponential kernel. Hyperparameters are fitted by
// minimising the negative marginal log-likelihood with Adam; predictions (mean and variance)
// are computed in batches on the GPU from a cached Cholesky factor.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

struct GPConfig {
  int64_t n_train = 800;
  int64_t n_test = 4000;
  int64_t iters = 300;
  double lr = 0.05;
  double jitter = 1e-6;
  double min_noise = 1e-4;
  double obs_noise = 0.1;
  int64_t pred_batch = 1024;
  int64_t window = 20;
  double tol = 1e-4;
};

struct ARDKernelImpl : torch::nn::Module {
  explicit ARDKernelImpl(int64_t dims) {
    log_lengthscale = register_parameter("log_lengthscale", torch::zeros({dims}));
    log_outputscale = register_parameter("log_outputscale", torch::zeros({}));
  }

  torch::Tensor lengthscale() const { return log_lengthscale.exp(); }
  torch::Tensor outputscale() const { return log_outputscale.exp(); }

  torch::Tensor forward(const torch::Tensor& x1, const torch::Tensor& x2) {
    auto ls = lengthscale();
    auto a = x1 / ls;
    auto b = x2 / ls;
    auto sq = a.pow(2).sum(-1, true) - 2.0 * a.matmul(b.t()) + b.pow(2).sum(-1).unsqueeze(0);
    // FACT: a = torch.randn(4, 2, requires_grad=True); sq = a.pow(2).sum(-1, True) - 2.0 * a.matmul(a.t()) + a.pow(2).sum(-1).unsqueeze(0); sq.clamp_min_(0.0); sq.mul(-0.5).exp().sum().backward()
    sq.clamp_min_(0.0);  // LOOKALIKE: tensor-inplace-on-saved -- sq is the result of add/sub, which keep nothing of their result
    auto K = sq.mul(-0.5).exp_();
    // FACT: assert backward_fails(lambda: (lambda K: (K.mul_(torch.tensor(2.0, requires_grad=True)), K.sum().backward()))(torch.randn(3, 3, requires_grad=True).mul(-0.5).exp_()))
    K.mul_(outputscale());  // EXPECT: tensor-inplace-on-saved
    return K;
  }

  torch::Tensor diag(const torch::Tensor& x) const { return outputscale().expand({x.size(0)}); }

  torch::Tensor log_lengthscale, log_outputscale;
};
TORCH_MODULE(ARDKernel);

struct ExactGPImpl : torch::nn::Module {
  explicit ExactGPImpl(int64_t dims) : kernel(register_module("kernel", ARDKernel(dims))) {
    log_noise = register_parameter("log_noise", torch::full({}, std::log(0.1)));
    mean_const = register_parameter("mean_const", torch::zeros({}));
  }

  torch::Tensor noise() const { return log_noise.exp(); }

  // Negative marginal log-likelihood per data point, plus a log-normal hyperprior on the lengthscales.
  torch::Tensor neg_mll(const torch::Tensor& x, const torch::Tensor& y, double jitter) {
    const int64_t n = x.size(0);
    auto Kxx = kernel(x, x) + (noise() + jitter) * torch::eye(n);  // EXPECT: tensor-device-mismatch
    auto L = torch::linalg::cholesky(Kxx);
    auto r = (y - mean_const).unsqueeze(-1);
    auto alpha = torch::cholesky_solve(r, L);
    auto fit = (r * alpha).sum();
    auto logdet = 2.0 * L.diagonal().log().sum();
    auto nmll = 0.5 * (fit + logdet + static_cast<double>(n) * std::log(2.0 * M_PI));
    auto prior = 0.5 * (kernel->log_lengthscale - prior_loc).pow(2).sum() / (prior_scale * prior_scale);  // LOOKALIKE: tensor-device-mismatch -- prior_loc is a 0-dim CPU tensor, which may meet CUDA operands
    return (nmll + prior) / static_cast<double>(n);
  }

  void constrain_noise(double min_noise) {
    log_noise.clamp_min_(std::log(min_noise));  // EXPECT: tensor-inplace-on-leaf
  }

  ARDKernel kernel;
  torch::Tensor log_noise, mean_const;
  torch::Tensor prior_loc = torch::tensor(std::log(0.5));
  double prior_scale = 1.0;
};
TORCH_MODULE(ExactGP);

// ---------------------------------------------------------------------------
struct Scaler {
  torch::Tensor mean, scale;
  static Scaler fit(const torch::Tensor& x) { return {x.mean(0), x.std(0)}; }
  torch::Tensor apply(const torch::Tensor& x) const {
    return x.clone().sub_(mean).div_(scale);  // EXPECT: tensor-unnecessary-clone
  }
};

struct Dataset {
  torch::Tensor x, y;
};

Dataset make_data(int64_t n, double noise) {
  auto x = torch::rand({n, 2}) * 4.0 - 2.0;
  auto x0 = x.select(1, 0), x1 = x.select(1, 1);
  auto f = torch::sin(3.0 * x0) + 0.5 * torch::cos(2.0 * x1) * x0 + 0.1 * x1.pow(2);
  return {x, f + noise * torch::randn({n})};
}

torch::Tensor make_grid(int64_t nx, int64_t ny, double lo, double hi) {
  auto mesh = torch::meshgrid({torch::linspace(lo, hi, nx), torch::linspace(lo, hi, ny)}, "ij");
  // FACT: gx, gy = torch.meshgrid(torch.linspace(-2, 2, 4), torch.linspace(-2, 2, 5), indexing='ij'); assert not is_contiguous(gx) and is_copy_of(gx.flatten(), gx) and is_copy_of(gy.flatten(), gy)
  return torch::stack({mesh[0].flatten(), mesh[1].flatten()}, 1);  // EXPECT: tensor-reshape-non-contiguous
}

struct Posterior {
  torch::Tensor x, L, alpha;
};

Posterior fit_posterior(ExactGP& gp, const torch::Tensor& x, const torch::Tensor& y, double jitter) {
  torch::NoGradGuard no_grad;
  auto K = gp->kernel(x, x);
  K.diagonal().add_(gp->noise() + jitter);
  auto L = torch::linalg::cholesky(K);
  auto alpha = torch::cholesky_solve((y - gp->mean_const).unsqueeze(-1), L);
  return {x, L, alpha};
}

struct Prediction {
  torch::Tensor mean, var;
  double rmse = std::numeric_limits<double>::quiet_NaN();
};

Prediction predict(ExactGP& gp, const Posterior& post, const Scaler& xs, const torch::Tensor& test_x,
                   const torch::Tensor& targets, int64_t batch, torch::Device device) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> means, vars;
  double sse = 0.0;
  for (int64_t i = 0; i < test_x.size(0); i += batch) {
    const int64_t n = std::min(batch, test_x.size(0) - i);
    auto xb = xs.apply(test_x.narrow(0, i, n)).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice is moved each iteration
    auto Ks = gp->kernel(xb, post.x);
    auto mu = Ks.matmul(post.alpha).squeeze(-1) + gp->mean_const;
    auto v = torch::linalg_solve_triangular(post.L, Ks.t(), /*upper=*/false);
    auto var = gp->kernel->diag(xb) - v.pow(2).sum(0);
    // FACT: d = torch.tensor(1.5).expand(6); v = d - torch.rand(6); assert d.stride(0) == 0 and is_copy_of(v, d) and not raises(lambda: v.clamp_min_(1e-10))
    var.clamp_min_(1e-10);  // LOOKALIKE: tensor-inplace-on-expanded -- the subtraction produced a fresh dense tensor, not the expanded diagonal
    if (targets.defined()) {
      auto yb = targets.narrow(0, i, n).to(device);
      sse += (mu - yb).pow(2).sum().item<double>();  // EXPECT: tensor-sync-in-loop
    }
    means.push_back(mu);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard, no graph attached
    vars.push_back(var + gp->noise());
  }
  Prediction out{torch::cat(means), torch::cat(vars)};
  if (targets.defined()) out.rmse = std::sqrt(sse / static_cast<double>(test_x.size(0)));
  return out;
}

void clamp_hyperparameters(ExactGP& gp) {
  gp->kernel->log_lengthscale.detach().clamp_(-4.0, 4.0);  // LOOKALIKE: tensor-inplace-on-detached -- writes the parameter on purpose, after step() and before the next forward
  torch::NoGradGuard no_grad;
  gp->kernel->log_outputscale.clamp_(-6.0, 6.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  GPConfig cfg;

  auto train = make_data(cfg.n_train, cfg.obs_noise);
  auto test = make_data(cfg.n_test, cfg.obs_noise);
  auto train_x = train.x, train_y = train.y;

  const auto xs = Scaler::fit(train_x);
  auto y_mean = train_y.mean(), y_std = train_y.std();
  auto y = train_y;
  // FACT: a = torch.randn(6); m, s = a.mean(), a.std(); b = a; b.sub_(m).div_(s); assert shares_storage(a, b) and abs(a.mean().item()) < 1e-5
  y.sub_(y_mean).div_(y_std);  // EXPECT: tensor-alias-then-mutate
  auto y_dev = y.to(device);

  ExactGP gp(train_x.size(1));
  gp->to(device);
  torch::optim::Adam opt(gp->parameters(), torch::optim::AdamOptions(cfg.lr));

  std::vector<torch::Tensor> losses;
  const int64_t W = cfg.window;
  auto window = torch::full({W}, std::numeric_limits<float>::infinity(), torch::TensorOptions().device(device));
  for (int64_t it = 0; it < cfg.iters; ++it) {
    auto x = xs.apply(train_x).to(device);  // EXPECT: tensor-clone-in-loop
    opt.zero_grad();
    auto loss = gp->neg_mll(x, y_dev, cfg.jitter);
    loss.backward();
    opt.step();
    gp->constrain_noise(cfg.min_noise);
    clamp_hyperparameters(gp);

    losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    // FACT: w = torch.arange(6.0); assert raises(lambda: w[:5].copy_(w[1:]), "single memory location")
    window.narrow(0, 0, W - 1).copy_(window.narrow(0, 1, W - 1));  // EXPECT: tensor-inplace-overlap
    window[W - 1].copy_(loss.detach());
    if (it % 25 == 0) {
      std::printf("iter %4lld  nmll %.5f  noise %.4f\n", static_cast<long long>(it),
                  loss.item<double>(), gp->noise().item<double>());  // LOOKALIKE: tensor-sync-in-loop -- only every 25th iteration, for the log
      if (it >= W && (window.max() - window.min()).item<double>() < cfg.tol) break;
    }
  }

  auto post = fit_posterior(gp, xs.apply(train_x).to(device), y_dev, cfg.jitter);
  auto test_t = (test.y - y_mean) / y_std;
  auto pred = predict(gp, post, xs, test.x, test_t, cfg.pred_batch, device);
  const double baseline = (test.y - train_y.mean()).pow(2).mean().sqrt().item<double>() / y_std.item<double>();
  std::printf("test rmse (standardised) %.4f  vs constant baseline %.4f\n", pred.rmse, baseline);

  const int64_t nx = 60, ny = 60;
  auto grid = make_grid(nx, ny, -2.0, 2.0);
  auto gpred = predict(gp, post, xs, grid, torch::Tensor(), cfg.pred_batch, device);
  // FACT: m = torch.cat([torch.randn(1024), torch.randn(2576)]); assert is_view_of(m.reshape(60, 60), m)
  auto mean_grid = gpred.mean.reshape({nx, ny});  // LOOKALIKE: tensor-reshape-non-contiguous -- cat produced a dense tensor, so reshape is a view
  auto sd_grid = gpred.var.sqrt().reshape({nx, ny});
  std::printf("grid mean range [%.3f, %.3f], max sd %.3f\n", mean_grid.min().item<double>(),
              mean_grid.max().item<double>(), sd_grid.max().item<double>());
  std::printf("lengthscales:");
  auto ls = gp->kernel->lengthscale().detach().cpu();
  for (int64_t d = 0; d < ls.size(0); ++d) std::printf(" %.3f", ls[d].item<double>());  // LOOKALIKE: tensor-sync-in-loop -- ls was copied to the host once; item() on a CPU tensor waits for nothing
  std::printf("\n");
  return 0;
}
