// EDM (Karras et al., "Elucidating the Design Space of Diffusion-Based Generative Models"):
// preconditioned denoiser D(x; sigma), the log-normal sigma training loss, and the
// deterministic/stochastic Heun sampler over the rho-spaced sigma schedule.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace edm {

struct EDMConfig {
  double sigma_min = 0.002, sigma_max = 80.0, sigma_data = 0.5, rho = 7.0;
  double P_mean = -1.2, P_std = 1.2;  // log-normal training distribution of sigma
};

struct SamplerConfig {
  int64_t num_steps = 18;
  double S_churn = 40.0, S_min = 0.05, S_max = 50.0, S_noise = 1.003;  // churn settings of the paper's ImageNet runs
};

struct TrainConfig {
  int64_t steps = 2000, batch_size = 64, log_every = 100, eval_every = 250;
  double lr = 2e-4, ema_decay = 0.999;
};

// Eq. 5 of the paper, t_N = 0 appended so the last Heun step lands on the data.
torch::Tensor karras_sigmas(int64_t n, const EDMConfig& cfg) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto ramp = torch::arange(n, opts) / static_cast<double>(std::max<int64_t>(n - 1, 1));
  const double min_inv = std::pow(cfg.sigma_min, 1.0 / cfg.rho);
  const double max_inv = std::pow(cfg.sigma_max, 1.0 / cfg.rho);
  auto sigmas = (max_inv + ramp * (min_inv - max_inv)).pow(cfg.rho);
  return torch::cat({sigmas, torch::zeros({1}, opts)});
}

// Forced weight normalisation (EDM2 style): every output filter has unit norm.
torch::Tensor normalize_weight(const torch::Tensor& w, double eps = 1e-4) {
  auto norm = w.norm(2, {1, 2, 3}, /*keepdim=*/true);
  const double alpha = std::sqrt(static_cast<double>(norm.numel()) / w.numel());
  return w / (eps + alpha * norm);
}

torch::Tensor noise_embedding(const torch::Tensor& c_noise, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, c_noise.options()) * (-std::log(10000.0) / half));
  auto args = c_noise.view({-1, 1}) * freqs.unsqueeze(0);
  return torch::cat({args.cos(), args.sin()}, 1);
}

struct MPConvImpl : torch::nn::Module {
  MPConvImpl(int64_t in_ch, int64_t out_ch, int64_t kernel) : kernel_(kernel) {
    weight = register_parameter("weight", torch::randn({out_ch, in_ch, kernel, kernel}));
  }

  torch::Tensor forward(const torch::Tensor& x, double gain = 1.0) {
    if (is_training()) {
      // keep the stored filters on the unit sphere so Adam's step size stays meaningful
      weight.copy_(normalize_weight(weight));  // EXPECT: tensor-inplace-on-leaf
    }
    auto w = normalize_weight(weight) * (gain / std::sqrt(static_cast<double>(weight[0].numel())));
    return torch::conv2d(x, w.to(x.scalar_type()), {}, 1, kernel_ / 2);
  }

  torch::Tensor weight;
  int64_t kernel_;
};
TORCH_MODULE(MPConv);

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t ch, int64_t emb_dim)
      : conv1(register_module("conv1", MPConv(ch, ch, 3))),
        conv2(register_module("conv2", MPConv(ch, ch, 3))),
        film(register_module("film", torch::nn::Linear(emb_dim, ch))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& emb) {
    auto h = conv1(torch::silu(x));
    auto scale = torch::tanh(film(emb)).view({-1, h.size(1), 1, 1});
    scale.add_(1.0);  // EXPECT: tensor-inplace-on-saved
    h = conv2(torch::silu(h * scale));
    return (x + h) / std::sqrt(2.0);
  }

  MPConv conv1, conv2;
  torch::nn::Linear film;
};
TORCH_MODULE(ResBlock);

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t ch, int64_t heads)
      : heads_(heads),
        norm(register_module("norm", torch::nn::GroupNorm(8, ch))),
        qkv(register_module("qkv", torch::nn::Linear(ch, 3 * ch))),
        proj(register_module("proj", torch::nn::Linear(ch, ch))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    const auto d = C / heads_;
    // FACT: h = torch.nn.functional.group_norm(torch.randn(2, 8, 4, 4), 4); assert is_view_of(h.permute(0, 2, 3, 1).reshape(2, 16, 8), h)
    auto seq = norm(x).permute({0, 2, 3, 1}).reshape({B, H * W, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- only H and W are merged and they stay adjacent: a view
    auto parts = qkv(seq).view({B, H * W, 3, heads_, d}).permute({2, 0, 3, 1, 4});
    auto q = parts[0], k = parts[1], v = parts[2];
    auto attn = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d)), -1);
    // FACT: o = torch.randn(2, 2, 16, 4); assert is_copy_of(o.permute(0, 2, 1, 3).reshape(2, 16, 8), o)
    auto out = torch::matmul(attn, v).permute({0, 2, 1, 3}).reshape({B, H * W, C});  // EXPECT: tensor-reshape-non-contiguous
    out = proj(out);
    // FACT: p = torch.randn(2, 16, 8); assert is_view_of(p.transpose(1, 2).view(2, 8, 4, 4), p)
    return x + out.transpose(1, 2).view({B, C, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- only splits the token dim, which the strides allow
  }

  int64_t heads_;
  torch::nn::GroupNorm norm;
  torch::nn::Linear qkv, proj;
};
TORCH_MODULE(SelfAttention);

struct TinyUNetImpl : torch::nn::Module {
  TinyUNetImpl(int64_t in_ch, int64_t ch, int64_t emb_dim, int64_t num_classes)
      : emb_dim_(emb_dim),
        map(register_module("map", torch::nn::Sequential(torch::nn::Linear(emb_dim, emb_dim), torch::nn::SiLU(),
                                                          torch::nn::Linear(emb_dim, emb_dim)))),
        label_emb(register_module("label_emb", torch::nn::Embedding(num_classes, emb_dim))),
        in_conv(register_module("in_conv", MPConv(in_ch, ch, 3))),
        enc(register_module("enc", ResBlock(ch, emb_dim))),
        mid(register_module("mid", ResBlock(ch, emb_dim))),
        attn(register_module("attn", SelfAttention(ch, 4))),
        dec(register_module("dec", ResBlock(ch, emb_dim))),
        out_conv(register_module("out_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, in_ch, 3).padding(1)))) {
    torch::NoGradGuard no_grad;
    out_conv->weight.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- zero-init under NoGradGuard
    out_conv->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& c_noise, const torch::Tensor& labels) {
    auto emb = map->forward(noise_embedding(c_noise, emb_dim_));
    if (labels.defined()) emb = emb + label_emb(labels);
    emb = torch::silu(emb);
    auto h = enc(in_conv(x), emb);
    auto low = mid(torch::avg_pool2d(h, 2), emb);
    low = attn(low);
    h = dec(h + torch::upsample_nearest2d(low, {h.size(2), h.size(3)}), emb);
    return out_conv(torch::silu(h));
  }

  int64_t emb_dim_;
  torch::nn::Sequential map;
  torch::nn::Embedding label_emb;
  MPConv in_conv;
  ResBlock enc, mid;
  SelfAttention attn;
  ResBlock dec;
  torch::nn::Conv2d out_conv;
};
TORCH_MODULE(TinyUNet);

// D(x; sigma) = c_skip x + c_out F(c_in x; c_noise)
struct EDMPrecondImpl : torch::nn::Module {
  EDMPrecondImpl(TinyUNet net, EDMConfig cfg) : net_(register_module("net", net)), cfg_(cfg) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& sigma, const torch::Tensor& labels) {
    auto s = sigma.to(torch::kFloat32).reshape({-1, 1, 1, 1});
    const double sd = cfg_.sigma_data;
    auto c_skip = sd * sd / (s.square() + sd * sd);
    auto c_out = s * sd / (s.square() + sd * sd).sqrt();
    auto c_in = 1 / (s.square() + sd * sd).sqrt();
    auto c_noise = s.log().flatten() / 4;

    // FACT: x = torch.randn(2, 3, 4, 4); x_in = x.to(torch.float32); x_in.mul_(0.5); assert shares_storage(x_in, x) and torch.equal(x_in, x)
    auto x_in = x.to(torch::kFloat32);
    x_in.mul_(c_in);  // EXPECT: tensor-alias-then-mutate
    auto F_x = net_(x_in, c_noise, labels);
    return c_skip * x + c_out * F_x.to(torch::kFloat32);
  }

  TinyUNet net_;
  EDMConfig cfg_;
};
TORCH_MODULE(EDMPrecond);

torch::Tensor edm_loss(EDMPrecond& model, const torch::Tensor& images, const torch::Tensor& labels,
                       const EDMConfig& cfg) {
  const double sd = cfg.sigma_data;
  auto rnd_normal = torch::randn({images.size(0), 1, 1, 1});
  auto sigma = (rnd_normal * cfg.P_std + cfg.P_mean).exp();
  auto weight = (sigma.square() + sd * sd) / (sigma * sd).square();
  auto n = torch::randn_like(images) * sigma;  // EXPECT: tensor-device-mismatch
  auto D_yn = model(images + n, sigma, labels);
  return (weight * (D_yn - images).square()).mean();
}

struct Ema {
  Ema(const std::vector<torch::Tensor>& params, double decay) : decay(decay) {
    for (const auto& p : params)
      shadow.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: the live parameter keeps moving under Adam
  }

  void update(const std::vector<torch::Tensor>& params) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) shadow[i].lerp_(params[i], 1.0 - decay);
  }

  void copy_to(const std::vector<torch::Tensor>& params) const {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].detach().copy_(shadow[i]);  // LOOKALIKE: tensor-inplace-on-detached -- overwrites the parameter on purpose, no pending backward
  }

  std::vector<torch::Tensor> shadow;
  double decay;
};

void train(EDMPrecond& model, Ema& ema, const torch::Tensor& images, const torch::Tensor& labels,
           const torch::Tensor& val_images, const torch::Tensor& val_labels, const EDMConfig& cfg,
           const TrainConfig& tc, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(tc.lr).betas({0.9, 0.99}));
  std::vector<torch::Tensor> val_history;
  auto running = torch::zeros({}, torch::TensorOptions().device(device));
  const auto vx = val_images.to(device);
  const auto vy = val_labels.to(device);
  const auto N = images.size(0);
  model->train();
  for (int64_t step = 0; step < tc.steps; ++step) {
    auto idx = torch::randint(N, {tc.batch_size}, torch::kLong);
    auto x = images.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh batch every step
    auto y = labels.index_select(0, idx).to(device);
    auto loss = edm_loss(model, x, y, cfg);
    opt.zero_grad();
    loss.backward();
    opt.step();
    ema.update(model->parameters());
    running += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before accumulating
    if ((step + 1) % tc.log_every == 0) {
      std::printf("step %6lld  loss %.5f\n", static_cast<long long>(step + 1),
                  (running / static_cast<double>(tc.log_every)).item<double>());  // LOOKALIKE: tensor-sync-in-loop -- one read per log interval
      running.zero_();
    }
    if ((step + 1) % tc.eval_every == 0) {
      val_history.push_back(edm_loss(model, vx, vy, cfg));  // EXPECT: tensor-graph-kept-across-iterations
      std::printf("  val loss %.5f\n", val_history.back().item<double>());
    }
  }
}

torch::Tensor heun_sample(EDMPrecond& model, const torch::Tensor& latents, const torch::Tensor& class_labels,
                          const EDMConfig& edm, const SamplerConfig& cfg,
                          std::vector<torch::Tensor>* trajectory = nullptr,
                          std::vector<double>* denoised_std = nullptr) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = latents.device();
  auto t_steps = karras_sigmas(cfg.num_steps, edm);
  // FACT: x = torch.randn(2, 3); assert is_copy_of(x.to(torch.float64), x)
  auto x_next = latents.to(torch::kFloat64) * t_steps[0];  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may join a CUDA op // LOOKALIKE: tensor-alias-then-mutate -- the dtype changes, so to() copies
  if (trajectory) trajectory->push_back(x_next);

  for (int64_t i = 0; i < cfg.num_steps; ++i) {
    const double t_cur = t_steps[i].item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the schedule lives on the CPU
    const double t_next = t_steps[i + 1].item<double>();
    auto x_cur = x_next;

    // temporarily raise the noise level (churn)
    const double gamma = (cfg.S_min <= t_cur && t_cur <= cfg.S_max)
                             ? std::min(cfg.S_churn / cfg.num_steps, std::sqrt(2.0) - 1.0)
                             : 0.0;
    const double t_hat = t_cur + gamma * t_cur;
    // FACT: a = torch.zeros(2, 3); traj = [a]; x_hat = traj[-1]; x_hat.add_(torch.randn(2, 3), alpha=0.1); assert shares_storage(traj[0], x_hat) and traj[0].abs().sum() > 0
    auto x_hat = x_cur;
    if (gamma > 0) {
      x_hat.add_(torch::randn_like(x_cur), cfg.S_noise * std::sqrt(t_hat * t_hat - t_cur * t_cur));  // EXPECT: tensor-alias-then-mutate
    }

    auto labels = class_labels.to(device);  // EXPECT: tensor-clone-in-loop
    auto sigma_hat = torch::full({x_hat.size(0)}, t_hat, x_hat.options());
    auto denoised = model(x_hat, sigma_hat, labels).to(torch::kFloat64);
    auto d_cur = (x_hat - denoised) / t_hat;
    auto x_euler = x_hat.clone();  // EXPECT: tensor-unnecessary-clone
    x_euler.add_(d_cur, t_next - t_hat);
    x_next = x_euler;

    // 2nd-order correction, skipped on the final step to sigma = 0
    if (i < cfg.num_steps - 1) {
      auto sigma_next = torch::full({x_hat.size(0)}, t_next, x_hat.options());
      auto denoised2 = model(x_next, sigma_next, labels).to(torch::kFloat64);
      auto d_prime = (x_next - denoised2) / t_next;
      x_next = x_hat + (t_next - t_hat) * (0.5 * d_cur + 0.5 * d_prime);
    }
    if (denoised_std) denoised_std->push_back(denoised.std().item<double>());  // EXPECT: tensor-sync-in-loop
    if (trajectory) trajectory->push_back(x_next);
  }
  return x_next;
}

}  // namespace edm

int main() {
  using namespace edm;
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  EDMConfig cfg;
  TrainConfig tc;
  auto images = torch::rand({1024, 3, 16, 16}) * 2 - 1;
  auto labels = torch::randint(10, {1024}, torch::kLong);
  auto val_images = torch::rand({64, 3, 16, 16}) * 2 - 1;
  auto val_labels = torch::randint(10, {64}, torch::kLong);
  EDMPrecond model(TinyUNet(3, 64, 128, 10), cfg);
  model->to(device);
  Ema ema(model->parameters(), tc.ema_decay);
  train(model, ema, images, labels, val_images, val_labels, cfg, tc, device);
  ema.copy_to(model->parameters());
  auto latents = torch::randn({16, 3, 16, 16}, torch::TensorOptions().device(device));
  auto class_labels = torch::arange(16, torch::kLong) % 10;
  std::vector<torch::Tensor> trajectory;
  std::vector<double> stds;
  auto samples = heun_sample(model, latents, class_labels, cfg, SamplerConfig{}, &trajectory, &stds);
  auto pixels = samples.clamp(-1, 1).add(1).mul(127.5).to(torch::kUInt8).cpu();
  std::printf("sampled %lld images over %zu states, final std %.4f\n",
              static_cast<long long>(pixels.size(0)), trajectory.size(), stds.empty() ? 0.0 : stds.back());
  return 0;
}
