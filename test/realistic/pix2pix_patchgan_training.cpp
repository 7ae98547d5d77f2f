// pix2pix (Isola et al., 2017): paired image-to-image translation (facade label maps -> photos).
// A U-Net generator with skip connections maps the source image into the target domain; a 70x70
// PatchGAN discriminator scores overlapping patches of the (source, image) pair, concatenated on
// channels. The generator minimises the adversarial loss plus lambda * L1 to the target; the
// discriminator sees fakes drawn from a pool of past generator outputs. Validation writes
// source | fake | target strips as binary PPM files and reports the L1 error.
#include <torch/torch.h>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Pix2PixConfig {
  int64_t in_ch = 3, out_ch = 3, ngf = 64, ndf = 64, n_down = 8, d_layers = 3;
  int64_t epochs = 200, decay_start = 100, pool_size = 50, log_every = 100, val_every = 5;
  double lr = 2e-4, beta1 = 0.5, lambda_l1 = 100.0, dropout = 0.5, fg_weight = 1.0;
  bool residual = false; // the generator predicts a correction to its input
  std::string out_dir = "samples";
};

struct PairBatch {
  torch::Tensor src, tgt; // [B, C, H, W] float in [-1, 1]
  torch::Tensor fg;       // [B, 1, H, W] foreground mask in {0, 1}; undefined when the set has none
};

// Conv 4x4 stride 2 -> (BN) -> LeakyReLU(0.2).
struct DownImpl : nn::Module {
  DownImpl(int64_t in, int64_t out, bool norm) {
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, 4).stride(2).padding(1).bias(!norm)));
    if (norm)
      bn = register_module("bn", nn::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = conv(x);
    if (!bn.is_empty())
      h = bn(h);
    // FACT: c = torch.nn.Conv2d(3, 4, 4, 2, 1); b = torch.nn.BatchNorm2d(4); h = b(c(torch.randn(2, 3, 8, 8))); torch.nn.functional.leaky_relu_(h, 0.2); h.sum().backward(); assert c.weight.grad is not None
    return torch::leaky_relu_(h, 0.2); // LOOKALIKE: tensor-inplace-on-saved -- convolution and batch norm do not save their output
  }
  nn::Conv2d conv{nullptr};
  nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(Down);

// ConvTranspose 4x4 stride 2 -> BN -> (dropout) -> ReLU, concatenated with the encoder's skip.
struct UpImpl : nn::Module {
  UpImpl(int64_t in, int64_t out, double dropout) : p(dropout) {
    deconv = register_module("deconv", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(in, out, 4).stride(2).padding(1).bias(false)));
    bn = register_module("bn", nn::BatchNorm2d(out));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &skip) {
    auto h = bn(deconv(x));
    if (p > 0)
      h = F::dropout(h, F::DropoutFuncOptions().p(p).training(is_training()));
    return torch::cat({torch::relu(h), skip}, 1);
  }
  nn::ConvTranspose2d deconv{nullptr};
  nn::BatchNorm2d bn{nullptr};
  double p;
};
TORCH_MODULE(Up);

struct UNetImpl : nn::Module {
  explicit UNetImpl(const Pix2PixConfig &cfg) : residual(cfg.residual) {
    std::vector<int64_t> ch; // ngf, 2 ngf, 4 ngf, 8 ngf, 8 ngf, ...
    for (int64_t i = 0, c = cfg.ngf; i < cfg.n_down; ++i, c = std::min(2 * c, 8 * cfg.ngf))
      ch.push_back(c);
    for (int64_t i = 0; i < cfg.n_down; ++i) // the outermost and the innermost level have no norm
      downs.push_back(register_module("down" + std::to_string(i),
                                      Down(i == 0 ? cfg.in_ch : ch[i - 1], ch[i], i != 0 && i != cfg.n_down - 1)));
    for (int64_t i = cfg.n_down - 1; i > 0; --i) // dropout on the three innermost up blocks
      ups.push_back(register_module("up" + std::to_string(i), Up(i == cfg.n_down - 1 ? ch[i] : 2 * ch[i], ch[i - 1],
                                                                 i >= cfg.n_down - 3 ? cfg.dropout : 0.0)));
    outer = register_module("outer", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2 * ch[0], cfg.out_ch, 4).stride(2).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    std::vector<torch::Tensor> skips;
    auto h = x;
    for (auto &down : downs) {
      h = down->forward(h);
      skips.push_back(h); // LOOKALIKE: tensor-graph-kept-across-iterations -- the skips feed the decoder of this same forward
    }
    skips.pop_back(); // the innermost output is h itself
    for (auto &up : ups) {
      h = up->forward(h, skips.back());
      skips.pop_back();
    }
    auto y = torch::tanh(outer->forward(h));
    if (residual) {
      // FACT: y = torch.tanh(torch.nn.Conv2d(3, 3, 3, padding=1)(torch.randn(2, 3, 8, 8))); x = torch.randn(2, 3, 8, 8); y += x; assert backward_fails(lambda: y.sum().backward())
      y += x; // EXPECT: tensor-inplace-on-saved -- tanh saved y for its backward: the generator update raises
      y.clamp_(-1.0, 1.0);
    }
    return y;
  }
  bool residual;
  std::vector<Down> downs;
  std::vector<Up> ups;
  nn::ConvTranspose2d outer{nullptr};
};
TORCH_MODULE(UNet);

// 70x70 PatchGAN: one logit per overlapping patch of the (source, image) pair.
struct PatchGANImpl : nn::Module {
  explicit PatchGANImpl(const Pix2PixConfig &cfg) {
    int64_t c = cfg.ndf;
    body->push_back(nn::Conv2d(nn::Conv2dOptions(cfg.in_ch + cfg.out_ch, c, 4).stride(2).padding(1)));
    body->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2).inplace(true)));
    for (int64_t i = 1; i <= cfg.d_layers; ++i) {
      const int64_t next = std::min(2 * c, 8 * cfg.ndf);
      body->push_back(nn::Conv2d(nn::Conv2dOptions(c, next, 4).stride(i == cfg.d_layers ? 1 : 2).padding(1).bias(false)));
      body->push_back(nn::BatchNorm2d(next));
      body->push_back(nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2).inplace(true)));
      c = next;
    }
    body->push_back(nn::Conv2d(nn::Conv2dOptions(c, 1, 4).padding(1)));
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor &src, const torch::Tensor &img) { return body->forward(torch::cat({src, img}, 1)); }
  nn::Sequential body;
};
TORCH_MODULE(PatchGAN);

// N(0, 0.02) convolutions, N(1, 0.02) batch-norm scales, as in the reference implementation.
void init_weights(nn::Module &net) {
  torch::NoGradGuard no_grad;
  for (auto &m : net.modules(/*include_self=*/false)) {
    if (auto *conv = m->as<nn::Conv2d>()) {
      nn::init::normal_(conv->weight, 0.0, 0.02);
    } else if (auto *deconv = m->as<nn::ConvTranspose2d>()) {
      deconv->weight.normal_(0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    } else if (auto *bn = m->as<nn::BatchNorm2d>()) {
      bn->weight.normal_(1.0, 0.02);
      bn->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
  }
}

void set_requires_grad(nn::Module &net, bool flag) {
  for (auto &p : net.parameters())
    p.set_requires_grad(flag);
}

// History of generated images (Shrivastava et al., 2017): once full, each new fake is, with
// probability 1/2, swapped for a stored one, so the discriminator also sees older fakes.
class ImagePool {
public:
  explicit ImagePool(int64_t capacity) : capacity_(capacity), pick_(0, std::max<int64_t>(capacity - 1, 0)) {}

  torch::Tensor query(const torch::Tensor &fakes) {
    if (capacity_ == 0)
      return fakes.detach();
    std::vector<torch::Tensor> out;
    for (int64_t i = 0; i < fakes.size(0); ++i) {
      auto img = fakes[i].detach();
      if (static_cast<int64_t>(pool_.size()) < capacity_) {
        pool_.push_back(img.clone()); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- slots are overwritten in place later and must not pin the generator's batch
        out.push_back(img); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph
      } else if (coin_(rng_) < 0.5) {
        const auto slot = static_cast<size_t>(pick_(rng_));
        auto old = pool_[slot];
        // FACT: pool = [torch.rand(3, 4, 4)]; old = pool[0]; new = torch.rand(3, 4, 4); pool[0].copy_(new); assert shares_storage(old, pool[0]) and torch.equal(old, new)
        pool_[slot].copy_(img); // EXPECT: tensor-alias-then-mutate -- old is the same tensor: the "past" fake handed out is the new one
        out.push_back(old);
      } else {
        out.push_back(img);
      }
    }
    return torch::stack(out);
  }

private:
  int64_t capacity_;
  std::vector<torch::Tensor> pool_;
  std::mt19937 rng_{20170101};
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
  std::uniform_int_distribution<int64_t> pick_;
};

// [C, H, W] in [-1, 1] -> [H, W, C] uint8.
torch::Tensor to_u8_hwc(const torch::Tensor &img) {
  auto t = img.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten at once: img.add(1.0) makes the same tensor in one pass
  t.add_(1.0).mul_(127.5).round_().clamp_(0.0, 255.0);
  return t.permute({1, 2, 0}).to(torch::kByte);
}

void write_ppm(const std::string &path, int64_t h, int64_t w, const torch::Tensor &bytes) {
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << w << " " << h << "\n255\n";
  f.write(reinterpret_cast<const char *>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

double validate(UNet &G, const std::vector<PairBatch> &val, const Pix2PixConfig &cfg, torch::Device device, int64_t epoch) {
  G->eval();
  double l1_sum = 0;
  for (size_t b = 0; b < val.size(); ++b) {
    auto src = val[b].src.to(device), tgt = val[b].tgt.to(device);
    auto fake = G->forward(src);
    auto vis = fake.detach(); // pixel values for the strips
    // FACT: f = torch.tanh(torch.randn(2, 3, requires_grad=True)); v = f.detach(); v.add_(1.0).mul_(127.5).clamp_(0.0, 255.0); assert shares_storage(v, f) and f.detach().max() > 1
    vis.add_(1.0).mul_(127.5).clamp_(0.0, 255.0); // EXPECT: tensor-inplace-on-detached -- rescales fake itself: the L1 below compares 0..255 pixels with [-1, 1] targets
    const auto H = src.size(2), W = src.size(3);
    for (int64_t i = 0; i < src.size(0); ++i) {
      auto strip = torch::empty({H, 3 * W, 3}, torch::kByte);
      strip.narrow(1, 0, W).copy_(to_u8_hwc(src[i].cpu())); // LOOKALIKE: tensor-copy-narrowing, tensor-sync-in-loop -- already uint8; the host copy is the image written out
      // FACT: s = torch.empty(2, 6, 3, dtype=torch.uint8); v = torch.full((2, 2, 3), 200.7); s.narrow(1, 2, 2).copy_(v); assert s[0, 2, 0].item() == 200
      strip.narrow(1, W, W).copy_(vis[i].permute({1, 2, 0})); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates, while the other columns are rounded
      strip.narrow(1, 2 * W, W).copy_(to_u8_hwc(tgt[i].cpu()));
      const auto path = cfg.out_dir + "/e" + std::to_string(epoch) + "_" + std::to_string(b) + "_" + std::to_string(i) + ".ppm";
      // FACT: s = torch.empty(4, 12, 3, dtype=torch.uint8); assert is_view_of(s.view(-1), s)
      write_ppm(path, H, 3 * W, strip.view({-1})); // LOOKALIKE: tensor-view-non-contiguous -- a fresh contiguous tensor
    }
    l1_sum += F::l1_loss(fake, tgt).item<double>(); // EXPECT: tensor-sync-in-loop -- the caller passes a CUDA device: every batch waits only to sum the error
  }
  G->train();
  return l1_sum / static_cast<double>(val.size());
}

// Translates held-out sources for the report: one PPM per image.
void export_translations(UNet &G, const std::vector<torch::Tensor> &sources, const std::string &dir, torch::Device device) {
  torch::NoGradGuard no_grad;
  G->eval();
  for (size_t i = 0; i < sources.size(); ++i) {
    auto fake = G->forward(sources[i].unsqueeze(0).to(device)).squeeze(0).cpu(); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- each image is moved once; its host copy is written out
    auto hwc = to_u8_hwc(fake);
    // FACT: x = torch.rand(3, 4, 5) * 2 - 1; u = x.permute(1, 2, 0).to(torch.uint8); assert raises(lambda: u.view(-1), "view size is not compatible")
    write_ppm(dir + "/" + std::to_string(i) + ".ppm", hwc.size(0), hwc.size(1), hwc.view({-1})); // EXPECT: tensor-view-non-contiguous -- to_u8_hwc returns a permuted tensor (to() keeps the strides): the view throws
  }
}

void train_pix2pix(UNet &G, PatchGAN &D, const std::vector<PairBatch> &train, const std::vector<PairBatch> &val,
                   const Pix2PixConfig &cfg) {
  const torch::Device device(torch::kCUDA);
  init_weights(*G);
  init_weights(*D);
  G->to(device);
  D->to(device);
  torch::optim::Adam opt_g(G->parameters(), torch::optim::AdamOptions(cfg.lr).betas({cfg.beta1, 0.999}));
  torch::optim::Adam opt_d(D->parameters(), torch::optim::AdamOptions(cfg.lr).betas({cfg.beta1, 0.999}));
  ImagePool pool(cfg.pool_size);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    // constant rate, then linear decay to zero
    const double frac = std::max<double>(0.0, static_cast<double>(epoch - cfg.decay_start) / static_cast<double>(cfg.epochs - cfg.decay_start));
    for (auto *opt : {&opt_g, &opt_d})
      for (auto &group : opt->param_groups())
        static_cast<torch::optim::AdamOptions &>(group.options()).lr(cfg.lr * (1.0 - frac));
    std::vector<torch::Tensor> d_losses;
    auto l1_sum = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto &batch : train) {
      auto src = batch.src.to(device), tgt = batch.tgt.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new pair every step
      auto fake = G->forward(src);

      // discriminator: real pairs against pooled fakes
      set_requires_grad(*D, true);
      auto pred_real = D->forward(src, tgt);
      auto pred_fake = D->forward(src, pool.query(fake));
      auto real_label = torch::ones({pred_real.size(0), 1, pred_real.size(2), pred_real.size(3)});
      auto loss_real = F::binary_cross_entropy_with_logits(pred_real, real_label); // EXPECT: tensor-device-mismatch -- the labels are made on the host, the predictions are on the GPU
      auto loss_fake = F::binary_cross_entropy_with_logits(pred_fake, torch::zeros_like(pred_fake)); // LOOKALIKE: tensor-device-mismatch -- zeros_like is made on the prediction's device
      auto loss_d = 0.5 * (loss_real + loss_fake);
      opt_d.zero_grad();
      loss_d.backward();
      opt_d.step();
      d_losses.push_back(loss_d); // EXPECT: tensor-graph-kept-across-iterations -- every step's discriminator graph stays alive until the epoch ends

      // generator: fool the discriminator and stay close to the target
      set_requires_grad(*D, false);
      auto pred = D->forward(src, fake);
      auto loss_gan = F::binary_cross_entropy_with_logits(pred, torch::ones_like(pred)); // LOOKALIKE: tensor-device-mismatch -- ones_like follows pred
      auto diff = (fake - tgt).abs();
      if (batch.fg.defined() && cfg.fg_weight != 1.0) {
        // FACT: w = torch.randn(2, 3, requires_grad=True); f = torch.tanh(w); d = (f - torch.rand(2, 3)).abs(); d.mul_(2.0); d.mean().backward(); assert w.grad is not None
        diff.mul_(1.0 + (cfg.fg_weight - 1.0) * batch.fg.to(device)); // LOOKALIKE: tensor-inplace-on-saved -- abs saves its input, not its result
      }
      auto loss_l1 = diff.mean();
      auto loss_g = loss_gan + cfg.lambda_l1 * loss_l1;
      opt_g.zero_grad();
      loss_g.backward();
      opt_g.step();
      l1_sum += loss_l1.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " D " << loss_d.item<float>() << " G " << loss_g.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    std::cout << "epoch " << epoch << " D " << torch::stack(d_losses).mean().item<double>() << " L1 "
              << l1_sum.item<double>() / static_cast<double>(train.size()) << "\n";
    if ((epoch + 1) % cfg.val_every == 0)
      std::cout << "  val L1 " << validate(G, val, cfg, device, epoch) << "\n";
  }
}
