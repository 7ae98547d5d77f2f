// Text-to-image inference for a small pixel-space diffusion model: cosine noise schedule,
// deterministic DDIM updates (eta = 0) or the PLMS multistep variant, classifier-free guidance
// with the conditional and unconditional halves run as one batch, and 8-bit images assembled on
// the host for the PNG writer.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct SamplerConfig {
  int64_t train_steps = 1000, sample_steps = 50, image_size = 64, channels = 3;
  int64_t text_dim = 512, emb_dim = 256, width = 128;
  double eta = 0.0;
  std::vector<double> guidance; // one scale per prompt of a batch
  bool plms = false;
  int64_t preview_every = 10; // keep x0 predictions for the progress strip
};

// Cosine schedule (Nichol & Dhariwal 2021): alpha_bar(t) for t = 0 .. T - 1, float32 on the CPU.
torch::Tensor cosine_alphas_cumprod(int64_t T, double s = 0.008) {
  auto t = torch::arange(T + 1, torch::kDouble) / T;
  auto f = torch::cos((t + s) / (1 + s) * kPi / 2).pow(2);
  auto ac = f / f[0];
  auto betas = (1 - ac.slice(0, 1) / ac.slice(0, 0, T)).clamp(0, 0.999);
  return torch::cumprod(1 - betas, 0).to(torch::kFloat);
}

torch::Tensor timestep_embedding(const torch::Tensor &t, int64_t dim) {
  const auto half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, t.options().dtype(torch::kFloat)) * (-std::log(10000.0) / half));
  auto args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0); // LOOKALIKE: tensor-device-mismatch -- the frequencies are made with t's options, on t's device
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

struct DenoiserImpl : torch::nn::Module {
  explicit DenoiserImpl(const SamplerConfig &cfg) : emb_dim_(cfg.emb_dim) {
    namespace nn = torch::nn;
    t_mlp_ = register_module("t_mlp", nn::Sequential(nn::Linear(cfg.emb_dim, cfg.width), nn::SiLU(),
                                                     nn::Linear(cfg.width, cfg.width)));
    txt_ = register_module("txt", nn::Linear(cfg.text_dim, cfg.width));
    in_ = register_module("in", nn::Conv2d(nn::Conv2dOptions(cfg.channels, cfg.width, 3).padding(1)));
    mid_ = register_module("mid", nn::Sequential(nn::GroupNorm(8, cfg.width), nn::SiLU(),
                                                 nn::Conv2d(nn::Conv2dOptions(cfg.width, cfg.width, 3).padding(1)),
                                                 nn::GroupNorm(8, cfg.width), nn::SiLU(),
                                                 nn::Conv2d(nn::Conv2dOptions(cfg.width, cfg.width, 3).padding(1))));
    out_ = register_module("out", nn::Conv2d(nn::Conv2dOptions(cfg.width, cfg.channels, 3).padding(1)));
  }

  // x [B, C, H, W], t [B] int64, text [B, text_dim] -> predicted noise [B, C, H, W]
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &t, const torch::Tensor &text) {
    auto cond = t_mlp_->forward(timestep_embedding(t, emb_dim_)) + txt_(text);
    // FACT: a = torch.nn.Linear(4, 6)(torch.randn(2, 4)) + torch.nn.Linear(3, 6)(torch.randn(2, 3)); assert is_view_of(a.view(2, -1, 1, 1), a)
    auto h = in_(x) + cond.view({x.size(0), -1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a sum of two Linear outputs is contiguous
    h = h + mid_->forward(h);
    return out_(h);
  }

  int64_t emb_dim_;
  torch::nn::Sequential t_mlp_{nullptr}, mid_{nullptr};
  torch::nn::Linear txt_{nullptr};
  torch::nn::Conv2d in_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Denoiser);

// The weights the sampler runs with are the EMA copy saved by the trainer.
void load_ema(Denoiser &model, const std::vector<torch::Tensor> &ema) {
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  TORCH_CHECK(params.size() == ema.size(), "EMA checkpoint does not match the model");
  // FACT: w = torch.nn.Linear(3, 2).weight; exec('with torch.no_grad(): w.copy_(torch.ones(2, 3))'); assert w.is_leaf and w.requires_grad and bool((w == 1).all())
  for (size_t i = 0; i < params.size(); ++i)
    params[i].copy_(ema[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
}

// Pseudo linear multistep: combines the current noise estimate with the last three.
torch::Tensor plms_eps(const torch::Tensor &eps, const torch::Tensor &hist, int64_t n_hist) {
  if (n_hist == 0)
    return eps;
  if (n_hist == 1)
    return (3 * eps - hist[2]) / 2;
  if (n_hist == 2)
    return (23 * eps - 16 * hist[2] + 5 * hist[1]) / 12;
  return (55 * eps - 59 * hist[2] + 37 * hist[1] - 9 * hist[0]) / 24;
}

struct SampleResult {
  torch::Tensor images;                // [B, C, H, W] in [-1, 1], on the GPU
  std::vector<torch::Tensor> previews; // x0 predictions, host copies
};

class Sampler {
public:
  Sampler(Denoiser model, const SamplerConfig &cfg) : model_(std::move(model)), cfg_(cfg), device_(torch::kCUDA) {
    ac_ = cosine_alphas_cumprod(cfg.train_steps);
    timesteps_ = torch::linspace(cfg.train_steps - 1, 0, cfg.sample_steps).round().to(torch::kLong);
    model_->to(device_);
    model_->eval();
  }

  SampleResult sample(const torch::Tensor &text_emb, const torch::Tensor &null_emb, uint64_t seed) {
    torch::NoGradGuard no_grad;
    const auto B = text_emb.size(0), C = cfg_.channels, S = cfg_.image_size;
    torch::manual_seed(seed);
    auto x = torch::randn({B, C, S, S}, torch::TensorOptions().device(device_));
    auto cond = text_emb.to(device_);
    auto scales = torch::tensor(cfg_.guidance);
    auto hist = torch::zeros({3, B, C, S, S}, x.options());
    int64_t n_hist = 0;
    auto ts = timesteps_.accessor<int64_t, 1>();
    SampleResult res;

    for (int64_t i = 0; i < cfg_.sample_steps; ++i) {
      const int64_t t = ts[i];
      const int64_t t_prev = i + 1 < cfg_.sample_steps ? ts[i + 1] : -1;
      auto ctx = torch::cat({cond, null_emb.to(device_).expand_as(cond)}); // EXPECT: tensor-clone-in-loop -- the same null-prompt embedding is sent to the GPU at every step
      auto tin = torch::full({2 * B}, t, torch::TensorOptions().dtype(torch::kLong).device(device_));
      auto eps_both = model_->forward(torch::cat({x, x}), tin, ctx);
      auto halves = eps_both.chunk(2);
      auto eps_c = halves[0], eps_u = halves[1];
      auto eps = eps_u + scales.view({-1, 1, 1, 1}) * (eps_c - eps_u); // EXPECT: tensor-device-mismatch -- the per-prompt guidance scales are a host tensor of B values

      if (cfg_.plms) {
        auto e = plms_eps(eps, hist, n_hist);
        // FACT: h = torch.randn(3, 2, 4); assert raises(lambda: h.narrow(0, 0, 2).copy_(h.narrow(0, 1, 2)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
        hist.narrow(0, 0, 2).copy_(hist.narrow(0, 1, 2)); // EXPECT: tensor-inplace-overlap -- shifting the history inside one buffer: rows 0-1 and 1-2 overlap
        // FACT: h = torch.randn(3, 2, 4); e = torch.randn(2, 4); h[2].copy_(e); assert torch.equal(h[2], e)
        hist[2].copy_(eps); // LOOKALIKE: tensor-inplace-overlap -- the newest row is written from eps, a tensor of its own
        n_hist = std::min<int64_t>(n_hist + 1, 3);
        eps = e;
      }

      auto a_t = ac_[t];
      auto a_prev = t_prev >= 0 ? ac_[t_prev] : torch::ones({});
      auto x0 = (x - (1 - a_t).sqrt() * eps) / a_t.sqrt(); // LOOKALIKE: tensor-device-mismatch -- ac_[t] is a 0-dim CPU tensor, which CUDA ops accept
      // FACT: x0 = torch.randn(2, 3) * 3; c = x0.clone(); c.clamp_(-1, 1); assert torch.equal(c, x0.clamp(-1, 1)) and is_copy_of(c, x0)
      auto x0_clipped = x0.clone(); // EXPECT: tensor-unnecessary-clone -- clamped in place right after: x0.clamp(-1, 1) is one pass
      x0_clipped.clamp_(-1, 1);
      auto sigma = cfg_.eta * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)).sqrt();
      auto dir = (1 - a_prev - sigma * sigma).sqrt() * eps;
      x = a_prev.sqrt() * x0_clipped + dir;
      if (cfg_.eta > 0)
        x = x + sigma * torch::randn_like(x);

      std::cout << "\rstep " << i + 1 << "/" << cfg_.sample_steps << "  mean |x0| "
                << x0_clipped.abs().mean().item<float>() << std::flush; // EXPECT: tensor-sync-in-loop -- a progress line that waits for the GPU at every step
      if (cfg_.preview_every > 0 && i % cfg_.preview_every == 0)
        res.previews.push_back(x0_clipped.cpu()); // LOOKALIKE: tensor-clone-in-loop, tensor-graph-kept-across-iterations, tensor-sync-in-loop -- every preview_every steps, a new prediction, kept; under NoGradGuard
    }
    std::cout << "\n";
    res.images = x;
    return res;
  }

private:
  Denoiser model_;
  SamplerConfig cfg_;
  torch::Device device_;
  torch::Tensor ac_, timesteps_;
};

// [B, C, H, W] floats in [-1, 1] -> [B, H, W, C] uint8 on the host.
torch::Tensor to_uint8(const torch::Tensor &samples) {
  auto img = samples.to(torch::kFloat); // the sampler may have run in half precision
  // FACT: s = torch.randn(2, 3, 4, 4); i = s.to(torch.float32); i.clamp_(-1, 1).add_(1).mul_(127.5); assert shares_storage(i, s) and s.min().item() >= 0
  img.clamp_(-1, 1).add_(1).mul_(127.5); // EXPECT: tensor-alias-then-mutate -- to(kFloat) of float32 samples is the caller's tensor: they are rescaled in place
  return img.round().to(torch::kUInt8).permute({0, 2, 3, 1}).contiguous().cpu();
}

// Tiles a [B, H, W, C] batch into one [rows * H, cols * W, C] image.
torch::Tensor make_grid(const torch::Tensor &hwc, int64_t cols) {
  const auto B = hwc.size(0), H = hwc.size(1), W = hwc.size(2), C = hwc.size(3);
  const auto rows = B / cols;
  // FACT: b = torch.randint(0, 255, (6, 4, 5, 3), dtype=torch.uint8); assert is_view_of(b.narrow(0, 0, 4).view(2, 2, 4, 5, 3), b)
  auto g = hwc.narrow(0, 0, rows * cols).view({rows, cols, H, W, C}); // LOOKALIKE: tensor-view-non-contiguous -- a narrow along dim 0 of a contiguous batch stays contiguous
  // FACT: b = torch.randint(0, 255, (2, 2, 4, 5, 3), dtype=torch.uint8); assert is_copy_of(b.permute(0, 2, 1, 3, 4).reshape(8, 10, 3), b)
  return g.permute({0, 2, 1, 3, 4}).reshape({rows * H, cols * W, C}); // EXPECT: tensor-reshape-non-contiguous -- rows and H are not adjacent after the permute: the grid is copied
}

struct Generation {
  std::vector<torch::Tensor> grids;   // one uint8 image per prompt batch
  std::vector<torch::Tensor> samples; // float samples for FID statistics
  std::vector<torch::Tensor> strips;  // previews, for the progress report
};

Generation generate(Sampler &sampler, const std::vector<torch::Tensor> &prompt_embs, const torch::Tensor &null_emb,
                    int64_t cols, uint64_t seed) {
  Generation gen;
  for (const auto &emb : prompt_embs) {
    auto res = sampler.sample(emb, null_emb, seed++);
    auto u8 = to_uint8(res.images);
    gen.grids.push_back(make_grid(u8, cols));
    gen.samples.push_back(res.images.cpu()); // LOOKALIKE: tensor-clone-in-loop, tensor-sync-in-loop -- a new batch every prompt, kept for the statistics
    for (auto &p : res.previews)
      gen.strips.push_back(make_grid(to_uint8(p), cols));
  }
  return gen;
}
