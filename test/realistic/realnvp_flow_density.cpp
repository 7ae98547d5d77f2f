// Glow-style normalising flow (Kingma & Dhariwal 2018, after RealNVP, Dinh et al. 2017) for
// 32x32 RGB images: L levels, each a squeeze followed by K steps of actnorm (data-dependent
// init), invertible 1x1 convolution and affine coupling (checkerboard and channel masks), with
// half of the channels factored out after every level but the last. Trained by maximum
// likelihood on dequantised 8-bit pixels, reported in bits per dimension; samples are drawn at a
// reduced temperature, and a fixed-noise preview grid sweeps temperatures row by row.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct FlowConfig {
  int64_t channels = 3, image_size = 32, levels = 3, steps = 8, hidden = 512, n_bits = 8;
  int64_t preview_rows = 4, preview_cols = 8, log_every = 100, warmup_steps = 5000;
  double lr = 1e-3, temperature = 0.7, clip = 50.0;
  int epochs = 200;
};

// [B, C, H, W] -> [B, 4C, H/2, W/2]: each 2x2 patch becomes four channels.
torch::Tensor squeeze2x2(const torch::Tensor &x) {
  const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // FACT: x = torch.randn(2, 6, 4, 4).narrow(1, 0, 3); assert is_view_of(x.view(2, 3, 2, 2, 2, 2), x)
  auto y = x.view({B, C, H / 2, 2, W / 2, 2}).permute({0, 1, 3, 5, 2, 4}); // LOOKALIKE: tensor-view-non-contiguous -- only splits dims: a view even of a channel slice
  // FACT: x = torch.randn(2, 3, 4, 4); assert is_copy_of(x.view(2, 3, 2, 2, 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(2, 12, 2, 2), x)
  return y.reshape({B, C * 4, H / 2, W / 2}); // EXPECT: tensor-reshape-non-contiguous -- the patch dims sit between channels and rows: every squeeze copies the activations
}

// Inverse of squeeze2x2: [B, 4C, H, W] -> [B, C, 2H, 2W].
torch::Tensor unsqueeze2x2(const torch::Tensor &x) {
  const auto B = x.size(0), C = x.size(1) / 4, H = x.size(2), W = x.size(3);
  auto y = x.view({B, C, 2, 2, H, W}).permute({0, 1, 4, 2, 5, 3});
  // FACT: y = torch.randn(2, 12, 2, 2); assert raises(lambda: y.view(2, 3, 2, 2, 2, 2).permute(0, 1, 4, 2, 5, 3).view(2, 3, 4, 4), "view size is not compatible")
  return y.view({B, C, H * 2, W * 2}); // EXPECT: tensor-view-non-contiguous -- rows and their patch offsets are not adjacent after the permute: sampling throws
}

torch::Tensor gaussian_logp(const torch::Tensor &z, const torch::Tensor &mean, const torch::Tensor &logs) {
  return (-0.5 * (std::log(2 * kPi) + 2 * logs + (z - mean).pow(2) * torch::exp(-2 * logs))).sum({1, 2, 3});
}

// Checkerboard [1, 1, S, S] or channel [1, C, 1, 1] mask: 1 marks the half passed through unchanged.
torch::Tensor coupling_mask(int64_t C, int64_t S, bool checkerboard, bool flip) {
  auto m = checkerboard ? ((torch::arange(S).view({-1, 1}) + torch::arange(S).view({1, -1})) % 2).to(torch::kFloat).view({1, 1, S, S})
                        : (torch::arange(C) < C / 2).to(torch::kFloat).view({1, C, 1, 1});
  return flip ? 1 - m : m;
}

struct ActNormImpl : torch::nn::Module {
  explicit ActNormImpl(int64_t C) {
    loc_ = register_parameter("loc", torch::zeros({1, C, 1, 1}));
    log_scale_ = register_parameter("log_scale", torch::zeros({1, C, 1, 1}));
  }

  // Data-dependent init: zero mean and unit variance per channel on the first batch seen.
  void initialize(const torch::Tensor &x) {
    auto mean = x.mean({0, 2, 3}, /*keepdim=*/true);
    auto stdev = x.std({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true);
    // FACT: p = torch.nn.Parameter(torch.zeros(1, 3, 1, 1)); x = torch.randn(4, 3, 2, 2); assert raises(lambda: p.copy_(-x.mean((0, 2, 3), keepdim=True)), "a leaf Variable that requires grad")
    loc_.copy_(-mean); // EXPECT: tensor-inplace-on-leaf -- called from forward() with grad mode on
    // FACT: p = torch.nn.Parameter(torch.zeros(1, 3, 1, 1)); s = torch.rand(1, 3, 1, 1) + 0.5; p.data.copy_(-torch.log(s)); assert p.is_leaf and p.requires_grad and torch.allclose(p.detach(), -torch.log(s))
    log_scale_.data().copy_(-torch::log(stdev + 1e-6)); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- data() is no leaf; writing the parameter's values is the intent
    initialized_ = true;
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    if (!initialized_)
      initialize(x);
    auto y = (x + loc_) * torch::exp(log_scale_);
    return {y, (log_scale_.sum() * (x.size(2) * x.size(3))).expand({x.size(0)})};
  }
  torch::Tensor reverse(const torch::Tensor &y) { return y * torch::exp(-log_scale_) - loc_; }

  torch::Tensor loc_, log_scale_;
  bool initialized_ = false;
};
TORCH_MODULE(ActNorm);

struct InvConv1x1Impl : torch::nn::Module {
  explicit InvConv1x1Impl(int64_t C) {
    weight_ = register_parameter("weight", std::get<0>(torch::linalg_qr(torch::randn({C, C})))); // a random rotation
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    const auto C = weight_.size(0);
    // log|det W| in double: float32 LU drifts for the 48-channel levels
    auto logabsdet = std::get<1>(torch::slogdet(weight_.to(torch::kDouble))).to(x.scalar_type());
    // FACT: q = torch.linalg.qr(torch.randn(4, 4))[0]; w = torch.nn.Parameter(q); assert not is_contiguous(w) and is_view_of(w.view(4, 4, 1, 1), w)
    auto y = torch::conv2d(x, weight_.view({C, C, 1, 1})); // LOOKALIKE: tensor-view-non-contiguous -- QR's Q is column-major, but appending size-1 dims is always a view
    return {y, (logabsdet * (x.size(2) * x.size(3))).expand({x.size(0)})};
  }
  torch::Tensor reverse(const torch::Tensor &y) {
    const auto C = weight_.size(0);
    return torch::conv2d(y, torch::inverse(weight_.to(torch::kDouble)).to(y.scalar_type()).view({C, C, 1, 1}));
  }

  torch::Tensor weight_;
};
TORCH_MODULE(InvConv1x1);

struct AffineCouplingImpl : torch::nn::Module {
  AffineCouplingImpl(int64_t C, int64_t S, int64_t hidden, bool checkerboard, bool flip) : C_(C) {
    namespace nn = torch::nn;
    net_ = register_module("net", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(C, hidden, 3).padding(1)), nn::ReLU(),
                                                 nn::Conv2d(nn::Conv2dOptions(hidden, hidden, 1)), nn::ReLU()));
    out_ = register_module("out", nn::Conv2d(nn::Conv2dOptions(hidden, 2 * C, 3).padding(1)));
    out_scale_ = register_parameter("out_scale", torch::zeros({1, 2 * C, 1, 1}));
    mask_ = register_buffer("mask", coupling_mask(C, S, checkerboard, flip));
    torch::NoGradGuard no_grad;
    // FACT: c = torch.nn.Conv2d(4, 6, 3); exec('with torch.no_grad(): c.weight.zero_()'); assert c.weight.is_leaf and c.weight.requires_grad and c.weight.abs().sum() == 0
    out_->weight.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard: every step starts close to the identity
    out_->bias.zero_();
  }

  // Glow's zero-initialised output conv, scaled by exp(3 * s): sigmoid scale and shift for the free half.
  std::pair<torch::Tensor, torch::Tensor> scale_shift(const torch::Tensor &x_id) {
    auto h = out_(net_->forward(x_id));
    // FACT: conv = torch.nn.Conv2d(3, 6, 3, padding=1); s = torch.nn.Parameter(torch.zeros(1, 6, 1, 1)); h = conv(torch.randn(2, 3, 4, 4)); h.mul_(torch.exp(s * 3)); h.pow(2).sum().backward(); assert s.grad is not None
    h.mul_(torch::exp(out_scale_ * 3)); // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    return {torch::sigmoid(h.narrow(1, 0, C_) + 2.0), h.narrow(1, C_, C_)};
  }

  // y = x_id + (1 - m) * (x + shift) * scale; log|det| = sum of log scale over the free half
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    auto x_id = x * mask_; // LOOKALIKE: tensor-device-mismatch -- the mask is a buffer: it moves with the module
    auto [scale, shift] = scale_shift(x_id);
    auto y = x_id + (1 - mask_) * (x + shift) * scale;
    return {y, ((1 - mask_) * torch::log(scale)).sum({1, 2, 3})};
  }
  torch::Tensor reverse(const torch::Tensor &y) {
    auto y_id = y * mask_;
    auto [scale, shift] = scale_shift(y_id);
    return y_id + (1 - mask_) * (y / scale - shift);
  }

  int64_t C_;
  torch::nn::Sequential net_{nullptr};
  torch::nn::Conv2d out_{nullptr};
  torch::Tensor out_scale_, mask_;
};
TORCH_MODULE(AffineCoupling);

struct FlowStepImpl : torch::nn::Module {
  FlowStepImpl(int64_t C, int64_t S, int64_t hidden, bool checkerboard, bool flip) {
    norm_ = register_module("norm", ActNorm(C));
    conv_ = register_module("conv", InvConv1x1(C));
    coupling_ = register_module("coupling", AffineCoupling(C, S, hidden, checkerboard, flip));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    auto a = norm_(x);
    auto b = conv_(a.first);
    auto c = coupling_(b.first);
    return {c.first, a.second + b.second + c.second};
  }
  torch::Tensor reverse(const torch::Tensor &y) { return norm_->reverse(conv_->reverse(coupling_->reverse(y))); }

  ActNorm norm_{nullptr};
  InvConv1x1 conv_{nullptr};
  AffineCoupling coupling_{nullptr};
};
TORCH_MODULE(FlowStep);

struct FlowOut {
  std::vector<torch::Tensor> zs; // factored-out halves by level, the top latent last
  torch::Tensor log_prob;        // log p(x) per image, nats, continuous density on [0, 1)^D
};

struct GlowImpl : torch::nn::Module {
  explicit GlowImpl(const FlowConfig &cfg) {
    int64_t C = cfg.channels, S = cfg.image_size;
    for (int64_t l = 0; l < cfg.levels; ++l) {
      C *= 4, S /= 2;
      std::vector<FlowStep> level;
      for (int64_t k = 0; k < cfg.steps; ++k)
        level.push_back(register_module("l" + std::to_string(l) + "_s" + std::to_string(k),
                                        FlowStep(C, S, cfg.hidden, /*checkerboard=*/k % 2 == 0, /*flip=*/(k / 2) % 2 == 1)));
      levels_.push_back(std::move(level));
      if (l + 1 < cfg.levels)
        C /= 2, split_shapes_.push_back({C, S});
    }
    prior_ = register_parameter("prior", torch::zeros({1, 2 * C, S, S})); // learned mean and log-std of the top latent
  }

  FlowOut forward(const torch::Tensor &x) {
    FlowOut out;
    auto h = x - 0.5;
    auto logp = torch::zeros({x.size(0)}, x.options());
    for (size_t l = 0; l < levels_.size(); ++l) {
      h = squeeze2x2(h);
      for (auto &step : levels_[l]) {
        auto r = step(h);
        h = r.first;
        logp = logp + r.second; // LOOKALIKE: tensor-graph-kept-across-iterations -- the log-dets of this forward pass, returned for the loss
      }
      if (l + 1 < levels_.size()) {
        const auto half = h.size(1) / 2;
        out.zs.push_back(h.narrow(1, half, half));
        logp = logp + gaussian_logp(out.zs.back(), torch::zeros_like(out.zs.back()), torch::zeros_like(out.zs.back()));
        h = h.narrow(1, 0, half);
      }
    }
    auto prior = prior_.expand({x.size(0), -1, -1, -1});
    const auto C = h.size(1);
    out.zs.push_back(h);
    // FACT: p = torch.nn.Parameter(torch.zeros(1, 6, 4, 4)); e = p.expand(5, -1, -1, -1); z = torch.randn(5, 3, 4, 4); ((z - e.narrow(1, 0, 3)) * torch.exp(-e.narrow(1, 3, 3))).pow(2).sum().backward(); assert p.grad.shape == p.shape
    out.log_prob = logp + gaussian_logp(h, prior.narrow(1, 0, C), prior.narrow(1, C, C)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded prior is only read
    return out;
  }

  // The top latent at temperature T from standard-normal noise: mean + T * std * eps.
  torch::Tensor top_latent(const torch::Tensor &eps, double temperature) {
    torch::NoGradGuard no_grad;
    auto prior = prior_.expand({eps.size(0), -1, -1, -1});
    const auto C = eps.size(1);
    auto mean = prior.narrow(1, 0, C), logs = prior.narrow(1, C, C);
    // FACT: p = torch.nn.Parameter(torch.zeros(1, 6, 4, 4)); l = p.expand(5, -1, -1, -1).narrow(1, 3, 3); g = torch.no_grad(); g.__enter__(); ok = raises(lambda: l.add_(-0.35), "more than one element of the written-to tensor"); g.__exit__(None, None, None); assert ok
    logs.add_(std::log(temperature)); // EXPECT: tensor-inplace-on-expanded -- every sample's log-std is the one prior row
    return mean + torch::exp(logs) * eps;
  }

  torch::Tensor decode(const std::vector<torch::Tensor> &zs) {
    auto h = zs.back();
    for (auto l = static_cast<int64_t>(levels_.size()) - 1; l >= 0; --l) {
      if (l + 1 < static_cast<int64_t>(levels_.size()))
        h = torch::cat({h, zs[l]}, 1);
      for (auto it = levels_[l].rbegin(); it != levels_[l].rend(); ++it)
        h = (*it)->reverse(h);
      h = unsqueeze2x2(h);
    }
    return h + 0.5;
  }

  torch::Tensor sample(const torch::Tensor &eps, double temperature) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> zs;
    for (const auto &s : split_shapes_)
      zs.push_back(torch::randn({eps.size(0), s.first, s.second, s.second}, eps.options()) * temperature); // LOOKALIKE: tensor-device-mismatch -- made with eps's options, on its device
    zs.push_back(top_latent(eps, temperature));
    return decode(zs);
  }

  int64_t top_channels() const { return prior_.size(1) / 2; }
  int64_t top_size() const { return prior_.size(2); }

  std::vector<std::vector<FlowStep>> levels_;
  std::vector<std::pair<int64_t, int64_t>> split_shapes_; // (channels, size) of each factored-out half
  torch::Tensor prior_;
};
TORCH_MODULE(Glow);

// Round trip x -> z -> x on one batch: a broken inverse shows up as a large error.
double check_invertible(Glow &model, const torch::Tensor &x) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x_in = x.clone(); // EXPECT: tensor-unnecessary-clone -- neither x nor the copy is written: the error can be taken against x
  auto rec = model->decode(model->forward(x).zs);
  return (rec - x_in).abs().max().item<double>();
}

// The same noise every epoch so grids are comparable; row r at temperature 0.5 .. 1.0.
class Previewer {
public:
  Previewer(Glow model, const FlowConfig &cfg, torch::Device device) : model_(std::move(model)) {
    const auto n = cfg.preview_rows * cfg.preview_cols, S = model_->top_size();
    eps_ = torch::randn({n, model_->top_channels(), S, S}, torch::TensorOptions().device(device));
    temps_ = torch::linspace(0.5, 1.0, cfg.preview_rows, torch::TensorOptions().device(device)).repeat_interleave(cfg.preview_cols).view({-1, 1, 1, 1});
  }

  void save(int epoch) {
    torch::NoGradGuard no_grad;
    model_->eval();
    torch::Tensor eps = eps_;
    // FACT: e = torch.randn(4, 3, 2, 2); e0 = e.clone(); x = e; x.mul_(torch.full((4, 1, 1, 1), 0.5)); assert shares_storage(x, e) and torch.equal(e, e0 * 0.5)
    eps.mul_(temps_); // EXPECT: tensor-alias-then-mutate -- eps is the member: the fixed noise shrinks at every preview
    auto img = model_->sample(eps, 1.0).clamp(0, 1);
    torch::save((img * 255).round().to(torch::kUInt8).cpu(), "preview_" + std::to_string(epoch) + ".pt");
  }

private:
  Glow model_;
  torch::Tensor eps_, temps_;
};

void train(Glow &model, const std::vector<torch::Tensor> &batches, const FlowConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const double bins = std::pow(2.0, static_cast<double>(cfg.n_bits));
  const double dims = static_cast<double>(cfg.channels * cfg.image_size * cfg.image_size);
  Previewer preview(model, cfg, device);
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_bpd = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &images : batches) { // [B, 3, 32, 32] pixel values 0 .. 255
      auto x = images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      x = (x + torch::rand(x.sizes())) / bins; // EXPECT: tensor-device-mismatch -- the dequantisation noise is made on the host, the pixels are on the GPU
      auto out = model->forward(x);
      auto bpd = ((-out.log_prob + dims * std::log(bins)) / (dims * std::log(2.0))).mean();
      for (auto &group : opt.param_groups())
        static_cast<torch::optim::AdamOptions &>(group.options()).lr(cfg.lr * std::min(1.0, (step + 1.0) / cfg.warmup_steps));
      opt.zero_grad();
      bpd.backward();
      torch::nn::utils::clip_grad_value_(model->parameters(), cfg.clip);
      opt.step();
      epoch_bpd += bpd.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " bpd " << bpd.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " bpd " << (epoch_bpd / static_cast<double>(batches.size())).item<double>() << "\n";
    std::cout << "  round-trip error " << check_invertible(model, batches.front().to(device).div(bins)) << "\n";
    preview.save(epoch);
  }
}
