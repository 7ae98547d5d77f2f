// SN-DCGAN (Miyato et al., 2018): DCGAN generator, discriminator whose conv
// weights are divided by their spectral norm (one power iteration per step on
// persistent u/v buffers), hinge loss, EMA generator for the sample grids.
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct GanConfig {
  int64_t nz = 128;
  int64_t ngf = 64;
  int64_t ndf = 64;
  int64_t channels = 3;
  int64_t power_iterations = 1;
  double lr_g = 2e-4;
  double lr_d = 2e-4;
  double beta1 = 0.0;
  double beta2 = 0.9;
  double instance_noise = 0.1;
  double ema_decay = 0.999;
  int64_t epochs = 50;
  int64_t log_every = 100;
  int64_t sample_every = 1000;
  int64_t grid_rows = 8;
  std::string out_dir = "samples";
};

// Conv2d with W / sigma(W); sigma estimated by power iteration on W reshaped to [out, -1].
class SNConv2dImpl : public torch::nn::Module {
 public:
  SNConv2dImpl(int64_t in_ch, int64_t out_ch, int64_t k, int64_t stride, int64_t pad,
               int64_t n_power_iterations = 1)
      : stride_(stride), pad_(pad), n_power_(n_power_iterations) {
    weight_orig = register_parameter("weight_orig", torch::empty({out_ch, in_ch, k, k}));
    bias = register_parameter("bias", torch::zeros({out_ch}));
    torch::nn::init::normal_(weight_orig, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    const auto opts = F::NormalizeFuncOptions().dim(0).eps(1e-12);
    u_ = register_buffer("u", F::normalize(torch::randn({out_ch}), opts));
    v_ = register_buffer("v", F::normalize(torch::randn({in_ch * k * k}), opts));
  }

  torch::Tensor normalized_weight() {
    const int64_t out_ch = weight_orig.size(0);
    // FACT: w = torch.nn.Conv2d(3, 8, 4).weight; assert is_view_of(w.view(8, -1), w)
    auto w_mat = weight_orig.view({out_ch, -1});  // LOOKALIKE: tensor-view-non-contiguous -- a registered parameter is contiguous
    if (is_training()) {
      torch::NoGradGuard no_grad;
      auto w_det = w_mat.detach();
      const auto opts = F::NormalizeFuncOptions().dim(0).eps(1e-12);
      for (int64_t i = 0; i < n_power_; ++i) {
        v_.copy_(F::normalize(torch::mv(w_det.t(), u_), opts));
        u_.copy_(F::normalize(torch::mv(w_det, v_), opts));
      }
    }
    // sigma's graph saves u and v; the next forward (real and fake batches both go
    // through D before backward) rewrites u_/v_ in place, so keep copies here.
    auto u = u_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- without it backward fails once D ran twice
    auto v = v_.clone();
    auto sigma = torch::dot(u, torch::mv(w_mat, v));
    return weight_orig / sigma;
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return F::conv2d(x, normalized_weight(),
                     F::Conv2dFuncOptions().bias(bias).stride(stride_).padding(pad_));
  }

  torch::Tensor weight_orig, bias;

 private:
  int64_t stride_, pad_, n_power_;
  torch::Tensor u_, v_;
};
TORCH_MODULE(SNConv2d);

class GeneratorImpl : public torch::nn::Module {
 public:
  explicit GeneratorImpl(const GanConfig& cfg) {
    using torch::nn::ConvTranspose2dOptions;
    const int64_t g = cfg.ngf;
    up0_ = register_module("up0", torch::nn::ConvTranspose2d(ConvTranspose2dOptions(cfg.nz, 4 * g, 4).bias(false)));
    up1_ = register_module("up1", torch::nn::ConvTranspose2d(ConvTranspose2dOptions(4 * g, 2 * g, 4).stride(2).padding(1).bias(false)));
    up2_ = register_module("up2", torch::nn::ConvTranspose2d(ConvTranspose2dOptions(2 * g, g, 4).stride(2).padding(1).bias(false)));
    to_rgb_ = register_module("to_rgb", torch::nn::ConvTranspose2d(ConvTranspose2dOptions(g, cfg.channels, 4).stride(2).padding(1)));
    bn0_ = register_module("bn0", torch::nn::BatchNorm2d(4 * g));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(2 * g));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(g));
  }

  // z: [B, nz, 1, 1] -> images in [-1, 1], [B, C, 32, 32]
  torch::Tensor forward(const torch::Tensor& z) {
    auto h = bn0_(up0_(z));
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output
    h = F::relu(bn1_(up1_(h)));
    h = F::relu(bn2_(up2_(h)));
    return torch::tanh(to_rgb_(h));
  }

 private:
  torch::nn::ConvTranspose2d up0_{nullptr}, up1_{nullptr}, up2_{nullptr}, to_rgb_{nullptr};
  torch::nn::BatchNorm2d bn0_{nullptr}, bn1_{nullptr}, bn2_{nullptr};
};
TORCH_MODULE(Generator);

class DiscriminatorImpl : public torch::nn::Module {
 public:
  explicit DiscriminatorImpl(const GanConfig& cfg) {
    const int64_t d = cfg.ndf, it = cfg.power_iterations;
    conv1_ = register_module("conv1", SNConv2d(cfg.channels, d, 4, 2, 1, it));
    conv2_ = register_module("conv2", SNConv2d(d, 2 * d, 4, 2, 1, it));
    conv3_ = register_module("conv3", SNConv2d(2 * d, 4 * d, 4, 2, 1, it));
    head_ = register_module("head", SNConv2d(4 * d, 1, 4, 1, 0, it));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto lrelu = F::LeakyReLUFuncOptions().negative_slope(0.1);
    auto h = F::leaky_relu(conv1_(x), lrelu);
    h = F::leaky_relu(conv2_(h), lrelu);
    h = F::leaky_relu(conv3_(h), lrelu);
    auto score = head_(h);  // [B, 1, 1, 1]
    // FACT: o = torch.nn.Conv2d(4, 1, 4)(torch.randn(3, 4, 4, 4)); assert is_view_of(o.view(-1), o)
    return score.view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous
  }

 private:
  SNConv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr}, head_{nullptr};
};
TORCH_MODULE(Discriminator);

// DCGAN init: N(0, 0.02) conv weights, N(1, 0.02) batch-norm scales.
void init_generator(Generator& gen) {
  for (auto& p : gen->parameters()) {
    if (p.dim() == 4) p.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
  }
  for (const auto& m : gen->modules(/*include_self=*/false)) {
    if (auto* bn = m->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::normal_(bn->weight, 1.0, 0.02);
      torch::nn::init::zeros_(bn->bias);
    }
  }
}

// tanh output -> [0, 255] floats.
torch::Tensor to_pixels(const torch::Tensor& samples) {
  auto img = samples.contiguous();
  // FACT: s = torch.randn(2, 3, 4, 4); assert shares_storage(s.contiguous(), s)
  img.add_(1.0).mul_(127.5).clamp_(0.0, 255.0);  // EXPECT: tensor-alias-then-mutate
  return img;
}

// [N, C, H, W] -> [rows * H, cols * W, C], row-major tiles.
torch::Tensor make_grid(const torch::Tensor& pixels, int64_t rows) {
  const int64_t n = pixels.size(0), c = pixels.size(1), h = pixels.size(2), w = pixels.size(3);
  TORCH_CHECK(n % rows == 0, "grid needs a multiple of ", rows, " samples");
  const int64_t cols = n / rows;
  // FACT: p = torch.randn(6, 3, 4, 5); assert is_view_of(p.view(2, 3, 3, 4, 5), p)
  auto tiles = pixels.view({rows, cols, c, h, w});  // LOOKALIKE: tensor-view-non-contiguous -- splits the batch dim of a contiguous tensor
  // FACT: p = torch.randn(6, 3, 4, 5); assert raises(lambda: p.view(2, 3, 3, 4, 5).permute(0, 3, 1, 4, 2).view(8, 15, 3), "view size is not compatible")
  return tiles.permute({0, 3, 1, 4, 2}).view({rows * h, cols * w, c});  // EXPECT: tensor-view-non-contiguous
}

void save_ppm(const torch::Tensor& grid, const std::string& path) {
  TORCH_CHECK(grid.dim() == 3 && grid.size(2) == 3, "expected an [H, W, 3] image");
  auto bytes = torch::empty({grid.size(0), grid.size(1), 3}, torch::kByte);
  bytes.copy_(grid.round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped: whole numbers in [0, 255]
  std::ofstream out(path, std::ios::binary);
  out << "P6\n" << grid.size(1) << ' ' << grid.size(0) << "\n255\n";
  out.write(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
}

// Samples quantised like the uint8 PNGs the reference FID statistics came from.
torch::Tensor quantize_for_fid(const torch::Tensor& fake) {
  auto q = torch::empty(fake.sizes(), torch::TensorOptions().dtype(torch::kByte));
  q.copy_((fake + 1.0) * 127.5);  // EXPECT: tensor-copy-narrowing
  return q;
}

// Per-channel spread of a batch; a collapsing generator drives it towards 0.
torch::Tensor channel_spread(const torch::Tensor& samples) {
  // FACT: f = torch.randn(4, 3, 5, 5); assert is_copy_of(f.transpose(0, 1).reshape(3, -1), f)
  auto per_channel = samples.transpose(0, 1).reshape({samples.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
  return per_channel.std(1);
}

// Histogram of discriminator scores for the training log.
torch::Tensor score_histogram(const torch::Tensor& scores, int64_t bins) {
  auto hist = torch::zeros({bins}, torch::kLong);
  hist.copy_(torch::histc(scores.detach().cpu(), bins, -5.0, 5.0));  // LOOKALIKE: tensor-copy-narrowing -- histc counts are whole numbers
  return hist;
}

// Returns the uint8 sample batches kept for the FID evaluator.
std::vector<torch::Tensor> train_sngan(Generator& gen, Generator& gen_ema, Discriminator& disc,
                 const std::vector<torch::Tensor>& batches, const GanConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  gen->to(device);
  gen_ema->to(device);
  disc->to(device);
  init_generator(gen);
  {
    torch::NoGradGuard no_grad;
    auto src = gen->parameters();
    auto dst = gen_ema->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }

  torch::optim::Adam opt_g(gen->parameters(), torch::optim::AdamOptions(cfg.lr_g).betas(std::make_tuple(cfg.beta1, cfg.beta2)));
  torch::optim::Adam opt_d(disc->parameters(), torch::optim::AdamOptions(cfg.lr_d).betas(std::make_tuple(cfg.beta1, cfg.beta2)));

  const int64_t n_fixed = cfg.grid_rows * cfg.grid_rows;
  auto fixed_noise = torch::randn({n_fixed, cfg.nz, 1, 1}, torch::TensorOptions().device(device));
  auto pixel_mean = torch::full({1, cfg.channels, 1, 1}, 0.5);
  auto pixel_std = torch::full({1, cfg.channels, 1, 1}, 0.5);
  int64_t step = 0;
  std::vector<torch::Tensor> fid_batches;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    torch::Tensor d_real_sum = torch::zeros({}, torch::TensorOptions().device(device));
    const double noise_std = cfg.instance_noise * (1.0 - static_cast<double>(epoch) / cfg.epochs);
    for (const auto& raw : batches) {  // uint8 [B, H, W, C]
      auto x01 = raw.to(device).permute({0, 3, 1, 2}).to(torch::kFloat).div(255.0);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto real = (x01 - pixel_mean.to(device)) / pixel_std.to(device);  // EXPECT: tensor-clone-in-loop
      const int64_t b = real.size(0);

      // discriminator step (hinge loss)
      auto z = torch::randn({b, cfg.nz, 1, 1}, real.options());
      auto fake = gen->forward(z);
      auto fake_in = fake.detach();
      if (noise_std > 0) fake_in.add_(noise_std * torch::randn_like(fake_in));  // EXPECT: tensor-inplace-on-detached
      auto real_in = real + noise_std * torch::randn_like(real);
      auto d_real = disc->forward(real_in);
      auto d_fake = disc->forward(fake_in);
      auto d_loss = F::relu(1.0 - d_real).mean() + F::relu(1.0 + d_fake).mean();
      opt_d.zero_grad();
      d_loss.backward();
      opt_d.step();
      d_real_sum += d_real.mean();  // EXPECT: tensor-graph-kept-across-iterations

      // generator step
      auto g_loss = -disc->forward(fake).mean();
      opt_g.zero_grad();
      g_loss.backward();
      opt_g.step();

      {
        torch::NoGradGuard no_grad;
        auto ema = gen_ema->parameters();
        auto cur = gen->parameters();
        for (size_t i = 0; i < ema.size(); ++i)
          ema[i].mul_(cfg.ema_decay).add_(cur[i], 1.0 - cfg.ema_decay);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA update under NoGradGuard
        auto ema_buffers = gen_ema->buffers();
        auto cur_buffers = gen->buffers();
        for (size_t i = 0; i < ema_buffers.size(); ++i) ema_buffers[i].copy_(cur_buffers[i]);
      }

      ++step;
      if (step % cfg.log_every == 0)
        std::cout << "step " << step << " d_loss " << d_loss.item<float>() << " g_loss " << g_loss.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
                  << " hist " << score_histogram(d_fake, 10) << '\n';

      if (step % cfg.sample_every == 0) {
        torch::NoGradGuard no_grad;
        gen_ema->eval();
        auto samples = gen_ema->forward(fixed_noise).cpu();
        auto pixels = to_pixels(samples);
        save_ppm(make_grid(pixels, cfg.grid_rows), cfg.out_dir + "/step_" + std::to_string(step) + ".ppm");
        std::cout << "channel spread " << channel_spread(samples) << '\n';
        fid_batches.push_back(quantize_for_fid(samples));
        gen_ema->train();
      }
    }
    std::cout << "epoch " << epoch << " mean D(real) " << d_real_sum.item<double>() / batches.size() << '\n';
  }
  return fid_batches;
}
