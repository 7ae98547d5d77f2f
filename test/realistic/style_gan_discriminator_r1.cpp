// Non-saturating GAN training in the StyleGAN2 recipe: residual D with minibatch stddev, lazy R1
// (every r1_every steps, scaled up), augmentation of all D inputs, a fake pool and EMA of G.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct GanConfig {
  int64_t z_dim = 128;
  int64_t channels = 3;
  int64_t resolution = 32;
  int64_t width = 128;
  int64_t batch = 32;
  int64_t mbstd_group = 4;
  int64_t pool_size = 256;
  double lr = 2e-3;
  double r1_gamma = 10.0;
  int64_t r1_every = 16;
  double ema_beta = 0.999;
  double aug_p = 0.2;
  double instance_noise = 0.05;
  int64_t steps = 20000;
  int64_t log_every = 100;
  int64_t sample_every = 1000;
};

const auto kLeaky = F::LeakyReLUFuncOptions().negative_slope(0.2);

// Appends the average standard deviation over a group of samples as one extra feature map.
struct MinibatchStdImpl : nn::Module {
  explicit MinibatchStdImpl(int64_t group) : group_(group) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    const int64_t g = std::min(group_, b);
    // FACT: x = torch.randn(8, 4, 5, 5); assert is_view_of(x.view(4, -1, 4, 5, 5), x)
    auto y = x.view({g, -1, c, h, w});  // LOOKALIKE: tensor-view-non-contiguous -- conv activations are contiguous; only the batch dim is split
    y = y - y.mean(0);
    y = (y.pow(2).mean(0) + 1e-8).sqrt();
    y = y.mean({1, 2, 3});
    y = y.view({-1, 1, 1, 1}).repeat({g, 1, h, w});
    return torch::cat({x, y}, 1);
  }

  int64_t group_;
};
TORCH_MODULE(MinibatchStd);

struct DBlockImpl : nn::Module {
  DBlockImpl(int64_t in, int64_t out)
      : conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, in, 3).padding(1)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(2).padding(1)))),
        skip(register_module("skip", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(2).bias(false)))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = F::leaky_relu(conv1(x), kLeaky);
    auto out = conv2(h);
    out += skip(x);  // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    return F::leaky_relu(out, kLeaky) * (1.0 / std::sqrt(2.0));
  }

  nn::Conv2d conv1, conv2, skip;
};
TORCH_MODULE(DBlock);

struct DiscriminatorImpl : nn::Module {
  explicit DiscriminatorImpl(const GanConfig& cfg) {
    from_rgb = register_module("from_rgb", nn::Conv2d(nn::Conv2dOptions(cfg.channels, cfg.width, 1)));
    for (int64_t r = cfg.resolution, i = 0; r > 4; r /= 2, ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), DBlock(cfg.width, cfg.width)));
    }
    mbstd = register_module("mbstd", MinibatchStd(cfg.mbstd_group));
    conv = register_module("conv", nn::Conv2d(nn::Conv2dOptions(cfg.width + 1, cfg.width, 3).padding(1)));
    fc = register_module("fc", nn::Linear(cfg.width * 16, cfg.width));
    out = register_module("out", nn::Linear(cfg.width, 1));
  }

  torch::Tensor forward(const torch::Tensor& img) {
    auto h = F::leaky_relu(from_rgb(img), kLeaky);
    for (auto& block : blocks) h = block(h);
    h = F::leaky_relu(conv(mbstd(h)), kLeaky);
    h = F::leaky_relu(fc(h.flatten(1)), kLeaky);
    return out(h);
  }

  nn::Conv2d from_rgb{nullptr}, conv{nullptr};
  std::vector<DBlock> blocks;
  MinibatchStd mbstd{nullptr};
  nn::Linear fc{nullptr}, out{nullptr};
};
TORCH_MODULE(Discriminator);

struct GeneratorImpl : nn::Module {
  explicit GeneratorImpl(const GanConfig& cfg) : width_(cfg.width) {
    fc = register_module("fc", nn::Linear(cfg.z_dim, cfg.width * 16));
    for (int64_t r = 4, i = 0; r < cfg.resolution; r *= 2, ++i) {
      convs.push_back(register_module("conv" + std::to_string(i), nn::Conv2d(nn::Conv2dOptions(cfg.width, cfg.width, 3).padding(1))));
    }
    to_rgb = register_module("to_rgb", nn::Conv2d(nn::Conv2dOptions(cfg.width, cfg.channels, 1)));
  }

  torch::Tensor forward(const torch::Tensor& z) {
    // FACT: y = torch.randn(3, 8 * 16); assert is_view_of(y.view(-1, 8, 4, 4), y)
    auto h = fc(F::normalize(z, F::NormalizeFuncOptions().dim(1))).view({-1, width_, 4, 4});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    h = F::leaky_relu(h, kLeaky);
    for (auto& conv : convs) {
      h = F::interpolate(h, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
      h = F::leaky_relu(conv(h), kLeaky);
    }
    return torch::tanh(to_rgb(h));
  }

  int64_t width_;
  nn::Linear fc{nullptr};
  std::vector<nn::Conv2d> convs;
  nn::Conv2d to_rgb{nullptr};
};
TORCH_MODULE(Generator);

// Differentiable augmentation (x-flip, brightness, contrast, integer translation), each with
// probability p; applied to reals and fakes alike so that D never sees the raw distribution.
torch::Tensor augment(const torch::Tensor& x, double p) {
  if (p <= 0.0) return x;
  const int64_t b = x.size(0);
  auto opts = x.options();
  auto flip = torch::rand({b, 1, 1, 1}, opts) < p;
  auto out = torch::where(flip, x.flip({3}), x);
  auto gate = (torch::rand({b, 1, 1, 1}, opts) < p).to(x.scalar_type());
  out = out + (torch::rand({b, 1, 1, 1}, opts) - 0.5) * 0.4 * gate;
  auto mean = out.mean({1, 2, 3}, /*keepdim=*/true);
  out = (out - mean) * torch::exp2(torch::randn({b, 1, 1, 1}, opts) * 0.5 * gate) + mean;
  if (torch::rand({1}).item<double>() < p) {
    const int64_t r = std::max<int64_t>(1, x.size(2) / 8);
    const int64_t dy = torch::randint(-r, r + 1, {1}).item<int64_t>();
    const int64_t dx = torch::randint(-r, r + 1, {1}).item<int64_t>();
    out = torch::roll(out, {dy, dx}, {2, 3});
  }
  return out;
}

// Keeps one uint8 frame of the fixed-noise samples per snapshot for a progress video.
class ProgressRecorder {
 public:
  ProgressRecorder(int64_t max_frames, int64_t n, int64_t c, int64_t r)
      : frames_(torch::zeros({max_frames, n, c, r, r}, torch::kByte)) {}

  void record(const torch::Tensor& samples) {
    if (count_ >= frames_.size(0)) return;
    frames_[count_].copy_((samples.clamp(-1.0, 1.0) + 1.0) * 127.5);  // EXPECT: tensor-copy-narrowing
    ++count_;
  }

  torch::Tensor frames() const { return frames_.narrow(0, 0, count_); }

 private:
  torch::Tensor frames_;
  int64_t count_ = 0;
};

void save_grid(const torch::Tensor& images, int64_t cols, const std::string& path) {
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const int64_t rows = (n + cols - 1) / cols;
  auto canvas = torch::zeros({rows * h, cols * w, c}, torch::kByte);
  for (int64_t i = 0; i < n; ++i) {
    auto tile = canvas.narrow(0, (i / cols) * h, h).narrow(1, (i % cols) * w, w);
    tile.copy_(((images[i].permute({1, 2, 0}) + 1.0) * 127.5).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to whole numbers in 0..255 first
  }
  std::ofstream out(path, std::ios::binary);
  out << "P6\n" << cols * w << " " << rows * h << "\n255\n";
  out.write(reinterpret_cast<const char*>(canvas.data_ptr<uint8_t>()), canvas.numel());
}

// Coloured gaussian blobs on a dark background, in [-1, 1].
std::vector<torch::Tensor> make_dataset(const GanConfig& cfg, int64_t num_batches) {
  std::vector<torch::Tensor> batches;
  auto coords = torch::linspace(-1.0, 1.0, cfg.resolution);
  auto yy = coords.view({1, 1, -1, 1}), xx = coords.view({1, 1, 1, -1});
  for (int64_t i = 0; i < num_batches; ++i) {
    auto centre = torch::rand({cfg.batch, 2, 1, 1}) * 1.2 - 0.6;
    auto colour = torch::rand({cfg.batch, cfg.channels, 1, 1});
    auto d2 = (yy - centre.narrow(1, 0, 1)).pow(2) + (xx - centre.narrow(1, 1, 1)).pow(2);
    batches.push_back(colour * torch::exp(-d2 * 8.0) * 2.0 - 1.0);
  }
  return batches;
}

void train(const GanConfig& cfg, const std::vector<torch::Tensor>& dataset) {
  torch::Device device(torch::kCUDA);
  Generator G(cfg);
  Generator G_ema(cfg);
  Discriminator D(cfg);
  G->to(device);
  G_ema->to(device);
  D->to(device);
  {
    torch::NoGradGuard no_grad;
    auto src = G->parameters();
    auto dst = G_ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  // Lazy regularisation: D's Adam hyper-parameters are rescaled by k / (k + 1).
  const double c = static_cast<double>(cfg.r1_every) / static_cast<double>(cfg.r1_every + 1);
  torch::optim::Adam g_opt(G->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.0, 0.99}));
  torch::optim::Adam d_opt(D->parameters(), torch::optim::AdamOptions(cfg.lr * c).betas({0.0, std::pow(0.99, c)}));

  auto update_ema = [&](double beta) {
    auto src = G->named_parameters();
    for (auto& item : G_ema->named_parameters()) {
      item.value().mul_(beta).add_(src[item.key()].detach(), 1.0 - beta);  // EXPECT: tensor-inplace-on-leaf
    }
  };

  auto r1_penalty = [&](const torch::Tensor& reals) {
    auto x = reals.detach().requires_grad_(true);
    auto logits = D->forward(augment(x, cfg.aug_p));
    auto grads = torch::autograd::grad({logits.sum()}, {x}, /*grad_outputs=*/{}, /*retain_graph=*/true,
                                       /*create_graph=*/true)[0];
    auto sq = grads.clone();  // EXPECT: tensor-unnecessary-clone
    sq.pow_(2);
    return sq.sum({1, 2, 3}).mean();
  };

  ProgressRecorder recorder(cfg.steps / cfg.sample_every + 1, 16, cfg.channels, cfg.resolution);
  auto fixed_z = torch::randn({16, cfg.z_dim});
  auto pool = torch::zeros({cfg.pool_size, cfg.channels, cfg.resolution, cfg.resolution}, torch::TensorOptions().device(device));
  auto d_loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  const int64_t k = pool.size(0);
  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto reals = dataset[step % static_cast<int64_t>(dataset.size())].to(device);
    const int64_t b = reals.size(0);
    const int64_t half = b / 2;
    // FACT: x = torch.randn(6, 3, 4, 4); x.narrow(0, 3, 3).copy_(x.narrow(0, 3, 3).flip(3)); assert is_copy_of(x.narrow(0, 3, 3).flip(3), x)
    reals.narrow(0, half, b - half).copy_(reals.narrow(0, half, b - half).flip({3}));  // LOOKALIKE: tensor-inplace-overlap -- flip() makes a new tensor; the source does not alias the slice

    // ---- D step -------------------------------------------------------------------------
    auto z = torch::randn({b, cfg.z_dim}, torch::TensorOptions().device(device));
    auto fake = G->forward(z);  // LOOKALIKE: tensor-device-mismatch -- z is created on the generator's device
    auto fake_d = fake.detach();
    fake_d.add_(torch::randn_like(fake_d) * cfg.instance_noise);  // EXPECT: tensor-inplace-on-detached

    // FACT: p = torch.randn(5, 3, 4, 4); assert raises(lambda: p.narrow(0, 1, 4).copy_(p.narrow(0, 0, 4)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    pool.narrow(0, 1, k - 1).copy_(pool.narrow(0, 0, k - 1));  // EXPECT: tensor-inplace-overlap
    pool[0].copy_(fake_d[0]);
    torch::Tensor d_fake_in = fake_d;
    if (step >= cfg.pool_size) {
      auto idx = torch::randint(0, k, {b / 4}, torch::TensorOptions().dtype(torch::kLong).device(device));
      d_fake_in = torch::cat({fake_d.narrow(0, 0, b - b / 4), pool.index_select(0, idx)});
    }

    auto d_fake = D->forward(augment(d_fake_in, cfg.aug_p));
    auto d_real = D->forward(augment(reals, cfg.aug_p));
    auto d_loss = F::softplus(d_fake).mean() + F::softplus(-d_real).mean();
    d_opt.zero_grad();
    d_loss.backward();
    d_opt.step();
    d_loss_sum += d_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- only the detached value is summed

    if (step % cfg.r1_every == 0) {
      auto reg = r1_penalty(reals) * (0.5 * cfg.r1_gamma * static_cast<double>(cfg.r1_every));
      d_opt.zero_grad();
      reg.backward();
      d_opt.step();
    }

    // ---- G step (reuses this step's fakes) -----------------------------------------------
    auto g_loss = F::softplus(-D->forward(augment(fake, cfg.aug_p))).mean();
    g_opt.zero_grad();
    g_loss.backward();
    g_opt.step();
    update_ema(cfg.ema_beta);

    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " D " << (d_loss_sum / cfg.log_every).item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
                << " G " << g_loss.item<double>() << "\n";
      d_loss_sum.zero_();
    }
    if (step % cfg.sample_every == 0) {
      torch::NoGradGuard no_grad;
      G_ema->eval();
      auto samples = G_ema->forward(fixed_z);  // EXPECT: tensor-device-mismatch
      recorder.record(samples);
      save_grid(samples.cpu(), 4, "samples_" + std::to_string(step) + ".ppm");
    }
  }
  std::cout << "recorded " << recorder.frames().size(0) << " frames\n";
}

int main() {
  torch::manual_seed(1);
  GanConfig cfg;
  auto dataset = make_dataset(cfg, 64);
  train(cfg, dataset);
  return 0;
}
