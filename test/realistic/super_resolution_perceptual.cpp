// ESRGAN-style 4x super-resolution (Wang et al. 2018): an RRDB generator trained with an L1 pixel
// loss, a perceptual loss on frozen VGG19 features (conv5_4, before its ReLU) and a relativistic
// average discriminator. An exponential moving average of the generator's weights is what gets
// validated and exported. Full images are upscaled in overlapping tiles whose seams are
// feathered with a linear ramp; validation reports PSNR on the luma channel, as SR papers do.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SrConfig {
  int64_t nf = 64, gc = 32, n_rrdb = 23, scale = 4, batch_size = 16;
  int64_t epochs = 200, val_every = 5;
  int64_t tile = 128, overlap = 16, tile_batch = 8;
  double lr_g = 1e-4, lr_d = 1e-4, w_pixel = 1e-2, w_percep = 1.0, w_adv = 5e-3, ema_decay = 0.999;
  std::string vgg_weights = "weights/vgg19_features.pt";
};

struct DenseBlockImpl : nn::Module {
  DenseBlockImpl(int64_t nf, int64_t gc) {
    for (int64_t i = 0; i < 5; ++i)
      convs_.push_back(register_module("conv" + std::to_string(i + 1),
                                       nn::Conv2d(nn::Conv2dOptions(nf + i * gc, i == 4 ? nf : gc, 3).padding(1))));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    std::vector<torch::Tensor> feats{x};
    for (size_t i = 0; i < 4; ++i)
      feats.push_back(torch::leaky_relu(convs_[i](torch::cat(feats, 1)), 0.2));
    auto out = convs_[4](torch::cat(feats, 1));
    // FACT: c = torch.nn.Conv2d(4, 4, 3, padding=1); x = torch.randn(1, 4, 6, 6, requires_grad=True); o = c(x); o.mul_(0.2).add_(x); o.sum().backward(); assert c.weight.grad is not None
    return out.mul_(0.2).add_(x); // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input and weight, not its output
  }
  std::vector<nn::Conv2d> convs_;
};
TORCH_MODULE(DenseBlock);

struct RrdbImpl : nn::Module {
  RrdbImpl(int64_t nf, int64_t gc) {
    rdb1_ = register_module("rdb1", DenseBlock(nf, gc));
    rdb2_ = register_module("rdb2", DenseBlock(nf, gc));
    rdb3_ = register_module("rdb3", DenseBlock(nf, gc));
  }
  torch::Tensor forward(const torch::Tensor &x) { return rdb3_(rdb2_(rdb1_(x))) * 0.2 + x; }
  DenseBlock rdb1_{nullptr}, rdb2_{nullptr}, rdb3_{nullptr};
};
TORCH_MODULE(Rrdb);

struct RrdbNetImpl : nn::Module {
  explicit RrdbNetImpl(const SrConfig &cfg) {
    first_ = register_module("conv_first", nn::Conv2d(nn::Conv2dOptions(3, cfg.nf, 3).padding(1)));
    body_ = register_module("body", nn::Sequential());
    for (int64_t i = 0; i < cfg.n_rrdb; ++i)
      body_->push_back(Rrdb(cfg.nf, cfg.gc));
    conv_body_ = register_module("conv_body", nn::Conv2d(nn::Conv2dOptions(cfg.nf, cfg.nf, 3).padding(1)));
    up_ = register_module("upsample", nn::Sequential());
    for (int64_t s = 1; s < cfg.scale; s *= 2) { // one x2 PixelShuffle stage per octave
      up_->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.nf, cfg.nf * 4, 3).padding(1)));
      up_->push_back(nn::PixelShuffle(nn::PixelShuffleOptions(2)));
      up_->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)));
    }
    conv_hr_ = register_module("conv_hr", nn::Conv2d(nn::Conv2dOptions(cfg.nf, cfg.nf, 3).padding(1)));
    conv_last_ = register_module("conv_last", nn::Conv2d(nn::Conv2dOptions(cfg.nf, 3, 3).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto feat = first_(x);
    feat = feat + conv_body_(body_->forward(feat));
    feat = up_->forward(feat);
    return conv_last_(torch::leaky_relu(conv_hr_(feat), 0.2));
  }
  nn::Conv2d first_{nullptr}, conv_body_{nullptr}, conv_hr_{nullptr}, conv_last_{nullptr};
  nn::Sequential body_{nullptr}, up_{nullptr};
};
TORCH_MODULE(RrdbNet);

// VGG19 features up to conv5_4 (before its ReLU), torchvision weights exported with torch::save.
struct VggFeaturesImpl : nn::Module {
  explicit VggFeaturesImpl(const std::string &weights) {
    const std::vector<int64_t> plan{64, 64, -1, 128, 128, -1, 256, 256, 256, 256, -1, 512, 512, 512, 512, -1, 512, 512, 512, 512};
    layers_ = nn::Sequential();
    int64_t in = 3;
    for (size_t i = 0; i < plan.size(); ++i) {
      if (plan[i] < 0) {
        layers_->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(2)));
        continue;
      }
      layers_->push_back(nn::Conv2d(nn::Conv2dOptions(in, plan[i], 3).padding(1)));
      if (i + 1 < plan.size())
        layers_->push_back(nn::ReLU());
      in = plan[i];
    }
    register_module("features", layers_);
    torch::load(layers_, weights);
    mean_ = register_buffer("mean", torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}));
    std_ = register_buffer("std", torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}));
    for (auto &p : parameters())
      p.requires_grad_(false); // LOOKALIKE: tensor-inplace-on-leaf -- only the flag changes: the extractor is frozen
    eval();
  }
  torch::Tensor forward(const torch::Tensor &x) {
    return layers_->forward((x - mean_) / std_); // LOOKALIKE: tensor-device-mismatch -- registered buffers move with the module
  }
  nn::Sequential layers_{nullptr};
  torch::Tensor mean_, std_;
};
TORCH_MODULE(VggFeatures);

// VGG-style discriminator for 128 x 128 HR patches.
struct DiscriminatorImpl : nn::Module {
  explicit DiscriminatorImpl(int64_t nf) {
    features_ = nn::Sequential();
    int64_t in = 3, out = nf;
    for (int i = 0; i < 5; ++i) {
      features_->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)));
      features_->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)));
      features_->push_back(nn::Conv2d(nn::Conv2dOptions(out, out, 4).stride(2).padding(1).bias(false)));
      features_->push_back(nn::BatchNorm2d(out));
      features_->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)));
      in = out;
      out = std::min<int64_t>(out * 2, 8 * nf);
    }
    register_module("features", features_);
    fc1_ = register_module("fc1", nn::Linear(in * 4 * 4, 100));
    fc2_ = register_module("fc2", nn::Linear(100, 1));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    // FACT: h = torch.nn.LeakyReLU(0.2)(torch.nn.BatchNorm2d(8)(torch.nn.Conv2d(3, 8, 4, 2, 1)(torch.randn(2, 3, 8, 8)))); assert is_view_of(h.flatten(1), h)
    auto h = features_->forward(x).flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- the feature map is contiguous: flatten is a view
    return fc2_(torch::leaky_relu(fc1_(h), 0.2));
  }
  nn::Sequential features_{nullptr};
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Discriminator);

torch::Tensor bce_logits(const torch::Tensor &x, double target) {
  return F::binary_cross_entropy_with_logits(x, torch::full_like(x, target));
}

// BT.601 luma in [16/255, 235/255] of RGB in [0, 1]: [B, 3, H, W] -> [B, H, W].
torch::Tensor luma(const torch::Tensor &rgb) {
  auto w = torch::tensor({65.481f, 128.553f, 24.966f}).view({1, 3, 1, 1});
  return (rgb * w).sum(1) / 255.0 + 16.0 / 255.0; // EXPECT: tensor-device-mismatch -- validate() passes GPU images; the weights are a host tensor of rank 4
}

// Upscales [1, 3, H, W] in overlapping tiles and blends them with feathered weights.
torch::Tensor upscale_tiled(RrdbNet &g, const torch::Tensor &img, const SrConfig &cfg) {
  torch::NoGradGuard no_grad;
  const auto C = img.size(1), H = img.size(2), W = img.size(3);
  const auto s = cfg.scale, step = cfg.tile - cfg.overlap;
  const auto nh = std::max<int64_t>((H - cfg.overlap + step - 1) / step, 1);
  const auto nw = std::max<int64_t>((W - cfg.overlap + step - 1) / step, 1);
  const auto Hp = (nh - 1) * step + cfg.tile, Wp = (nw - 1) * step + cfg.tile;
  auto padded = F::pad(img, F::PadFuncOptions({0, Wp - W, 0, Hp - H}).mode(torch::kReplicate));
  auto tiles = padded.unfold(2, cfg.tile, step).unfold(3, cfg.tile, step); // [1, C, nh, nw, tile, tile]
  // FACT: p = torch.randn(1, 3, 40, 40); t = p.unfold(2, 16, 12).unfold(3, 16, 12); assert raises(lambda: t.permute(0, 2, 3, 1, 4, 5).view(-1, 3, 16, 16), "view size is not compatible")
  auto batch = tiles.permute({0, 2, 3, 1, 4, 5}).view({nh * nw, C, cfg.tile, cfg.tile}); // EXPECT: tensor-view-non-contiguous -- the tiles overlap: no strides can list them as one batch
  std::vector<torch::Tensor> outs;
  for (int64_t i = 0; i < nh * nw; i += cfg.tile_batch)
    outs.push_back(g->forward(batch.narrow(0, i, std::min(cfg.tile_batch, nh * nw - i)))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  auto up = torch::cat(outs); // [nh * nw, C, T, T]

  const auto T = cfg.tile * s, ov = cfg.overlap * s;
  auto ramp = torch::ones({T}, up.options());
  auto edge = torch::linspace(0, 1, ov + 2, up.options()).narrow(0, 1, ov);
  ramp.narrow(0, 0, ov).copy_(edge);
  ramp.narrow(0, T - ov, ov).copy_(edge.flip(0));
  auto feather = ramp.unsqueeze(1) * ramp.unsqueeze(0); // [T, T]
  auto out = torch::zeros({1, C, Hp * s, Wp * s}, up.options());
  auto weight = torch::zeros({1, 1, Hp * s, Wp * s}, up.options());
  for (int64_t i = 0; i < nh; ++i)
    for (int64_t j = 0; j < nw; ++j) {
      // FACT: o = torch.zeros(1, 3, 10, 10); u = torch.randn(4, 3, 6, 6); o.narrow(2, 0, 6).narrow(3, 4, 6).add_(u[1]); assert torch.equal(o[0, :, :6, 4:], u[1])
      out.narrow(2, i * step * s, T).narrow(3, j * step * s, T).add_(up[i * nw + j] * feather); // LOOKALIKE: tensor-inplace-overlap -- the source is the tile batch, another tensor
      weight.narrow(2, i * step * s, T).narrow(3, j * step * s, T).add_(feather);
    }
  return out.div_(weight).narrow(2, 0, H * s).narrow(3, 0, W * s);
}

// [1, 3, H, W] in [0, 1] -> [H, W, 3] uint8 for the PNG encoder.
torch::Tensor to_image(const torch::Tensor &sr) {
  auto hwc = sr.squeeze(0).permute({1, 2, 0}).clamp(0, 1).mul(255);
  auto img = torch::empty({hwc.size(0), hwc.size(1), 3}, torch::kUInt8);
  // FACT: x = torch.tensor([0.999, 0.5]) * 255; b = torch.empty(2, dtype=torch.uint8); b.copy_(x); assert b.tolist() == [254, 127]
  img.copy_(hwc); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates (254.7 -> 254): every pixel darkened by half a level on average
  return img;
}

struct PatchDataset : torch::data::datasets::Dataset<PatchDataset> {
  PatchDataset(torch::Tensor lr, torch::Tensor hr) : lr_(std::move(lr)), hr_(std::move(hr)) {}
  torch::data::Example<> get(size_t i) override { return {lr_[i], hr_[i]}; }
  torch::optional<size_t> size() const override { return lr_.size(0); }
  torch::Tensor lr_, hr_;
};

class SrTrainer {
public:
  explicit SrTrainer(const SrConfig &cfg)
      : cfg_(cfg), device_(torch::kCUDA), g_(cfg), ema_(cfg), d_(cfg.nf), vgg_(cfg.vgg_weights),
        opt_g_(g_->parameters(), torch::optim::AdamOptions(cfg.lr_g).betas(std::make_tuple(0.9, 0.99))),
        opt_d_(d_->parameters(), torch::optim::AdamOptions(cfg.lr_d).betas(std::make_tuple(0.9, 0.99))) {
    g_->to(device_);
    ema_->to(device_);
    d_->to(device_);
    vgg_->to(device_);
    torch::NoGradGuard no_grad;
    auto src = g_->parameters();
    auto dst = ema_->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].copy_(src[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      dst[i].requires_grad_(false);
    }
    ema_->eval();
  }

  void update_ema() {
    torch::NoGradGuard no_grad;
    auto src = g_->parameters();
    auto dst = ema_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].mul_(cfg_.ema_decay).add_(src[i].detach(), 1.0 - cfg_.ema_decay); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- under NoGradGuard; the detached weight is only read
  }

  void train_epoch(const PatchDataset &data, int64_t epoch) {
    auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        PatchDataset(data).map(torch::data::transforms::Stack<>()),
        torch::data::DataLoaderOptions(cfg_.batch_size).workers(4).drop_last(true));
    g_->train();
    d_->train();
    auto g_total = torch::zeros({}, device_);
    int64_t steps = 0;
    for (auto &batch : *loader) {
      auto lr = batch.data.to(device_), hr = batch.target.to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto fake = g_->forward(lr);

      // Discriminator: real patches should score above the average fake, fakes below the average real.
      auto fake_in = fake.detach();
      // FACT: g = torch.nn.Conv2d(3, 3, 3, padding=1); f = g(torch.rand(1, 3, 4, 4)) * 3; before = f.detach().clone(); d = f.detach(); d.clamp_(0, 1); assert shares_storage(d, f) and not torch.equal(f.detach(), before)
      fake_in.clamp_(0, 1); // EXPECT: tensor-inplace-on-detached -- detach shares fake's storage: the generator's losses below see the clamped values, its gradients do not
      auto d_real = d_->forward(hr), d_fake = d_->forward(fake_in);
      auto loss_d = 0.5 * (bce_logits(d_real - d_fake.mean(), 1.0) + bce_logits(d_fake - d_real.mean(), 0.0));
      opt_d_.zero_grad();
      loss_d.backward();
      opt_d_.step();

      // Generator: pixel + perceptual + relativistic adversarial terms, D frozen.
      for (auto &p : d_->parameters())
        p.requires_grad_(false);
      auto g_real = d_->forward(hr).detach(), g_fake = d_->forward(fake);
      auto adv = 0.5 * (bce_logits(g_real - g_fake.mean(), 0.0) + bce_logits(g_fake - g_real.mean(), 1.0));
      auto percep = F::l1_loss(vgg_->forward(fake), vgg_->forward(hr));
      auto pixel = F::l1_loss(fake, hr);
      auto loss_g = cfg_.w_pixel * pixel + cfg_.w_percep * percep + cfg_.w_adv * adv;
      opt_g_.zero_grad();
      loss_g.backward();
      opt_g_.step();
      for (auto &p : d_->parameters())
        p.requires_grad_(true);
      update_ema();

      // FACT: c = torch.nn.Conv2d(3, 3, 3); s = torch.zeros(()); exec('for _ in range(3):\n l = c(torch.rand(1, 3, 5, 5)).abs().mean(); l.backward(); s += l'); assert s.requires_grad and kept_nodes(s) >= 3 * 3
      g_total += loss_g; // EXPECT: tensor-graph-kept-across-iterations -- the epoch total links every step's generator graph
      ++steps;
      std::cout << "\repoch " << epoch << " step " << steps << " g " << loss_g.item<float>() << " d " << loss_d.item<float>() << std::flush; // EXPECT: tensor-sync-in-loop -- a progress line that waits for the GPU at every step
    }
    std::cout << "\nepoch " << epoch << " mean generator loss " << (g_total / std::max<int64_t>(steps, 1)).item<double>() << "\n";
  }

  // PSNR on the luma channel with `scale` border pixels cropped; the EMA weights are evaluated.
  double validate(const std::vector<std::pair<torch::Tensor, torch::Tensor>> &val, const std::string &png_prefix) {
    torch::NoGradGuard no_grad;
    double psnr_sum = 0;
    const auto b = cfg_.scale;
    for (size_t i = 0; i < val.size(); ++i) {
      auto sr = upscale_tiled(ema_, val[i].first.to(device_), cfg_).clamp(0, 1); // LOOKALIKE: tensor-clone-in-loop -- a different image each time
      auto hr = val[i].second.to(device_);
      auto y_sr = luma(sr), y_hr = luma(hr);
      auto diff = (y_sr - y_hr).narrow(1, b, y_sr.size(1) - 2 * b).narrow(2, b, y_sr.size(2) - 2 * b);
      auto mse = diff.pow(2).mean();
      psnr_sum += (-10.0 * torch::log10(mse)).item<double>(); // LOOKALIKE: tensor-sync-in-loop -- one value per image, after a whole tiled pass of the generator
      if (i < 4)
        torch::save(to_image(sr), png_prefix + std::to_string(i) + ".pt");
    }
    return psnr_sum / static_cast<double>(std::max<size_t>(val.size(), 1));
  }

  void export_ema(const std::string &path) { torch::save(ema_, path); }

private:
  SrConfig cfg_;
  torch::Device device_;
  RrdbNet g_, ema_;
  Discriminator d_;
  VggFeatures vgg_;
  torch::optim::Adam opt_g_, opt_d_;
};

void train_esrgan(const PatchDataset &train, const std::vector<std::pair<torch::Tensor, torch::Tensor>> &val,
                  const SrConfig &cfg) {
  SrTrainer trainer(cfg);
  double best = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    trainer.train_epoch(train, epoch);
    if ((epoch + 1) % cfg.val_every != 0)
      continue;
    const double psnr = trainer.validate(val, "val/epoch" + std::to_string(epoch) + "_");
    std::cout << "epoch " << epoch << " val PSNR(Y) " << psnr << " dB\n";
    if (psnr > best) {
      best = psnr;
      trainer.export_ema("esrgan_ema_best.pt");
    }
  }
}
