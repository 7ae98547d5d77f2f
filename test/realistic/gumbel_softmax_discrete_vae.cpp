// Discrete VAE with a grid of categorical latents (Jang et al. 2017; the dVAE of DALL-E). A conv
// encoder gives logits over K codes for every cell of a 7x7 grid; a Gumbel-softmax sample (hard:
// straight-through one-hot) feeds a conv decoder that predicts Bernoulli pixel logits. The loss is
// the reconstruction NLL plus the KL of the posterior to a uniform prior; the temperature is annealed
// every few hundred steps. Also: token export for a prior model, sampling from the uniform prior,
// and an 8-bit image dump.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct DvaeConfig {
  int64_t codes = 64, hidden = 128, grid = 7, image_size = 28, batch = 128, epochs = 30;
  int64_t anneal_every = 500, log_every = 100, n_samples = 64, panel_seed = 1234;
  double lr = 1e-3, tau0 = 1.0, tau_min = 0.5, anneal_rate = 3e-5, kl_weight = 1.0, usage_tau = 0.5;
  double pixel_smoothing = 0.02, data_logit = -1.4;
  bool hard = true;
};

// Relaxed one-hot sample over dim 1. hard: one-hot in the forward pass, the soft sample's gradient.
torch::Tensor gumbel_softmax(const torch::Tensor &logits, double tau, bool hard) {
  auto u = torch::rand_like(logits).clamp_(1e-10, 1.0 - 1e-10); // LOOKALIKE: tensor-device-mismatch -- rand_like makes the noise on the logits' device
  auto g = -torch::log(-torch::log(u));
  auto y_soft = torch::softmax((logits + g) / tau, 1);
  if (!hard)
    return y_soft;
  auto index = y_soft.argmax(1, /*keepdim=*/true);
  // FACT: l = torch.randn(2, 5, 3, 3, requires_grad=True); y = torch.softmax(l, 1); h = torch.zeros_like(y).scatter_(1, y.argmax(1, True), 1.0); (h - y.detach() + y).sum().backward(); assert l.grad is not None
  auto y_hard = torch::zeros_like(y_soft).scatter_(1, index, 1.0); // LOOKALIKE: tensor-inplace-on-saved -- zeros_like is a new tensor, not softmax's output
  return y_hard - y_soft.detach() + y_soft;
}

// [B, K, h, w] -> [B, h, w, K]: one categorical distribution per grid cell, classes last.
torch::Tensor classes_last(const torch::Tensor &t) { return t.permute({0, 2, 3, 1}); }

struct DvaeOutput {
  torch::Tensor recon_logits, logits, z; // [B, 1, H, W], [B, K, h, w], [B, K, h, w]
};

struct DvaeImpl : nn::Module {
  explicit DvaeImpl(const DvaeConfig &cfg) : cfg_(cfg) {
    enc = register_module("enc", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 64, 4).stride(2).padding(1)), nn::ReLU(),
                                                nn::Conv2d(nn::Conv2dOptions(64, cfg.hidden, 4).stride(2).padding(1)), nn::ReLU(),
                                                nn::Conv2d(nn::Conv2dOptions(cfg.hidden, cfg.codes, 1))));
    dec = register_module("dec", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(cfg.codes, cfg.hidden, 1)), nn::ReLU(),
                                                nn::ConvTranspose2d(nn::ConvTranspose2dOptions(cfg.hidden, 64, 4).stride(2).padding(1)),
                                                nn::ReLU()));
    out = register_module("out", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1)));
    usage_ema_ = register_buffer("usage_ema", torch::full({cfg.codes}, 1.0 / static_cast<double>(cfg.codes)));
    torch::NoGradGuard no_grad;
    // Start the pixel logits at the data's mean log-odds, so the first steps do not fight the bias.
    out->bias.fill_(cfg.data_logit); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor encode(const torch::Tensor &x) { return enc->forward(x); }
  torch::Tensor decode(const torch::Tensor &z) { return out(dec->forward(z)); }

  DvaeOutput forward(const torch::Tensor &x, double tau, bool hard) {
    auto logits = encode(x);
    if (is_training()) {
      // Code usage on sharpened probabilities: dead codes show up as zeros in the EMA.
      auto sharp = logits.detach();
      // FACT: c = torch.nn.Conv2d(2, 4, 1); l = c(torch.randn(2, 2, 3, 3)); l0 = l.detach().clone(); s = l.detach(); s.div_(0.5); assert shares_storage(s, l) and not torch.equal(l.detach(), l0)
      sharp.div_(cfg_.usage_tau); // EXPECT: tensor-inplace-on-detached
      auto usage = torch::softmax(sharp, 1).mean({0, 2, 3});
      usage_ema_.mul_(0.99).add_(usage, 0.01); // LOOKALIKE: tensor-inplace-on-leaf, tensor-graph-kept-across-iterations -- a buffer, fed from detached logits
    }
    auto z = gumbel_softmax(logits, tau, hard);
    return {decode(z), logits, z};
  }

  const torch::Tensor &usage() const { return usage_ema_; }

  DvaeConfig cfg_;
  nn::Sequential enc{nullptr}, dec{nullptr};
  nn::ConvTranspose2d out{nullptr};
  torch::Tensor usage_ema_;
};
TORCH_MODULE(Dvae);

// KL(q || uniform) per image, summed over the grid: sum_k q log q + log K for every cell.
torch::Tensor kl_to_uniform(const torch::Tensor &logits) {
  const auto K = logits.size(1);
  auto q = torch::softmax(logits, 1);
  // FACT: l = torch.randn(2, 5, 3, 3, requires_grad=True); q = torch.softmax(l, 1); q.clamp_min_(1e-10); assert backward_fails(lambda: (q * q.log()).sum().backward())
  q.clamp_min_(1e-10); // EXPECT: tensor-inplace-on-saved
  return (q * (q.log() + std::log(static_cast<double>(K)))).sum({1, 2, 3});
}

// Perplexity of the batch's average code distribution (K when every code is used equally).
double code_perplexity(const torch::Tensor &logits) {
  const auto K = logits.size(1);
  // FACT: p = torch.softmax(torch.randn(4, 6, 3, 3), 1); assert is_copy_of(p.permute(0, 2, 3, 1).reshape(-1, 6), p)
  auto avg = classes_last(torch::softmax(logits, 1)).reshape({-1, K}).mean(0); // EXPECT: tensor-reshape-non-contiguous
  return std::exp(-(avg * avg.clamp_min(1e-10).log()).sum().item<double>());
}

double temperature_at(int64_t step, const DvaeConfig &cfg) {
  const auto k = step / cfg.anneal_every * cfg.anneal_every;
  return std::max(cfg.tau_min, cfg.tau0 * std::exp(-cfg.anneal_rate * static_cast<double>(k)));
}

// batches: the training images, [B, 1, H, W] float in [0, 1].
void train(Dvae &model, const std::vector<torch::Tensor> &batches, const DvaeConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> kl_hist;
    double recon_sum = 0;
    int64_t n_batches = 0;
    for (const auto &images : batches) {
      auto x = images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      const auto B = x.size(0);
      const double tau = temperature_at(step, cfg);
      auto out = model->forward(x, tau, cfg.hard);
      auto target = (x > 0.5).to(torch::kFloat);
      // FACT: x = torch.rand(4, 1, 6, 6); t = (x > 0.5).to(torch.float32); t.mul_(0.98).add_(0.01); assert is_copy_of(t, x)
      target.mul_(1.0 - cfg.pixel_smoothing).add_(0.5 * cfg.pixel_smoothing); // LOOKALIKE: tensor-alias-then-mutate -- a bool mask converted to float is a new tensor
      auto recon = F::binary_cross_entropy_with_logits(out.recon_logits, target,
                                                       F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum)) / B;
      auto kl = kl_to_uniform(out.logits).mean();
      auto loss = recon + cfg.kl_weight * kl;
      opt.zero_grad();
      loss.backward();
      opt.step();

      kl_hist.push_back(kl); // EXPECT: tensor-graph-kept-across-iterations
      recon_sum += recon.item<double>(); // EXPECT: tensor-sync-in-loop
      ++n_batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " tau " << tau << " loss " << loss.item<double>() // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
                  << " perplexity " << code_perplexity(out.logits.detach()) << "\n";
    }
    const double mean_kl = torch::stack(kl_hist).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per epoch
    std::cout << "epoch " << epoch << " recon " << recon_sum / static_cast<double>(n_batches) << " kl " << mean_kl << " dead codes "
              << (model->usage() < 1e-3).sum().item<int64_t>() << "\n";
  }
}

// Hard codes [B, h, w] of a batch, for training an autoregressive prior over the grid.
torch::Tensor encode_tokens(Dvae &model, const torch::Tensor &x) {
  torch::NoGradGuard no_grad;
  auto logits = model->encode(x);
  const auto B = logits.size(0), K = logits.size(1), h = logits.size(2), w = logits.size(3);
  // FACT: l = torch.randn(2, 6, 3, 3); assert raises(lambda: l.permute(0, 2, 3, 1).view(-1, 6), "view size is not compatible")
  return classes_last(logits).view({-1, K}).argmax(1).view({B, h, w}); // EXPECT: tensor-view-non-contiguous
}

// Per-cell code sequences of a whole data set, [N, h * w] int64.
torch::Tensor export_tokens(Dvae &model, const torch::Tensor &images, const DvaeConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto N = images.size(0), cells = cfg.grid * cfg.grid;
  auto tokens = torch::empty({N, cells}, torch::kLong);
  for (int64_t i = 0; i < N; i += cfg.batch) {
    const auto b = std::min(cfg.batch, N - i);
    auto logits = model->encode(images.narrow(0, i, b).to(device));
    // FACT: l = torch.randn(2, 6, 3, 3); assert is_view_of(l.permute(0, 2, 3, 1).view(2, 9, 6), l)
    auto per_cell = classes_last(logits).view({b, cells, cfg.codes}); // LOOKALIKE: tensor-view-non-contiguous -- merges only the two grid dims, which stay adjacent
    // FACT: t = torch.empty(4, 9, dtype=torch.long); a = torch.randn(2, 9, 6).argmax(-1); t.narrow(0, 0, 2).copy_(a); assert a.dtype == t.dtype
    tokens.narrow(0, i, b).copy_(per_cell.argmax(-1).cpu()); // LOOKALIKE: tensor-copy-narrowing -- argmax gives int64, like the buffer
  }
  return tokens;
}

// Reconstruction error (nats per image) on held-out data with hard codes at the final temperature.
double evaluate(Dvae &model, const torch::Tensor &images, const DvaeConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto total = torch::zeros({}, torch::TensorOptions().device(device));
  const auto N = images.size(0);
  for (int64_t i = 0; i < N; i += cfg.batch) {
    const auto b = std::min(cfg.batch, N - i);
    auto x = images.narrow(0, i, b).to(device);
    auto out = model->forward(x, cfg.tau_min, /*hard=*/true);
    auto nll = F::binary_cross_entropy_with_logits(out.recon_logits, (x > 0.5).to(torch::kFloat),
                                                   F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
    // FACT: r = torch.nn.functional.binary_cross_entropy_with_logits(torch.randn(2, 1, 4, 4), torch.rand(2, 1, 4, 4), reduction='none'); assert is_view_of(r.view(2, -1), r)
    total += nll.view({b, -1}).sum(1).sum(); // LOOKALIKE: tensor-view-non-contiguous, tensor-graph-kept-across-iterations -- the loss map is contiguous; under NoGradGuard
  }
  return total.item<double>() / static_cast<double>(N);
}

// Decodes codes drawn from the uniform prior into 8-bit images: the samples, the same samples with
// the top half of every grid re-drawn (to show how local the codes are), and a fixed panel.
std::vector<torch::Tensor> sample_images(Dvae &model, const DvaeConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto n = cfg.n_samples, g = cfg.grid;
  auto codes = torch::randint(cfg.codes, {n, g, g}, torch::TensorOptions().dtype(torch::kLong).device(device)); // LOOKALIKE: tensor-device-mismatch -- drawn on the model's device
  auto edited = codes.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the copy is re-drawn below while the original codes are decoded too
  edited.narrow(1, 0, g / 2).random_(0, cfg.codes);
  auto one_hot = [&](const torch::Tensor &c) { return F::one_hot(c, cfg.codes).permute({0, 3, 1, 2}).to(torch::kFloat); };
  auto probs = torch::sigmoid(model->decode(one_hot(codes)));
  auto probs_edited = torch::sigmoid(model->decode(one_hot(edited)));
  auto shown = probs.clone(); // EXPECT: tensor-unnecessary-clone
  shown.mul_(255.0);
  auto img = torch::empty({n, 1, cfg.image_size, cfg.image_size}, torch::kByte);
  // FACT: t = torch.empty(3, dtype=torch.uint8); t.copy_(torch.tensor([254.7, 3.9, 0.6])); assert t.tolist() == [254, 3, 0]
  img.copy_(shown.cpu()); // EXPECT: tensor-copy-narrowing
  auto img_edited = (probs_edited * 255.0).round().to(torch::kByte).cpu(); // LOOKALIKE: tensor-copy-narrowing -- rounded, then converted explicitly

  // A fixed grid from a seeded host generator, so the panel is the same in every run.
  torch::manual_seed(cfg.panel_seed);
  auto idx = torch::randint(cfg.codes, {n, g, g});
  auto host_z = F::one_hot(idx, cfg.codes).permute({0, 3, 1, 2}).to(torch::kFloat);
  auto probs_host = torch::sigmoid(model->decode(host_z)); // EXPECT: tensor-device-mismatch
  return {img, img_edited, (probs_host * 255.0).round().to(torch::kByte).cpu()};
}
