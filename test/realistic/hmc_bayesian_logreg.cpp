// Hamiltonian Monte Carlo for Bayesian logistic regression.
//
// Several chains run side by side on one device. Warm start from the MAP estimate,
// leapfrog integration with a diagonal mass matrix, Metropolis correction,
// dual-averaging step-size adaptation (Hoffman & Gelman 2014) during warmup,
// then split-R-hat, posterior quantiles and the test-set predictive likelihood.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

struct HMCConfig {
  int64_t n_obs = 2000;
  int64_t n_features = 12;
  int64_t chains = 4;
  int64_t warmup = 500;
  int64_t draws = 1000;
  int64_t leapfrog_steps = 16;
  int64_t thin = 5;
  double init_step = 0.05;
  double target_accept = 0.8;
  double prior_sigma = 2.5;
  int64_t map_iters = 300;
  double map_lr = 0.05;
};

struct Dataset {
  torch::Tensor X, y;
};

Dataset make_data(const HMCConfig& cfg) {
  auto w_true = 1.5 * torch::randn({cfg.n_features});
  auto X = 2.0 * torch::randn({cfg.n_obs, cfg.n_features}) + 0.5;
  X.select(1, 0).fill_(1.0);  // intercept column
  auto y = torch::bernoulli(torch::sigmoid(X.matmul(w_true) / 2.0));
  return {X, y};
}

// HMC runs in float64; standardise every column except the intercept.
Dataset standardize(const Dataset& raw) {
  // FACT: X = torch.randn(50, 4); Xs = X.to(torch.float64); c = Xs.narrow(1, 1, 3); c.sub_(c.mean(0)).div_(c.std(0)); assert is_copy_of(Xs, X) and is_view_of(c, Xs)
  auto Xs = raw.X.to(torch::kFloat64);
  auto cols = Xs.narrow(1, 1, Xs.size(1) - 1);
  auto mu = cols.mean(0);
  auto sd = cols.std(0);
  cols.sub_(mu).div_(sd);  // LOOKALIKE: tensor-alias-then-mutate -- Xs is a fresh float64 copy; raw.X is untouched
  return {Xs, raw.y.to(torch::kFloat64)};
}

struct BayesLogRegImpl : torch::nn::Module {
  BayesLogRegImpl(int64_t d, double prior_sigma)
      : prior_var(torch::tensor(prior_sigma * prior_sigma, torch::kFloat64)) {
    w = register_parameter("w", torch::zeros({d}, torch::kFloat64));
  }

  // Log joint density, one value per row of q.
  torch::Tensor log_prob(const torch::Tensor& q, const torch::Tensor& X, const torch::Tensor& y) {
    auto logits = X.matmul(q.t());
    auto p = torch::sigmoid(logits);
    // FACT: q = torch.randn(2, 3, dtype=torch.float64, requires_grad=True); p = torch.sigmoid(torch.randn(5, 3, dtype=torch.float64) @ q.t()); p.clamp_(1e-7, 1 - 1e-7); assert backward_fails(lambda: p.log().sum().backward())
    p.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
    auto yy = y.unsqueeze(1);
    auto loglik = (yy * p.log() + (1.0 - yy) * (1.0 - p).log()).sum(0);
    auto logprior = -0.5 * q.pow(2).sum(1) / prior_var;  // LOOKALIKE: tensor-device-mismatch -- prior_var is a 0-dim CPU tensor, allowed with CUDA operands
    return loglik + logprior;
  }

  torch::Tensor log_joint(const torch::Tensor& X, const torch::Tensor& y) {
    return log_prob(w.unsqueeze(0), X, y).squeeze(0);
  }

  torch::Tensor w;
  torch::Tensor prior_var;
};
TORCH_MODULE(BayesLogReg);

// Potential energy U(q) = -log p(q | data) and its gradient.
struct Potential {
  BayesLogReg model;
  torch::Tensor X, y;

  std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& q) {
    auto qv = q.detach().requires_grad_(true);  // LOOKALIKE: tensor-inplace-on-detached -- requires_grad_ only flags the new leaf, no data is written
    auto U = -model->log_prob(qv, X, y);
    auto g = torch::autograd::grad({U.sum()}, {qv})[0];
    return {U.detach(), g};
  }
};

torch::Tensor kinetic(const torch::Tensor& p, const torch::Tensor& inv_mass) {
  return 0.5 * (p.pow(2) * inv_mass).sum(1);
}

struct Proposal {
  torch::Tensor q, p, U, grad;
};

Proposal leapfrog(Potential& potential, const torch::Tensor& q0, const torch::Tensor& p0,
                  const torch::Tensor& grad0, const torch::Tensor& inv_mass, double eps,
                  int64_t steps) {
  torch::Tensor q = q0.clone();  // LOOKALIKE: tensor-unnecessary-clone -- working buffer written at every leapfrog step; q0 stays the fallback on rejection
  torch::Tensor p = p0;
  // FACT: p0 = torch.randn(4, 3); p = p0; p.add_(torch.randn(4, 3), alpha=-0.025); assert shares_storage(p, p0) and p is p0
  p.add_(grad0, -0.5 * eps);  // EXPECT: tensor-alias-then-mutate
  torch::Tensor U, grad = grad0;
  for (int64_t l = 0; l < steps; ++l) {
    q.add_(p * inv_mass, eps);
    std::tie(U, grad) = potential(q);
    if (l + 1 < steps) p.add_(grad, -eps);
  }
  p.add_(grad, -0.5 * eps);
  return {q, p, U, grad};
}

struct DualAveraging {
  DualAveraging(double eps0, double target) : mu(std::log(10.0 * eps0)), delta(target) {}

  double update(double accept_prob) {
    ++t;
    const double eta = 1.0 / (t + t0);
    h_bar = (1.0 - eta) * h_bar + eta * (delta - accept_prob);
    const double log_eps = mu - std::sqrt(static_cast<double>(t)) / gamma * h_bar;
    const double w = std::pow(static_cast<double>(t), -kappa);
    log_eps_bar = w * log_eps + (1.0 - w) * log_eps_bar;
    return std::exp(log_eps);
  }
  double final_step() const { return std::exp(log_eps_bar); }

  double mu, delta;
  double log_eps_bar = 0.0, h_bar = 0.0;
  double gamma = 0.05, t0 = 10.0, kappa = 0.75;
  int64_t t = 0;
};

struct SampleResult {
  torch::Tensor draws;
  std::vector<torch::Tensor> energy;
  double accept_rate = 0.0;
  double step_size = 0.0;
};

SampleResult run_hmc(Potential& potential, const torch::Tensor& q_init, const HMCConfig& cfg) {
  auto opts = q_init.options();
  const int64_t C = cfg.chains, d = q_init.size(1);
  torch::Tensor q = q_init;
  auto [U, grad] = potential(q);
  torch::Tensor inv_mass = torch::ones({1}, opts).expand({d});  // unit metric until warmup ends
  auto w_sum = torch::zeros({d}, opts), w_sq = torch::zeros({d}, opts);
  int64_t w_count = 0, n_accept = 0;
  DualAveraging adapt(cfg.init_step, cfg.target_accept);
  double eps = cfg.init_step;

  SampleResult res;
  res.draws = torch::empty({cfg.draws, C, d}, torch::TensorOptions().device(opts.device()));
  for (int64_t it = 0; it < cfg.warmup + cfg.draws; ++it) {
    // FACT: m = torch.rand(3).rsqrt().expand(4, 3); assert m.stride(0) == 0 and not raises(lambda: torch.randn(4, 3).mul_(m))
    auto p0 = torch::randn({C, d}, torch::kFloat64).mul_(inv_mass.rsqrt().expand({C, d}));  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read, the write goes to the fresh randn
    auto prop = leapfrog(potential, q, p0, grad, inv_mass, eps, cfg.leapfrog_steps);
    auto H0 = U + kinetic(p0, inv_mass);
    auto H1 = prop.U + kinetic(prop.p, inv_mass);
    auto log_ratio = torch::nan_to_num(H0 - H1, -1e10);
    auto accept_prob = log_ratio.clamp_max(0.0).exp();
    auto accept = torch::rand({C}, opts).log() < log_ratio;
    q = torch::where(accept.unsqueeze(1), prop.q, q);
    grad = torch::where(accept.unsqueeze(1), prop.grad, grad);
    U = torch::where(accept, prop.U, U);
    res.energy.push_back(H1);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the potential returns detached energies, no graph rides along

    if (it < cfg.warmup) {
      eps = adapt.update(accept_prob.mean().item<double>());  // LOOKALIKE: tensor-sync-in-loop -- the host needs it to choose the next step size
      if (it >= cfg.warmup / 2) {
        w_sum += q.sum(0);
        w_sq += q.pow(2).sum(0);
        w_count += C;
      }
      if (it + 1 == cfg.warmup) {
        auto var = w_sq / w_count - (w_sum / w_count).pow(2);
        // FACT: assert raises(lambda: torch.ones(1, dtype=torch.float64).expand(3).copy_(torch.rand(3, dtype=torch.float64)), "more than one element")
        inv_mass.copy_(var.clamp_min(1e-3));  // EXPECT: tensor-inplace-on-expanded
        eps = adapt.final_step();
      }
    } else {
      n_accept += accept.sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      res.draws.select(0, it - cfg.warmup).copy_(q);  // EXPECT: tensor-copy-narrowing
    }
  }
  res.accept_rate = static_cast<double>(n_accept) / (cfg.draws * C);
  res.step_size = eps;
  return res;
}

// Split-R-hat per coordinate: each chain cut in two halves.
torch::Tensor split_rhat(const torch::Tensor& draws) {
  const auto S = draws.size(0), C = draws.size(1), d = draws.size(2);
  const auto half = S / 2;
  // FACT: s = torch.randn(40, 4, 3); assert is_copy_of(s.permute(2, 1, 0).reshape(3, 8, 20), s)
  auto chains = draws.narrow(0, 0, 2 * half).permute({2, 1, 0}).reshape({d, 2 * C, half});  // EXPECT: tensor-reshape-non-contiguous
  auto W = chains.var(2).mean(1);
  auto B = half * chains.mean(2).var(1);
  auto var_plus = (half - 1.0) / half * W + B / half;
  return (var_plus / W).sqrt();
}

torch::Tensor posterior_quantiles(const torch::Tensor& draws, const std::vector<double>& levels) {
  const auto d = draws.size(2);
  // FACT: s = torch.randn(40, 4, 3); assert is_view_of(s.permute(2, 0, 1).reshape(3, -1), s)
  auto pooled = draws.permute({2, 0, 1}).reshape({d, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- draw and chain dims stay adjacent in memory order, so this is a view
  auto q = torch::tensor(levels, draws.options());
  return torch::quantile(pooled, q, 1).t();
}

torch::Tensor find_map(BayesLogReg& model, const Dataset& data, const HMCConfig& cfg) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.map_lr));
  std::vector<torch::Tensor> map_trace;
  for (int64_t it = 0; it < cfg.map_iters; ++it) {
    opt.zero_grad();
    auto loss = -model->log_joint(data.X, data.y) / data.X.size(0);
    loss.backward();
    opt.step();
    map_trace.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
  }
  std::cout << "MAP objective " << map_trace.front().item<double>() << " -> "
            << map_trace.back().item<double>() << "\n";
  return model->w.detach().clone();
}

// Mean test log predictive density, averaging the likelihood over thinned draws.
double predictive_log_lik(BayesLogReg& model, const torch::Tensor& draws, const Dataset& test,
                          torch::Device device, int64_t thin) {
  torch::NoGradGuard no_grad;
  auto flat = draws.reshape({-1, draws.size(2)});
  auto lik_sum = torch::zeros({test.X.size(0)}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  auto y = test.y.to(device);
  int64_t used = 0;
  for (int64_t s = 0; s < flat.size(0); s += thin) {
    model->w.copy_(flat[s]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    auto Xd = test.X.to(device);  // EXPECT: tensor-clone-in-loop
    auto probs = torch::sigmoid(Xd.matmul(model->w));
    probs.clamp_(1e-7, 1.0 - 1e-7);  // LOOKALIKE: tensor-inplace-on-saved -- NoGradGuard, nothing is saved for backward
    lik_sum += torch::where(y > 0.5, probs, 1.0 - probs);
    ++used;
  }
  return (lik_sum / used).log().mean().item<double>();
}

int main() {
  torch::manual_seed(7);
  HMCConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto data = standardize(make_data(cfg));
  const int64_t n_train = cfg.n_obs * 4 / 5;
  Dataset train{data.X.narrow(0, 0, n_train).to(device), data.y.narrow(0, 0, n_train).to(device)};
  Dataset test{data.X.narrow(0, n_train, cfg.n_obs - n_train),
               data.y.narrow(0, n_train, cfg.n_obs - n_train)};

  BayesLogReg model(cfg.n_features, cfg.prior_sigma);
  model->to(device);
  auto w_map = find_map(model, train, cfg);

  Potential potential{model, train.X, train.y};
  auto q_init = w_map.unsqueeze(0).repeat({cfg.chains, 1}) +
                0.1 * torch::randn({cfg.chains, cfg.n_features}, w_map.options());
  auto res = run_hmc(potential, q_init, cfg);
  std::cout << "accept rate " << res.accept_rate << " step size " << res.step_size << "\n";

  auto rhat = split_rhat(res.draws);
  std::cout << "max split R-hat " << rhat.max().item<double>() << "\n";
  auto qs = posterior_quantiles(res.draws, {0.05, 0.5, 0.95}).cpu();
  for (int64_t j = 0; j < qs.size(0); ++j) {
    std::cout << "w[" << j << "] median " << qs[j][1].item<double>() << " 90% CI ["
              << qs[j][0].item<double>() << ", " << qs[j][2].item<double>() << "]\n";
  }
  std::cout << "test log predictive density "
            << predictive_log_lik(model, res.draws, test, device, cfg.thin) << "\n";

  // keep the posterior mean in the module for downstream point predictions
  model->w.copy_(res.draws.flatten(0, 1).mean(0));  // EXPECT: tensor-inplace-on-leaf
  torch::save(model, "bayes_logreg_posterior_mean.pt");
  return 0;
}
