// StyleGAN2 (Karras et al. 2020) at 32x32: mapping network, modulated/demodulated convolutions
// run as one grouped conv per batch, per-layer noise injection, non-saturating loss with lazy R1
// and path-length regularisation, and an exponential moving average of the generator.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct StyleGANConfig {
  int64_t z_dim = 256, w_dim = 256, mapping_layers = 8;
  int64_t resolution = 32, channels = 256, batch = 16;
  double lr = 0.0025, r1_gamma = 10.0, pl_weight = 2.0, pl_decay = 0.01, ema_beta = 0.999;
  int64_t r1_every = 16, pl_every = 4, snapshot_every = 1000, steps = 20000;
};

enum class NoiseMode { Random, Const, None };

// Equalised learning-rate dense layer.
struct EqualLinearImpl : torch::nn::Module {
  EqualLinearImpl(int64_t in, int64_t out, double bias_init = 0.0, double lr_mul = 1.0)
      : w_gain_(lr_mul / std::sqrt(static_cast<double>(in))), lr_mul_(lr_mul) {
    weight_ = register_parameter("weight", torch::randn({out, in}).div_(lr_mul));  // LOOKALIKE: tensor-inplace-on-leaf -- runs on the factory result before it is registered
    bias_ = register_parameter("bias", torch::empty({out}));
    bias_.fill_(bias_init);  // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::linear(x, weight_ * w_gain_, bias_ * lr_mul_);
  }
  double w_gain_, lr_mul_;
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(EqualLinear);

struct MappingNetworkImpl : torch::nn::Module {
  MappingNetworkImpl(const StyleGANConfig& cfg, int64_t num_ws) : num_ws_(num_ws) {
    for (int64_t i = 0; i < cfg.mapping_layers; ++i) {
      const int64_t in = i == 0 ? cfg.z_dim : cfg.w_dim;
      layers_.push_back(register_module("fc" + std::to_string(i), EqualLinear(in, cfg.w_dim, 0.0, 0.01)));
    }
    w_avg_ = register_buffer("w_avg", torch::zeros({cfg.w_dim}));
  }
  torch::Tensor forward(const torch::Tensor& z, double psi = 1.0) {
    auto x = z * torch::rsqrt(z.square().mean(1, /*keepdim=*/true) + 1e-8);
    for (auto& fc : layers_) {
      // FACT: a=torch.randn(2,8,requires_grad=True); y=torch.nn.functional.leaky_relu(a*2,0.2).mul_(2**0.5); y.sum().backward(); assert a.grad is not None
      x = torch::leaky_relu(fc(x), 0.2).mul_(std::sqrt(2.0));  // LOOKALIKE: tensor-inplace-on-saved -- out-of-place leaky_relu saves its input, not its result
    }
    // FACT: w=torch.zeros(4); [w.copy_((torch.randn(2,4,requires_grad=True)*2).mean(0).lerp(w,0.9)) for _ in range(3)]; assert w.requires_grad and kept_nodes(w) > 10
    if (is_training()) w_avg_.copy_(x.mean(0).lerp(w_avg_, 0.995));  // EXPECT: tensor-graph-kept-across-iterations
    if (psi != 1.0) x = w_avg_.lerp(x, psi);
    return x.unsqueeze(1).repeat({1, num_ws_, 1});
  }
  int64_t num_ws_;
  std::vector<EqualLinear> layers_;
  torch::Tensor w_avg_;
};
TORCH_MODULE(MappingNetwork);

struct ModulatedConvImpl : torch::nn::Module {
  ModulatedConvImpl(int64_t in, int64_t out, int64_t k, int64_t w_dim, bool demodulate, bool up)
      : in_(in), out_(out), k_(k), demod_(demodulate), up_(up),
        w_gain_(1.0 / std::sqrt(static_cast<double>(in * k * k))) {
    affine = register_module("affine", EqualLinear(w_dim, in, /*bias_init=*/1.0));
    weight_ = register_parameter("weight", torch::randn({out, in, k, k}));
    bias_ = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& w) {
    const auto B = x.size(0);
    auto styles = affine(w);
    auto wgt = weight_.unsqueeze(0) * w_gain_ * styles.view({B, 1, in_, 1, 1});
    if (demod_) {
      auto d = torch::rsqrt(wgt.pow(2).sum({2, 3, 4}) + 1e-8);
      // FACT: w=torch.randn(2,4,3,3,3,requires_grad=True)*1; d=torch.rsqrt(w.pow(2).sum([2,3,4])+1e-8); w.mul_(d.view(2,4,1,1,1)); assert backward_fails(lambda: w.sum().backward())
      wgt.mul_(d.view({B, out_, 1, 1, 1}));  // EXPECT: tensor-inplace-on-saved
    }
    auto xg = x.reshape({1, B * in_, x.size(2), x.size(3)});
    torch::Tensor y;
    if (up_) {
      // FACT: w=torch.randn(2,4,3,3,3); assert is_copy_of(w.transpose(1,2).reshape(6,4,3,3), w)
      auto wt = wgt.transpose(1, 2).reshape({B * in_, out_, k_, k_});  // EXPECT: tensor-reshape-non-contiguous
      y = F::conv_transpose2d(xg, wt, F::ConvTranspose2dFuncOptions().stride(2).groups(B));
      y = torch::avg_pool2d(y, 2, 1);  // cheap low-pass in place of the FIR blur
    } else {
      // FACT: w=torch.randn(4,3,3,3).unsqueeze(0)*torch.randn(2,1,3,1,1); assert is_contiguous(w) and is_view_of(w.view(8,3,3,3), w)
      auto wv = wgt.view({B * out_, in_, k_, k_});  // LOOKALIKE: tensor-view-non-contiguous -- the modulated weight is a fresh dense product
      y = F::conv2d(xg, wv, F::Conv2dFuncOptions().padding(k_ / 2).groups(B));
    }
    y = y.view({B, out_, y.size(2), y.size(3)});
    return y + bias_.view({1, -1, 1, 1});
  }
  int64_t in_, out_, k_;
  bool demod_, up_;
  double w_gain_;
  EqualLinear affine{nullptr};
  torch::Tensor weight_, bias_;
};
TORCH_MODULE(ModulatedConv);

struct NoiseInjectionImpl : torch::nn::Module {
  explicit NoiseInjectionImpl(int64_t res) : res_(res) {
    strength_ = register_parameter("strength", torch::zeros({1}));
    noise_const_ = register_buffer("noise_const", torch::randn({1, 1, res, res}));
  }
  torch::Tensor forward(const torch::Tensor& x, NoiseMode mode) {
    if (mode == NoiseMode::None) return x;
    const auto B = x.size(0);
    auto noise = mode == NoiseMode::Const ? noise_const_.expand({B, 1, res_, res_})
                                          : torch::randn({B, 1, res_, res_}, x.options());
    // FACT: n=torch.randn(1,1,4,4).expand(2,1,4,4); s=torch.zeros(1,requires_grad=True); assert raises(lambda: n.mul_(s), "more than one element")
    return x + noise.mul_(strength_);  // EXPECT: tensor-inplace-on-expanded
  }
  int64_t res_;
  torch::Tensor strength_, noise_const_;
};
TORCH_MODULE(NoiseInjection);

struct StyleLayerImpl : torch::nn::Module {
  StyleLayerImpl(int64_t in, int64_t out, int64_t w_dim, int64_t res, bool up) {
    conv = register_module("conv", ModulatedConv(in, out, 3, w_dim, /*demodulate=*/true, up));
    noise = register_module("noise", NoiseInjection(res));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& w, NoiseMode mode) {
    return torch::leaky_relu(noise(conv(x, w), mode), 0.2) * std::sqrt(2.0);
  }
  ModulatedConv conv{nullptr};
  NoiseInjection noise{nullptr};
};
TORCH_MODULE(StyleLayer);

struct SynthesisNetworkImpl : torch::nn::Module {
  explicit SynthesisNetworkImpl(const StyleGANConfig& cfg) : C_(cfg.channels) {
    const_ = register_parameter("const", torch::randn({cfg.channels, 4, 4}));
    int64_t idx = 0;
    layers_.push_back(register_module("l" + std::to_string(idx++), StyleLayer(C_, C_, cfg.w_dim, 4, false)));
    to_rgb_.push_back(register_module("rgb4", ModulatedConv(C_, 3, 1, cfg.w_dim, false, false)));
    for (int64_t res = 8; res <= cfg.resolution; res *= 2) {
      layers_.push_back(register_module("l" + std::to_string(idx++), StyleLayer(C_, C_, cfg.w_dim, res, true)));
      layers_.push_back(register_module("l" + std::to_string(idx++), StyleLayer(C_, C_, cfg.w_dim, res, false)));
      to_rgb_.push_back(register_module("rgb" + std::to_string(res), ModulatedConv(C_, 3, 1, cfg.w_dim, false, false)));
    }
  }
  int64_t num_ws() const { return static_cast<int64_t>(layers_.size() + 1); }
  torch::Tensor forward(const torch::Tensor& ws, NoiseMode mode) {
    const auto B = ws.size(0);
    auto x = const_.unsqueeze(0).repeat({B, 1, 1, 1});
    x = layers_[0](x, ws.select(1, 0), mode);
    auto img = to_rgb_[0](x, ws.select(1, 1));
    for (size_t r = 1; r < to_rgb_.size(); ++r) {
      const auto li = static_cast<int64_t>(2 * r - 1);
      x = layers_[li](x, ws.select(1, li), mode);
      x = layers_[li + 1](x, ws.select(1, li + 1), mode);
      img = F::interpolate(img, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0})
                                    .mode(torch::kBilinear).align_corners(false));
      img = img + to_rgb_[r](x, ws.select(1, li + 2));
    }
    return img;
  }
  int64_t C_;
  torch::Tensor const_;
  std::vector<StyleLayer> layers_;
  std::vector<ModulatedConv> to_rgb_;
};
TORCH_MODULE(SynthesisNetwork);

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const StyleGANConfig& cfg) {
    synthesis = register_module("synthesis", SynthesisNetwork(cfg));
    mapping = register_module("mapping", MappingNetwork(cfg, synthesis->num_ws()));
  }
  torch::Tensor forward(const torch::Tensor& z, double psi = 1.0, NoiseMode mode = NoiseMode::Random) {
    return synthesis(mapping(z, psi), mode);
  }
  SynthesisNetwork synthesis{nullptr};
  MappingNetwork mapping{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(const StyleGANConfig& cfg) {
    from_rgb = register_module("from_rgb", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.channels, 1)));
    for (int64_t res = cfg.resolution, i = 0; res > 4; res /= 2, ++i) {
      convs_.push_back(register_module("conv" + std::to_string(i),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.channels, cfg.channels, 3).padding(1))));
    }
    fc = register_module("fc", torch::nn::Linear(cfg.channels * 16, cfg.channels));
    out = register_module("out", torch::nn::Linear(cfg.channels, 1));
  }
  torch::Tensor forward(const torch::Tensor& img) {
    auto h = torch::leaky_relu(from_rgb(img), 0.2);
    for (auto& conv : convs_) h = torch::avg_pool2d(torch::leaky_relu(conv(h), 0.2), 2);
    return out(torch::leaky_relu(fc(h.flatten(1)), 0.2));
  }
  torch::nn::Conv2d from_rgb{nullptr};
  std::vector<torch::nn::Conv2d> convs_;
  torch::nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Discriminator);

static void copy_into(Generator& dst, Generator& src) {
  auto d = dst->parameters();
  auto s = src->parameters();
  for (size_t i = 0; i < d.size(); ++i) {
    d[i].detach().copy_(s[i].detach());  // LOOKALIKE: tensor-inplace-on-detached -- writes the EMA copy's weights on purpose
  }
}

static torch::Tensor to_uint8(const torch::Tensor& img) {
  auto u8 = torch::empty({img.size(0), img.size(2), img.size(3), img.size(1)}, torch::kUInt8);
  u8.copy_(img.permute({0, 2, 3, 1}).add(1.0).mul(127.5).clamp(0, 255));  // EXPECT: tensor-copy-narrowing
  return u8;
}

void train(Generator& G, Generator& G_ema, Discriminator& D, const torch::Tensor& dataset,
           const StyleGANConfig& cfg, torch::Device device) {
  // Mapping layers use lr_mul 0.01 through EqualLinear, so one optimiser per network is enough.
  torch::optim::Adam opt_g(G->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.0, 0.99}));
  torch::optim::Adam opt_d(D->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.0, 0.99}));
  auto pl_mean = torch::zeros({}, torch::TensorOptions().device(device));
  auto z_fixed = torch::randn({16, cfg.z_dim});
  std::vector<double> d_loss_log;
  const int64_t N = dataset.size(0), B = cfg.batch;

  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto batch = dataset.narrow(0, (step * B) % (N - B + 1), B);
    auto real = batch.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every step
    // FACT: ds=torch.rand(8,3,4,4); r=ds.narrow(0,2,2).to(torch.float32); r.mul_(2).sub_(1); assert shares_storage(r, ds) and float(ds.min()) < 0
    real.mul_(2).sub_(1);  // EXPECT: tensor-alias-then-mutate

    // Discriminator: logistic loss, R1 on real images every r1_every steps.
    auto z = torch::randn({B, cfg.z_dim}, torch::TensorOptions().device(device));
    auto fake = G->forward(z).detach();
    auto d_loss = torch::softplus(D->forward(fake)).mean() + torch::softplus(-D->forward(real)).mean();
    opt_d.zero_grad();
    d_loss.backward();
    if (step % cfg.r1_every == 0) {
      auto real_r1 = real.detach().requires_grad_(true);  // LOOKALIKE: tensor-inplace-on-detached -- only flags the new handle, the data is untouched
      auto logits = D->forward(real_r1);
      auto grads = torch::autograd::grad({logits.sum()}, {real_r1}, {}, true, true)[0];
      auto r1 = grads.square().sum({1, 2, 3}).mean();
      (r1 * (cfg.r1_gamma / 2 * cfg.r1_every)).backward();
    }
    opt_d.step();
    d_loss_log.push_back(d_loss.item<double>());  // EXPECT: tensor-sync-in-loop

    // Generator: non-saturating loss, path-length regularisation every pl_every steps.
    z = torch::randn({B, cfg.z_dim}, torch::TensorOptions().device(device));
    auto g_loss = torch::softplus(-D->forward(G->forward(z))).mean();
    opt_g.zero_grad();
    g_loss.backward();
    if (step % cfg.pl_every == 0) {
      const int64_t pl_b = std::max<int64_t>(1, B / 2);
      auto ws = G->mapping->forward(torch::randn({pl_b, cfg.z_dim}, torch::TensorOptions().device(device)));
      auto img = G->synthesis->forward(ws, NoiseMode::Random);
      auto pl_noise = torch::randn_like(img) / std::sqrt(static_cast<double>(img.size(2) * img.size(3)));
      auto pl_grads = torch::autograd::grad({(img * pl_noise).sum()}, {ws}, {}, true, true)[0];
      auto pl_lengths = pl_grads.square().sum(2).mean(1).sqrt();
      pl_mean.copy_(pl_mean.lerp(pl_lengths.mean().detach(), cfg.pl_decay));  // LOOKALIKE: tensor-graph-kept-across-iterations -- only a detached value is stored
      auto pl_penalty = (pl_lengths - pl_mean).square().mean();
      auto pl_dev = pl_lengths.detach();
      // FACT: p=torch.rand(3,requires_grad=True)+1; l=p.sqrt(); pen=(l-0.5).square().mean(); l.detach().sub_(0.5).abs_(); assert backward_fails(lambda: pen.backward())
      pl_dev.sub_(pl_mean).abs_();  // EXPECT: tensor-inplace-on-detached
      (pl_penalty * (cfg.pl_weight * cfg.pl_every)).backward();
      if (step % 100 == 0) std::printf("  pl deviation %.4f\n", pl_dev.mean().item<double>());
    }
    opt_g.step();

    {
      torch::NoGradGuard no_grad;
      auto ema_p = G_ema->parameters();
      auto p = G->parameters();
      for (size_t i = 0; i < p.size(); ++i) ema_p[i].lerp_(p[i], 1.0 - cfg.ema_beta);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA update under NoGradGuard
      auto ema_b = G_ema->buffers();
      auto b = G->buffers();
      for (size_t i = 0; i < b.size(); ++i) ema_b[i].copy_(b[i]);
    }

    if (step % 100 == 0) {
      std::printf("step %ld  D %.4f  G %.4f  pl_mean %.4f\n", static_cast<long>(step), d_loss_log.back(),
                  g_loss.item<double>(), pl_mean.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- every 100 steps only
    }
    if (step % cfg.snapshot_every == 0) {
      torch::NoGradGuard no_grad;
      for (double psi : {1.0, 0.7, 0.5}) {
        auto img = G_ema->forward(z_fixed.to(device), psi, NoiseMode::Const);  // EXPECT: tensor-clone-in-loop
        auto grid = to_uint8(img);
        std::printf("snapshot psi=%.1f: %ld images\n", psi, static_cast<long>(grid.size(0)));
      }
    }
  }
}

int main() {
  torch::manual_seed(0);
  const auto device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  StyleGANConfig cfg;
  cfg.channels = 128;
  cfg.steps = 500;
  Generator G(cfg), G_ema(cfg);
  Discriminator D(cfg);
  G->to(device);
  G_ema->to(device);
  D->to(device);
  copy_into(G_ema, G);
  G_ema->eval();
  // The whole (small) dataset lives on the training device, as images in [0, 1].
  auto dataset = torch::rand({1024, 3, cfg.resolution, cfg.resolution}, torch::TensorOptions().device(device));
  train(G, G_ema, D, dataset, cfg, device);
  return 0;
}
