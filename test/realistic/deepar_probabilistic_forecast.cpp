// DeepAR (Salinas et al., 2020) probabilistic forecaster for a panel of related demand series.
// An autoregressive LSTM reads each series' previous value, scaled by that series' mean level over
// the conditioning range, together with calendar covariates and a learned series embedding, and
// emits the mean and scale of a Gaussian for the next value. Training is teacher-forced over
// context + horizon; forecasting draws sample paths ancestrally, feeding every draw back in, and
// summarises them by quantiles. A rolling-origin backtest scores consecutive forecast windows.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DeepArConfig {
  int64_t num_series = 370, num_covariates = 4, embed_dim = 20, hidden = 40, layers = 3;
  int64_t context_len = 168, horizon = 24, num_samples = 200, epochs = 40, log_every = 200, windows = 7;
  double lr = 1e-3, dropout = 0.1, min_sigma = 1e-3, max_sigma = 1e3, grad_clip = 10.0, service_level = 0.9;
  bool softplus_scale = false; // exp link by default; softplus for intermittent series
  std::vector<double> quantiles{0.1, 0.5, 0.9};
};

// A batch of windows: target [B, T] float in original units, covariates [B, T, C] float,
// series_id [B] int64, with T = context_len + horizon.
struct SeriesBatch {
  torch::Tensor target, covariates, series_id;
};

struct GaussianOut {
  torch::Tensor mu, sigma;
};

using LstmState = std::tuple<torch::Tensor, torch::Tensor>;

struct DeepArImpl : nn::Module {
  explicit DeepArImpl(const DeepArConfig &cfg) : cfg_(cfg) {
    embed = register_module("embed", nn::Embedding(cfg.num_series, cfg.embed_dim));
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(1 + cfg.num_covariates + cfg.embed_dim, cfg.hidden)
                                                .num_layers(cfg.layers)
                                                .dropout(cfg.dropout)
                                                .batch_first(true)));
    mu_head = register_module("mu_head", nn::Linear(cfg.hidden, 1));
    sigma_head = register_module("sigma_head", nn::Linear(cfg.hidden, 1));
    init_gate_biases();
  }

  // Forget-gate bias 1 (PyTorch orders the gates i, f, g, o), recurrent biases 0.
  void init_gate_biases() {
    const auto H = cfg_.hidden;
    for (auto &p : lstm->named_parameters()) {
      if (p.key().find("bias_ih") != std::string::npos) {
        // FACT: l = torch.nn.LSTM(6, 4); assert raises(lambda: l.bias_ih_l0.narrow(0, 4, 4).fill_(1.0), "a view of a leaf Variable that requires grad")
        p.value().narrow(0, H, H).fill_(1.0); // EXPECT: tensor-inplace-on-leaf
      } else if (p.key().find("bias_hh") != std::string::npos) {
        torch::NoGradGuard no_grad;
        p.value().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
      }
    }
  }

  // Positive scale from the raw head output.
  torch::Tensor positive_scale(const torch::Tensor &raw) {
    if (cfg_.softplus_scale) {
      auto s = F::softplus(raw);
      // FACT: r = torch.randn(6, 1, requires_grad=True); s = torch.nn.functional.softplus(r); s.add_(1e-3); s.sum().backward(); assert r.grad is not None
      s.add_(cfg_.min_sigma); // LOOKALIKE: tensor-inplace-on-saved -- softplus saves its input for backward, not its result
      return s;
    }
    auto s = torch::exp(raw);
    // FACT: r = torch.randn(6, 1, requires_grad=True); s = torch.exp(r); s.clamp_(1e-3, 1e3); assert backward_fails(lambda: s.sum().backward())
    s.clamp_(cfg_.min_sigma, cfg_.max_sigma); // EXPECT: tensor-inplace-on-saved
    return s;
  }

  // LSTM input for every step: [previous scaled value, covariates, series embedding].
  torch::Tensor inputs(const torch::Tensor &prev, const torch::Tensor &cov, const torch::Tensor &ids) {
    auto e = embed(ids).unsqueeze(1).expand({-1, cov.size(1), -1});
    return torch::cat({prev.unsqueeze(-1), cov, e}, -1);
  }

  // Teacher-forced pass over whole windows: prev [B, T] is z shifted right by one step.
  GaussianOut forward(const torch::Tensor &prev, const torch::Tensor &cov, const torch::Tensor &ids) {
    auto out = std::get<0>(lstm->forward(inputs(prev, cov, ids))); // [B, T, H]
    const auto B = out.size(0), T = out.size(1);
    // FACT: l = torch.nn.LSTM(6, 4, num_layers=2, batch_first=True); o, _ = l(torch.randn(3, 5, 6)); assert not is_contiguous(o) and is_copy_of(o.reshape(15, 4), o)
    auto h = out.reshape({B * T, cfg_.hidden}); // EXPECT: tensor-reshape-non-contiguous
    // FACT: y = torch.nn.Linear(4, 1)(torch.randn(15, 4)); assert is_view_of(y.view(3, 5), y)
    auto mu = mu_head(h).view({B, T}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    return {mu, positive_scale(sigma_head(h)).view({B, T})};
  }

  // One autoregressive step for all sample paths: x [N, 1 + C + E]; the state is carried along.
  GaussianOut step(const torch::Tensor &x, LstmState &state) {
    auto res = lstm->forward(x.unsqueeze(1), state);
    state = std::get<1>(res);
    // FACT: l = torch.nn.LSTM(6, 4, num_layers=2, batch_first=True); o, _ = l(torch.randn(8, 1, 6)); assert is_view_of(o.view(8, 4), o)
    auto h = std::get<0>(res).view({x.size(0), cfg_.hidden}); // LOOKALIKE: tensor-view-non-contiguous -- one time step: the dim the batch_first transpose swaps has size 1
    return {mu_head(h).squeeze(-1), positive_scale(sigma_head(h)).squeeze(-1)};
  }

  DeepArConfig cfg_;
  nn::Embedding embed{nullptr};
  nn::LSTM lstm{nullptr};
  nn::Linear mu_head{nullptr}, sigma_head{nullptr};
};
TORCH_MODULE(DeepAr);

// nu = 1 + mean |z| over the conditioning range, [B, 1]: each series is modelled in units of its level.
torch::Tensor series_scale(const torch::Tensor &target, int64_t context_len) {
  // FACT: t = torch.rand(4, 10); s = t.narrow(1, 0, 6).abs().mean(1, keepdim=True); s.add_(1.0); assert is_copy_of(s, t)
  return target.narrow(1, 0, context_len).abs().mean(1, /*keepdim=*/true).add_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- mean made a new tensor, written before anyone else holds it
}

// Teacher-forcing targets in scaled units.
torch::Tensor scaled_target(const SeriesBatch &batch, const torch::Tensor &scale) {
  auto z = batch.target.to(torch::kFloat);
  // FACT: t = torch.rand(4, 6) * 50; z = t.to(torch.float32); z.div_(t.mean(1, keepdim=True) + 1); assert shares_storage(z, t)
  z.div_(scale); // EXPECT: tensor-alias-then-mutate
  return z;
}

// Elementwise negative log-likelihood of z under N(mu, sigma^2).
torch::Tensor gaussian_nll(const torch::Tensor &z, const torch::Tensor &mu, const torch::Tensor &sigma) {
  auto resid = (z - mu) / sigma;
  return torch::log(sigma) + 0.5 * resid.pow(2) + 0.5 * std::log(2.0 * M_PI);
}

class DeepArTrainer {
public:
  DeepArTrainer(DeepAr model, const DeepArConfig &cfg)
      : model_(std::move(model)), cfg_(cfg), opt_(model_->parameters(), torch::optim::AdamOptions(cfg.lr)) {}

  void fit(const std::vector<SeriesBatch> &train) {
    const torch::Device device(torch::kCUDA);
    model_->to(device);
    int64_t step = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      model_->train();
      double running = 0;
      auto covered = torch::zeros({}, torch::TensorOptions().device(device));
      for (const auto &batch : train) {
        auto scale = series_scale(batch.target, cfg_.context_len);
        auto z = scaled_target(batch, scale).to(device);
        auto cov = batch.covariates.to(device), ids = batch.series_id.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
        const auto B = z.size(0), T = z.size(1);
        auto prev = F::pad(z.narrow(1, 0, T - 1), F::PadFuncOptions({1, 0}));
        auto out = model_->forward(prev, cov, ids);
        auto nll = gaussian_nll(z, out.mu, out.sigma);
        // The first step has no previous value to condition on: it does not count.
        auto weight = torch::ones({B, T});
        weight.narrow(1, 0, 1).zero_();
        auto loss = (nll * weight).sum() / weight.sum(); // EXPECT: tensor-device-mismatch
        // Share of targets inside the central 90% interval, for monitoring.
        auto half_width = 1.645 * out.sigma.detach();
        covered += ((z - out.mu.detach()).abs() <= half_width).to(torch::kFloat).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison of detached values has no graph
        opt_.zero_grad();
        loss.backward();
        nn::utils::clip_grad_norm_(model_->parameters(), cfg_.grad_clip);
        opt_.step();
        nll_trace_.push_back(nll.mean()); // EXPECT: tensor-graph-kept-across-iterations
        running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
        if (++step % cfg_.log_every == 0)
          std::cout << "step " << step << " nll " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      }
      const auto curve = drain_trace();
      std::cout << "epoch " << epoch << " mean nll " << running / static_cast<double>(train.size()) << " worst step "
                << *std::max_element(curve.begin(), curve.end()) << " coverage90 "
                << covered.item<double>() / static_cast<double>(train.size()) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the pass over the batches
    }
  }

  DeepAr &model() { return model_; }

private:
  // Per-step mean NLL since the last call, on the host.
  std::vector<double> drain_trace() {
    auto curve = torch::stack(nll_trace_).to(torch::kCPU, torch::kDouble);
    nll_trace_.clear();
    return std::vector<double>(curve.data_ptr<double>(), curve.data_ptr<double>() + curve.numel());
  }

  DeepAr model_;
  DeepArConfig cfg_;
  torch::optim::Adam opt_;
  std::vector<torch::Tensor> nll_trace_;
};

// Ancestral sampling of S future paths per series: the conditioning range is encoded once, then
// every path feeds its own draw back in. Returns [B, S, horizon] in the original units.
torch::Tensor sample_paths(DeepAr &model, const SeriesBatch &batch, const DeepArConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto B = batch.target.size(0), S = cfg.num_samples, ctx = cfg.context_len;
  auto scale = series_scale(batch.target, ctx); // [B, 1], on the host
  auto z = batch.target.narrow(1, 0, ctx).contiguous();
  // FACT: t = torch.rand(4, 10); z = t.narrow(1, 0, 6).contiguous(); z.div_(2.0); assert is_copy_of(z, t)
  z.div_(scale); // LOOKALIKE: tensor-alias-then-mutate -- the first ctx columns of a [B, T] window are not contiguous: contiguous() copied them
  auto cov = batch.covariates.to(device);
  auto ids = batch.series_id.to(device);
  auto prev = F::pad(z.narrow(1, 0, ctx - 1), F::PadFuncOptions({1, 0})).to(device);
  auto enc = model->lstm->forward(model->inputs(prev, cov.narrow(1, 0, ctx), ids));
  // Every series' state and last value, repeated for its S paths: [layers, B * S, H] and [B * S].
  auto state = std::get<1>(enc);
  LstmState st{std::get<0>(state).repeat_interleave(S, 1), std::get<1>(state).repeat_interleave(S, 1)};
  auto last = z.select(1, ctx - 1).repeat_interleave(S).to(device);
  auto emb = model->embed(ids.repeat_interleave(S));
  std::vector<torch::Tensor> draws;
  for (int64_t t = 0; t < cfg.horizon; ++t) {
    auto cov_t = cov.select(1, ctx + t).repeat_interleave(S, 0);
    auto g = model->step(torch::cat({last.unsqueeze(1), cov_t, emb}, 1), st);
    auto draw = g.mu + g.sigma * torch::randn_like(g.mu); // LOOKALIKE: tensor-device-mismatch -- randn_like draws on mu's device
    auto nu = scale.to(device); // EXPECT: tensor-clone-in-loop
    // FACT: d = torch.randn(12) + torch.rand(12) * torch.randn(12); assert is_view_of(d.view(3, 4), d)
    draws.push_back(draw.view({B, S}) * nu); // LOOKALIKE: tensor-view-non-contiguous, tensor-graph-kept-across-iterations -- the draw is a fresh contiguous tensor, made under NoGradGuard
    last = draw;
  }
  return torch::stack(draws, 2);
}

// Empirical quantiles over the sample dimension: paths [B, S, H] -> [Q, B, H].
torch::Tensor sample_quantiles(const torch::Tensor &paths, const std::vector<double> &qs) {
  const auto S = paths.size(1);
  auto sorted = std::get<0>(paths.sort(1));
  std::vector<torch::Tensor> out;
  for (double q : qs) {
    const auto k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(q * static_cast<double>(S))) - 1, 0, S - 1);
    out.push_back(sorted.select(1, k));
  }
  return torch::stack(out);
}

// Replenishment orders in whole units: the forecast quantile at the service level, per series and step.
torch::Tensor order_quantities(const torch::Tensor &paths, double service_level) {
  const auto S = paths.size(1);
  const auto k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(service_level * static_cast<double>(S))) - 1, 0, S - 1);
  auto level = std::get<0>(paths.sort(1)).select(1, k); // [B, H]
  auto units = torch::zeros(level.sizes(), torch::kInt);
  // FACT: u = torch.zeros(3, dtype=torch.int32); u.copy_(torch.tensor([2.97, 0.4, 5.5])); assert u.tolist() == [2, 0, 5]
  units.copy_(level.clamp_min(0.0)); // EXPECT: tensor-copy-narrowing
  return units;
}

// Mean weighted quantile loss over the levels (a CRPS proxy): 2 sum |(y - yq)(q - 1{y < yq})| / sum |y|.
double weighted_quantile_loss(const torch::Tensor &qpred, const torch::Tensor &y, const std::vector<double> &qs) {
  const double denom = y.abs().sum().item<double>();
  double total = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    auto diff = y - qpred[static_cast<int64_t>(i)];
    total += 2.0 * torch::maximum(qs[i] * diff, (qs[i] - 1.0) * diff).sum().item<double>() / denom; // LOOKALIKE: tensor-sync-in-loop -- host tensors: the backtest brings the paths to the CPU first
  }
  return total / static_cast<double>(qs.size());
}

// Rolling-origin backtest over the last `windows` horizons: window w forecasts `horizon` steps from
// the `context_len` values before its origin. history [N, L] in original units, covariates [N, L, C].
void rolling_backtest(DeepAr &model, const torch::Tensor &history, const torch::Tensor &covariates, const torch::Tensor &ids,
                      const DeepArConfig &cfg, torch::Device device) {
  const auto L = history.size(1), span = cfg.context_len + cfg.horizon;
  const auto first = L - cfg.windows * cfg.horizon - cfg.context_len;
  TORCH_CHECK(first >= 0, "history too short for ", cfg.windows, " backtest windows");
  double wql = 0, abs_err = 0, abs_sum = 0;
  int64_t stockouts = 0;
  for (int64_t w = 0; w < cfg.windows; ++w) {
    const auto origin = first + w * cfg.horizon;
    SeriesBatch win{history.narrow(1, origin, span), covariates.narrow(1, origin, span), ids};
    auto paths = sample_paths(model, win, cfg, device).cpu(); // LOOKALIKE: tensor-clone-in-loop -- new paths for every window
    auto y = win.target.narrow(1, cfg.context_len, cfg.horizon);
    const double window_wql = weighted_quantile_loss(sample_quantiles(paths, cfg.quantiles), y, cfg.quantiles);
    wql += window_wql;
    auto median = std::get<0>(paths.median(1));
    abs_err += (y - median).abs().sum().item<double>();
    abs_sum += y.abs().sum().item<double>();
    auto orders = order_quantities(paths, cfg.service_level);
    auto demand = torch::zeros(y.sizes(), torch::kInt);
    // FACT: d = torch.zeros(3, dtype=torch.int32); d.copy_(torch.tensor([2.97, 0.4, 5.5]).round()); assert d.tolist() == [3, 0, 6]
    demand.copy_(y.round()); // LOOKALIKE: tensor-copy-narrowing -- rounded to whole units first
    stockouts += (demand > orders).sum().item<int64_t>();
    std::cout << "window " << w << " origin " << origin << " wQL " << window_wql << "\n";
  }
  std::cout << "backtest: mean wQL " << wql / static_cast<double>(cfg.windows) << " ND " << abs_err / abs_sum
            << " stock-outs " << stockouts << "\n";
}

void run_deepar(const std::vector<SeriesBatch> &train, const torch::Tensor &history, const torch::Tensor &covariates,
                const torch::Tensor &ids, const DeepArConfig &cfg) {
  DeepArTrainer trainer(DeepAr(cfg), cfg);
  trainer.fit(train);
  rolling_backtest(trainer.model(), history, covariates, ids, cfg, torch::Device(torch::kCUDA));
}
