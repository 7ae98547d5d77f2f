// BigGAN (Brock et al. 2019) at 64x64: shared class embedding + hierarchical latent feeding
// class-conditional batch norm, a SAGAN self-attention block, projection discriminator,
// hinge loss, orthogonal regularisation on G and the truncation trick at sampling time.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct BigGANConfig {
  int64_t n_classes = 100, dz = 120, shared_dim = 128, ch = 32, resolution = 64;
  int64_t batch = 64, steps = 10000, log_every = 100, sample_every = 1000;
  double g_lr = 1e-4, d_lr = 4e-4, ortho = 1e-4, truncation = 0.5;
};

// BatchNorm without affine params; gain and bias are predicted from [shared class embedding, z chunk].
struct CondBatchNormImpl : torch::nn::Module {
  CondBatchNormImpl(int64_t channels, int64_t cond_dim) : C_(channels) {
    bn = register_module("bn", torch::nn::BatchNorm2d(
        torch::nn::BatchNorm2dOptions(channels).affine(false).eps(1e-4).momentum(0.1)));
    gain = register_module("gain", torch::nn::Linear(torch::nn::LinearOptions(cond_dim, channels).bias(false)));
    bias = register_module("bias", torch::nn::Linear(torch::nn::LinearOptions(cond_dim, channels).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto g = gain(y).clone().add_(1.0);  // EXPECT: tensor-unnecessary-clone
    auto b = bias(y);
    auto out = bn(x);
    // FACT: x=torch.randn(2,4,4,4,requires_grad=True); g=torch.randn(2,4,requires_grad=True); o=torch.nn.BatchNorm2d(4,affine=False)(x); o.mul_(g.view(-1,4,1,1)).add_(1); o.sum().backward(); assert x.grad is not None
    out.mul_(g.view({-1, C_, 1, 1})).add_(b.view({-1, C_, 1, 1}));  // LOOKALIKE: tensor-inplace-on-saved -- batch_norm saves its input and batch stats, not its output
    return out;
  }
  int64_t C_;
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear gain{nullptr}, bias{nullptr};
};
TORCH_MODULE(CondBatchNorm);

static torch::Tensor upsample2x(const torch::Tensor& x) {
  return F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
}

struct GBlockImpl : torch::nn::Module {
  GBlockImpl(int64_t in, int64_t out, int64_t cond_dim) {
    bn1 = register_module("bn1", CondBatchNorm(in, cond_dim));
    bn2 = register_module("bn2", CondBatchNorm(out, cond_dim));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1)));
    conv_sc = register_module("conv_sc", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = conv1(upsample2x(torch::relu(bn1(x, y))));
    // FACT: x=torch.randn(2,4,4,4); o=x*torch.randn(4,1,1)+1; h=torch.relu_(o); assert shares_storage(h,o) and is_copy_of(o,x)
    h = bn2(h, y).relu_();  // LOOKALIKE: tensor-alias-then-mutate -- bn2's result is a temporary nobody else holds
    h = conv2(h);
    return h + conv_sc(upsample2x(x));
  }
  CondBatchNorm bn1{nullptr}, bn2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_sc{nullptr};
};
TORCH_MODULE(GBlock);

// SAGAN non-local block, used once in G at 32x32.
struct SelfAttentionImpl : torch::nn::Module {
  explicit SelfAttentionImpl(int64_t ch) : ch_(ch) {
    auto conv1x1 = [](int64_t i, int64_t o) { return torch::nn::Conv2d(torch::nn::Conv2dOptions(i, o, 1).bias(false)); };
    theta = register_module("theta", conv1x1(ch, ch / 8));
    phi = register_module("phi", conv1x1(ch, ch / 8));
    g = register_module("g", conv1x1(ch, ch / 2));
    o = register_module("o", conv1x1(ch / 2, ch));
    gamma_ = register_parameter("gamma", torch::zeros({1}));
  }
  torch::Tensor forward(torch::Tensor x) {
    const auto B = x.size(0), H = x.size(2), W = x.size(3);
    auto th = theta(x).view({B, ch_ / 8, H * W});
    auto ph = torch::max_pool2d(phi(x), 2).view({B, ch_ / 8, H * W / 4});
    auto gg = torch::max_pool2d(g(x), 2).view({B, ch_ / 2, H * W / 4});
    auto beta = torch::softmax(torch::bmm(th.transpose(1, 2), ph), -1);
    // FACT: a=torch.randn(2,4,8); b=torch.randn(2,16,8).transpose(1,2); r=torch.bmm(a,b); assert is_contiguous(r) and is_view_of(r.view(2,4,4,4), r)
    auto out = torch::bmm(gg, beta.transpose(1, 2)).view({B, ch_ / 2, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- bmm returns a fresh contiguous result
    out = o(out);
    out.mul_(gamma_);  // LOOKALIKE: tensor-inplace-on-saved -- conv keeps its input and weight, not its output
    // FACT: x=torch.randn(1,8,4,4,requires_grad=True)*1; y=torch.nn.functional.conv2d(x,torch.randn(2,8,1,1,requires_grad=True)); x.add_(1); assert backward_fails(lambda: y.sum().backward())
    return x.add_(out);  // EXPECT: tensor-inplace-on-saved
  }
  int64_t ch_;
  torch::nn::Conv2d theta{nullptr}, phi{nullptr}, g{nullptr}, o{nullptr};
  torch::Tensor gamma_;
};
TORCH_MODULE(SelfAttention);

struct GeneratorImpl : torch::nn::Module {
  explicit GeneratorImpl(const BigGANConfig& cfg) : ch_(cfg.ch) {
    const std::vector<int64_t> mult_in{16, 16, 8, 4}, mult_out{16, 8, 4, 2};
    z_chunk_ = cfg.dz / static_cast<int64_t>(mult_in.size() + 1);
    const int64_t cond_dim = cfg.shared_dim + z_chunk_;
    shared = register_module("shared", torch::nn::Embedding(cfg.n_classes, cfg.shared_dim));
    linear = register_module("linear", torch::nn::Linear(z_chunk_, 16 * ch_ * 4 * 4));
    for (size_t i = 0; i < mult_in.size(); ++i) {
      blocks_.push_back(register_module("block" + std::to_string(i),
                                        GBlock(mult_in[i] * ch_, mult_out[i] * ch_, cond_dim)));
    }
    attn = register_module("attn", SelfAttention(4 * ch_));  // after the 16 -> 32 block
    out_bn = register_module("out_bn", torch::nn::BatchNorm2d(2 * ch_));
    out_conv = register_module("out_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2 * ch_, 3, 3).padding(1)));
    for (auto& p : named_parameters()) {
      if (p.value().dim() > 1 && p.key().rfind("shared", 0) != 0) {
        torch::nn::init::orthogonal_(p.value());
      }
    }
  }
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& y_emb) {
    auto zs = z.split(z_chunk_, 1);
    auto h = linear(zs[0]).view({z.size(0), 16 * ch_, 4, 4});
    for (size_t i = 0; i < blocks_.size(); ++i) {
      h = blocks_[i](h, torch::cat({y_emb, zs[i + 1]}, 1));
      if (i == 2) h = attn(h);
    }
    return torch::tanh(out_conv(torch::relu(out_bn(h))));
  }
  int64_t ch_, z_chunk_;
  torch::nn::Embedding shared{nullptr};
  torch::nn::Linear linear{nullptr};
  std::vector<GBlock> blocks_;
  SelfAttention attn{nullptr};
  torch::nn::BatchNorm2d out_bn{nullptr};
  torch::nn::Conv2d out_conv{nullptr};
};
TORCH_MODULE(Generator);

struct DBlockImpl : torch::nn::Module {
  DBlockImpl(int64_t in, int64_t out, bool preactivation) : preact_(preactivation) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1)));
    conv_sc = register_module("conv_sc", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = x;
    // FACT: x=torch.randn(2,4,4,4); h=x; torch.relu_(h); assert shares_storage(h,x) and bool((x>=0).all())
    if (preact_) h = torch::relu_(h);  // EXPECT: tensor-alias-then-mutate
    h = torch::avg_pool2d(conv2(torch::relu(conv1(h))), 2);
    return h + torch::avg_pool2d(conv_sc(x), 2);
  }
  bool preact_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv_sc{nullptr};
};
TORCH_MODULE(DBlock);

// Projection discriminator: class information enters as <embed(y), features>.
struct DiscriminatorImpl : torch::nn::Module {
  explicit DiscriminatorImpl(const BigGANConfig& cfg) {
    const std::vector<int64_t> mult_in{0, 1, 2, 4}, mult_out{1, 2, 4, 8};
    for (size_t i = 0; i < mult_in.size(); ++i) {
      const int64_t in = i == 0 ? 3 : mult_in[i] * cfg.ch;
      blocks_.push_back(register_module("block" + std::to_string(i), DBlock(in, mult_out[i] * cfg.ch, i > 0)));
    }
    linear = register_module("linear", torch::nn::Linear(8 * cfg.ch, 1));
    embed = register_module("embed", torch::nn::Embedding(cfg.n_classes, 8 * cfg.ch));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = x;
    for (auto& blk : blocks_) h = blk(h);
    h = torch::relu(h).sum({2, 3});
    return linear(h) + (embed(y) * h).sum(1, /*keepdim=*/true);
  }
  std::vector<DBlock> blocks_;
  torch::nn::Linear linear{nullptr};
  torch::nn::Embedding embed{nullptr};
};
TORCH_MODULE(Discriminator);

// Resampling truncated normal: redraw entries outside [-threshold, threshold].
static torch::Tensor truncated_noise(int64_t n, int64_t dz, double threshold, torch::Device device) {
  auto z = torch::randn({n, dz}, torch::TensorOptions().device(device));
  auto outside = z.abs() > threshold;
  while (outside.any().item<bool>()) {  // LOOKALIKE: tensor-sync-in-loop -- the value decides when the loop stops
    z = torch::where(outside, torch::randn_like(z), z);
    outside = z.abs() > threshold;
  }
  return z;
}

// Evaluation latents via the inverse CDF, computed in double for clean tails.
static void fill_fixed_z(torch::Tensor& z_fixed, double threshold) {
  auto u = torch::rand(z_fixed.sizes(), torch::kFloat64);
  const double a = std::erf(-threshold / std::sqrt(2.0));
  auto z = std::sqrt(2.0) * torch::erfinv(a + (-2.0 * a) * u);
  z_fixed.copy_(z);  // EXPECT: tensor-copy-narrowing
}

// BigGAN's orthogonal regularisation, applied straight to the gradients after backward().
static void ortho_reg_(Generator& G, double strength) {
  torch::NoGradGuard no_grad;
  for (auto& item : G->named_parameters()) {
    auto& p = item.value();
    if (p.dim() < 2 || item.key().rfind("shared", 0) == 0 || !p.grad().defined()) continue;
    // FACT: p=torch.randn(8,4,3,3); assert is_view_of(p.view(8,-1), p)
    auto w = p.view({p.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- parameters are allocated dense
    auto wwt = torch::mm(w, w.t());
    auto grad = 2 * torch::mm(wwt * (1 - torch::eye(w.size(0))), w);  // EXPECT: tensor-device-mismatch
    p.grad().add_(grad.view_as(p), strength);  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient buffer, under NoGradGuard
  }
}

static void save_grid(const torch::Tensor& img01, const std::string& path) {
  auto u8 = img01.mul(255).clamp(0, 255).to(torch::kCPU).to(torch::kUInt8).permute({0, 2, 3, 1}).contiguous();  // LOOKALIKE: tensor-copy-narrowing -- explicit to(kUInt8)
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(u8.data_ptr<uint8_t>()), static_cast<std::streamsize>(u8.numel()));
}

// Class morph at a fixed latent: one row per interpolation step between cls_a and cls_b.
torch::Tensor class_morph(Generator& G, int64_t cls_a, int64_t cls_b, int64_t steps,
                          const BigGANConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  G->eval();
  auto ids = torch::tensor({cls_a, cls_b}, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto emb = G->shared(ids);
  auto alpha = torch::linspace(0, 1, steps, torch::TensorOptions().device(device)).unsqueeze(1);
  auto z = truncated_noise(1, cfg.dz, 2.0, device).repeat({steps, 1});
  // FACT: z=torch.randn(1,8).repeat(4,1); assert not raises(lambda: z.mul_(0.5))
  z.mul_(cfg.truncation);  // LOOKALIKE: tensor-inplace-on-expanded -- repeat materialises every row
  auto y = emb[0].unsqueeze(0).expand({steps, -1});
  // FACT: e=torch.randn(2,8); y=e[0].unsqueeze(0).expand(5,-1); a=torch.linspace(0,1,5).unsqueeze(1); assert raises(lambda: y.mul_(1-a), "more than one element")
  y.mul_(1 - alpha).add_(emb[1].unsqueeze(0) * alpha);  // EXPECT: tensor-inplace-on-expanded
  return G->forward(z, y);
}

void train(Generator& G, Discriminator& D, const torch::Tensor& images, const torch::Tensor& labels,
           const BigGANConfig& cfg, torch::Device device) {
  torch::optim::Adam opt_g(G->parameters(), torch::optim::AdamOptions(cfg.g_lr).betas({0.0, 0.999}).eps(1e-6));
  torch::optim::Adam opt_d(D->parameters(), torch::optim::AdamOptions(cfg.d_lr).betas({0.0, 0.999}).eps(1e-6));
  auto class_freq = torch::bincount(labels, {}, cfg.n_classes).to(torch::kFloat32);
  auto z_fixed = torch::empty({16, cfg.dz});
  fill_fixed_z(z_fixed, 2.0);
  auto z_eval = z_fixed.to(device).mul(cfg.truncation);
  auto y_fixed = torch::arange(16, torch::kLong).remainder(cfg.n_classes).to(device);
  auto d_loss_total = torch::zeros({}, torch::TensorOptions().device(device));
  double d_real_acc = 0.0;
  const int64_t B = cfg.batch;
  const auto long_dev = torch::TensorOptions().dtype(torch::kLong).device(device);

  for (int64_t step = 0; step < cfg.steps; ++step) {
    G->train();
    auto idx = torch::randint(0, images.size(0), {B}, torch::kLong);
    auto real = images.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh batch every step
    auto y_real = labels.index_select(0, idx).to(device);

    // D step, hinge loss; fake classes follow the data's class frequencies.
    auto y_fake = torch::multinomial(class_freq.to(device), B, /*replacement=*/true);  // EXPECT: tensor-clone-in-loop
    torch::Tensor fake;
    {
      torch::NoGradGuard no_grad;
      fake = G->forward(torch::randn({B, cfg.dz}, torch::TensorOptions().device(device)), G->shared(y_fake));
    }
    auto d_real = D->forward(real, y_real);
    auto d_fake = D->forward(fake, y_fake);
    auto d_loss = torch::relu(1.0 - d_real).mean() + torch::relu(1.0 + d_fake).mean();
    opt_d.zero_grad();
    d_loss.backward();
    opt_d.step();
    d_loss_total += d_loss;  // EXPECT: tensor-graph-kept-across-iterations
    d_real_acc += d_real.mean().item<double>();  // EXPECT: tensor-sync-in-loop

    // G step.
    auto y_g = torch::randint(0, cfg.n_classes, {B}, long_dev);
    auto gen = G->forward(torch::randn({B, cfg.dz}, torch::TensorOptions().device(device)), G->shared(y_g));
    auto g_loss = -D->forward(gen, y_g).mean();
    if (step % cfg.sample_every == 0) {
      // FACT: a=torch.randn(2,8,requires_grad=True); t=torch.tanh(a*1); l=(t*2).sum(); t.detach().add_(1).mul_(0.5); assert backward_fails(lambda: l.backward())
      save_grid(gen.detach().add_(1.0).mul_(0.5), "train_" + std::to_string(step) + ".raw");  // EXPECT: tensor-inplace-on-detached
    }
    opt_g.zero_grad();
    g_loss.backward();
    ortho_reg_(G, cfg.ortho);
    opt_g.step();

    if (step % cfg.log_every == 0) {
      std::printf("step %ld  D %.4f  D(real) %.3f  G %.4f\n", static_cast<long>(step),
                  d_loss_total.item<double>() / cfg.log_every, d_real_acc / cfg.log_every, g_loss.item<double>());
      d_loss_total.zero_();
      d_real_acc = 0.0;
    }
    if (step % cfg.sample_every == 0) {
      torch::NoGradGuard no_grad;
      G->eval();
      auto samples = G->forward(z_eval, G->shared(y_fixed));
      save_grid(samples.add(1.0).mul(0.5), "fixed_" + std::to_string(step) + ".raw");
    }
  }
}

int main() {
  torch::manual_seed(0);
  const auto device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  BigGANConfig cfg;
  cfg.steps = 300;
  Generator G(cfg);
  Discriminator D(cfg);
  G->to(device);
  D->to(device);
  auto images = torch::rand({2048, 3, cfg.resolution, cfg.resolution}).mul_(2).sub_(1);
  auto labels = torch::randint(0, cfg.n_classes, {2048}, torch::kLong);
  train(G, D, images, labels, cfg, device);
  auto morph = class_morph(G, 3, 17, 8, cfg, device);
  save_grid(morph.add(1.0).mul(0.5), "morph.raw");
  return 0;
}
