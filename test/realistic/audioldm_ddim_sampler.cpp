// Text-to-audio latent diffusion (AudioLDM-style): a UNet denoises VAE latents of log-mel
// spectrograms; DDIM sampling with classifier-free guidance, and fine-tuning with an EMA copy.
#include <torch/torch.h>

#include <cmath>
#include <deque>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct LdmConfig {
  int64_t latent_channels = 8, latent_frames = 256, latent_bins = 16;
  int64_t model_channels = 128, context_dim = 512, context_len = 8, heads = 8;
  int64_t train_steps = 1000, sample_steps = 200;
  double beta_start = 0.0015, beta_end = 0.0195, guidance_scale = 3.5, guidance_rescale = 0.7, eta = 0.0;
  double vae_scale = 0.9227, dropout = 0.1, uncond_prob = 0.1, lr = 1e-5, ema_decay = 0.9999;
};

torch::nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1));
}

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(-std::log(10000.0) * torch::arange(half, t.options().dtype(torch::kFloat)) / half);
  auto args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, -1);
}

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in_ch, int64_t out_ch, int64_t emb_dim, double dropout) : dropout(dropout) {
    norm1 = register_module("norm1", torch::nn::GroupNorm(32, in_ch));
    conv1 = register_module("conv1", conv3x3(in_ch, out_ch));
    emb_proj = register_module("emb_proj", torch::nn::Linear(emb_dim, 2 * out_ch));
    norm2 = register_module("norm2", torch::nn::GroupNorm(32, out_ch));
    conv2 = register_module("conv2", conv3x3(out_ch, out_ch));
    if (in_ch != out_ch) skip = register_module("skip", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_ch, out_ch, 1)));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& emb) {
    auto h = conv1(F::silu(norm1(x)));
    auto ss = emb_proj(F::silu(emb)).unsqueeze(-1).unsqueeze(-1).chunk(2, 1);
    h = norm2(h) * (1 + ss[0]) + ss[1];
    // FACT: x = torch.randn(2, 4, requires_grad=True); h = torch.nn.functional.silu(x); torch.nn.functional.dropout(h, 0.5, True, True); h.sum().backward()
    h = F::dropout(F::silu(h), F::DropoutFuncOptions().p(dropout).training(is_training()).inplace(true));  // LOOKALIKE: tensor-inplace-on-saved -- silu saves its input, not its output
    return (skip ? skip(x) : x) + conv2(h);
  }

  double dropout;
  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, skip{nullptr};
  torch::nn::Linear emb_proj{nullptr};
};
TORCH_MODULE(ResBlock);

struct CrossAttentionImpl : torch::nn::Module {
  CrossAttentionImpl(int64_t channels, int64_t context_dim, int64_t heads, double attn_drop)
      : heads(heads), attn_drop(attn_drop) {
    norm = register_module("norm", torch::nn::GroupNorm(32, channels));
    to_q = register_module("to_q", torch::nn::Linear(torch::nn::LinearOptions(channels, channels).bias(false)));
    to_k = register_module("to_k", torch::nn::Linear(torch::nn::LinearOptions(context_dim, channels).bias(false)));
    to_v = register_module("to_v", torch::nn::Linear(torch::nn::LinearOptions(context_dim, channels).bias(false)));
    to_out = register_module("to_out", torch::nn::Linear(channels, channels));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context) {
    const auto b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3), d = c / heads;
    auto tokens = norm(x).flatten(2).transpose(1, 2);
    auto q = to_q(tokens).view({b, -1, heads, d}).transpose(1, 2);
    auto k = to_k(context).view({b, -1, heads, d}).transpose(1, 2);
    auto v = to_v(context).view({b, -1, heads, d}).transpose(1, 2);
    auto attn = torch::softmax(torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d)), -1);
    attn = F::dropout(attn, F::DropoutFuncOptions().p(attn_drop).training(is_training()).inplace(true));  // EXPECT: tensor-inplace-on-saved
    // FACT: o = torch.randn(2, 4, 16, 8).transpose(1, 2); r = o.reshape(2, 16, 32); assert is_copy_of(r, o)
    auto out = torch::matmul(attn, v).transpose(1, 2).reshape({b, -1, c});  // EXPECT: tensor-reshape-non-contiguous
    out = to_out(out);
    // FACT: o = torch.randn(2, 16, 32).transpose(1, 2); r = o.reshape(2, 32, 4, 4); assert is_view_of(r, o)
    return x + out.transpose(1, 2).reshape({b, c, h, w});  // LOOKALIKE: tensor-reshape-non-contiguous -- splitting the token dim back into h, w is a view
  }

  int64_t heads;
  double attn_drop;
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
};
TORCH_MODULE(CrossAttention);

struct AudioUNetImpl : torch::nn::Module {
  explicit AudioUNetImpl(const LdmConfig& cfg) : ch(cfg.model_channels) {
    const int64_t emb = 4 * ch;
    time_mlp = register_module("time_mlp", torch::nn::Sequential(torch::nn::Linear(ch, emb), torch::nn::SiLU(),
                                                                 torch::nn::Linear(emb, emb)));
    in_conv = register_module("in_conv", conv3x3(cfg.latent_channels, ch));
    down = register_module("down", ResBlock(ch, ch, emb, cfg.dropout));
    downsample = register_module("downsample", conv3x3(ch, 2 * ch, 2));
    mid = register_module("mid", ResBlock(2 * ch, 2 * ch, emb, cfg.dropout));
    mid_attn = register_module("mid_attn", CrossAttention(2 * ch, cfg.context_dim, cfg.heads, cfg.dropout));
    up = register_module("up", ResBlock(3 * ch, ch, emb, cfg.dropout));
    out_norm = register_module("out_norm", torch::nn::GroupNorm(32, ch));
    out_conv = register_module("out_conv", conv3x3(ch, cfg.latent_channels));
    // learned "empty prompt" used for the unconditional branch of guidance
    null_context = register_parameter("null_context", torch::empty({1, cfg.context_len, cfg.context_dim}));
    null_context.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& context) {
    auto emb = time_mlp->forward(timestep_embedding(t, ch));
    auto h0 = down(in_conv(x), emb);
    auto h = mid_attn(mid(downsample(h0), emb), context);
    h = F::interpolate(h, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest));
    h = up(torch::cat({h, h0}, 1), emb);
    return out_conv(F::silu(out_norm(h)));
  }

  int64_t ch;
  torch::nn::Sequential time_mlp{nullptr};
  torch::nn::Conv2d in_conv{nullptr}, downsample{nullptr}, out_conv{nullptr};
  ResBlock down{nullptr}, mid{nullptr}, up{nullptr};
  CrossAttention mid_attn{nullptr};
  torch::nn::GroupNorm out_norm{nullptr};
  torch::Tensor null_context;
};
TORCH_MODULE(AudioUNet);

struct MelVaeImpl : torch::nn::Module {
  explicit MelVaeImpl(const LdmConfig& cfg) {
    using torch::nn::ConvTranspose2d, torch::nn::ConvTranspose2dOptions;
    enc = register_module("enc", torch::nn::Sequential(conv3x3(1, 64, 2), torch::nn::SiLU(),
                                                       conv3x3(64, 2 * cfg.latent_channels, 2)));
    dec = register_module("dec", torch::nn::Sequential(
        ConvTranspose2d(ConvTranspose2dOptions(cfg.latent_channels, 64, 4).stride(2).padding(1)), torch::nn::SiLU(),
        ConvTranspose2d(ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1))));
  }
  torch::Tensor encode(const torch::Tensor& mel) { return enc->forward(mel).chunk(2, 1)[0]; }
  torch::Tensor decode(const torch::Tensor& z) { return dec->forward(z); }
  torch::nn::Sequential enc{nullptr}, dec{nullptr};
};
TORCH_MODULE(MelVae);

class DdimScheduler {
 public:
  DdimScheduler(const LdmConfig& cfg, uint64_t seed) : cfg_(cfg), gen_(at::detail::createCPUGenerator(seed)) {
    // scaled-linear betas; the cumulative product is taken in double
    auto betas = torch::linspace(std::sqrt(cfg.beta_start), std::sqrt(cfg.beta_end), cfg.train_steps, torch::kFloat64).pow(2);
    auto cumprod = torch::cumprod(1.0 - betas, 0);
    alphas_cumprod_ = torch::empty({cfg.train_steps});
    alphas_cumprod_.copy_(cumprod);  // EXPECT: tensor-copy-narrowing
    final_alpha_ = torch::empty({1});
    final_alpha_.copy_(cumprod.narrow(0, 0, 1).to(final_alpha_.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the conversion is spelled out
  }

  void set_timesteps(int64_t n) {
    num_steps_ = n;
    timesteps_ = torch::arange(0, n, torch::kLong).mul(cfg_.train_steps / n).flip({0}) + 1;
  }
  const torch::Tensor& timesteps() const { return timesteps_; }
  const torch::Tensor& alphas_cumprod() const { return alphas_cumprod_; }

  torch::Tensor initial_latents(int64_t batch, bool shared_noise, double variation, torch::Device device) {
    const std::vector<int64_t> one{1, cfg_.latent_channels, cfg_.latent_frames, cfg_.latent_bins};
    if (shared_noise) {
      // one draw for every prompt, so prompts are compared on the same noise
      // FACT: x = torch.randn(1, 4, 8, 4).expand(3, 4, 8, 4); assert raises(lambda: x.mul_(1.0), "single memory location")
      auto z = torch::randn(one, gen_).to(device).expand({batch, -1, -1, -1});
      z.mul_(init_noise_sigma_);  // EXPECT: tensor-inplace-on-expanded
      return z;
    }
    if (variation > 0) {
      // FACT: x = torch.randn(1, 4, 8, 4).repeat(3, 1, 1, 1); x.add_(torch.randn(3, 4, 8, 4), alpha=0.1); assert x.stride(0) != 0
      auto z = torch::randn(one, gen_).repeat({batch, 1, 1, 1});
      z.add_(torch::randn(z.sizes(), gen_), variation);  // LOOKALIKE: tensor-inplace-on-expanded -- repeat() materialises every copy
      return (z / std::sqrt(1.0 + variation * variation)).to(device);
    }
    auto z = torch::randn({batch, one[1], one[2], one[3]}, gen_).to(device);  // LOOKALIKE: tensor-device-mismatch -- drawn on the CPU generator, moved before any device op
    return z * init_noise_sigma_;
  }

  torch::Tensor step(const torch::Tensor& eps, int64_t t, const torch::Tensor& sample, double eta) {
    const int64_t prev_t = t - cfg_.train_steps / num_steps_;
    auto alpha_t = alphas_cumprod_[t];
    auto alpha_prev = prev_t >= 0 ? alphas_cumprod_[prev_t] : final_alpha_[0];
    auto pred_x0 = (sample - (1 - alpha_t).sqrt() * eps) / alpha_t.sqrt();  // LOOKALIKE: tensor-device-mismatch -- schedule entries are 0-dim CPU tensors, accepted next to CUDA operands
    auto variance = (1 - alpha_prev) / (1 - alpha_t) * (1 - alpha_t / alpha_prev);
    auto sigma = eta * variance.sqrt();
    auto prev = alpha_prev.sqrt() * pred_x0 + (1 - alpha_prev - sigma.pow(2)).sqrt() * eps;
    if (eta > 0) {
      auto noise = torch::randn(sample.sizes(), gen_);
      prev = prev + sigma * noise;  // EXPECT: tensor-device-mismatch
    }
    return prev;
  }

 private:
  LdmConfig cfg_;
  at::Generator gen_;
  torch::Tensor alphas_cumprod_, final_alpha_, timesteps_;
  int64_t num_steps_ = 1;
  double init_noise_sigma_ = 1.0;
};

class AudioLdmSampler {
 public:
  AudioLdmSampler(AudioUNet unet, MelVae vae, DdimScheduler& sched, const LdmConfig& cfg, torch::Device device)
      : unet_(std::move(unet)), vae_(std::move(vae)), sched_(sched), cfg_(cfg), device_(device) {}

  torch::Tensor guided_eps(const torch::Tensor& latents, int64_t t, const torch::Tensor& context) {
    const auto b = latents.size(0);
    auto model_in = torch::cat({latents, latents}, 0);
    auto t_batch = torch::full({2 * b}, t, torch::TensorOptions().dtype(torch::kLong).device(device_));
    auto ctx = torch::cat({unet_->null_context.expand({b, -1, -1}), context}, 0);
    auto chunks = unet_->forward(model_in, t_batch, ctx).chunk(2, 0);
    auto eps_uncond = chunks[0], eps_cond = chunks[1];
    // FACT: out = torch.randn(4, 8, 16, 4); u, c = out.chunk(2); e = c; e.sub_(u); assert shares_storage(e, c) and torch.equal(e, c)
    auto eps = eps_cond;
    eps.sub_(eps_uncond).mul_(cfg_.guidance_scale).add_(eps_uncond);  // EXPECT: tensor-alias-then-mutate
    if (cfg_.guidance_rescale > 0) {
      // pull the guided prediction back toward the std of the conditional one
      auto std_cond = eps_cond.std({1, 2, 3}, true, true);
      auto std_cfg = eps.std({1, 2, 3}, true, true);
      eps = cfg_.guidance_rescale * (eps * (std_cond / std_cfg)) + (1 - cfg_.guidance_rescale) * eps;
    }
    return eps;
  }

  torch::Tensor sample(const torch::Tensor& text_emb, bool shared_noise, double variation,
                       std::vector<double>* latent_std = nullptr) {
    torch::NoGradGuard no_grad;
    unet_->eval();
    vae_->eval();
    sched_.set_timesteps(cfg_.sample_steps);
    auto context = text_emb.to(device_);
    auto latents = sched_.initial_latents(text_emb.size(0), shared_noise, variation, device_);
    const auto& ts = sched_.timesteps();
    for (int64_t i = 0; i < ts.size(0); ++i) {
      const int64_t t = ts[i].item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the timestep table lives on the CPU
      latents = sched_.step(guided_eps(latents, t, context), t, latents, cfg_.eta);
      if (latent_std) latent_std->push_back(latents.std().item<double>());  // EXPECT: tensor-sync-in-loop
    }
    auto z = latents.clone();  // EXPECT: tensor-unnecessary-clone
    z.div_(cfg_.vae_scale);
    return vae_->decode(z);
  }

 private:
  AudioUNet unet_;
  MelVae vae_;
  DdimScheduler& sched_;
  LdmConfig cfg_;
  torch::Device device_;
};

struct AudioBatch { torch::Tensor mel, text_emb; };

void ema_update(AudioUNet& ema, AudioUNet& model, double decay) {
  torch::NoGradGuard no_grad;
  auto ema_params = ema->parameters();
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    ema_params[i].mul_(decay).add_(params[i].detach(), 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA weights are written under NoGradGuard
}

void finetune(AudioUNet& unet, AudioUNet& ema, MelVae& vae, const DdimScheduler& sched,
              const std::vector<AudioBatch>& data, const LdmConfig& cfg, torch::Device device) {
  unet->train();
  torch::optim::AdamW opt(unet->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-2));
  auto alphas = sched.alphas_cumprod().to(device);
  auto smoothed = torch::zeros({}, torch::TensorOptions().device(device));
  std::deque<torch::Tensor> window;
  for (size_t step = 0; step < data.size(); ++step) {
    auto z0 = [&] {
      torch::NoGradGuard no_grad;
      return vae->encode(data[step].mel.to(device)) * cfg.vae_scale;
    }();
    auto t = torch::randint(0, cfg.train_steps, {z0.size(0)}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto noise = torch::randn_like(z0);
    auto a = alphas.index_select(0, t).view({-1, 1, 1, 1});
    auto zt = a.sqrt() * z0 + (1 - a).sqrt() * noise;
    auto ctx = data[step].text_emb.to(device);
    // drop the text for part of the batch so the unconditional branch keeps training
    auto drop = torch::rand({z0.size(0), 1, 1}, ctx.options()) < cfg.uncond_prob;
    ctx = torch::where(drop, unet->null_context.expand_as(ctx), ctx);
    auto loss = F::mse_loss(unet->forward(zt, t, ctx), noise);
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(unet->parameters(), 1.0);
    opt.step();
    ema_update(ema, unet, cfg.ema_decay);
    smoothed = 0.98 * smoothed + 0.02 * loss;  // EXPECT: tensor-graph-kept-across-iterations
    window.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- only detached values are kept
    if (window.size() > 50) window.pop_front();
    if (step % 100 == 0)
      std::cout << "step " << step << " loss(ema) " << smoothed.item<double>() << " loss(50) "
                << torch::stack(std::vector<torch::Tensor>(window.begin(), window.end())).mean().item<double>() << "\n";
  }
}

int main() {
  LdmConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  AudioUNet unet(cfg), ema(cfg);
  MelVae vae(cfg);
  ema_update(ema, unet, /*decay=*/0.0);  // start the EMA from the initial weights
  unet->to(device);
  ema->to(device);
  vae->to(device);
  DdimScheduler sched(cfg, 1234);

  std::vector<AudioBatch> data;
  for (int i = 0; i < 200; ++i)
    data.push_back({torch::randn({4, 1, 4 * cfg.latent_frames, 4 * cfg.latent_bins}),
                    torch::randn({4, cfg.context_len, cfg.context_dim})});
  finetune(unet, ema, vae, sched, data, cfg, device);

  AudioLdmSampler sampler(ema, vae, sched, cfg, device);
  std::vector<double> trace;
  auto mel = sampler.sample(torch::randn({2, cfg.context_len, cfg.context_dim}), /*shared_noise=*/true, 0.0, &trace);
  std::cout << "mel " << mel.sizes() << ", final latent std " << (trace.empty() ? 0.0 : trace.back()) << "\n";
  return 0;
}
