// StyleGAN2 (Karras et al. 2020) at small scale: a mapping network with equalised learning rate
// that tracks the average w, modulated/demodulated convolutions fed one style vector per layer,
// style mixing regularisation while training, lazy R1 and path-length regularisation, an EMA copy
// of the generator, and the truncation trick for the figures (psi rows, sweep, mixing grid).
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct StyleConfig {
  int64_t z_dim = 512, w_dim = 512, mapping_layers = 8, resolution = 64, channels = 256;
  int64_t pl_batch_shrink = 2, pl_interval = 4, r1_interval = 16, steps = 100000, log_every = 100;
  double lr_mul = 0.01, w_avg_beta = 0.995, mixing_prob = 0.9, pl_weight = 2.0, pl_decay = 0.01, r1_gamma = 10.0;
  double lr = 0.0025, ema_beta = 0.999;
};

// Linear layer with equalised learning rate: weights stored at N(0, 1 / lr_mul^2), scaled at run time.
struct EqualLinearImpl : torch::nn::Module {
  EqualLinearImpl(int64_t in, int64_t out, double lr_mul, double bias_init = 0.0, bool act = true)
      : w_gain_(lr_mul / std::sqrt(static_cast<double>(in))), b_gain_(lr_mul), act_(act) {
    // FACT: w = torch.randn(4, 3).div_(0.01); p = torch.nn.Parameter(w); assert p.is_leaf and p.requires_grad
    weight_ = register_parameter("weight", torch::randn({out, in}).div_(lr_mul)); // LOOKALIKE: tensor-inplace-on-leaf -- divided before register_parameter makes it a parameter
    bias_ = register_parameter("bias", torch::full({out}, bias_init / lr_mul));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto y = F::linear(x, weight_ * w_gain_, bias_ * b_gain_);
    return act_ ? torch::leaky_relu(y, 0.2) * std::sqrt(2.0) : y;
  }
  torch::Tensor weight_, bias_;
  double w_gain_, b_gain_; bool act_;
};
TORCH_MODULE(EqualLinear);

struct MappingNetworkImpl : torch::nn::Module {
  explicit MappingNetworkImpl(const StyleConfig &cfg) : beta_(cfg.w_avg_beta) {
    for (int64_t i = 0; i < cfg.mapping_layers; ++i)
      layers_.push_back(register_module("fc" + std::to_string(i), EqualLinear(i == 0 ? cfg.z_dim : cfg.w_dim, cfg.w_dim, cfg.lr_mul)));
    w_avg_ = register_buffer("w_avg", torch::zeros({cfg.w_dim}));
  }
  // z [B, z_dim] -> w [B, w_dim]; while training, also the running average of w.
  torch::Tensor forward(const torch::Tensor &z) {
    auto x = z * (z.square().mean(1, true) + 1e-8).rsqrt();
    for (auto &l : layers_) x = l->forward(x);
    if (is_training()) {
      torch::NoGradGuard no_grad;
      // FACT: m = torch.nn.Module(); m.register_buffer('w_avg', torch.zeros(4)); w = torch.randn(3, 4, requires_grad=True); w0 = w.detach().clone(); exec('with torch.no_grad(): m.w_avg.copy_(w.detach().mean(0).lerp(m.w_avg, 0.995))'); assert not m.w_avg.requires_grad and torch.equal(w.detach(), w0)
      w_avg_.copy_(x.detach().mean(0).lerp(w_avg_, beta_)); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- a buffer written under NoGradGuard; the detached w is only read
    }
    return x;
  }
  std::vector<EqualLinear> layers_;
  torch::Tensor w_avg_;
  double beta_;
};
TORCH_MODULE(MappingNetwork);

// 3x3 (or 1x1 for toRGB) convolution whose weights are scaled per sample by the style.
struct ModulatedConvImpl : torch::nn::Module {
  ModulatedConvImpl(int64_t in, int64_t out, int64_t k, int64_t w_dim, bool up, bool demod, bool act)
      : k_(k), up_(up), demod_(demod), act_(act), scale_(1.0 / std::sqrt(static_cast<double>(in * k * k))) {
    weight_ = register_parameter("weight", torch::randn({1, out, in, k, k}));
    bias_ = register_parameter("bias", torch::zeros({out}));
    affine_ = register_module("affine", EqualLinear(w_dim, in, 1.0, 1.0, false));
    if (act) noise_strength_ = register_parameter("noise_strength", torch::zeros({1}));
  }
  // x [B, I, H, W], w [B, w_dim]
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &w) {
    auto h = up_ ? F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest)) : x;
    const auto B = h.size(0), I = h.size(1), H = h.size(2), W = h.size(3), O = weight_.size(1);
    auto styles = affine_->forward(w);
    // FACT: s = torch.nn.Linear(6, 4)(torch.randn(3, 6)); assert is_view_of(s.view(3, 1, 4, 1, 1), s)
    auto wt = weight_ * scale_ * styles.view({B, 1, I, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    if (demod_) wt = wt * (wt.square().sum({2, 3, 4}, true) + 1e-8).rsqrt();
    // FACT: x = torch.randn(1, 8, 4, 4).repeat(3, 1, 1, 1); assert is_view_of(x.reshape(1, -1, 4, 4), x)
    auto y = F::conv2d(h.reshape({1, B * I, H, W}), wt.view({B * O, I, k_, k_}), // LOOKALIKE: tensor-reshape-non-contiguous -- the activations are contiguous: all samples as groups of one batch is a view
                       F::Conv2dFuncOptions().padding(k_ / 2).groups(B));
    y = y.view({B, O, H, W}) + bias_.view({1, -1, 1, 1});
    if (!act_) return y;
    y = y + noise_strength_ * torch::randn({B, 1, H, W}, y.options()); // LOOKALIKE: tensor-device-mismatch -- the noise is made with y's options, on y's device
    return torch::leaky_relu(y, 0.2) * std::sqrt(2.0);
  }
  int64_t k_; bool up_, demod_, act_; double scale_;
  torch::Tensor weight_, bias_, noise_strength_;
  EqualLinear affine_{nullptr};
};
TORCH_MODULE(ModulatedConv);

struct SynthesisImpl : torch::nn::Module {
  explicit SynthesisImpl(const StyleConfig &cfg) {
    const auto C = cfg.channels, wd = cfg.w_dim;
    const_ = register_parameter("const", torch::randn({1, C, 4, 4}));
    conv0_ = register_module("conv0", ModulatedConv(C, C, 3, wd, false, true, true));
    rgb0_ = register_module("rgb0", ModulatedConv(C, 3, 1, wd, false, false, false));
    for (int64_t res = 8, i = 0; res <= cfg.resolution; res *= 2, ++i) {
      ups_.push_back(register_module("up" + std::to_string(i), ModulatedConv(C, C, 3, wd, true, true, true)));
      convs_.push_back(register_module("conv" + std::to_string(i + 1), ModulatedConv(C, C, 3, wd, false, true, true)));
      rgbs_.push_back(register_module("rgb" + std::to_string(i + 1), ModulatedConv(C, 3, 1, wd, false, false, false)));
    }
    num_ws_ = 2 + 2 * static_cast<int64_t>(ups_.size());
  }
  // ws [B, num_ws, w_dim] -> images [B, 3, R, R] in about [-1, 1]
  torch::Tensor forward(const torch::Tensor &ws) {
    auto x = const_.repeat({ws.size(0), 1, 1, 1});
    x = conv0_->forward(x, ws.select(1, 0));
    auto img = rgb0_->forward(x, ws.select(1, 1));
    for (size_t i = 0; i < ups_.size(); ++i) {
      const auto idx = 1 + 2 * static_cast<int64_t>(i);
      x = ups_[i]->forward(x, ws.select(1, idx));
      x = convs_[i]->forward(x, ws.select(1, idx + 1));
      img = F::interpolate(img, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kBilinear).align_corners(false)) +
            rgbs_[i]->forward(x, ws.select(1, idx + 2));
    }
    return img;
  }
  torch::Tensor const_;
  ModulatedConv conv0_{nullptr}, rgb0_{nullptr};
  std::vector<ModulatedConv> ups_, convs_, rgbs_;
  int64_t num_ws_ = 0;
};
TORCH_MODULE(Synthesis);

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const StyleConfig &cfg) {
    mapping_ = register_module("mapping", MappingNetwork(cfg));
    synthesis_ = register_module("synthesis", Synthesis(cfg));
    num_ws_ = synthesis_->num_ws_;
  }
  // One w per image for every layer, truncated towards the average w below `cutoff`.
  torch::Tensor ws_for(const torch::Tensor &z, double psi = 1.0, int64_t cutoff = -1) {
    auto ws = mapping_->forward(z).unsqueeze(1).repeat({1, num_ws_, 1});
    if (psi != 1.0) {
      // FACT: x = torch.randn(2, 4); ws = x.unsqueeze(1).repeat(1, 3, 1); ws[:, :2].lerp_(torch.zeros(4), 0.3); assert is_copy_of(ws, x) and ws.stride(1) == 4
      ws.narrow(1, 0, cutoff < 0 ? num_ws_ : cutoff).lerp_(mapping_->w_avg_, 1.0 - psi); // LOOKALIKE: tensor-inplace-on-expanded -- repeat made real copies, unlike expand
    }
    return ws;
  }
  MappingNetwork mapping_{nullptr};
  Synthesis synthesis_{nullptr};
  int64_t num_ws_ = 0;
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(const StyleConfig &cfg) {
    namespace nn = torch::nn;
    const auto C = cfg.channels;
    features_ = register_module("features", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, C, 3).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2))));
    for (int64_t res = cfg.resolution; res > 4; res /= 2)
      features_->extend(*nn::Sequential(nn::Conv2d(nn::Conv2dOptions(C, C, 3).stride(2).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2))));
    out_ = register_module("out", torch::nn::Linear(C * 16, 1));
  }
  torch::Tensor forward(const torch::Tensor &img) {
    auto h = features_->forward(img);
    // FACT: h = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)(torch.randn(2, 3, 8, 8)); assert is_view_of(h.flatten(1), h)
    return out_(h.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- a conv output is contiguous: flatten is a view
  }
  torch::nn::Sequential features_{nullptr};
  torch::nn::Linear out_{nullptr};
};
TORCH_MODULE(Discriminator);

class StyleGanTrainer {
public:
  StyleGanTrainer(Generator G, Generator G_ema, Discriminator D, const StyleConfig &cfg)
      : G_(std::move(G)), G_ema_(std::move(G_ema)), D_(std::move(D)), cfg_(cfg),
        device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU) {
    G_->to(device_);
    G_ema_->to(device_);
    D_->to(device_);
    pl_mean_ = torch::zeros({}, torch::TensorOptions().device(device_));
  }

  // Training latents; style mixing: from a random layer on, the styles of a second latent.
  torch::Tensor sample_ws(int64_t batch) {
    auto z = torch::randn({batch, cfg_.z_dim}, torch::TensorOptions().device(device_));
    const int64_t L = G_->num_ws_;
    auto ws = G_->mapping_->forward(z).unsqueeze(1).expand({batch, L, cfg_.w_dim});
    if (torch::rand({}).item<double>() < cfg_.mixing_prob) {
      const int64_t cutoff = torch::randint(1, L, {1}).item<int64_t>();
      auto w2 = G_->mapping_->forward(torch::randn_like(z));
      // FACT: w = torch.randn(2, 5); ws = w.unsqueeze(1).expand(-1, 6, -1); w2 = torch.randn(2, 5); assert raises(lambda: ws[:, 3:].copy_(w2.unsqueeze(1).expand(-1, 3, -1)), "more than one element of the written-to tensor refers to a single memory location")
      ws.narrow(1, cutoff, L - cutoff).copy_(w2.unsqueeze(1).expand({batch, L - cutoff, cfg_.w_dim})); // EXPECT: tensor-inplace-on-expanded -- every layer of ws is the same w in memory: the write is refused
    }
    return ws;
  }

  // Lazy path-length regularisation: |J^T y| should stay near its running mean.
  torch::Tensor path_length_penalty(int64_t batch) {
    const int64_t n = std::max<int64_t>(1, batch / cfg_.pl_batch_shrink);
    auto ws = sample_ws(n);
    auto img = G_->synthesis_->forward(ws);
    auto noise = torch::randn_like(img) / std::sqrt(static_cast<double>(img.size(2) * img.size(3)));
    auto grads = torch::autograd::grad({(img * noise).sum()}, {ws}, {}, true, true)[0];
    auto pl_lengths = grads.square().sum(2).mean(1).sqrt();
    { torch::NoGradGuard no_grad; pl_mean_.copy_(pl_mean_.lerp(pl_lengths.mean(), cfg_.pl_decay)); }
    // FACT: g = torch.randn(4, 3, 5, requires_grad=True); pl = g.square().sum(2).mean(1).sqrt(); d = pl.detach(); d.sub_(1.0).abs_(); assert backward_fails(lambda: (pl - 1.0).square().mean().backward())
    auto spread = pl_lengths.detach();
    spread.sub_(pl_mean_).abs_(); // EXPECT: tensor-inplace-on-detached -- rewrites pl_lengths, which sqrt saved: the penalty reads the spread and backward fails
    pl_spread_ = spread.mean();
    return (pl_lengths - pl_mean_).square().mean() * cfg_.pl_weight;
  }

  void update_ema() {
    torch::NoGradGuard no_grad;
    auto src = G_->parameters(), dst = G_ema_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].lerp_(src[i], 1.0 - cfg_.ema_beta); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    auto sb = G_->buffers(), db = G_ema_->buffers(); // w_avg
    for (size_t i = 0; i < sb.size(); ++i) db[i].copy_(sb[i]);
  }

  void train(const std::vector<torch::Tensor> &batches) {
    torch::optim::Adam g_opt(G_->parameters(), torch::optim::AdamOptions(cfg_.lr).betas({0.0, 0.99}));
    torch::optim::Adam d_opt(D_->parameters(), torch::optim::AdamOptions(cfg_.lr).betas({0.0, 0.99}));
    G_->train();
    D_->train();
    std::vector<torch::Tensor> g_hist;
    double d_loss_sum = 0;
    for (int64_t step = 0; step < cfg_.steps; ++step) {
      auto real = batches[static_cast<size_t>(step) % batches.size()].to(device_);
      const auto B = real.size(0);
      // Discriminator: logistic loss; R1 on the reals every r1_interval steps.
      torch::Tensor fake;
      { torch::NoGradGuard no_grad; fake = G_->synthesis_->forward(sample_ws(B)); }
      auto d_loss = F::softplus(D_->forward(fake)).mean() + F::softplus(-D_->forward(real)).mean();
      if (step % cfg_.r1_interval == 0) {
        // FACT: x = torch.randn(2, 3); x0 = x.clone(); r = x.detach().requires_grad_(True); assert r.requires_grad and not x.requires_grad and shares_storage(r, x) and torch.equal(x, x0)
        auto real_r1 = real.detach().requires_grad_(true); // LOOKALIKE: tensor-inplace-on-detached -- requires_grad_ only sets a flag: no value is written
        auto grad = torch::autograd::grad({D_->forward(real_r1).sum()}, {real_r1}, {}, true, true)[0];
        d_loss = d_loss + grad.square().sum({1, 2, 3}).mean() * (cfg_.r1_gamma / 2 * static_cast<double>(cfg_.r1_interval));
      }
      d_opt.zero_grad();
      d_loss.backward();
      d_opt.step();
      // Generator: non-saturating loss; path-length penalty every pl_interval steps.
      auto g_loss = F::softplus(-D_->forward(G_->synthesis_->forward(sample_ws(B)))).mean();
      if (step % cfg_.pl_interval == 0)
        g_loss = g_loss + path_length_penalty(B) * static_cast<double>(cfg_.pl_interval);
      g_opt.zero_grad();
      g_loss.backward();
      g_opt.step();
      update_ema();
      d_loss_sum += d_loss.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to add the loss up
      // FACT: m = torch.nn.Linear(3, 1); h = []; exec('for _ in range(3):\n l = torch.nn.functional.softplus(-m(torch.randn(4, 3))).mean(); l.backward(); h.append(l)'); assert kept_nodes(h) >= 3 * 3
      g_hist.push_back(g_loss); // EXPECT: tensor-graph-kept-across-iterations -- every step's generator graph stays reachable from the history
      if ((step + 1) % cfg_.log_every == 0) {
        std::cout << "step " << step + 1 << " D " << d_loss_sum / static_cast<double>(cfg_.log_every) << " G "
                  << g_loss.item<float>() << " pl_mean " << pl_mean_.item<float>() << " spread " << pl_spread_.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once every log_every steps
        d_loss_sum = 0;
      }
    }
    std::cout << "mean G loss " << torch::stack(g_hist).mean().item<double>() << "\n";
  }

  Generator G_, G_ema_;
  Discriminator D_;
  StyleConfig cfg_;
  torch::Device device_;
  torch::Tensor pl_mean_, pl_spread_;
};

// [B, 3, H, W] in [-1, 1] -> [B, H, W, 3] uint8 for the PNG writer.
torch::Tensor to_uint8(const torch::Tensor &img) {
  auto hwc = torch::empty({img.size(0), img.size(2), img.size(3), img.size(1)}, torch::kUInt8);
  // FACT: u = torch.empty(3, dtype=torch.uint8); u.copy_(torch.tensor([127.9, 254.6, 0.99])); assert u.tolist() == [127, 254, 0]
  hwc.copy_(((img.clamp(-1, 1) + 1) * 127.5).permute({0, 2, 3, 1})); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates instead of rounding: pixels come out up to one level too dark
  return hwc;
}

// Truncation towards the average w, every style vector of the batch.
torch::Tensor truncate(const torch::Tensor &ws, const torch::Tensor &w_avg, double psi) {
  auto flat = ws.reshape({-1, ws.size(-1)});
  // FACT: ws = torch.randn(2, 3, 4); w0 = ws.clone(); f = ws.reshape(-1, 4); f.sub_(torch.ones(4)).mul_(0.5).add_(torch.ones(4)); assert shares_storage(f, ws) and not torch.equal(ws, w0)
  flat.sub_(w_avg).mul_(psi).add_(w_avg); // EXPECT: tensor-alias-then-mutate -- reshape of the contiguous ws is a view: the caller's latents are truncated too
  return flat.view(ws.sizes());
}

// Figure: untruncated samples on top, the same latents truncated below.
torch::Tensor truncation_figure(Generator &G, const torch::Tensor &z, double psi) {
  torch::NoGradGuard no_grad;
  G->eval();
  auto ws = G->ws_for(z);
  auto trunc = truncate(ws, G->mapping_->w_avg_, psi);
  return to_uint8(torch::cat({G->synthesis_->forward(ws), G->synthesis_->forward(trunc)}, 0));
}

// Frames for a truncation sweep video: the same latents, psi from 0 to 1 on the coarse layers.
std::vector<torch::Tensor> truncation_sweep(Generator &G, const torch::Tensor &z, int64_t frames, int64_t cutoff) {
  torch::NoGradGuard no_grad;
  G->eval();
  auto ws = G->ws_for(z);
  std::vector<torch::Tensor> out;
  for (int64_t f = 0; f < frames; ++f) {
    const double psi = static_cast<double>(f) / static_cast<double>(std::max<int64_t>(frames - 1, 1));
    auto ws_f = ws.clone(); // EXPECT: tensor-clone-in-loop -- ws never changes: the same copy is made every frame (one buffer refilled with copy_ would do)
    ws_f.narrow(1, 0, cutoff).lerp_(G->mapping_->w_avg_, 1.0 - psi);
    out.push_back(to_uint8(G->synthesis_->forward(ws_f)));
  }
  return out;
}

// The style-mixing grid: tile (r, c) takes the coarse styles of row r and the rest from column c.
torch::Tensor mixing_figure(Generator &G, const torch::Tensor &z_rows, const torch::Tensor &z_cols, int64_t coarse) {
  torch::NoGradGuard no_grad;
  G->eval();
  auto ws_r = G->ws_for(z_rows), ws_c = G->ws_for(z_cols);
  std::vector<torch::Tensor> tiles;
  for (int64_t r = 0; r < ws_r.size(0); ++r)
    for (int64_t c = 0; c < ws_c.size(0); ++c) {
      auto mixed = ws_c[c].clone(); // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- a different column each time, written and kept as a tile
      mixed.narrow(0, 0, coarse).copy_(ws_r[r].narrow(0, 0, coarse));
      tiles.push_back(mixed);
    }
  return to_uint8(G->synthesis_->forward(torch::stack(tiles)));
}
