// Mid block of a text-conditioned latent diffusion UNet (ResBlock + spatial transformer with
// self-/cross-attention), the DDPM trainer with classifier-free dropout, and a CFG sampler.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct UNetBlockConfig {
  int64_t channels = 320;
  int64_t groups = 32;
  int64_t heads = 8;
  int64_t context_dim = 768;
  int64_t time_dim = 1280;
  int64_t ff_mult = 4;
  double dropout = 0.0;
};

struct DiffusionConfig {
  int64_t timesteps = 1000;
  double beta_start = 1e-4;
  double beta_end = 0.02;
  double p_uncond = 0.1;      // classifier-free dropout of the prompt
  double offset_noise = 0.1;  // per-channel DC offset added to the noise
  double ema_decay = 0.9999;
  double lr = 1e-4;
  int64_t log_every = 50;
};

// Sinusoidal timestep embedding (DDPM / "Attention Is All You Need").
torch::Tensor timestep_embedding(const torch::Tensor& timesteps, int64_t dim, double scale = 1.0) {
  const int64_t half = dim / 2;
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(timesteps.device());
  auto freqs = torch::exp(torch::arange(half, opts) * (-std::log(10000.0) / half));
  // FACT: t = torch.randint(0, 1000, (4,)); assert is_copy_of(t.to(torch.float), t)
  auto t = timesteps.to(torch::kFloat);
  t.mul_(scale);  // LOOKALIKE: tensor-alias-then-mutate -- timesteps are int64 indices, so to(kFloat) makes a new tensor
  auto args = t.unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, -1);
}

// [B, heads, N, d] -> [B, N, heads * d]
torch::Tensor merge_heads(const torch::Tensor& o) {
  // FACT: o = torch.randn(2, 3, 4, 5); assert is_copy_of(o.transpose(1, 2).reshape(2, 4, -1), o)
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});  // EXPECT: tensor-reshape-non-contiguous
}

struct ResBlockImpl : nn::Module {
  ResBlockImpl(int64_t in_ch, int64_t out_ch, int64_t time_dim, int64_t groups, double dropout)
      : norm1(register_module("norm1", nn::GroupNorm(nn::GroupNormOptions(groups, in_ch)))),
        conv1(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 3).padding(1)))),
        time_proj(register_module("time_proj", nn::Linear(time_dim, out_ch))),
        norm2(register_module("norm2", nn::GroupNorm(nn::GroupNormOptions(groups, out_ch)))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out_ch, out_ch, 3).padding(1)))),
        dropout_(dropout) {
    if (in_ch != out_ch)
      skip = register_module("skip", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 1)));
    nn::init::zeros_(conv2->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    nn::init::zeros_(conv2->bias);  // every residual branch starts as the identity
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    auto h = conv1(F::silu(norm1(x)));
    const int64_t B = h.size(0);
    h += time_proj(F::silu(temb)).view({B, -1, 1, 1});  // LOOKALIKE: tensor-inplace-on-saved -- conv1 saves its input, not its output
    h = F::dropout(F::silu(norm2(h)), F::DropoutFuncOptions().p(dropout_).training(is_training()));
    h = conv2(h);
    return h + (skip.is_empty() ? x : skip(x));
  }

  nn::GroupNorm norm1;
  nn::Conv2d conv1;
  nn::Linear time_proj;
  nn::GroupNorm norm2;
  nn::Conv2d conv2, skip{nullptr};
  double dropout_;
};
TORCH_MODULE(ResBlock);

struct GEGLUFeedForwardImpl : nn::Module {
  GEGLUFeedForwardImpl(int64_t dim, int64_t mult)
      : proj(register_module("proj", nn::Linear(dim, dim * mult * 2))),
        out(register_module("out", nn::Linear(dim * mult, dim))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto parts = proj(x).chunk(2, -1);
    auto gate = F::gelu(parts[1]);
    // FACT: x = torch.randn(2, 8, requires_grad=True); p = x.chunk(2, -1); g = torch.nn.functional.gelu(p[1]); g.mul_(p[0]); g.sum().backward()
    gate.mul_(parts[0]);  // LOOKALIKE: tensor-inplace-on-saved -- gelu saves its input, not its result
    return out(gate);
  }

  nn::Linear proj, out;
};
TORCH_MODULE(GEGLUFeedForward);

struct CrossAttentionImpl : nn::Module {
  CrossAttentionImpl(int64_t query_dim, int64_t context_dim, int64_t heads)
      : heads_(heads), dim_head_(query_dim / heads) {
    to_q = register_module("to_q", nn::Linear(nn::LinearOptions(query_dim, query_dim).bias(false)));
    to_k = register_module("to_k", nn::Linear(nn::LinearOptions(context_dim, query_dim).bias(false)));
    to_v = register_module("to_v", nn::Linear(nn::LinearOptions(context_dim, query_dim).bias(false)));
    to_out = register_module("to_out", nn::Linear(query_dim, query_dim));
  }

  // x: [B, N, C] image tokens; context: [B, M, Dc] text tokens; key_pad: [B, M], true on padding.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context, const torch::Tensor& key_pad) {
    const int64_t B = x.size(0), N = x.size(1), M = context.size(1);
    auto q = to_q(x).view({B, N, heads_, dim_head_}).transpose(1, 2);
    auto k = to_k(context).view({B, M, heads_, dim_head_}).transpose(1, 2);
    auto v = to_v(context).view({B, M, heads_, dim_head_}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dim_head_)));
    auto pad = key_pad.view({B, 1, 1, M});
    scores.masked_fill_(pad, -1e9);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves q and k, not its result; scaling by a number saves nothing
    auto attn = torch::softmax(scores, -1);
    // an all-padding prompt (the dropped condition) must not attend anywhere
    attn.masked_fill_(pad, 0.0);  // EXPECT: tensor-inplace-on-saved
    auto out = torch::matmul(attn, v);  // [B, heads, N, d]
    // FACT: o = torch.randn(2, 3, 4, 5); assert raises(lambda: o.transpose(1, 2).view(2, 4, 15), "view size is not compatible")
    return to_out(out.transpose(1, 2).view({B, N, heads_ * dim_head_}));  // EXPECT: tensor-view-non-contiguous
  }

  int64_t heads_, dim_head_;
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
};
TORCH_MODULE(CrossAttention);

struct SpatialTransformerImpl : nn::Module {
  explicit SpatialTransformerImpl(const UNetBlockConfig& c)
      : heads_(c.heads),
        norm(register_module("norm", nn::GroupNorm(nn::GroupNormOptions(c.groups, c.channels)))),
        proj_in(register_module("proj_in", nn::Linear(c.channels, c.channels))),
        ln1(register_module("ln1", nn::LayerNorm(nn::LayerNormOptions({c.channels})))),
        to_qkv(register_module("to_qkv", nn::Linear(nn::LinearOptions(c.channels, 3 * c.channels).bias(false)))),
        attn_out(register_module("attn_out", nn::Linear(c.channels, c.channels))),
        ln2(register_module("ln2", nn::LayerNorm(nn::LayerNormOptions({c.channels})))),
        cross(register_module("cross", CrossAttention(c.channels, c.context_dim, c.heads))),
        ln3(register_module("ln3", nn::LayerNorm(nn::LayerNormOptions({c.channels})))),
        ff(register_module("ff", GEGLUFeedForward(c.channels, c.ff_mult))),
        proj_out(register_module("proj_out", nn::Linear(c.channels, c.channels))) {
    // zero-init the output projection so the block starts as the identity
    for (auto& p : proj_out->parameters()) p.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor self_attend(const torch::Tensor& t) {
    const int64_t B = t.size(0), N = t.size(1), C = t.size(2);
    auto qkv = to_qkv(t).view({B, N, 3, heads_, C / heads_}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(C / heads_));
    return attn_out(merge_heads(torch::matmul(torch::softmax(scores, -1), v)));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context, const torch::Tensor& key_pad) {
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    // FACT: x = torch.randn(2, 3, 4, 5); assert is_view_of(x.permute(0, 2, 3, 1).view(2, 20, 3), x)
    auto tokens = norm(x).permute({0, 2, 3, 1}).view({B, H * W, C});  // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent in NHWC order, so merging them is a view
    tokens = proj_in(tokens);
    tokens = tokens + self_attend(ln1(tokens));
    tokens = tokens + cross(ln2(tokens), context, key_pad);
    tokens = tokens + ff(ln3(tokens));
    auto out = proj_out(tokens);  // [B, H*W, C]
    // FACT: o = torch.randn(2, 12, 5); assert is_view_of(o.transpose(1, 2).view(2, 5, 3, 4), o)
    return x + out.transpose(1, 2).view({B, C, H, W});  // LOOKALIKE: tensor-view-non-contiguous -- only splits the token dim, always a view
  }

  int64_t heads_;
  nn::GroupNorm norm;
  nn::Linear proj_in;
  nn::LayerNorm ln1;
  nn::Linear to_qkv, attn_out;
  nn::LayerNorm ln2;
  CrossAttention cross;
  nn::LayerNorm ln3;
  GEGLUFeedForward ff;
  nn::Linear proj_out;
};
TORCH_MODULE(SpatialTransformer);

struct UNetMidBlockImpl : nn::Module {
  explicit UNetMidBlockImpl(const UNetBlockConfig& c) : cfg(c) {
    time_mlp = register_module("time_mlp", nn::Sequential(nn::Linear(c.channels, c.time_dim), nn::SiLU(),
                                                          nn::Linear(c.time_dim, c.time_dim)));
    res1 = register_module("res1", ResBlock(c.channels, c.channels, c.time_dim, c.groups, c.dropout));
    attn = register_module("attn", SpatialTransformer(c));
    res2 = register_module("res2", ResBlock(c.channels, c.channels, c.time_dim, c.groups, c.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& timesteps, const torch::Tensor& context,
                        const torch::Tensor& key_pad) {
    auto temb = time_mlp->forward(timestep_embedding(timesteps, cfg.channels));
    auto h = res1(x, temb);
    h = attn(h, context, key_pad);
    return res2(h, temb);
  }

  UNetBlockConfig cfg;
  nn::Sequential time_mlp{nullptr};
  ResBlock res1{nullptr}, res2{nullptr};
  SpatialTransformer attn{nullptr};
};
TORCH_MODULE(UNetMidBlock);
struct TextLatentBatch {
  torch::Tensor latents;  // [B, C, H, W] VAE latents
  torch::Tensor text;     // [B, M, Dc] frozen text-encoder states
  torch::Tensor pad;      // [B, M] bool, true on padding
};

class DiffusionTrainer {
 public:
  DiffusionTrainer(UNetMidBlock model, UNetMidBlock ema, const DiffusionConfig& cfg)
      : model_(model), ema_(ema), cfg_(cfg), device_(torch::kCUDA),
        opt_(model->parameters(), torch::optim::AdamOptions(cfg.lr)) {
    model_->to(device_);
    ema_->to(device_);
    auto betas = torch::linspace(cfg_.beta_start, cfg_.beta_end, cfg_.timesteps, torch::kDouble);
    auto alpha_bar = torch::cumprod(1.0 - betas, 0);
    sqrt_ab_ = alpha_bar.sqrt().to(torch::kFloat);
    sqrt_1m_ab_ = (1.0 - alpha_bar).sqrt().to(torch::kFloat);
  }

  double train_epoch(const std::vector<TextLatentBatch>& batches) {
    model_->train();
    double running = 0.0;
    int64_t step = 0;
    for (const auto& batch : batches) {
      auto x0 = batch.latents.to(device_);
      auto ctx = batch.text.to(device_);
      auto pad = batch.pad.to(device_);
      const int64_t B = x0.size(0);
      // classifier-free guidance: train the unconditional model on a fraction of the batch
      auto drop = torch::rand({B}) < cfg_.p_uncond;
      ctx = torch::where(drop.view({B, 1, 1}), torch::zeros_like(ctx), ctx);  // EXPECT: tensor-device-mismatch

      auto t = torch::randint(0, cfg_.timesteps, {B}, torch::kLong);
      auto a = sqrt_ab_.index_select(0, t).view({B, 1, 1, 1}).to(device_);  // LOOKALIKE: tensor-device-mismatch -- schedule and t are both on the CPU; the gathered rows move afterwards
      auto s = sqrt_1m_ab_.index_select(0, t).view({B, 1, 1, 1}).to(device_);
      auto noise = torch::randn_like(x0);
      if (cfg_.offset_noise > 0) {
        // FACT: o = torch.randn(2, 3, 1, 1).expand(2, 3, 4, 4); assert raises(lambda: o.mul_(0.1), "more than one element")
        auto offset = torch::randn({B, x0.size(1), 1, 1}, x0.options()).expand_as(x0);
        offset.mul_(cfg_.offset_noise);  // EXPECT: tensor-inplace-on-expanded
        noise = noise + offset;
      }
      auto x_t = a * x0 + s * noise;
      auto eps = model_->forward(x_t, t.to(device_), ctx, pad);
      auto loss = F::mse_loss(eps, noise);
      opt_.zero_grad();
      loss.backward();
      opt_.step();
      update_ema();

      running += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++step % cfg_.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    return running / std::max<int64_t>(step, 1);
  }

 private:
  void update_ema() {
    torch::NoGradGuard no_grad;
    auto src = model_->parameters();
    auto dst = ema_->parameters();
    for (size_t i = 0; i < src.size(); ++i)
      dst[i].mul_(cfg_.ema_decay).add_(src[i], 1.0 - cfg_.ema_decay);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA weights updated under NoGradGuard
  }

  UNetMidBlock model_, ema_;
  DiffusionConfig cfg_;
  torch::Device device_;
  torch::optim::Adam opt_;
  torch::Tensor sqrt_ab_, sqrt_1m_ab_;
};

// Ancestral DDPM sampling with classifier-free guidance. The text encoder is a
// torch::nn::TransformerEncoder, so its states come sequence-first: [M, B, Dc].
torch::Tensor sample_cfg(UNetMidBlock& model, const torch::Tensor& text_states, const torch::Tensor& pad,
                         const DiffusionConfig& cfg, double guidance, at::IntArrayRef shape) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto betas = torch::linspace(cfg.beta_start, cfg.beta_end, cfg.timesteps);
  auto alphas = 1.0 - betas;
  auto alpha_bar = torch::cumprod(alphas, 0);
  auto x = torch::randn(shape);
  const int64_t B = x.size(0);
  for (int64_t i = cfg.timesteps - 1; i >= 0; --i) {
    auto ctx = text_states.transpose(0, 1).contiguous();  // EXPECT: tensor-clone-in-loop
    auto t = torch::full({B}, i, torch::kLong);
    auto eps_c = model->forward(x, t, ctx, pad);
    auto eps_u = model->forward(x, t, torch::zeros_like(ctx), pad);
    auto eps = eps_u + guidance * (eps_c - eps_u);
    const double a = alphas[i].item<double>(), ab = alpha_bar[i].item<double>(), b = betas[i].item<double>();
    x = (x - eps * (b / std::sqrt(1.0 - ab))) / std::sqrt(a);
    if (i > 0) x = x + std::sqrt(b) * torch::randn_like(x);
  }
  return x;
}
