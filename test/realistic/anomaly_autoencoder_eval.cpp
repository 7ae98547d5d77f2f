// Visual inspection: a convolutional (denoising) autoencoder trained on defect-free images only.
// The per-image reconstruction error is the anomaly score; the alarm threshold is a quantile of
// the scores of held-out normal images, and a monitor keeps running statistics of the score over
// the production stream to report drift.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <utility>
#include <vector>

struct AEConfig {
  int64_t channels = 3, base = 32, latent = 128;
  int64_t epochs = 30, window = 64;
  double lr = 1e-3, noise_std = 0.05, quantile = 0.995, momentum = 0.99;
};

struct ConvAutoencoderImpl : torch::nn::Module {
  explicit ConvAutoencoderImpl(const AEConfig &cfg) {
    namespace nn = torch::nn;
    const auto c = cfg.base;
    auto lrelu = [] { return nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)); };
    encoder_ = register_module(
        "encoder", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(cfg.channels, c, 4).stride(2).padding(1)), lrelu(),
                                  nn::Conv2d(nn::Conv2dOptions(c, 2 * c, 4).stride(2).padding(1)), nn::BatchNorm2d(2 * c),
                                  lrelu(), nn::Conv2d(nn::Conv2dOptions(2 * c, 4 * c, 4).stride(2).padding(1)),
                                  nn::BatchNorm2d(4 * c), lrelu(), nn::Conv2d(nn::Conv2dOptions(4 * c, cfg.latent, 1))));
    decoder_ = register_module(
        "decoder",
        nn::Sequential(nn::ConvTranspose2d(nn::ConvTranspose2dOptions(cfg.latent, 4 * c, 1)), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(4 * c, 2 * c, 4).stride(2).padding(1)),
                       nn::BatchNorm2d(2 * c), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2 * c, c, 4).stride(2).padding(1)),
                       nn::BatchNorm2d(c), nn::ReLU(),
                       nn::ConvTranspose2d(nn::ConvTranspose2dOptions(c, cfg.channels, 4).stride(2).padding(1)),
                       nn::Sigmoid()));
  }
  torch::Tensor forward(const torch::Tensor &x) { return decoder_->forward(encoder_->forward(x)); }
  torch::nn::Sequential encoder_{nullptr}, decoder_{nullptr};
};
TORCH_MODULE(ConvAutoencoder);

// Per-image score and per-pixel error map (mean over channels) of a batch [B, C, H, W].
std::pair<torch::Tensor, torch::Tensor> reconstruction_error(ConvAutoencoder &model, const torch::Tensor &x) {
  auto err_map = (model->forward(x) - x).pow(2).mean(1); // [B, H, W]
  // FACT: m = (torch.rand(2, 3, 4, 5) - torch.rand(2, 3, 4, 5)).pow(2).mean(1); assert is_view_of(m.flatten(1), m)
  auto score = err_map.flatten(1).mean(1); // LOOKALIKE: tensor-reshape-non-contiguous -- the channel mean is a fresh contiguous [B, H, W]
  return {score, err_map};
}

void train(ConvAutoencoder &model, const std::vector<torch::Tensor> &batches, const AEConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    int64_t step = 0;
    for (const auto &batch : batches) {
      auto x = batch.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      // Denoising objective: reconstruct the clean image from a corrupted copy.
      auto noisy = x.detach();
      // FACT: x = torch.rand(2, 3); x0 = x.clone(); n = x.detach(); n.add_(torch.randn(2, 3) * 0.05).clamp_(0.0, 1.0); assert shares_storage(n, x) and not torch.equal(x, x0)
      noisy.add_(torch::randn_like(noisy) * cfg.noise_std).clamp_(0.0, 1.0); // EXPECT: tensor-inplace-on-detached -- 'x', the clean target, is corrupted as well
      auto loss = torch::mse_loss(model->forward(noisy), x);
      opt.zero_grad();
      loss.backward();
      opt.step();
      std::cout << "epoch " << epoch << " step " << step++ << " loss " << loss.item<float>() << "\n"; // EXPECT: tensor-sync-in-loop
    }
  }
}

double validate(ConvAutoencoder &model, const std::vector<torch::Tensor> &batches, torch::Device device) {
  model->eval();
  torch::Tensor total = torch::zeros({}, device);
  int64_t n = 0;
  for (const auto &batch : batches) {
    auto x = batch.to(device);
    // FACT: m = torch.nn.Linear(3, 3); t = torch.zeros(()); exec('for _ in range(3):\n x = torch.rand(2, 3); t += torch.nn.functional.mse_loss(m(x), x, reduction="sum")'); assert t.requires_grad and kept_nodes(t) >= 6
    total += torch::mse_loss(model->forward(x), x, torch::Reduction::Sum); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard: every batch's graph lives until the sum is read
    n += x.numel();
  }
  return total.item<double>() / n;
}

struct Calibration {
  double threshold = 0, mean = 0, stdev = 1;
};

// Threshold at a quantile of the scores of held-out normal images (label 0); labels 1 are
// known defects, used only to report the recall at that threshold.
Calibration calibrate(ConvAutoencoder &model, const std::vector<std::pair<torch::Tensor, torch::Tensor>> &held_out,
                      torch::Device device, const AEConfig &cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t n = 0;
  for (const auto &b : held_out)
    n += b.first.size(0);
  auto labels = torch::empty({n}, torch::kLong);
  auto scores = torch::empty_like(labels);
  int64_t off = 0;
  for (const auto &[images, target] : held_out) {
    const auto b = images.size(0);
    auto x = images.to(device);
    auto score = (model->forward(x) - x).pow(2).flatten(1).mean(1);
    // FACT: s = torch.empty(4, dtype=torch.long); s.narrow(0, 0, 2).copy_(torch.tensor([0.0132, 0.4])); assert s[:2].tolist() == [0, 0]
    scores.narrow(0, off, b).copy_(score); // EXPECT: tensor-copy-narrowing -- empty_like(labels) is int64: every score truncates to 0
    // FACT: l = torch.empty(3, dtype=torch.long); l.copy_(torch.tensor([0.0, 1.0, 0.0])); assert l.tolist() == [0, 1, 0]
    labels.narrow(0, off, b).copy_(target); // LOOKALIKE: tensor-copy-narrowing -- 0/1 labels are exact in int64 whatever their dtype
    off += b;
  }
  auto normal = scores.masked_select(labels == 0).to(torch::kDouble);
  auto sorted = std::get<0>(normal.sort());
  const auto k = std::min<int64_t>(sorted.size(0) - 1, static_cast<int64_t>(cfg.quantile * sorted.size(0)));
  Calibration cal;
  cal.threshold = sorted[k].item<double>();
  cal.mean = normal.mean().item<double>();
  cal.stdev = normal.std().item<double>();
  auto recall = (scores.masked_select(labels == 1) > cal.threshold).to(torch::kDouble).mean();
  std::cout << "threshold " << cal.threshold << " defect recall " << recall.item<double>() << "\n";
  return cal;
}

// Scores of the production stream, on the host: an EMA of the score's mean and variance for
// drift, and the last `window` scores for a smoothed alarm.
class OnlineMonitor {
public:
  OnlineMonitor(const Calibration &cal, const AEConfig &cfg)
      : cal_(cal), momentum_(cfg.momentum), mean_(torch::full({}, cal.mean)),
        var_(torch::full({}, cal.stdev * cal.stdev)), recent_(torch::zeros({cfg.window})) {}

  // One alarm flag per image of the batch.
  torch::Tensor push(const torch::Tensor &scores) {
    const auto W = recent_.size(0);
    for (int64_t i = 0; i < scores.size(0); ++i) {
      // FACT: r = torch.zeros(6); assert raises(lambda: r.narrow(0, 0, 5).copy_(r.narrow(0, 1, 5)), "some elements of the input tensor and the written-to tensor")
      recent_.narrow(0, 0, W - 1).copy_(recent_.narrow(0, 1, W - 1)); // EXPECT: tensor-inplace-overlap
      recent_[W - 1] = scores[i];
    }
    auto prev_mean = mean_;
    // FACT: m = torch.zeros(()); p = m; s = torch.tensor([3.0, 5.0]); m.mul_(0.9).add_(s.mean(), alpha=0.1); assert shares_storage(p, m) and p.item() == m.item() != 0.0
    mean_.mul_(momentum_).add_(scores.mean(), 1.0 - momentum_); // EXPECT: tensor-alias-then-mutate -- 'prev_mean' follows: the variance below uses the new mean
    var_.mul_(momentum_).add_((scores - prev_mean).pow(2).mean(), 1.0 - momentum_);
    auto z = scores.to(torch::kDouble);
    // FACT: s = torch.rand(4); z = s.to(torch.float64); z.sub_(0.5).div_(0.1); assert is_copy_of(z, s)
    z.sub_(cal_.mean).div_(cal_.stdev); // LOOKALIKE: tensor-alias-then-mutate -- float32 scores: to(kDouble) makes a copy
    last_z_ = z;
    return (scores > cal_.threshold).logical_or(recent_.mean() > cal_.threshold);
  }
  double drift() const { return (mean_.item<double>() - cal_.mean) / cal_.stdev; }

private:
  Calibration cal_;
  double momentum_;
  torch::Tensor mean_, var_, recent_, last_z_;
};

// Scores a stream of batches on the GPU and keeps the error maps of the flagged images.
int64_t detect(ConvAutoencoder &model, OnlineMonitor &monitor, const std::vector<torch::Tensor> &stream,
               std::vector<torch::Tensor> &maps_out) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  int64_t n_alarms = 0;
  for (const auto &batch : stream) {
    auto [score, err_map] = reconstruction_error(model, batch.cuda());
    auto flags = monitor.push(score.cpu()); // LOOKALIKE: tensor-sync-in-loop -- the host scores are data for the monitor
    auto idx = flags.nonzero().squeeze(1);
    n_alarms += idx.size(0);
    if (idx.size(0) > 0)
      maps_out.push_back(err_map.index_select(0, idx.cuda()).cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- under NoGradGuard; the host maps are kept
  }
  std::cout << "alarms " << n_alarms << " drift " << monitor.drift() << "\n";
  return n_alarms;
}
