// Class-conditional image generator with conditional batch norm: BatchNorm2d without affine
// parameters, modulated per channel by a gamma and a beta that a FiLM head predicts from the class
// embedding concatenated with the block's own chunk of the latent (BigGAN's hierarchical latent).
// Residual up-sampling blocks, one self-attention block at 16x16, a projection discriminator that
// scores every position of its last feature map, hinge losses with consistency regularisation,
// an EMA generator for sampling, and the class sweep / latent walk written to the progress grids.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct CondGanConfig {
  int64_t z_dim = 120, n_classes = 100, embed_dim = 128, ch = 64, image_size = 32;
  int64_t batch_size = 64, iters = 200000, log_every = 200, sample_every = 2000, walk_steps = 9;
  double g_lr = 1e-4, d_lr = 4e-4, beta1 = 0.0, beta2 = 0.999, ema_decay = 0.999;
  double truncation = 0.5, instance_noise = 0.1, noise_anneal_iters = 50000, brightness = 0.5, cr_weight = 10.0;
  bool diff_augment = true;
  std::string out_dir = "samples";
};

// BatchNorm whose per-channel affine comes from a condition vector (FiLM on the normalised map).
struct ConditionalBatchNormImpl : nn::Module {
  ConditionalBatchNormImpl(int64_t channels, int64_t cond_dim) {
    bn_ = register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(channels).affine(false)));
    gamma_ = register_module("gamma", nn::Linear(cond_dim, channels));
    beta_ = register_module("beta", nn::Linear(cond_dim, channels));
    // Start as plain BatchNorm for every class: gamma = 1, beta = 0.
    // FACT: l = torch.nn.Linear(5, 3); torch.nn.init.normal_(l.weight, 0.0, 0.02); assert l.weight.is_leaf and l.weight.requires_grad
    nn::init::normal_(gamma_->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills the weight under no-grad
    // FACT: l = torch.nn.Linear(5, 3); assert raises(lambda: l.bias.fill_(1.0), "a leaf Variable that requires grad")
    gamma_->bias.fill_(1.0); // EXPECT: tensor-inplace-on-leaf -- a trainable bias written with grad mode on: the constructor throws
    nn::init::zeros_(beta_->weight);
    nn::init::zeros_(beta_->bias);
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &cond) {
    const auto B = x.size(0), C = x.size(1);
    // FACT: g = torch.nn.Linear(5, 3)(torch.randn(4, 5)); assert is_view_of(g.view(4, 3, 1, 1), g)
    auto gamma = gamma_(cond).view({B, C, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto beta = beta_(cond).unsqueeze(-1).unsqueeze(-1);
    return bn_(x) * gamma + beta;
  }

  nn::BatchNorm2d bn_{nullptr};
  nn::Linear gamma_{nullptr}, beta_{nullptr};
};
TORCH_MODULE(ConditionalBatchNorm);

struct GenBlockImpl : nn::Module {
  GenBlockImpl(int64_t in_ch, int64_t out_ch, int64_t cond_dim) {
    cbn1_ = register_module("cbn1", ConditionalBatchNorm(in_ch, cond_dim));
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 3).padding(1)));
    cbn2_ = register_module("cbn2", ConditionalBatchNorm(out_ch, cond_dim));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out_ch, out_ch, 3).padding(1)));
    skip_ = register_module("skip", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 1)));
  }

  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &cond) {
    auto up = F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest);
    auto h = torch::relu(cbn1_(x, cond));
    h = conv1_(F::interpolate(h, up));
    h = conv2_(torch::relu(cbn2_(h, cond)));
    // FACT: c = torch.nn.Conv2d(2, 2, 3, padding=1); x = torch.randn(1, 2, 4, 4, requires_grad=True); h = c(torch.relu(x)); h += x * 2; h.sum().backward(); assert x.grad is not None
    h += skip_(F::interpolate(x, up)); // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input and weight, not its output
    return h;
  }

  ConditionalBatchNorm cbn1_{nullptr}, cbn2_{nullptr};
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, skip_{nullptr};
};
TORCH_MODULE(GenBlock);

// SAGAN self-attention; the keys and values are pooled 2x2.
struct SelfAttentionImpl : nn::Module {
  explicit SelfAttentionImpl(int64_t ch) : ch_(ch) {
    theta_ = register_module("theta", nn::Conv2d(nn::Conv2dOptions(ch, ch / 8, 1).bias(false)));
    phi_ = register_module("phi", nn::Conv2d(nn::Conv2dOptions(ch, ch / 8, 1).bias(false)));
    g_ = register_module("g", nn::Conv2d(nn::Conv2dOptions(ch, ch / 2, 1).bias(false)));
    o_ = register_module("o", nn::Conv2d(nn::Conv2dOptions(ch / 2, ch, 1).bias(false)));
    gain_ = register_parameter("gain", torch::zeros({1}));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    const auto B = x.size(0), H = x.size(2), W = x.size(3);
    auto theta = theta_(x).flatten(2);                      // [B, C/8, HW]
    auto phi = torch::max_pool2d(phi_(x), 2).flatten(2);    // [B, C/8, HW/4]
    auto g = torch::max_pool2d(g_(x), 2).flatten(2);        // [B, C/2, HW/4]
    auto attn = torch::softmax(torch::bmm(theta.transpose(1, 2), phi), -1);
    auto o = torch::bmm(attn, g.transpose(1, 2));           // [B, HW, C/2]
    // FACT: o = torch.bmm(torch.randn(2, 12, 6), torch.randn(2, 6, 5)); assert is_view_of(o.transpose(1, 2).view(2, 5, 3, 4), o)
    auto maps = o.transpose(1, 2).view({B, ch_ / 2, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- only splits the HW dim: any stride can be split
    return x + gain_ * o_(maps);
  }

  int64_t ch_;
  nn::Conv2d theta_{nullptr}, phi_{nullptr}, g_{nullptr}, o_{nullptr};
  torch::Tensor gain_;
};
TORCH_MODULE(SelfAttention);

struct GeneratorImpl : nn::Module {
  explicit GeneratorImpl(const CondGanConfig &cfg) : ch_(cfg.ch), chunk_(cfg.z_dim / 4) {
    const auto cond_dim = cfg.embed_dim + chunk_;
    embed_ = register_module("embed", nn::Embedding(cfg.n_classes, cfg.embed_dim));
    stem_ = register_module("stem", nn::Linear(chunk_, 4 * 4 * 4 * cfg.ch));
    b1_ = register_module("b1", GenBlock(4 * cfg.ch, 4 * cfg.ch, cond_dim)); //  4 ->  8
    b2_ = register_module("b2", GenBlock(4 * cfg.ch, 2 * cfg.ch, cond_dim)); //  8 -> 16
    attn_ = register_module("attn", SelfAttention(2 * cfg.ch));
    b3_ = register_module("b3", GenBlock(2 * cfg.ch, cfg.ch, cond_dim));     // 16 -> 32
    bn_out_ = register_module("bn_out", nn::BatchNorm2d(cfg.ch));
    to_rgb_ = register_module("to_rgb", nn::Conv2d(nn::Conv2dOptions(cfg.ch, 3, 3).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor &z, const torch::Tensor &labels) {
    auto zs = z.split(chunk_, 1);
    auto e = embed_(labels);
    auto h = stem_(zs[0]).view({z.size(0), 4 * ch_, 4, 4});
    h = b1_(h, torch::cat({e, zs[1]}, 1));
    h = attn_(b2_(h, torch::cat({e, zs[2]}, 1)));
    h = b3_(h, torch::cat({e, zs[3]}, 1));
    return torch::tanh(to_rgb_(torch::relu(bn_out_(h))));
  }

  int64_t ch_, chunk_;
  nn::Embedding embed_{nullptr};
  nn::Linear stem_{nullptr};
  GenBlock b1_{nullptr}, b2_{nullptr}, b3_{nullptr};
  SelfAttention attn_{nullptr};
  nn::BatchNorm2d bn_out_{nullptr};
  nn::Conv2d to_rgb_{nullptr};
};
TORCH_MODULE(Generator);

// Projection discriminator scoring each position of the 8x8 map: [B, 3, S, S] -> [B, 64].
struct DiscriminatorImpl : nn::Module {
  explicit DiscriminatorImpl(const CondGanConfig &cfg) {
    body_ = register_module("body", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(3, cfg.ch, 3).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
        nn::Conv2d(nn::Conv2dOptions(cfg.ch, 2 * cfg.ch, 4).stride(2).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
        nn::Conv2d(nn::Conv2dOptions(2 * cfg.ch, 4 * cfg.ch, 4).stride(2).padding(1)), nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2))));
    fc_ = register_module("fc", nn::Linear(4 * cfg.ch, 1));
    embed_ = register_module("embed", nn::Embedding(cfg.n_classes, 4 * cfg.ch));
  }

  torch::Tensor forward(const torch::Tensor &img, const torch::Tensor &labels) {
    auto h = body_->forward(img); // [B, C, 8, 8]
    const auto B = h.size(0), C = h.size(1);
    // FACT: h = torch.randn(2, 6, 4, 4); assert raises(lambda: h.permute(0, 2, 3, 1).view(-1, 6), "view size is not compatible")
    auto tokens = h.permute({0, 2, 3, 1}).view({-1, C}); // EXPECT: tensor-view-non-contiguous -- the batch and spatial dims are not adjacent in memory after the permute: view throws
    auto proj = (tokens.view({B, -1, C}) * embed_(labels).unsqueeze(1)).sum(-1);
    return fc_(tokens).view({B, -1}) + proj;
  }

  nn::Sequential body_{nullptr};
  nn::Linear fc_{nullptr};
  nn::Embedding embed_{nullptr};
};
TORCH_MODULE(Discriminator);

struct LabeledImages : torch::data::datasets::Dataset<LabeledImages> {
  LabeledImages(torch::Tensor images, torch::Tensor labels) : images_(std::move(images)), labels_(std::move(labels)) {}
  torch::data::Example<> get(size_t i) override { return {images_[i], labels_[i]}; }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_, labels_; // [N, 3, S, S] in [0, 1], [N] class ids
};

// DiffAugment-style brightness jitter, one offset per image.
torch::Tensor brightness(const torch::Tensor &img, double strength) {
  return img + (torch::rand({img.size(0), 1, 1, 1}, img.options()) - 0.5) * strength;
}

void ema_update(Generator &ema, Generator &G, double decay) {
  torch::NoGradGuard no_grad;
  auto dst = ema->parameters();
  auto src = G->parameters();
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].mul_(decay).add_(src[i], 1.0 - decay); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  auto dst_b = ema->buffers();
  auto src_b = G->buffers();
  for (size_t i = 0; i < dst_b.size(); ++i)
    dst_b[i].copy_(src_b[i]);
}

// [N, 3, S, S] in [0, 1] -> one [rows * S, nrow * S, 3] uint8 image on the host.
torch::Tensor to_uint8_grid(const torch::Tensor &samples, int64_t nrow) {
  const auto C = samples.size(1), S = samples.size(2);
  const auto rows = samples.size(0) / nrow;
  // FACT: s = torch.rand(4, 3); c = s.clone(); c.mul_(255.0).clamp_(0, 255); assert torch.equal(c, s.mul(255.0).clamp_(0, 255)) and is_copy_of(s.mul(255.0), s)
  auto img = samples.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten in place at once: samples.mul(255.0) makes the copy in the same pass
  img.mul_(255.0).clamp_(0, 255);
  auto tiles = img.narrow(0, 0, rows * nrow).view({rows, nrow, C, S, S});
  // FACT: t = torch.randn(2, 3, 3, 4, 4); g = t.permute(0, 3, 1, 4, 2).contiguous(); assert is_contiguous(g) and is_view_of(g.view(8, 12, 3), g)
  auto grid = tiles.permute({0, 3, 1, 4, 2}).contiguous().view({rows * S, nrow * S, C}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
  return grid.round().to(torch::kUInt8).cpu();
}

// One latent for every class: each row of the grid shows what the label alone changes.
torch::Tensor class_sweep(Generator &G, const CondGanConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  G->eval();
  auto labels = torch::arange(cfg.n_classes, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto z = torch::randn({1, cfg.z_dim}, device).expand({cfg.n_classes, -1});
  // FACT: z = torch.randn(1, 8).expand(5, -1); assert raises(lambda: z.mul_(0.5), "more than one element of the written-to tensor refers to a single memory location")
  z.mul_(cfg.truncation); // EXPECT: tensor-inplace-on-expanded -- every row of z is the same memory: the in-place scale throws
  auto imgs = G->forward(z, labels);
  // FACT: c = torch.nn.Conv2d(2, 3, 1); exec('with torch.no_grad():\n y = torch.tanh(c(torch.randn(1, 2, 2, 2)))\n y.add_(1.0).mul_(0.5)'); assert y.grad_fn is None
  imgs.add_(1.0).mul_(0.5); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard tanh recorded nothing
  G->train();
  return imgs;
}

// A walk from one latent along a random direction, for the interpolation strip of one class.
torch::Tensor latent_walk(Generator &G, int64_t label, const CondGanConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  G->eval();
  const auto n = cfg.walk_steps;
  auto z0 = torch::randn({1, cfg.z_dim}, device) * cfg.truncation;
  auto dir = F::normalize(torch::randn({1, cfg.z_dim}, device), F::NormalizeFuncOptions().dim(1));
  auto z = z0.expand({n, cfg.z_dim}).contiguous();
  // FACT: z0 = torch.randn(1, 6); z = z0.expand(4, 6).contiguous(); z.add_(torch.linspace(-2, 2, 4).unsqueeze(1) * torch.randn(1, 6)); assert is_copy_of(z, z0)
  z.add_(torch::linspace(-2.0, 2.0, n, device).unsqueeze(1) * dir); // LOOKALIKE: tensor-inplace-on-expanded, tensor-alias-then-mutate -- contiguous() of an expanded tensor is a copy of its own
  auto y = torch::full({n}, label, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto imgs = G->forward(z, y);
  G->train();
  return (imgs + 1.0) * 0.5;
}

void train(const LabeledImages &data, const CondGanConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Generator G(cfg), G_ema(cfg);
  Discriminator D(cfg);
  G->to(device);
  G_ema->to(device);
  D->to(device);
  for (auto &p : G_ema->parameters())
    p.requires_grad_(false);
  ema_update(G_ema, G, 0.0);
  torch::optim::Adam g_opt(G->parameters(), torch::optim::AdamOptions(cfg.g_lr).betas({cfg.beta1, cfg.beta2}));
  torch::optim::Adam d_opt(D->parameters(), torch::optim::AdamOptions(cfg.d_lr).betas({cfg.beta1, cfg.beta2}));
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      LabeledImages(data).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(cfg.batch_size).drop_last(true));

  std::vector<torch::Tensor> g_hist;
  int64_t it = 0;
  while (it < cfg.iters) {
    for (auto &batch : *loader) {
      auto real = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto y = batch.target.to(device);
      // FACT: b = torch.rand(4, 3, 2, 2); r = b.to('cpu'); r.mul_(2.0).sub_(1.0); assert shares_storage(r, b) and r.min().item() >= -1
      real.mul_(2.0).sub_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- the loader stacks a fresh batch every step: nothing else reads it
      const auto B = real.size(0);
      const double sigma = cfg.instance_noise * std::max(0.0, 1.0 - static_cast<double>(it) / cfg.noise_anneal_iters);

      // Discriminator: hinge loss on noisy inputs, consistency term on the clean batch.
      torch::Tensor fake;
      {
        torch::NoGradGuard no_grad;
        fake = G->forward(torch::randn({B, cfg.z_dim}, real.options()), y);
      }
      auto real_in = real;
      // FACT: r = torch.randn(2, 3); r0 = r.clone(); a = r; a.add_(torch.randn_like(a), alpha=0.1); assert shares_storage(a, r) and not torch.equal(r, r0)
      real_in.add_(torch::randn_like(real_in), sigma); // EXPECT: tensor-alias-then-mutate -- real_in is real: the consistency term below reads the noisy batch as the clean one
      auto d_real = D->forward(real_in, y);
      auto d_fake = D->forward(fake + sigma * torch::randn_like(fake), y);
      auto d_aug = D->forward(brightness(real, cfg.brightness), y);
      auto d_loss = torch::relu(1.0 - d_real).mean() + torch::relu(1.0 + d_fake).mean() +
                    cfg.cr_weight * (d_real - d_aug).pow(2).mean();
      d_opt.zero_grad();
      d_loss.backward();
      d_opt.step();

      // Generator.
      auto y_g = torch::randint(cfg.n_classes, {B}, y.options());
      auto fake_g = G->forward(torch::randn({B, cfg.z_dim}, real.options()), y_g);
      // FACT: c = torch.nn.Conv2d(3, 3, 1); f = torch.tanh(c(torch.randn(2, 3, 4, 4))); f.add_(torch.rand(2, 1, 1, 1) - 0.5); assert backward_fails(lambda: f.sum().backward())
      if (cfg.diff_augment)
        fake_g.add_((torch::rand({B, 1, 1, 1}, fake_g.options()) - 0.5) * cfg.brightness); // EXPECT: tensor-inplace-on-saved -- tanh saved this output for its backward: g_loss.backward() throws
      auto g_loss = -D->forward(fake_g, y_g).mean();
      g_opt.zero_grad();
      g_loss.backward();
      g_opt.step();
      ema_update(G_ema, G, cfg.ema_decay);
      g_hist.push_back(g_loss.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept

      if (++it % cfg.log_every == 0) {
        auto g_mean = torch::stack(g_hist).mean();
        std::cout << "it " << it << " d " << d_loss.item<float>() << " g " << g_mean.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once every log_every steps
        g_hist.clear();
      }
      if (it % cfg.sample_every == 0) {
        const auto stem = cfg.out_dir + "/it" + std::to_string(it);
        torch::save(to_uint8_grid(class_sweep(G_ema, cfg, device), 10), stem + "_classes.pt");
        torch::save(to_uint8_grid(latent_walk(G_ema, it % cfg.n_classes, cfg, device), cfg.walk_steps), stem + "_walk.pt");
      }
      if (it >= cfg.iters)
        break;
    }
  }
}
