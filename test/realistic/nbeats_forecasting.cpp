// N-BEATS (Oreshkin et al. 2020) as one global model over a multivariate series: every column
// is a univariate series (a meter, a store, a sensor) and the training windows of all of them are
// pooled. Interpretable configuration: a trend stack (polynomial basis), a seasonality stack
// (Fourier basis), then a generic stack. Each series is normalised with the mean and standard
// deviation of its training part and mapped back before the metrics. The test period is
// forecast by rolling: every forecast is fed back into the input window of the next one, and
// sMAPE / MASE are accumulated over the rolls on the device.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
constexpr double kPi = 3.14159265358979323846;

struct ForecastConfig {
  int64_t lookback = 120, horizon = 24, season = 24; // hourly data: five days in, one day out
  int64_t width = 256, layers_per_block = 4, blocks_per_stack = 3;
  int64_t trend_degree = 3, harmonics = 8;
  int64_t epochs = 30, batch_size = 1024;
  double lr = 1e-3, clip = 1.0;
};

enum class BasisKind { Trend, Seasonality, Generic };

// Polynomial basis [degree + 1, len] at times t [len].
torch::Tensor trend_basis(int64_t degree, const torch::Tensor &t) {
  auto p = torch::arange(degree + 1, torch::kFloat).unsqueeze(1);
  return t.unsqueeze(0).pow(p);
}

// Fourier basis [2 * harmonics + 1, len] at times t [len], in units of the season.
torch::Tensor fourier_basis(int64_t harmonics, const torch::Tensor &t) {
  auto k = torch::arange(1, harmonics + 1, torch::kFloat).unsqueeze(1);
  auto ang = 2 * kPi * k * t.unsqueeze(0);
  return torch::cat({torch::ones({1, t.size(0)}), torch::cos(ang), torch::sin(ang)}, 0);
}

struct BlockOutput {
  torch::Tensor backcast, forecast;
};

struct NBeatsBlockImpl : nn::Module {
  NBeatsBlockImpl(const ForecastConfig &cfg, BasisKind kind) : kind_(kind) {
    fc_ = register_module("fc", nn::Sequential());
    for (int64_t i = 0; i < cfg.layers_per_block; ++i) {
      fc_->push_back(nn::Linear(i == 0 ? cfg.lookback : cfg.width, cfg.width));
      fc_->push_back(nn::ReLU());
    }
    const auto L = cfg.lookback, H = cfg.horizon;
    auto tb = torch::arange(-L, 0, torch::kFloat), tf = torch::arange(H, torch::kFloat);
    int64_t pb = cfg.width, pf = cfg.width;
    if (kind == BasisKind::Trend) {
      basis_b_ = register_buffer("basis_b", trend_basis(cfg.trend_degree, tb / H));
      basis_f_ = register_buffer("basis_f", trend_basis(cfg.trend_degree, tf / H));
    } else if (kind == BasisKind::Seasonality) {
      basis_b_ = register_buffer("basis_b", fourier_basis(cfg.harmonics, tb / cfg.season));
      basis_f_ = register_buffer("basis_f", fourier_basis(cfg.harmonics, tf / cfg.season));
    } else {
      back_ = register_module("back", nn::Linear(cfg.width, L));
      fore_ = register_module("fore", nn::Linear(cfg.width, H));
    }
    if (kind != BasisKind::Generic) {
      pb = basis_b_.size(0);
      pf = basis_f_.size(0);
    }
    theta_b_ = register_module("theta_b", nn::Linear(nn::LinearOptions(cfg.width, pb).bias(false)));
    theta_f_ = register_module("theta_f", nn::Linear(nn::LinearOptions(cfg.width, pf).bias(false)));
  }

  BlockOutput forward(const torch::Tensor &x) {
    auto h = fc_->forward(x);
    auto tb = theta_b_(h), tf = theta_f_(h);
    if (kind_ == BasisKind::Generic)
      return {back_(tb), fore_(tf)};
    return {tb.matmul(basis_b_), tf.matmul(basis_f_)}; // LOOKALIKE: tensor-device-mismatch -- the bases are registered buffers: they move with the module
  }

  BasisKind kind_;
  nn::Sequential fc_{nullptr};
  nn::Linear theta_b_{nullptr}, theta_f_{nullptr}, back_{nullptr}, fore_{nullptr};
  torch::Tensor basis_b_, basis_f_;
};
TORCH_MODULE(NBeatsBlock);

struct NBeatsImpl : nn::Module {
  explicit NBeatsImpl(const ForecastConfig &cfg) : horizon_(cfg.horizon) {
    int64_t i = 0;
    for (auto kind : {BasisKind::Trend, BasisKind::Seasonality, BasisKind::Generic})
      for (int64_t b = 0; b < cfg.blocks_per_stack; ++b, ++i)
        blocks_.push_back(register_module("block" + std::to_string(i), NBeatsBlock(cfg, kind)));
  }

  // x [B, lookback], normalised -> forecast [B, horizon]. Doubly residual: each block explains
  // part of the input away and adds its part of the forecast.
  torch::Tensor forward(const torch::Tensor &x) {
    auto residual = x;
    auto forecast = torch::zeros({x.size(0), horizon_}, x.options());
    for (auto &block : blocks_) {
      auto out = block->forward(residual);
      // FACT: l = torch.nn.Linear(4, 3); x = torch.randn(5, 4); x0 = x.clone(); r = x; y = l(r); r.sub_(torch.randn(5, 4)); assert shares_storage(r, x) and not torch.equal(x, x0) and backward_fails(lambda: y.sum().backward())
      residual.sub_(out.backcast); // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved -- residual is the caller's window, rewritten block by block; and the block's first Linear saved it for its weight's gradient
      // FACT: f = torch.zeros(2, 3); l = torch.nn.Linear(4, 3); f.add_(l(torch.randn(2, 4))); f.sum().backward(); assert l.weight.grad is not None
      forecast.add_(out.forecast); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-saved -- fresh zeros that do not require grad and that nothing saved
    }
    return forecast;
  }

  int64_t horizon_;
  std::vector<NBeatsBlock> blocks_;
};
TORCH_MODULE(NBeats);

// Per-series statistics of the training part of a [T, S] series.
struct Normaliser {
  torch::Tensor mean, std; // [S]

  static Normaliser fit(const torch::Tensor &train) {
    auto sd = train.std(0);
    // FACT: t = torch.randn(30, 3); s = t.std(0); s.clamp_min_(1e-6); assert is_copy_of(s, t)
    sd.clamp_min_(1e-6); // LOOKALIKE: tensor-alias-then-mutate -- std() returns a new tensor: the series is untouched
    return {train.mean(0), sd};
  }
  torch::Tensor apply(const torch::Tensor &y) const { return (y - mean) / std; }
};

// Every window of `len` consecutive steps of every series, one per row: [S * N, len],
// N = T - len + 1, for a [T, S] series.
torch::Tensor make_windows(const torch::Tensor &series, int64_t len) {
  auto per_series = series.t().unfold(1, len, 1); // [S, N, len]
  // FACT: s = torch.randn(20, 3); w = s.t().unfold(1, 5, 1); assert is_copy_of(w.reshape(-1, 5), s) and w.reshape(-1, 5).shape == (48, 5)
  return per_series.reshape({-1, len}); // EXPECT: tensor-reshape-non-contiguous -- overlapping windows cannot be a view: the series is copied len times over
}

// MASE denominator: in-sample mean absolute error of the seasonal naive forecast, per series.
torch::Tensor seasonal_naive_scale(const torch::Tensor &train, int64_t m) {
  // FACT: t = torch.randn(30, 3); y = t.clone(); assert torch.equal((y[4:] - y[:-4]).abs().mean(0), (t[4:] - t[:-4]).abs().mean(0))
  auto y = train.clone(); // EXPECT: tensor-unnecessary-clone -- neither y nor train is written: the copy of the whole training split buys nothing
  const auto T = y.size(0);
  return (y.narrow(0, m, T - m) - y.narrow(0, 0, T - m)).abs().mean(0);
}

// sMAPE in percent, summed over the horizon: y, yhat [H, S] -> [S].
torch::Tensor smape_sum(const torch::Tensor &y, const torch::Tensor &yhat) {
  auto denom = (y.abs() + yhat.abs()).clamp_min(1e-8);
  return (200.0 * (y - yhat).abs() / denom).sum(0);
}

void train(NBeats &model, const torch::Tensor &train_norm, const ForecastConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  const auto L = cfg.lookback, H = cfg.horizon;
  auto windows = make_windows(train_norm, L + H); // host
  const auto n = windows.size(0);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n);
    auto epoch_loss = torch::zeros({}, device);
    int64_t steps = 0;
    for (int64_t i = 0; i + cfg.batch_size <= n; i += cfg.batch_size) {
      auto batch = windows.index_select(0, perm.narrow(0, i, cfg.batch_size)).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch each step
      auto x = batch.narrow(1, 0, L), y = batch.narrow(1, L, H);
      auto loss = torch::l1_loss(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      ++steps;
    }
    std::cout << "epoch " << epoch << " train MAE " << (epoch_loss / std::max<int64_t>(steps, 1)).item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after its steps
  }
}

struct Metrics {
  double smape = 0, mase = 0;
};

// Forecasts [t_test, T) horizon by horizon from the last `lookback` steps, feeding each forecast
// back into the window. series: [T, S] in the original units, on the host.
Metrics rolling_eval(NBeats &model, const torch::Tensor &series, int64_t t_test, const Normaliser &norm,
                     const ForecastConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::Device device(torch::kCUDA);
  const auto L = cfg.lookback, H = cfg.horizon, S = series.size(1);
  auto scale = seasonal_naive_scale(series.narrow(0, 0, t_test), cfg.season); // [S]
  auto mu = norm.mean.to(device), sd = norm.std.to(device);
  auto ctx = norm.apply(series.narrow(0, t_test - L, L)).to(device); // [L, S], time-major like the series
  auto smape_acc = torch::zeros({S}, ctx.options()), mase_acc = torch::zeros({S}, ctx.options());
  int64_t steps = 0;
  for (int64_t t = t_test; t + H <= series.size(0); t += H) {
    auto pred_n = model->forward(ctx.t()).t(); // [H, S], normalised
    auto pred = pred_n * sd + mu;
    auto actual = series.narrow(0, t, H).to(device); // LOOKALIKE: tensor-clone-in-loop -- the next slice of the test period each roll
    smape_acc += smape_sum(actual, pred); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    mase_acc += (actual - pred).abs().sum(0) / scale.to(device); // EXPECT: tensor-clone-in-loop -- the same naive-forecast scale is copied to the GPU at every roll
    steps += H;
    // The oldest H steps leave the window; the forecast takes their place at the end.
    // FACT: c = torch.randn(10, 3); assert raises(lambda: c.narrow(0, 0, 8).copy_(c.narrow(0, 2, 8)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    ctx.narrow(0, 0, L - H).copy_(ctx.narrow(0, H, L - H)); // EXPECT: tensor-inplace-overlap -- with lookback > 2 * horizon the two row ranges overlap: PyTorch refuses the copy
    // FACT: c = torch.randn(10, 3); p = torch.randn(3, 2).t(); c.narrow(0, 8, 2).copy_(p); assert torch.equal(c[8:], p)
    ctx.narrow(0, L - H, H).copy_(pred_n); // LOOKALIKE: tensor-inplace-overlap, tensor-copy-narrowing -- the forecast is a tensor of its own, float32 like the window
  }
  const auto denom = static_cast<double>(std::max<int64_t>(steps, 1));
  Metrics m;
  m.smape = smape_acc.mean().item<double>() / denom;
  m.mase = mase_acc.mean().item<double>() / denom;
  return m;
}

void run_forecast(const torch::Tensor &series, const ForecastConfig &cfg) {
  const auto T = series.size(0);
  const auto t_test = T * 8 / 10;
  auto norm = Normaliser::fit(series.narrow(0, 0, t_test));
  auto train_norm = norm.apply(series.narrow(0, 0, t_test));
  NBeats model(cfg);
  train(model, train_norm, cfg);
  const auto m = rolling_eval(model, series, t_test, norm, cfg);
  std::cout << "test sMAPE " << m.smape << "%  MASE " << m.mase << "\n";
}
