// MQ-RNN multi-horizon quantile forecaster: an LSTM encodes the history of
// each series, a global MLP turns the encoding plus the known future calendar
// into horizon-specific and horizon-agnostic contexts, and a local MLP shared
// across horizons emits one value per quantile. Trained with forking sequences
// and the pinball loss; evaluated on rolling origins with per-series scaling.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <string>
#include <vector>

using torch::nn::Linear;

struct MQConfig {
  int64_t n_series = 64;
  int64_t series_len = 24 * 7 * 6;
  int64_t history = 96;
  int64_t horizon = 24;
  int64_t n_forks = 8;
  int64_t n_cov = 4;
  int64_t hidden = 64;
  int64_t global_hidden = 128;
  int64_t ctx = 16;
  int64_t ctx_agnostic = 32;
  int64_t local_hidden = 32;
  std::vector<double> quantiles{0.1, 0.5, 0.9};
  int64_t batch = 32;
  int64_t epochs = 20;
  int64_t steps_per_epoch = 200;
};

class MQRNNImpl : public torch::nn::Module {
 public:
  explicit MQRNNImpl(const MQConfig& c) : c_(c) {
    encoder = register_module(
        "encoder", torch::nn::LSTM(torch::nn::LSTMOptions(1 + c.n_cov, c.hidden)));
    auto forget_bias = encoder->named_parameters()["bias_ih_l0"];
    // FACT: l = torch.nn.LSTM(3, 4); assert raises(lambda: l.bias_ih_l0[4:8].fill_(1.0), "leaf Variable")
    forget_bias.slice(0, c.hidden, 2 * c.hidden).fill_(1.0);  // EXPECT: tensor-inplace-on-leaf
    global1 = register_module("global1", Linear(c.hidden + c.horizon * c.n_cov, c.global_hidden));
    global2 = register_module(
        "global2", Linear(c.global_hidden, c.horizon * c.ctx + c.ctx_agnostic));
    const auto local_in = c.ctx + c.ctx_agnostic + c.n_cov;
    local1 = register_module("local1", Linear(local_in, c.local_hidden));
    local_skip = register_module(
        "local_skip", Linear(torch::nn::LinearOptions(local_in, c.local_hidden).bias(false)));
    local_out = register_module("local_out", Linear(c.local_hidden, c.quantiles.size()));
    torch::nn::init::xavier_uniform_(local_out->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
    taus = register_buffer("taus", torch::tensor(c.quantiles, torch::kFloat));
  }

  // hist is time-major; fut holds the known covariates of the K steps after each fork.
  torch::Tensor forward(const torch::Tensor& hist, const torch::Tensor& fut) {
    const auto B = hist.size(1), F = fut.size(1), K = c_.horizon;
    auto enc = std::get<0>(encoder->forward(hist));
    // FACT: e = torch.randn(10, 4, 6); assert is_copy_of(e[7:].transpose(0, 1).reshape(12, -1), e)
    auto h = enc.slice(0, enc.size(0) - F).transpose(0, 1).reshape({B * F, -1});  // EXPECT: tensor-reshape-non-contiguous
    auto fut_flat = fut.reshape({B * F, K, c_.n_cov});
    auto g = global2(torch::relu(global1(torch::cat({h, fut_flat.view({B * F, -1})}, 1))));
    // FACT: g = torch.randn(6, 24 * 4 + 8); s = g[:, :96]; assert not is_contiguous(s) and is_view_of(s.view(6, 24, 4), g)
    auto ctx_h = g.slice(1, 0, K * c_.ctx).view({B * F, K, c_.ctx});  // LOOKALIKE: tensor-view-non-contiguous -- splitting the column dim of a row slice is expressible with strides
    auto ctx_a = g.slice(1, K * c_.ctx).unsqueeze(1).expand({B * F, K, c_.ctx_agnostic});
    auto local_in = torch::cat({ctx_h, ctx_a, fut_flat}, 2);
    auto z = torch::relu(local1(local_in));
    // FACT: x = torch.randn(3, 4, requires_grad=True) * 1; z = torch.relu(x); l = z.sum(); z.add_(1); assert backward_fails(lambda: l.backward())
    z.add_(local_skip(local_in));  // EXPECT: tensor-inplace-on-saved
    return local_out(z).view({B, F, K, -1});
  }

  torch::nn::LSTM encoder{nullptr};
  Linear global1{nullptr}, global2{nullptr}, local1{nullptr}, local_skip{nullptr},
      local_out{nullptr};
  torch::Tensor taus;

 private:
  MQConfig c_;
};
TORCH_MODULE(MQRNN);

// Pinball loss for every quantile level, averaged over everything else.
torch::Tensor per_quantile_loss(const torch::Tensor& pred, const torch::Tensor& target,
                                const torch::Tensor& taus) {
  auto err = target.unsqueeze(-1) - pred;
  auto l = torch::max(taus * err, (taus - 1) * err);
  // FACT: l = torch.randn(4, 2, 6, 3); assert is_view_of(l.movedim(-1, 0).reshape(3, -1), l)
  return l.movedim(-1, 0).reshape({l.size(-1), -1}).mean(1);  // LOOKALIKE: tensor-reshape-non-contiguous -- moving the last dim to the front keeps the others mergeable
}

struct SeriesData {
  torch::Tensor values, calendar;
};

SeriesData make_data(const MQConfig& c) {
  auto t = torch::arange(c.series_len, torch::kFloat64);
  auto level = torch::rand({c.n_series, 1}, torch::kFloat64) * 90 + 10;
  auto phase = torch::rand({c.n_series, 1}, torch::kFloat64) * 2 * M_PI;
  auto daily = torch::sin(2 * M_PI * t / 24 + phase);
  auto weekly = torch::cos(2 * M_PI * t / (24 * 7) + phase);
  auto noise = torch::randn({c.n_series, c.series_len}, torch::kFloat64) * 0.05;
  auto values = level * (1 + 0.3 * daily + 0.1 * weekly + noise);
  auto hour = t.remainder(24) / 24 * 2 * M_PI;
  auto dow = (t / 24).floor().remainder(7) / 7 * 2 * M_PI;
  auto calendar = torch::stack({hour.sin(), hour.cos(), dow.sin(), dow.cos()}, 1);
  return {values, calendar.to(torch::kFloat)};
}

struct Batch {
  torch::Tensor hist, fut, target;
};

Batch sample_batch(const torch::Tensor& series, const torch::Tensor& calendar,
                   const MQConfig& c, int64_t train_end) {
  const auto T = c.history, K = c.horizon, F = c.n_forks, B = c.batch;
  const auto span = T + F - 1 + K;
  auto sid = torch::randint(series.size(0), {B}, torch::kLong);
  auto start = torch::randint(train_end - span + 1, {B}, torch::kLong);
  auto t_idx = start.unsqueeze(1) + torch::arange(span, torch::kLong);
  auto win = series.index({sid.unsqueeze(1), t_idx});
  auto scale = win.slice(1, 0, T).abs().mean(1, true).clamp_min(1e-3);
  // FACT: s = torch.randn(4, 50); w = s[torch.tensor([[0], [2]]), torch.arange(10).expand(2, 10)]; w.div_(2.0); assert is_copy_of(w, s)
  win.div_(scale);  // LOOKALIKE: tensor-alias-then-mutate -- advanced indexing gathered a copy of the series
  auto cov = calendar.index_select(0, t_idx.flatten()).view({B, span, c.n_cov});
  auto hist = torch::cat({win.slice(1, 0, T + F - 1).unsqueeze(-1), cov.slice(1, 0, T + F - 1)}, 2)
                  .transpose(0, 1);
  auto fut_idx = (T + torch::arange(F, torch::kLong).unsqueeze(1) +
                  torch::arange(K, torch::kLong)).flatten();
  auto fut = cov.index_select(1, fut_idx).view({B, F, K, c.n_cov});
  auto target = win.index_select(1, fut_idx).view({B, F, K});
  return {hist, fut, target};
}

void write_forecasts(const std::string& path, const torch::Tensor& pred, int64_t origin) {
  std::ofstream os(path);
  os << "# origin " << origin << ": per series, all horizons of each quantile in turn\n";
  auto host = pred.to(torch::kCPU);
  // FACT: p = torch.randn(5, 24, 3); assert raises(lambda: p.transpose(1, 2).view(5, -1), "view size is not compatible")
  auto rows = host.transpose(1, 2).view({host.size(0), -1});  // EXPECT: tensor-view-non-contiguous
  for (int64_t s = 0; s < rows.size(0); ++s) {
    auto r = rows[s];
    for (int64_t k = 0; k < r.size(0); ++k) os << r[k].item<float>() << (k + 1 < r.size(0) ? "," : "\n");
  }
}

struct EvalResult {
  double pinball = 0.0;
  torch::Tensor coverage;
};

EvalResult rolling_origin_eval(MQRNN& model, const torch::Tensor& series,
                               const torch::Tensor& calendar, const MQConfig& c,
                               int64_t first_origin, int64_t last_origin,
                               const torch::Device& device, bool dump) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto T = c.history, K = c.horizon, S = series.size(0);
  double total = 0.0;
  int64_t n_origins = 0;
  auto covered = torch::zeros({static_cast<int64_t>(c.quantiles.size())}, torch::kFloat).to(device);
  torch::Tensor last_pred;
  for (int64_t o = first_origin; o + K <= last_origin; o += K) {
    auto hist_vals = series.narrow(1, o - T, T);
    auto scale = hist_vals.abs().mean(1, true).clamp_min(1e-3);
    // FACT: s = torch.randn(4, 50); w = s.narrow(1, 10, 20); w.div_(2.0); assert is_view_of(w, s)
    hist_vals.div_(scale);  // EXPECT: tensor-alias-then-mutate
    auto cov = calendar.to(device);  // EXPECT: tensor-clone-in-loop
    auto hist = torch::cat({hist_vals.t().unsqueeze(-1),
                            calendar.narrow(0, o - T, T).unsqueeze(1).expand({T, S, c.n_cov})},
                           2);
    auto pred = model->forward(hist.to(device),  // LOOKALIKE: tensor-clone-in-loop -- the history window moves with the origin
                               cov.narrow(0, o, K).view({1, 1, K, c.n_cov}).expand({S, 1, K, c.n_cov}));
    auto pred_abs = pred.squeeze(1) * scale.unsqueeze(-1);  // EXPECT: tensor-device-mismatch
    auto actual = series.narrow(1, o, K).to(device);
    auto loss = per_quantile_loss(pred_abs, actual, model->taus);  // LOOKALIKE: tensor-device-mismatch -- taus is a registered buffer, moved by model->to(device)
    total += loss.mean().item<double>();  // EXPECT: tensor-sync-in-loop
    covered += (actual.unsqueeze(-1) <= pred_abs).to(torch::kFloat).mean(at::IntArrayRef{0, 1});
    last_pred = pred_abs;
    ++n_origins;
  }
  if (dump && last_pred.defined()) write_forecasts("forecasts.csv", last_pred, last_origin - K);
  return {total / std::max<int64_t>(n_origins, 1), covered.cpu() / std::max<int64_t>(n_origins, 1)};
}

int main() {
  torch::manual_seed(0);
  const torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  MQConfig c;
  auto data = make_data(c);
  const int64_t test_len = 24 * 7, val_len = 24 * 7;
  const int64_t train_end = c.series_len - test_len - val_len;

  auto series = torch::empty({c.n_series, c.series_len}, torch::kFloat);
  // FACT: f = torch.empty(2, 3); f.copy_(torch.tensor([[1.0 + 1e-12] * 3] * 2, dtype=torch.float64)); assert f.dtype == torch.float32 and (f == 1.0).all()
  series.copy_(data.values);  // EXPECT: tensor-copy-narrowing

  MQRNN model(c);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  std::map<std::string, torch::Tensor> best_state;
  double best_val = std::numeric_limits<double>::infinity();

  for (int64_t epoch = 0; epoch < c.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> batch_losses;
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t step = 0; step < c.steps_per_epoch; ++step) {
      auto b = sample_batch(series, data.calendar, c, train_end);
      auto pred = model->forward(b.hist.to(device), b.fut.to(device));
      auto loss = per_quantile_loss(pred, b.target.to(device), model->taus).sum();
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      batch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is summed on the device
      if (step % 50 == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- read once every 50 steps for the log
                  << "\n";
      }
    }
    auto median = torch::stack(batch_losses).median().item<double>();
    auto val = rolling_origin_eval(model, series, data.calendar, c, train_end, train_end + val_len,
                                   device, false);
    std::cout << "epoch " << epoch << " mean " << epoch_loss.item<double>() / c.steps_per_epoch
              << " median " << median << " val pinball " << val.pinball << "\n";
    if (val.pinball < best_val) {
      best_val = val.pinball;
      for (const auto& kv : model->named_parameters()) {
        best_state[kv.key()] = kv.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the optimizer keeps updating the parameter; the snapshot needs its own storage
      }
    }
  }

  {
    torch::NoGradGuard no_grad;
    for (auto& kv : model->named_parameters()) {
      kv.value().copy_(best_state.at(kv.key()));  // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best weights under NoGradGuard
    }
  }
  auto test = rolling_origin_eval(model, series, data.calendar, c, train_end + val_len,
                                  c.series_len, device, true);
  std::cout << "test pinball " << test.pinball << " coverage " << test.coverage << "\n";
  return 0;
}
