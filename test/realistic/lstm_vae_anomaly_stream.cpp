// LSTM-VAE for multivariate time-series anomaly detection: trained on sliding windows
// of normal operation, scores a live stream by the reconstruction probability of the
// newest point, against per-feature thresholds learnt on validation windows.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct VaeConfig {
  int64_t n_features = 8;
  int64_t window = 64;
  int64_t stride = 4;
  int64_t hidden = 64;
  int64_t latent = 16;
  int64_t batch_size = 128;
  int64_t epochs = 30;
  int64_t n_samples = 16;       // posterior samples for the reconstruction probability
  int64_t smooth = 5;           // points averaged before flagging
  double lr = 1e-3;
  double kl_warmup_steps = 2000.0;
  double input_noise = 0.05;    // denoising: noise added to the encoder input
  double min_std = 1e-4;
  double anomaly_quantile = 0.005;
};

struct Standardizer {
  torch::Tensor mean, stdev;
  void fit(const torch::Tensor& series) {  // series [T, D]
    mean = series.mean(0);
    stdev = series.std(0).clamp_min(1e-6);
  }
};

// [T, D] stream -> [N, W, D] overlapping windows (views into the stream).
torch::Tensor make_windows(const torch::Tensor& series, int64_t window, int64_t stride) {
  return series.unfold(0, window, stride).permute({0, 2, 1});
}

struct VaeOutput {
  torch::Tensor x_mu, x_logvar;  // [B, W, D]
  torch::Tensor z_mu, z_logvar;  // [B, L]
};

struct LstmVaeImpl : nn::Module {
  explicit LstmVaeImpl(const VaeConfig& c) : cfg_(c) {
    enc_ = register_module("enc", nn::LSTM(nn::LSTMOptions(c.n_features, c.hidden).batch_first(true)));
    to_mu_ = register_module("to_mu", nn::Linear(c.window * c.hidden, c.latent));
    to_logvar_ = register_module("to_logvar", nn::Linear(c.window * c.hidden, c.latent));
    time_embed_ = register_parameter("time_embed", torch::randn({c.window, c.latent}) * 0.02);
    dec_ = register_module("dec", nn::LSTM(nn::LSTMOptions(c.latent, c.hidden).batch_first(true)));
    out_mu_ = register_module("out_mu", nn::Linear(c.hidden, c.n_features));
    out_logvar_ = register_module("out_logvar", nn::Linear(c.hidden, c.n_features));
  }

  std::pair<torch::Tensor, torch::Tensor> decode(const torch::Tensor& z_seq) {
    const int64_t B = z_seq.size(0), T = z_seq.size(1);
    auto dec_out = std::get<0>(dec_->forward(z_seq));  // [B, W, H]
    // FACT: l = torch.nn.LSTM(3, 5, batch_first=True); o, _ = l(torch.randn(4, 6, 3)); c = o.contiguous(); assert is_view_of(c.view(-1, 5), c)
    auto flat = dec_out.contiguous().view({-1, cfg_.hidden});  // LOOKALIKE: tensor-view-non-contiguous -- made contiguous first
    // FACT: l = torch.nn.Linear(5, 3); y = l(torch.randn(24, 5)); assert is_view_of(y.view(4, 6, -1), y)
    auto x_mu = out_mu_(flat).view({B, T, -1});  // LOOKALIKE: tensor-view-non-contiguous -- a 2-D Linear output is contiguous
    auto x_logvar = out_logvar_(flat).view({B, T, -1}).clamp(-8.0, 8.0);
    return {x_mu, x_logvar};
  }

  VaeOutput forward(const torch::Tensor& x) {  // x [B, W, D]
    const int64_t B = x.size(0), T = x.size(1);
    auto enc_out = std::get<0>(enc_->forward(x));  // [B, W, H]
    // FACT: l = torch.nn.LSTM(3, 5, batch_first=True); o, _ = l(torch.randn(4, 6, 3)); assert not is_contiguous(o) and is_copy_of(o.flatten(1), o)
    auto flat = enc_out.flatten(1);  // EXPECT: tensor-reshape-non-contiguous
    auto mu = to_mu_(flat);
    auto logvar = to_logvar_(flat);
    logvar.clamp_(-10.0, 10.0);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output

    auto stdev = torch::exp(0.5 * logvar);
    stdev.add_(cfg_.min_std);  // EXPECT: tensor-inplace-on-saved
    auto z = mu + torch::randn_like(stdev) * stdev;

    // FACT: z = torch.randn(4, 16); e = z.unsqueeze(1).expand(4, 8, 16); assert raises(lambda: e.add_(torch.randn(8, 16)), "more than one element")
    auto z_seq = z.unsqueeze(1).expand({B, T, cfg_.latent});
    z_seq.add_(time_embed_);  // EXPECT: tensor-inplace-on-expanded

    auto dec = decode(z_seq);
    return VaeOutput{dec.first, dec.second, mu, logvar};
  }

  // Synthetic "normal" windows from the prior, for sanity plots.
  torch::Tensor generate(int64_t n) {
    torch::NoGradGuard no_grad;
    auto z = torch::randn({n, cfg_.latent});
    // FACT: z = torch.randn(4, 16); r = z.unsqueeze(1).repeat(1, 8, 1); r += torch.randn(8, 16); assert is_copy_of(r, z)
    auto z_seq = z.unsqueeze(1).repeat({1, cfg_.window, 1});
    z_seq += time_embed_;  // LOOKALIKE: tensor-inplace-on-expanded -- repeat materialises the copies
    return decode(z_seq).first;
  }

  VaeConfig cfg_;
  nn::LSTM enc_{nullptr}, dec_{nullptr};
  nn::Linear to_mu_{nullptr}, to_logvar_{nullptr}, out_mu_{nullptr}, out_logvar_{nullptr};
  torch::Tensor time_embed_;
};
TORCH_MODULE(LstmVae);

// Elementwise -log N(x | mu, exp(logvar)).
torch::Tensor gaussian_nll(const torch::Tensor& x, const torch::Tensor& mu, const torch::Tensor& logvar) {
  return 0.5 * (logvar + (x - mu).pow(2) * torch::exp(-logvar) + std::log(2.0 * M_PI));
}

void train_vae(LstmVae& model, const torch::Tensor& train_windows, const VaeConfig& cfg) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const int64_t n = train_windows.size(0);
  int64_t global_step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n);
    double epoch_loss = 0.0;
    int64_t batches = 0;
    for (int64_t start = 0; start + cfg.batch_size <= n; start += cfg.batch_size) {
      auto clean = train_windows.index_select(0, perm.narrow(0, start, cfg.batch_size));
      auto noisy = clean.detach();
      noisy.add_(torch::randn_like(noisy) * cfg.input_noise);  // EXPECT: tensor-inplace-on-detached

      auto out = model->forward(noisy);
      auto recon = gaussian_nll(clean, out.x_mu, out.x_logvar).sum({1, 2}).mean();
      auto kl = (-0.5 * (1.0 + out.z_logvar - out.z_mu.pow(2) - out.z_logvar.exp())).sum(1).mean();
      const double beta = std::min(1.0, global_step / cfg.kl_warmup_steps);
      auto loss = recon + beta * kl;

      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();
      epoch_loss += loss.item<double>();  // LOOKALIKE: tensor-sync-in-loop -- model and data stay on the CPU
      ++batches;
      ++global_step;
    }
    std::cout << "epoch " << epoch << " -elbo " << epoch_loss / std::max<int64_t>(batches, 1) << "\n";
  }
}

// Monte-Carlo estimate of log p(x | z), z ~ q(z | x): [B, W, D].
torch::Tensor reconstruction_logprob(LstmVae& model, const torch::Tensor& x, int64_t n_samples) {
  torch::NoGradGuard no_grad;
  auto acc = torch::zeros_like(x);
  for (int64_t l = 0; l < n_samples; ++l) {
    auto out = model->forward(x);
    acc -= gaussian_nll(x, out.x_mu, out.x_logvar);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  }
  return acc / static_cast<double>(n_samples);
}

struct ScoreSmoother {
  torch::Tensor hist;  // [K, D] most recent log-probabilities, newest last
  torch::Tensor update(const torch::Tensor& logp) {
    const int64_t K = hist.size(0);
    // FACT: h = torch.randn(6, 4); h.narrow(0, 0, 5).copy_(h.narrow(0, 1, 5).clone())
    hist.narrow(0, 0, K - 1).copy_(hist.narrow(0, 1, K - 1).clone());  // LOOKALIKE: tensor-inplace-overlap -- the source is cloned first
    hist[K - 1] = logp;
    return hist.mean(0);
  }
};

class StreamScorer {
 public:
  StreamScorer(LstmVae model, Standardizer norm, const VaeConfig& cfg)
      : model_(std::move(model)), norm_(std::move(norm)), cfg_(cfg) {
    buffer_ = torch::zeros({cfg.window, cfg.n_features});
    threshold_ = torch::zeros({cfg.n_features});
    last_flags_ = torch::zeros({cfg.n_features}, torch::kBool);
    severity_ = torch::zeros({cfg.n_features}, torch::kByte);
    smoother_.hist = torch::zeros({cfg.smooth, cfg.n_features});
    model_->eval();
  }

  // Per-feature threshold: the anomaly_quantile of the newest point's log-probability on validation windows.
  void calibrate(const torch::Tensor& val_windows) {
    std::vector<torch::Tensor> newest;
    const int64_t n = val_windows.size(0);
    for (int64_t s = 0; s < n; s += cfg_.batch_size) {
      auto lp = reconstruction_logprob(model_, val_windows.narrow(0, s, std::min(cfg_.batch_size, n - s)), cfg_.n_samples);
      newest.push_back(lp.select(1, cfg_.window - 1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard
    }
    auto scores = torch::cat(newest);  // [N, D]
    threshold_ = torch::quantile(scores, cfg_.anomaly_quantile, /*dim=*/0);
  }

  // Score a recorded series offline, without touching the caller's data.
  torch::Tensor replay(const torch::Tensor& series) {
    auto x = series.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    // FACT: s = torch.randn(40, 3); x = s.to(torch.float32, copy=True); x.sub_(1.0); assert is_copy_of(x, s)
    x.sub_(norm_.mean).div_(norm_.stdev);  // LOOKALIKE: tensor-alias-then-mutate -- copy=true forces a new tensor
    auto windows = make_windows(x, cfg_.window, 1);
    auto lp = reconstruction_logprob(model_, windows, cfg_.n_samples);
    return lp.select(1, cfg_.window - 1) < threshold_;  // [T - W + 1, D]
  }

  // Feed one raw sample [D]; returns the per-feature flags of that sample.
  torch::Tensor push(const torch::Tensor& sample) {
    auto s = sample.to(torch::kFloat);
    // FACT: x = torch.randn(8); s = x.to(torch.float32); s.sub_(0.5).div_(2.0); assert shares_storage(x, s)
    s.sub_(norm_.mean).div_(norm_.stdev);  // EXPECT: tensor-alias-then-mutate

    const int64_t W = buffer_.size(0);
    // FACT: b = torch.randn(12, 3); assert raises(lambda: b.narrow(0, 0, 11).copy_(b.narrow(0, 1, 11)), "some elements")
    buffer_.narrow(0, 0, W - 1).copy_(buffer_.narrow(0, 1, W - 1));  // EXPECT: tensor-inplace-overlap
    buffer_[W - 1] = s;
    if (++seen_ < W) return torch::zeros_like(last_flags_);

    auto lp = reconstruction_logprob(model_, buffer_.unsqueeze(0), cfg_.n_samples);
    auto logp = smoother_.update(lp[0][W - 1]);
    last_flags_.copy_(logp < threshold_);  // LOOKALIKE: tensor-copy-narrowing -- a comparison is bool, like the destination

    // dashboard severity: threshold widths below the threshold, 0..255
    auto margin = (threshold_ - logp) / threshold_.abs().clamp_min(1e-6);
    severity_.copy_(margin.clamp(0, 255));  // EXPECT: tensor-copy-narrowing
    return last_flags_.clone();
  }

  const torch::Tensor& severity() const { return severity_; }

 private:
  LstmVae model_;
  Standardizer norm_;
  VaeConfig cfg_;
  ScoreSmoother smoother_;
  torch::Tensor buffer_, threshold_, last_flags_, severity_;
  int64_t seen_ = 0;
};

std::pair<StreamScorer, Standardizer> fit_detector(const torch::Tensor& train_series, const torch::Tensor& val_series,
                                                   const VaeConfig& cfg) {
  Standardizer norm;
  norm.fit(train_series);
  auto train_windows = make_windows((train_series - norm.mean) / norm.stdev, cfg.window, cfg.stride);
  auto val_windows = make_windows((val_series - norm.mean) / norm.stdev, cfg.window, cfg.stride);

  LstmVae model(cfg);
  train_vae(model, train_windows, cfg);
  StreamScorer scorer(model, norm, cfg);
  scorer.calibrate(val_windows);
  return {std::move(scorer), norm};
}
