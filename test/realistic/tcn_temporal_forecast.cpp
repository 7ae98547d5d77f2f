// Day-ahead forecasting of hourly grid load with a temporal convolutional network (Bai et al. 2018):
// residual blocks of dilated causal Conv1d (the right padding trimmed by a Chomp), a Gaussian head
// for the next `horizon` hours of the target series, training on random windows with early
// stopping, a fixed-model rolling-origin evaluation over the test span (MASE against the seasonal
// naive forecast, and the whole-megawatt commitment plan), and an online forecaster that keeps the
// last `lookback` observations in one buffer.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct TcnConfig {
  int64_t n_series = 8, target = 0, hidden = 64, kernel = 3, levels = 6;
  int64_t lookback = 168, horizon = 24, season = 24, origin_stride = 24;
  int64_t batch_size = 64, epochs = 40, log_every = 100;
  double dropout = 0.2, lr = 2e-3, clip = 1.0, min_sigma = 1e-3;
};

struct ChompImpl : nn::Module {
  explicit ChompImpl(int64_t chomp) : chomp_(chomp) {}
  // [B, C, T + chomp] -> [B, C, T]: drops the right padding, so no output sees a later input
  torch::Tensor forward(const torch::Tensor &x) { return x.narrow(2, 0, x.size(2) - chomp_).contiguous(); }
  int64_t chomp_;
};
TORCH_MODULE(Chomp);

struct TemporalBlockImpl : nn::Module {
  TemporalBlockImpl(int64_t in, int64_t out, int64_t kernel, int64_t dilation, double dropout) {
    const auto pad = (kernel - 1) * dilation;
    conv1 = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(in, out, kernel).padding(pad).dilation(dilation)));
    conv2 = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(out, out, kernel).padding(pad).dilation(dilation)));
    chomp1 = register_module("chomp1", Chomp(pad));
    chomp2 = register_module("chomp2", Chomp(pad));
    drop1 = register_module("drop1", nn::Dropout(dropout));
    drop2 = register_module("drop2", nn::Dropout(dropout));
    if (in != out)
      downsample = register_module("downsample", nn::Conv1d(nn::Conv1dOptions(in, out, 1)));
    // FACT: c = torch.nn.Conv1d(3, 4, 3); c.weight.data.normal_(0.0, 0.01); assert c.weight.is_leaf and c.weight.requires_grad and c.weight.abs().max().item() < 0.1
    conv1->weight.data().normal_(0.0, 0.01); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- the reference TCN init, written through data() on purpose
    conv2->weight.data().normal_(0.0, 0.01);
    if (!downsample.is_empty())
      downsample->weight.data().normal_(0.0, 0.01);
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto out = drop1(torch::relu(chomp1(conv1(x))));
    out = drop2(torch::relu(chomp2(conv2(out))));
    auto res = downsample.is_empty() ? x : downsample(x);
    return torch::relu(out + res);
  }

  nn::Conv1d conv1{nullptr}, conv2{nullptr}, downsample{nullptr};
  Chomp chomp1{nullptr}, chomp2{nullptr};
  nn::Dropout drop1{nullptr}, drop2{nullptr};
};
TORCH_MODULE(TemporalBlock);

struct GaussianForecast {
  torch::Tensor mu, sigma; // [B, horizon], in z-score units of the target series
};

struct TcnForecasterImpl : nn::Module {
  explicit TcnForecasterImpl(const TcnConfig &cfg) : target_(cfg.target), min_sigma_(cfg.min_sigma) {
    blocks = register_module("blocks", nn::Sequential());
    int64_t in = cfg.n_series;
    for (int64_t i = 0; i < cfg.levels; ++i) {
      blocks->push_back(TemporalBlock(in, cfg.hidden, cfg.kernel, int64_t{1} << i, cfg.dropout));
      in = cfg.hidden;
    }
    mu_head = register_module("mu_head", nn::Linear(cfg.hidden, cfg.horizon));
    log_sigma_head = register_module("log_sigma_head", nn::Linear(cfg.hidden, cfg.horizon));
  }

  // x [B, n_series, lookback], z-scored -> the next horizon steps of the target series
  GaussianForecast forward(const torch::Tensor &x) {
    auto h = blocks->forward(x).select(2, -1); // the last step sees the whole receptive field
    auto mu = mu_head(h);
    // FACT: l = torch.nn.Linear(4, 3); m = l(torch.randn(2, 4)); m.add_(torch.randn(2, 1)); m.sum().backward(); assert l.weight.grad is not None
    mu.add_(x.select(1, target_).select(1, -1).unsqueeze(1)); // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output: the head predicts the change from the last value
    auto sigma = torch::exp(log_sigma_head(h));
    // FACT: l = torch.nn.Linear(4, 3); s = torch.exp(l(torch.randn(2, 4))); s.add_(1e-3); assert backward_fails(lambda: s.sum().backward())
    sigma.add_(min_sigma_); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward
    return {mu, sigma};
  }

  int64_t target_;
  double min_sigma_;
  nn::Sequential blocks{nullptr};
  nn::Linear mu_head{nullptr}, log_sigma_head{nullptr};
};
TORCH_MODULE(TcnForecaster);

torch::Tensor gaussian_nll(const GaussianForecast &f, const torch::Tensor &y) {
  return (torch::log(f.sigma) + 0.5 * ((y - f.mu) / f.sigma).pow(2)).mean();
}

struct Scaler {
  torch::Tensor mean, std; // [n_series]
};

// z-scores every series with the statistics of the training span only (no look-ahead).
std::pair<torch::Tensor, Scaler> standardize(const torch::Tensor &raw, int64_t train_end) {
  auto fit = raw.narrow(0, 0, train_end);
  Scaler s{fit.mean(0), fit.std(0).clamp_min(1e-6)};
  auto z = raw.to(torch::kFloat); // some CSV exports come in as float64
  // FACT: raw = torch.rand(50, 3) * 100; r0 = raw.clone(); z = raw.to(torch.float32); z.sub_(raw[:40].mean(0)).div_(raw[:40].std(0)); assert shares_storage(z, raw) and not torch.equal(raw, r0)
  z.sub_(s.mean).div_(s.std); // EXPECT: tensor-alias-then-mutate -- to(kFloat) of a float32 series is the series itself: the caller's megawatts become z-scores
  return {z, s};
}

// Windows cut from a z-scored [T, n_series] series: input [n_series, lookback], target [horizon].
struct WindowDataset : torch::data::datasets::Dataset<WindowDataset> {
  WindowDataset(torch::Tensor z, const TcnConfig &cfg)
      : z_(std::move(z)), L_(cfg.lookback), H_(cfg.horizon), target_(cfg.target) {}
  torch::data::Example<> get(size_t i) override {
    auto w = z_.narrow(0, static_cast<int64_t>(i), L_ + H_);
    return {w.narrow(0, 0, L_).t(), w.narrow(0, L_, H_).select(1, target_)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(z_.size(0) - L_ - H_ + 1); }
  torch::Tensor z_;
  int64_t L_, H_, target_;
};

double validation_nll(TcnForecaster &model, const torch::Tensor &z_val, const TcnConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  WindowDataset ds(z_val, cfg);
  const auto n = ds.size().value();
  auto total = torch::zeros({}, device);
  int64_t count = 0;
  for (size_t i = 0; i < n; i += static_cast<size_t>(cfg.horizon)) {
    auto ex = ds.get(i);
    auto f = model->forward(ex.data.unsqueeze(0).to(device));
    total += gaussian_nll(f, ex.target.unsqueeze(0).to(device)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    ++count;
  }
  return total.item<double>() / std::max<int64_t>(count, 1);
}

void train(TcnForecaster &model, const torch::Tensor &z, int64_t split, int64_t val_len, const TcnConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      WindowDataset(z.narrow(0, 0, split - val_len), cfg).map(torch::data::transforms::Stack<>()), cfg.batch_size);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto z_val = z.narrow(0, split - val_len - cfg.lookback, val_len + cfg.lookback);

  double best = std::numeric_limits<double>::infinity();
  std::vector<torch::Tensor> best_params;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double epoch_nll = 0;
    int64_t n_batches = 0;
    for (auto &batch : *loader) {
      auto x = batch.data.to(device), y = batch.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto loss = gaussian_nll(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      epoch_nll += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on CUDA whenever one is available: every step waits for the GPU to add up the loss
      ++n_batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " nll " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once every log_every steps
    }
    const double val = validation_nll(model, z_val, cfg, device);
    std::cout << "epoch " << epoch << " train " << epoch_nll / std::max<int64_t>(n_batches, 1) << " val " << val << "\n";
    if (val < best) {
      best = val;
      best_params.clear();
      for (const auto &p : model->parameters())
        best_params.push_back(p.detach().clone()); // LOOKALIKE: tensor-clone-in-loop, tensor-graph-kept-across-iterations -- a snapshot of each parameter, kept; detached
    }
  }
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size() && i < best_params.size(); ++i)
    params[i].copy_(best_params[i]); // LOOKALIKE: tensor-inplace-on-leaf -- restoring the best epoch under NoGradGuard
}

struct RollingReport {
  double mae = 0, mase = 0, coverage = 0;
  torch::Tensor plan, actual; // [n_origins, horizon] whole megawatts
  std::vector<torch::Tensor> forecasts;
};

// Forecasts from origins split, split + stride, ... with the trained model (no refit); errors in
// megawatts, scaled by the seasonal-naive MAE on the training span.
RollingReport rolling_origin(TcnForecaster &model, const torch::Tensor &z, const torch::Tensor &raw, const Scaler &sc,
                             int64_t split, const TcnConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto T = z.size(0), L = cfg.lookback, H = cfg.horizon;
  const int64_t n_origins = (T - H - split) / cfg.origin_stride + 1;
  const double mu_t = sc.mean[cfg.target].item<double>(), sd_t = sc.std[cfg.target].item<double>();
  auto y_train = raw.narrow(0, 0, split).select(1, cfg.target);
  const double naive_mae = (y_train.narrow(0, cfg.season, split - cfg.season) - y_train.narrow(0, 0, split - cfg.season))
                               .abs().mean().item<double>();

  RollingReport rep;
  rep.plan = torch::zeros({n_origins, H}, torch::kLong);
  rep.actual = torch::zeros({n_origins, H}, torch::kLong);
  double abs_err = 0, inside = 0;
  for (int64_t k = 0; k < n_origins; ++k) {
    const auto o = split + k * cfg.origin_stride;
    // FACT: z = torch.randn(30, 4); assert is_copy_of(z.t().contiguous(), z)
    auto channels_first = z.t().contiguous(); // EXPECT: tensor-clone-in-loop -- the whole test series is transposed and copied again at every origin
    auto x = channels_first.narrow(1, o - L, L).unsqueeze(0).to(device);
    auto f = model->forward(x);
    auto pred = (f.mu.squeeze(0) * sd_t + mu_t).cpu();
    auto band = (f.sigma.squeeze(0) * (1.96 * sd_t)).cpu();
    auto truth = raw.narrow(0, o, H).select(1, cfg.target);
    abs_err += (pred - truth).abs().sum().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- pred was brought to the host above; this reads a CPU tensor
    inside += (pred - truth).abs().le(band).sum().item<double>();
    rep.forecasts.push_back(pred); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, kept on purpose
    // FACT: p = torch.zeros(2, 3, dtype=torch.long); p[0] = torch.tensor([41.9, 37.7, 0.6]).clamp_min(0); assert p[0].tolist() == [41, 37, 0]
    rep.plan[k] = pred.clamp_min(0); // EXPECT: tensor-copy-narrowing -- fractional megawatts truncated toward zero: the plan under-commits every hour
    // FACT: a = torch.zeros(2, 3, dtype=torch.long); a[1] = torch.tensor([41.9, 37.7, 0.6]).round().to(torch.long); assert a[1].tolist() == [42, 38, 1]
    rep.actual[k] = truth.round().to(torch::kLong); // LOOKALIKE: tensor-copy-narrowing -- rounded and converted explicitly
  }
  const double n = static_cast<double>(n_origins * H);
  rep.mae = abs_err / n;
  rep.mase = rep.mae / naive_mae;
  rep.coverage = inside / n;
  return rep;
}

// Online use: one raw observation [n_series] per hour; the last `lookback` hours stay in one buffer.
class OnlineForecaster {
public:
  OnlineForecaster(TcnForecaster model, Scaler sc, const TcnConfig &cfg, const torch::Tensor &history)
      : model_(std::move(model)), sc_(std::move(sc)), target_(cfg.target) {
    window_ = ((history - sc_.mean) / sc_.std).contiguous(); // [lookback, n_series], time-major
    model_->eval();
  }

  // Appends one observation and returns the next horizon in megawatts.
  torch::Tensor push(const torch::Tensor &obs) {
    torch::NoGradGuard no_grad;
    const auto L = window_.size(0);
    // FACT: w = torch.randn(6, 3); assert raises(lambda: w.narrow(0, 0, 5).copy_(w.narrow(0, 1, 5)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    window_.narrow(0, 0, L - 1).copy_(window_.narrow(0, 1, L - 1)); // EXPECT: tensor-inplace-overlap -- shifting the window inside its own buffer: rows 0..L-2 and 1..L-1 overlap
    // FACT: w = torch.randn(6, 3); o = torch.randn(3); w[5].copy_((o - 1.0) / 2.0); assert torch.equal(w[5], (o - 1.0) / 2.0)
    window_[L - 1].copy_((obs - sc_.mean) / sc_.std); // LOOKALIKE: tensor-inplace-overlap -- the new row comes from a tensor of its own
    return forecast();
  }

  // n hours without data: shift by n and carry the last observation forward.
  torch::Tensor skip(int64_t n) {
    torch::NoGradGuard no_grad;
    const auto L = window_.size(0);
    // FACT: w = torch.randn(6, 3); r = torch.roll(w, -2, 0); assert is_copy_of(r, w)
    window_.copy_(torch::roll(window_, {-n}, {0})); // LOOKALIKE: tensor-inplace-overlap -- roll returns a new tensor
    // FACT: w = torch.randn(6, 3); w.narrow(0, 4, 2).copy_(w[3].expand(2, -1)); assert torch.equal(w[4], w[3]) and torch.equal(w[5], w[3])
    window_.narrow(0, L - n, n).copy_(window_[L - 1 - n].expand({n, -1})); // LOOKALIKE: tensor-inplace-overlap, tensor-inplace-on-expanded -- disjoint rows; the expanded row is only read
    return forecast();
  }

private:
  torch::Tensor forecast() {
    auto f = model_->forward(window_.t().unsqueeze(0));
    return f.mu.squeeze(0) * sc_.std[target_] + sc_.mean[target_];
  }

  TcnForecaster model_;
  Scaler sc_;
  int64_t target_;
  torch::Tensor window_;
};

int main() {
  TcnConfig cfg;
  torch::Tensor raw; // [T, n_series] hourly megawatts, the target series first
  torch::load(raw, "grid_load_hourly.pt");
  const int64_t split = raw.size(0) * 4 / 5;
  auto [z, scaler] = standardize(raw, split);

  TcnForecaster model(cfg);
  train(model, z, split, 30 * 24, cfg);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto rep = rolling_origin(model, z, raw, scaler, split, cfg, device);
  std::cout << "MAE " << rep.mae << " MW, MASE " << rep.mase << ", 95% coverage " << rep.coverage << "\n";
  torch::save(rep.plan, "commitment_plan.pt");

  model->to(torch::kCPU);
  OnlineForecaster online(model, scaler, cfg, raw.narrow(0, raw.size(0) - cfg.lookback, cfg.lookback));
  std::cout << "next day: " << online.skip(2) << "\n";
}
