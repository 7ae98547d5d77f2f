// ESRGAN x4: RRDB generator, VGG-style discriminator, relativistic average GAN loss,
// perceptual (VGG feature) loss and L1 pixel loss. Validation reports PSNR on the Y channel.
#include <torch/torch.h>

#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;

struct EsrganConfig {
  int64_t nf = 64, gc = 32, n_rrdb = 8, scale = 4;
  int64_t lr_patch = 32, batch = 16, tile = 32;
  int64_t iters = 200000, log_every = 100, val_every = 5000;
  double lr_g = 1e-4, lr_d = 1e-4;
  double w_pix = 1e-2, w_percep = 1.0, w_gan = 5e-3;
  double noise_sigma = 0.05;
};

torch::nn::Conv2d conv3x3(int64_t in, int64_t out) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1));
}

Tensor lrelu(const Tensor& x) {
  return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.2).inplace(true));
}

void scaled_kaiming(torch::nn::Conv2d& conv, double scale) {
  torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanIn);
  conv->weight.data().mul_(scale);  // LOOKALIKE: tensor-inplace-on-detached -- init writes the parameter on purpose, before any graph uses it
  torch::nn::init::zeros_(conv->bias);
}

struct ResidualDenseBlockImpl : torch::nn::Module {
  ResidualDenseBlockImpl(int64_t nf, int64_t gc) {
    convs.push_back(register_module("conv1", conv3x3(nf, gc)));
    convs.push_back(register_module("conv2", conv3x3(nf + gc, gc)));
    convs.push_back(register_module("conv3", conv3x3(nf + 2 * gc, gc)));
    convs.push_back(register_module("conv4", conv3x3(nf + 3 * gc, gc)));
    convs.push_back(register_module("conv5", conv3x3(nf + 4 * gc, nf)));
    for (auto& conv : convs) {
      torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanIn);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under NoGradGuard
      // FACT: w = torch.nn.Conv2d(4, 4, 3).weight; assert raises(lambda: w.mul_(0.1), "leaf Variable")
      conv->weight.mul_(0.1);  // EXPECT: tensor-inplace-on-leaf
      torch::nn::init::zeros_(conv->bias);
    }
  }

  Tensor forward(const Tensor& x) {
    std::vector<Tensor> feats{x};
    for (size_t i = 0; i + 1 < convs.size(); ++i)
      feats.push_back(lrelu(convs[i]->forward(torch::cat(feats, 1))));
    auto x5 = convs.back()->forward(torch::cat(feats, 1));
    // FACT: c = torch.nn.Conv2d(2, 2, 3, padding=1); x = torch.rand(1, 2, 4, 4); y = c(x); y.mul_(0.2).add_(x); y.sum().backward(); assert c.weight.grad is not None
    return x5.mul_(0.2).add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- conv saves its input and weight, not its output
  }

  std::vector<torch::nn::Conv2d> convs;
};
TORCH_MODULE(ResidualDenseBlock);

struct RRDBImpl : torch::nn::Module {
  RRDBImpl(int64_t nf, int64_t gc) {
    for (int i = 0; i < 3; ++i)
      rdbs.push_back(register_module("rdb" + std::to_string(i), ResidualDenseBlock(nf, gc)));
  }
  Tensor forward(const Tensor& x) {
    auto out = x;
    for (auto& rdb : rdbs) out = rdb->forward(out);
    return out * 0.2 + x;
  }
  std::vector<ResidualDenseBlock> rdbs;
};
TORCH_MODULE(RRDB);

struct RRDBNetImpl : torch::nn::Module {
  explicit RRDBNetImpl(const EsrganConfig& cfg)
      : conv_first(register_module("conv_first", conv3x3(3, cfg.nf))),
        trunk_conv(register_module("trunk_conv", conv3x3(cfg.nf, cfg.nf))),
        upconv1(register_module("upconv1", conv3x3(cfg.nf, cfg.nf))),
        upconv2(register_module("upconv2", conv3x3(cfg.nf, cfg.nf))),
        hr_conv(register_module("hr_conv", conv3x3(cfg.nf, cfg.nf))),
        conv_last(register_module("conv_last", conv3x3(cfg.nf, 3))) {
    for (int64_t i = 0; i < cfg.n_rrdb; ++i) body->push_back(RRDB(cfg.nf, cfg.gc));
    register_module("body", body);
    scaled_kaiming(trunk_conv, 0.1);
  }

  Tensor forward(const Tensor& x) {
    auto fea = conv_first(x);
    fea = fea + trunk_conv(body->forward(fea));
    auto up = F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest);
    fea = lrelu(upconv1(F::interpolate(fea, up)));
    fea = lrelu(upconv2(F::interpolate(fea, up)));
    return conv_last(lrelu(hr_conv(fea)));
  }

  torch::nn::Conv2d conv_first, trunk_conv, upconv1, upconv2, hr_conv, conv_last;
  torch::nn::Sequential body;
};
TORCH_MODULE(RRDBNet);

struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(int64_t nf) {
    int64_t in = 3;
    for (int64_t mult : {1, 2, 4, 8, 8}) {
      const int64_t out = nf * mult;
      features->push_back(conv3x3(in, out));
      features->push_back(torch::nn::BatchNorm2d(out));
      features->push_back(torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)));
      features->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 4).stride(2).padding(1)));
      features->push_back(torch::nn::BatchNorm2d(out));
      features->push_back(torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)));
      in = out;
    }
    register_module("features", features);
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(nf * 8 * 4 * 4, 100),
                                                         torch::nn::LeakyReLU(torch::nn::LeakyReLUOptions().negative_slope(0.2)),
                                                         torch::nn::Linear(100, 1)));
  }
  Tensor forward(const Tensor& x) { return head->forward(features->forward(x).flatten(1)); }
  torch::nn::Sequential features, head;
};
TORCH_MODULE(Discriminator);

// VGG19 feature extractor (weights loaded from a TorchScript-exported state when present).
struct PerceptualLossImpl : torch::nn::Module {
  PerceptualLossImpl() {
    features = register_module("features", torch::nn::Sequential(
        conv3x3(3, 64), torch::nn::ReLU(), conv3x3(64, 64), torch::nn::ReLU(),
        torch::nn::MaxPool2d(2), conv3x3(64, 128), torch::nn::ReLU(), conv3x3(128, 128)));
    stdv = register_buffer("stdv", torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1}));
    mean = torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1});
    for (auto& p : features->parameters()) p.set_requires_grad(false);
  }
  Tensor extract(const Tensor& img) {
    return features->forward((img - mean) / stdv);  // EXPECT: tensor-device-mismatch
  }
  Tensor forward(const Tensor& sr, const Tensor& hr) {
    Tensor target;
    {
      torch::NoGradGuard no_grad;
      target = extract(hr);
    }
    return F::l1_loss(extract(sr), target);
  }
  torch::nn::Sequential features{nullptr};
  Tensor mean, stdv;
};
TORCH_MODULE(PerceptualLoss);

// Relativistic average BCE, with the sigmoid spelled out to control the epsilon.
Tensor ragan_bce(const Tensor& d_x, const Tensor& d_y, bool real) {
  auto p = torch::sigmoid(d_x - d_y.mean());
  // FACT: z = torch.rand(4, 1, requires_grad=True); p = torch.sigmoid(z); p.clamp_(1e-7, 1 - 1e-7); assert backward_fails(lambda: torch.log(p).sum().backward())
  p.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
  return real ? -torch::log(p).mean() : -torch::log(1.0 - p).mean();
}

Tensor add_noise(const Tensor& lr, double max_sigma, bool gray) {
  auto sigma = torch::rand({lr.size(0), 1, 1, 1}, lr.options()) * max_sigma;
  Tensor noise;
  if (gray) {
    noise = torch::randn({lr.size(0), 1, lr.size(2), lr.size(3)}, lr.options()).expand_as(lr);
    // FACT: n = torch.randn(2, 1, 4, 4).expand(2, 3, 4, 4); assert raises(lambda: n.mul_(torch.rand(2, 1, 1, 1)), "more than one element")
    noise.mul_(sigma);  // EXPECT: tensor-inplace-on-expanded
  } else {
    noise = torch::randn_like(lr);
    // FACT: n = torch.randn(2, 3, 4, 4); n.mul_(torch.rand(2, 1, 1, 1).expand(2, 3, 4, 4)); assert is_contiguous(n)
    noise.mul_(sigma.expand_as(lr));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read; the written one is dense
  }
  return (lr + noise).clamp_(0.0, 1.0);
}

struct SrDataset {
  Tensor hr, lr;  // uint8 caches
  SrDataset(Tensor hr_u8, int64_t scale) : hr(std::move(hr_u8)) {
    const auto N = hr.size(0);
    lr = torch::empty({N, 3, hr.size(2) / scale, hr.size(3) / scale}, torch::kByte);
    auto down = F::InterpolateFuncOptions()
                    .scale_factor(std::vector<double>{1.0 / scale, 1.0 / scale})
                    .mode(torch::kBicubic).align_corners(false);
    for (int64_t i = 0; i < N; i += 64) {
      const auto n = std::min<int64_t>(64, N - i);
      auto small = F::interpolate(hr.narrow(0, i, n).to(torch::kFloat), down);
      lr.narrow(0, i, n).copy_(small);  // EXPECT: tensor-copy-narrowing
    }
  }
};

std::pair<Tensor, Tensor> sample_batch(const SrDataset& ds, const EsrganConfig& cfg,
                                       torch::Device device, std::mt19937& rng) {
  const int64_t lp = cfg.lr_patch, hp = cfg.lr_patch * cfg.scale;
  std::uniform_int_distribution<int64_t> pick(0, ds.hr.size(0) - 1);
  std::uniform_int_distribution<int64_t> ys(0, ds.lr.size(2) - lp), xs(0, ds.lr.size(3) - lp);
  std::vector<Tensor> lrs, hrs;
  for (int64_t b = 0; b < cfg.batch; ++b) {
    const auto i = pick(rng), y = ys(rng), x = xs(rng);
    lrs.push_back(ds.lr[i].narrow(1, y, lp).narrow(2, x, lp));
    hrs.push_back(ds.hr[i].narrow(1, y * cfg.scale, hp).narrow(2, x * cfg.scale, hp));
  }
  auto lr = torch::stack(lrs).to(device).to(torch::kFloat).div_(255.0);
  auto hr = torch::stack(hrs).to(device).to(torch::kFloat).div_(255.0);
  return {lr, hr};
}

// Non-overlapping tiled inference for full validation images.
Tensor upscale_tiled(RRDBNet& G, const Tensor& lr, int64_t tile, int64_t scale) {
  const auto C = lr.size(1), nh = lr.size(2) / tile, nw = lr.size(3) / tile;
  auto tiles = lr.unfold(2, tile, tile).unfold(3, tile, tile);
  // FACT: t = torch.rand(1, 3, 8, 8).unfold(2, 4, 4).unfold(3, 4, 4); assert is_copy_of(t.permute(0, 2, 3, 1, 4, 5).reshape(-1, 3, 4, 4), t)
  auto batch = tiles.permute({0, 2, 3, 1, 4, 5}).reshape({-1, C, tile, tile});  // EXPECT: tensor-reshape-non-contiguous
  auto out = G->forward(batch);
  const auto ts = tile * scale;
  auto grid = out.view({1, nh, nw, C, ts, ts}).permute({0, 3, 1, 4, 2, 5});
  // FACT: g = torch.rand(4, 3, 16, 16).view(1, 2, 2, 3, 16, 16).permute(0, 3, 1, 4, 2, 5); assert raises(lambda: g.view(1, 3, 32, 32), "view size is not compatible")
  return grid.view({1, C, nh * ts, nw * ts});  // EXPECT: tensor-view-non-contiguous
}

Tensor rgb_to_y(const Tensor& img) {
  Tensor x = img.contiguous();
  // FACT: x = torch.rand(1, 3, 8, 8); assert shares_storage(x.contiguous(), x)
  x.mul_(255.0);  // EXPECT: tensor-alias-then-mutate
  auto y = x.select(1, 0) * 65.481 + x.select(1, 1) * 128.553 + x.select(1, 2) * 24.966;
  return (y / 255.0 + 16.0) / 255.0;
}

void write_ppm(const Tensor& sr, const std::string& path) {
  auto q = sr.squeeze(0).clamp(0.0, 1.0);
  // FACT: s = torch.rand(1, 3, 8, 8) * 1.2; assert is_copy_of(s.squeeze(0).clamp(0.0, 1.0), s)
  q.mul_(255.0).round_();  // LOOKALIKE: tensor-alias-then-mutate -- clamp returns a new tensor
  auto bytes = q.to(torch::kByte).permute({1, 2, 0}).contiguous().cpu();  // LOOKALIKE: tensor-copy-narrowing -- explicit conversion after clamping and rounding
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << bytes.size(1) << " " << bytes.size(0) << "\n255\n";
  f.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

double validate(RRDBNet& G, const std::vector<std::pair<Tensor, Tensor>>& val,
                const EsrganConfig& cfg, torch::Device device, int64_t iter) {
  torch::NoGradGuard no_grad;
  G->eval();
  double psnr_sum = 0.0;
  for (size_t i = 0; i < val.size(); ++i) {
    auto lr = val[i].first.to(device).to(torch::kFloat).div_(255.0);
    auto hr = val[i].second.to(device).to(torch::kFloat).div_(255.0);
    auto sr = upscale_tiled(G, lr, cfg.tile, cfg.scale).clamp(0.0, 1.0);
    auto mse = (rgb_to_y(sr) - rgb_to_y(hr)).pow(2).mean();
    psnr_sum += (10.0 * torch::log10(1.0 / mse)).item<double>();  // EXPECT: tensor-sync-in-loop
    if (i == 0) write_ppm(sr, "val_" + std::to_string(iter) + ".ppm");
  }
  G->train();
  return psnr_sum / static_cast<double>(val.size());
}

int main() {
  EsrganConfig cfg;
  torch::manual_seed(0);
  std::mt19937 rng(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  SrDataset train(torch::randint(0, 256, {256, 3, 256, 256}, torch::kByte), cfg.scale);
  std::vector<std::pair<Tensor, Tensor>> val;
  SrDataset val_src(torch::randint(0, 256, {8, 3, 256, 256}, torch::kByte), cfg.scale);
  for (int64_t i = 0; i < 8; ++i) val.emplace_back(val_src.lr.narrow(0, i, 1), val_src.hr.narrow(0, i, 1));

  RRDBNet G(cfg);
  Discriminator D(cfg.nf);
  PerceptualLoss percep;
  G->to(device);
  D->to(device);
  percep->to(device);
  percep->eval();

  torch::optim::Adam opt_g(G->parameters(), torch::optim::AdamOptions(cfg.lr_g).betas({0.9, 0.99}));
  torch::optim::Adam opt_d(D->parameters(), torch::optim::AdamOptions(cfg.lr_d).betas({0.9, 0.99}));
  std::vector<Tensor> g_hist, d_hist;

  for (int64_t iter = 1; iter <= cfg.iters; ++iter) {
    auto [lr, hr] = sample_batch(train, cfg, device, rng);
    lr = add_noise(lr, cfg.noise_sigma, iter % 2 == 0);

    for (auto& p : D->parameters()) p.set_requires_grad(false);
    opt_g.zero_grad();
    auto sr = G->forward(lr);
    auto d_real = D->forward(hr).detach();
    auto d_fake = D->forward(sr);
    auto l_gan = 0.5 * (ragan_bce(d_real, d_fake, false) + ragan_bce(d_fake, d_real, true));
    auto l_g = cfg.w_pix * F::l1_loss(sr, hr) + cfg.w_percep * percep->forward(sr, hr) + cfg.w_gan * l_gan;
    l_g.backward();
    opt_g.step();

    // Discriminator step.
    for (auto& p : D->parameters()) p.set_requires_grad(true);
    opt_d.zero_grad();
    auto dr = D->forward(hr);
    auto df = D->forward(sr.detach());
    auto l_d = 0.5 * (ragan_bce(dr, df, true) + ragan_bce(df, dr, false));
    l_d.backward();
    opt_d.step();

    g_hist.push_back(l_g);  // EXPECT: tensor-graph-kept-across-iterations
    d_hist.push_back(l_d.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
    if (iter % cfg.log_every == 0) {
      std::cout << "iter " << iter
                << " l_g " << torch::stack(g_hist).mean().item<double>()  // LOOKALIKE: tensor-sync-in-loop -- one read per log_every steps
                << " l_d " << torch::stack(d_hist).mean().item<double>() << "\n";
      g_hist.clear();
      d_hist.clear();
    }
    if (iter % cfg.val_every == 0) {
      std::cout << "iter " << iter << " val PSNR(Y) " << validate(G, val, cfg, device, iter) << "\n";
      torch::save(G, "esrgan_G_" + std::to_string(iter) + ".pt");
    }
  }
  return 0;
}
