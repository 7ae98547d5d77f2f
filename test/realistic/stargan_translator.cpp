// StarGAN: one generator translating CelebA faces between attribute domains (hair colour,
// gender, age), conditioned on target labels tiled into the input. WGAN-GP critic with an
// auxiliary attribute classifier, cycle reconstruction, EMA generator for samples.
#include <torch/torch.h>
#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct StarGANConfig {
  int64_t c_dim = 5;  // Black_Hair, Blond_Hair, Brown_Hair, Male, Young
  std::vector<int64_t> hair_color_indices{0, 1, 2};
  int64_t image_size = 128, g_conv_dim = 64, d_conv_dim = 64, g_repeat = 6, d_repeat = 6;
  double lambda_cls = 1.0, lambda_rec = 10.0, lambda_gp = 10.0;
  double g_lr = 1e-4, d_lr = 1e-4, beta1 = 0.5, beta2 = 0.999, ema_beta = 0.999;
  double instance_noise = 0.05;
  int64_t batch_size = 16, num_iters = 200000, n_critic = 5, log_step = 10, sample_step = 1000;
};

void init_weights(torch::nn::Module& m) {
  if (auto* conv = m.as<torch::nn::Conv2d>()) {
    conv->weight.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
    if (conv->options.bias())
      torch::nn::init::zeros_(conv->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under a NoGradGuard
  }
}

torch::nn::InstanceNorm2d inorm(int64_t dim) {
  return torch::nn::InstanceNorm2d(torch::nn::InstanceNorm2dOptions(dim).affine(true).track_running_stats(true));
}

struct ResidualBlockImpl : torch::nn::Module {
  explicit ResidualBlockImpl(int64_t dim) {
    body = register_module("body", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 3).padding(1).bias(false)), inorm(dim),
        torch::nn::ReLU(torch::nn::ReLUOptions(true)),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 3).padding(1).bias(false)), inorm(dim)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + body->forward(x); }
  torch::nn::Sequential body{nullptr};
};
TORCH_MODULE(ResidualBlock);

// SAGAN-style attention over the bottleneck positions.
struct SelfAttentionImpl : torch::nn::Module {
  explicit SelfAttentionImpl(int64_t dim) {
    query = register_module("query", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim / 8, 1)));
    key = register_module("key", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim / 8, 1)));
    value = register_module("value", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim, 1)));
    gamma = register_parameter("gamma", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    // FACT: x=torch.randn(2,8,4,4); assert is_view_of(x.permute(0,2,3,1).reshape(2,16,8), x)
    auto q = query(x).permute({0, 2, 3, 1}).reshape({b, h * w, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- h and w stay adjacent after the permute, so this is a view
    auto attn = torch::softmax(torch::bmm(q, key(x).flatten(2)), -1);
    auto out = torch::bmm(value(x).flatten(2), attn.transpose(1, 2)).view({b, c, h, w});
    return gamma * out + x;
  }
  torch::nn::Conv2d query{nullptr}, key{nullptr}, value{nullptr};
  torch::Tensor gamma;
};
TORCH_MODULE(SelfAttention);

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const StarGANConfig& cfg) {
    int64_t dim = cfg.g_conv_dim;
    torch::nn::Sequential layers;
    layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3 + cfg.c_dim, dim, 7).padding(3).bias(false)));
    layers->push_back(inorm(dim));
    layers->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    for (int i = 0; i < 2; ++i, dim *= 2) {
      layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim * 2, 4).stride(2).padding(1).bias(false)));
      layers->push_back(inorm(dim * 2));
      layers->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    }
    for (int64_t i = 0; i < cfg.g_repeat; ++i) layers->push_back(ResidualBlock(dim));
    layers->push_back(SelfAttention(dim));
    for (int i = 0; i < 2; ++i, dim /= 2) {
      layers->push_back(torch::nn::ConvTranspose2d(
          torch::nn::ConvTranspose2dOptions(dim, dim / 2, 4).stride(2).padding(1).bias(false)));
      layers->push_back(inorm(dim / 2));
      layers->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
    }
    layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, 3, 7).padding(3).bias(false)));
    layers->push_back(torch::nn::Tanh());
    main = register_module("main", layers);
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& c) {
    // replicate the domain labels spatially, in [-1, 1] like the image, and stack them as channels
    auto c_map = c.view({c.size(0), c.size(1), 1, 1}).expand({-1, -1, x.size(2), x.size(3)}).contiguous();
    // FACT: c=torch.rand(2,5); m=c.view(2,5,1,1).expand(2,5,4,4).contiguous(); m.mul_(2).sub_(1); assert is_copy_of(m,c) and is_contiguous(m)
    c_map.mul_(2).sub_(1);  // LOOKALIKE: tensor-inplace-on-expanded, tensor-alias-then-mutate -- contiguous() materialised the expanded labels into a new tensor
    return main->forward(torch::cat({x, c_map}, 1));
  }
  torch::nn::Sequential main{nullptr};
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(const StarGANConfig& cfg) {
    auto lrelu = torch::nn::LeakyReLUOptions().negative_slope(0.01);
    int64_t dim = cfg.d_conv_dim;
    torch::nn::Sequential layers;
    layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, dim, 4).stride(2).padding(1)));
    layers->push_back(torch::nn::LeakyReLU(lrelu));
    for (int64_t i = 1; i < cfg.d_repeat; ++i, dim *= 2) {
      layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, dim * 2, 4).stride(2).padding(1)));
      layers->push_back(torch::nn::LeakyReLU(lrelu));
    }
    const int64_t k = cfg.image_size >> cfg.d_repeat;
    main = register_module("main", layers);
    src = register_module("src", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, 1, 3).padding(1).bias(false)));
    cls = register_module("cls", torch::nn::Conv2d(torch::nn::Conv2dOptions(dim, cfg.c_dim, k).bias(false)));
  }
  // (patch realism scores, attribute logits)
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto h = main->forward(x);
    auto out_cls = cls(h);
    // FACT: o=torch.nn.functional.conv2d(torch.randn(2,8,2,2),torch.randn(5,8,2,2)); assert is_view_of(o.view(2,5), o)
    return {src(h), out_cls.view({out_cls.size(0), out_cls.size(1)})};  // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous
  }
  torch::nn::Sequential main{nullptr};
  torch::nn::Conv2d src{nullptr}, cls{nullptr};
};
TORCH_MODULE(Discriminator);

torch::Tensor gradient_penalty(const torch::Tensor& y, const torch::Tensor& x) {
  auto dydx = torch::autograd::grad({y}, {x}, {torch::ones_like(y)}, /*retain_graph=*/true,
                                    /*create_graph=*/true)[0];
  dydx = dydx.view({dydx.size(0), -1});
  return (dydx.pow(2).sum(1).sqrt() - 1).pow(2).mean();
}

torch::Tensor classification_loss(const torch::Tensor& logit, const torch::Tensor& target, const torch::Tensor& w) {
  auto opts = F::BinaryCrossEntropyWithLogitsFuncOptions().pos_weight(w).reduction(torch::kSum);
  return F::binary_cross_entropy_with_logits(logit, target, opts) / logit.size(0);
}

// Gaussian instance noise on the critic's real inputs keeps it from overfitting early on.
torch::Tensor add_instance_noise(torch::Tensor x, double sigma) {
  if (sigma <= 0) return x;
  // FACT: a=torch.zeros(3); b=a; b.add_(torch.ones(3), alpha=0.1); assert shares_storage(a,b) and a.sum()>0
  return x.add_(torch::randn_like(x), sigma);  // EXPECT: tensor-alias-then-mutate
}

torch::Tensor to_model_range(const torch::Tensor& images_u8, torch::Device device) {
  auto x = images_u8.to(device, torch::kFloat);
  // FACT: a=torch.randint(0,255,(2,3,4,4),dtype=torch.uint8); b=a.to(torch.float); b.div_(127.5).sub_(1); assert is_copy_of(b,a)
  return x.div_(127.5).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float always makes a new tensor
}

// One target label set per domain, as in the StarGAN sampler (hair colours are exclusive).
std::vector<torch::Tensor> create_labels(const torch::Tensor& c_org, const StarGANConfig& cfg) {
  const auto& hair = cfg.hair_color_indices;
  std::vector<torch::Tensor> c_trg_list;
  for (int64_t i = 0; i < cfg.c_dim; ++i) {
    auto c_trg = c_org.clone();  // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- every label set is kept and edited differently
    if (std::find(hair.begin(), hair.end(), i) != hair.end()) {
      for (int64_t j : hair) c_trg.select(1, j).fill_(j == i ? 1.0 : 0.0);
    } else {
      c_trg.select(1, i).copy_(c_trg.select(1, i) == 0);  // LOOKALIKE: tensor-copy-narrowing -- bool into float only widens
    }
    c_trg_list.push_back(c_trg);
  }
  return c_trg_list;
}

// Labels walking from c_org to c_trg, for the interpolation strip in the samples.
torch::Tensor label_walk(const torch::Tensor& c_org, const torch::Tensor& c_trg, int64_t steps) {
  auto t = torch::linspace(0, 1, steps, c_org.options()).view({1, steps, 1});
  auto walk = c_org.unsqueeze(1).expand({-1, steps, -1});
  // FACT: c=torch.rand(2,5); s=c.unsqueeze(1).expand(2,4,5); t=torch.linspace(0,1,4).view(1,4,1); assert raises(lambda: s.mul_(1-t), "more than one element")
  walk.mul_(1 - t);  // EXPECT: tensor-inplace-on-expanded
  return walk + c_trg.unsqueeze(1) * t;
}

void moving_average(Generator& g, Generator& g_ema, double beta) {
  torch::NoGradGuard no_grad;
  auto src = g->parameters();
  auto dst = g_ema->parameters();
  for (size_t i = 0; i < src.size(); ++i)
    dst[i].copy_(torch::lerp(src[i], dst[i], beta));  // LOOKALIKE: tensor-inplace-on-leaf -- parameter update under NoGradGuard
}

void copy_weights(Generator& from, Generator& to) {
  auto src = from->named_parameters();
  for (auto& p : to->named_parameters())
    p.value().data().copy_(src[p.key()].data());  // LOOKALIKE: tensor-inplace-on-detached -- writing the EMA copy's weights through data() is the intent
}

torch::Tensor make_grid_hwc(const std::vector<torch::Tensor>& columns) {
  auto grid = ((torch::cat(columns, 3) + 1) / 2).clamp_(0, 1);
  const int64_t n = grid.size(0), h = grid.size(2), w = grid.size(3);
  // FACT: g=torch.randn(2,3,4,12); assert is_copy_of(g.permute(0,2,3,1).reshape(8,12,3), g)
  return grid.permute({0, 2, 3, 1}).reshape({n * h, w, 3});  // EXPECT: tensor-reshape-non-contiguous
}

void save_ppm(const std::string& path, const torch::Tensor& hwc) {
  auto bytes = hwc.mul(255).round_().to(torch::kCPU, torch::kUInt8).contiguous();
  std::ofstream f(path, std::ios::binary);
  f << "P6\n" << bytes.size(1) << " " << bytes.size(0) << "\n255\n";
  f.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

struct CelebABatch { torch::Tensor images, labels; };

struct SyntheticCelebA {
  explicit SyntheticCelebA(const StarGANConfig& cfg) : cfg_(cfg) {}
  CelebABatch next() {
    auto images = torch::randint(0, 256, {cfg_.batch_size, 3, cfg_.image_size, cfg_.image_size}, torch::kUInt8);
    return {images, torch::bernoulli(torch::full({cfg_.batch_size, cfg_.c_dim}, 0.4))};
  }
  // negatives / positives per attribute, from list_attr_celeba.txt
  torch::Tensor positive_weights() const { return torch::tensor({3.2f, 5.7f, 3.9f, 1.4f, 0.3f}); }
  StarGANConfig cfg_;
};

void train(const StarGANConfig& cfg, torch::Device device) {
  Generator G(cfg), G_ema(cfg);
  Discriminator D(cfg);
  G->apply(init_weights);
  D->apply(init_weights);
  G->to(device);
  G_ema->to(device);
  D->to(device);
  copy_weights(G, G_ema);
  torch::optim::Adam g_opt(G->parameters(), torch::optim::AdamOptions(cfg.g_lr).betas({cfg.beta1, cfg.beta2}));
  torch::optim::Adam d_opt(D->parameters(), torch::optim::AdamOptions(cfg.d_lr).betas({cfg.beta1, cfg.beta2}));

  SyntheticCelebA loader(cfg);
  const auto attr_pos_weight = loader.positive_weights();
  auto fixed = loader.next();
  auto x_fixed = to_model_range(fixed.images, device);
  auto c_fixed_list = create_labels(fixed.labels, cfg);
  for (auto& c : c_fixed_list) c = c.to(device);

  auto g_rec_sum = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> d_hist;
  torch::Tensor last_preview;
  for (int64_t it = 0; it < cfg.num_iters; ++it) {
    auto batch = loader.next();
    auto x_real = to_model_range(batch.images, device);
    auto label_org = batch.labels.to(device);
    auto label_trg = label_org.index({torch::randperm(label_org.size(0), label_org.options().dtype(torch::kLong))});
    auto c_org = label_org.clone();  // EXPECT: tensor-unnecessary-clone
    auto cls_weight = attr_pos_weight.to(device);  // EXPECT: tensor-clone-in-loop

    // ---- critic: real / fake, attribute classification, gradient penalty ----
    auto [out_src, out_cls] = D->forward(add_instance_noise(x_real, cfg.instance_noise));
    auto d_loss_real = -out_src.mean();
    auto cls_prob = torch::sigmoid(out_cls);
    auto d_loss_cls = F::binary_cross_entropy(cls_prob, label_org, F::BinaryCrossEntropyFuncOptions().weight(cls_weight));
    // FACT: z=torch.randn(4,5,requires_grad=True); p=torch.sigmoid(z); l=torch.nn.functional.binary_cross_entropy(p,torch.rand(4,5).round()); p.round_(); assert backward_fails(l.backward)
    auto d_cls_acc = cls_prob.round_().eq(label_org).to(torch::kFloat).mean();  // EXPECT: tensor-inplace-on-saved

    auto x_fake = G->forward(x_real, label_trg);
    auto d_loss_fake = D->forward(x_fake.detach()).first.mean();
    auto alpha = torch::rand({x_real.size(0), 1, 1, 1});
    auto x_hat = (alpha * x_real + (1 - alpha) * x_fake.detach()).requires_grad_(true);  // EXPECT: tensor-device-mismatch
    auto d_loss_gp = gradient_penalty(D->forward(x_hat).first, x_hat);
    auto d_loss = d_loss_real + d_loss_fake + cfg.lambda_cls * d_loss_cls + cfg.lambda_gp * d_loss_gp;
    d_opt.zero_grad();
    d_loss.backward();
    d_opt.step();
    d_hist.push_back(d_loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, read at log time

    // ---- generator: fool the critic, hit the target attributes, reconstruct the input ----
    if ((it + 1) % cfg.n_critic == 0) {
      auto fake = G->forward(x_real, label_trg);
      auto [g_src, g_cls] = D->forward(fake);
      auto x_rec = G->forward(fake, c_org);
      auto g_loss_rec = (x_real - x_rec).abs().mean();
      auto g_loss = -g_src.mean() + cfg.lambda_rec * g_loss_rec +
                    cfg.lambda_cls * classification_loss(g_cls, label_trg, cls_weight);

      auto preview = fake.detach();
      // FACT: x=torch.randn(2,3,8,8,requires_grad=True)*1; y=torch.nn.functional.conv2d(x,torch.randn(4,3,3,3,requires_grad=True)).mean(); x.detach().add_(1).mul_(0.5); assert backward_fails(y.backward)
      preview.add_(1).mul_(0.5);  // EXPECT: tensor-inplace-on-detached
      last_preview = preview[0];
      g_opt.zero_grad();
      g_loss.backward();
      g_opt.step();
      moving_average(G, G_ema, cfg.ema_beta);
      g_rec_sum += g_loss_rec;  // EXPECT: tensor-graph-kept-across-iterations
    }

    if ((it + 1) % cfg.log_step == 0) {
      std::cout << "it " << it + 1 << " D " << torch::stack(d_hist).mean().item<float>() << " D/cls_acc "
                << d_cls_acc.item<float>() << " G/rec "
                << g_rec_sum.item<float>() / std::max<int64_t>(1, cfg.log_step / cfg.n_critic) << "\n";
      d_hist.clear();
      g_rec_sum = torch::zeros({}, torch::TensorOptions().device(device));
    }
    if ((it + 1) % cfg.sample_step == 0) {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> cols{x_fixed};
      for (const auto& c : c_fixed_list) cols.push_back(G_ema->forward(x_fixed, c));
      auto walk = label_walk(c_fixed_list[0], c_fixed_list[3], 6);
      for (int64_t s = 0; s < walk.size(1); ++s) cols.push_back(G_ema->forward(x_fixed, walk.select(1, s)));
      save_ppm("samples/" + std::to_string(it + 1) + "-images.ppm", make_grid_hwc(cols));
      if (last_preview.defined()) save_ppm("samples/train-fake.ppm", last_preview.permute({1, 2, 0}));
    }
  }
}

int main() {
  StarGANConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  train(cfg, device);
  return 0;
}
