// Spatio-temporal block for a latent video diffusion UNet: GroupNorm + FiLM
// time conditioning, spatial self-attention over each frame, temporal
// self-attention over each pixel's trajectory, and a DDIM sampling loop.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VideoBlockConfig {
  int64_t channels = 320;
  int64_t heads = 8;
  int64_t time_dim = 1280;
  int64_t text_dim = 768;
  int64_t groups = 32;
  int64_t max_frames = 32;
  bool temporal = true;
};

// Plain multi-head self-attention over tokens: x [N, L, C].
struct SpatialAttentionImpl : nn::Module {
  SpatialAttentionImpl(int64_t dim, int64_t heads) : heads_(heads) {
    qkv_ = register_module("qkv", nn::Linear(nn::LinearOptions(dim, 3 * dim).bias(false)));
    out_ = register_module("out", nn::Linear(dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto N = x.size(0), L = x.size(1), C = x.size(2);
    const auto dh = C / heads_;
    // FACT: y = torch.nn.Linear(8, 24)(torch.randn(3, 5, 8)); assert is_view_of(y.view(3, 5, 3, 2, 4), y)
    auto qkv = qkv_->forward(x).view({N, L, 3, heads_, dh}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
    auto q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
    auto attn = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(dh)), -1);
    auto ctx = torch::matmul(attn, v);  // [N, heads, L, dh]
    // FACT: c = torch.randn(3, 2, 5, 4); assert is_contiguous(c.transpose(1, 2).contiguous().view(3, 5, 8))
    return out_->forward(ctx.transpose(1, 2).contiguous().view({N, L, C})); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- explicit contiguous() copy, then a legal view
  }
  int64_t heads_;
  nn::Linear qkv_{nullptr}, out_{nullptr};
};
TORCH_MODULE(SpatialAttention);

// Attention along the frame axis with a learned relative-position bias: x [N, T, C].
struct TemporalAttentionImpl : nn::Module {
  TemporalAttentionImpl(int64_t dim, int64_t heads, int64_t max_frames) : heads_(heads), max_frames_(max_frames) {
    q_ = register_module("q", nn::Linear(dim, dim));
    k_ = register_module("k", nn::Linear(dim, dim));
    v_ = register_module("v", nn::Linear(dim, dim));
    o_ = register_module("o", nn::Linear(dim, dim));
    rel_bias_ = register_parameter("rel_bias", torch::zeros({heads, 2 * max_frames - 1}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto N = x.size(0), T = x.size(1), C = x.size(2);
    const auto dh = C / heads_;
    auto split = [&](const torch::Tensor& t) { return t.view({N, T, heads_, dh}).transpose(1, 2); };
    auto q = split(q_->forward(x)), k = split(k_->forward(x)), v = split(v_->forward(x));
    auto logits = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(dh));
    auto pos = torch::arange(T, torch::kLong);
    auto rel = (pos.unsqueeze(0) - pos.unsqueeze(1) + (max_frames_ - 1)).flatten();
    logits = logits + rel_bias_.index_select(1, rel).view({heads_, T, T});
    auto out = torch::matmul(torch::softmax(logits, -1), v);  // [N, heads, T, dh]
    // FACT: o = torch.randn(3, 2, 5, 4); assert raises(lambda: o.transpose(1, 2).view(3, 5, 8), "view size is not compatible")
    return o_->forward(out.transpose(1, 2).view({N, T, C})); // EXPECT: tensor-view-non-contiguous
  }
  int64_t heads_, max_frames_;
  nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  torch::Tensor rel_bias_;
};
TORCH_MODULE(TemporalAttention);

struct SpatioTemporalBlockImpl : nn::Module {
  explicit SpatioTemporalBlockImpl(const VideoBlockConfig& cfg) : cfg_(cfg) {
    const auto C = cfg.channels;
    norm_ = register_module("norm", nn::GroupNorm(nn::GroupNormOptions(cfg.groups, C)));
    film_ = register_module("film", nn::Linear(cfg.time_dim, 2 * C));
    norm_s_ = register_module("norm_s", nn::LayerNorm(nn::LayerNormOptions({C})));
    norm_t_ = register_module("norm_t", nn::LayerNorm(nn::LayerNormOptions({C})));
    spatial_ = register_module("spatial", SpatialAttention(C, cfg.heads));
    temporal_ = register_module("temporal", TemporalAttention(C, cfg.heads, cfg.max_frames));
    proj_out_ = register_module("proj_out", nn::Conv3d(nn::Conv3dOptions(C, C, 1)));
    // zero-init the residual branch so a freshly inflated image model starts as identity
    proj_out_->weight.zero_(); // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(proj_out_->bias); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
  }

  // x: [B, C, T, H, W], temb: [B, time_dim]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& temb) {
    const auto B = x.size(0), C = x.size(1), T = x.size(2), H = x.size(3), W = x.size(4);
    auto h = norm_->forward(x);
    auto ss = film_->forward(F::silu(temb));  // [B, 2C]
    // FACT: s = torch.randn(2, 6); g = s.narrow(1, 0, 3).view(2, 3, 1, 1, 1); assert is_view_of(g, s)
    auto gamma = ss.narrow(1, 0, C).view({B, C, 1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- only inserts size-1 dims into the [B, C] slice
    auto beta = ss.narrow(1, C, C).view({B, C, 1, 1, 1});
    auto scale = gamma.expand_as(h);
    // FACT: g = torch.randn(2, 3).view(2, 3, 1, 1, 1); h = torch.randn(2, 3, 4, 5, 6); assert raises(lambda: g.expand_as(h).add_(1.0), "more than one element")
    scale.add_(1.0); // EXPECT: tensor-inplace-on-expanded
    h = h * scale;
    // FACT: h = torch.randn(2, 3, 4, 5, 6); b = torch.randn(2, 3, 1, 1, 1); h.add_(b.expand_as(h)); assert is_contiguous(h)
    h.add_(beta.expand_as(h)); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read

    // spatial attention: every frame is a sequence of H*W tokens
    // FACT: h = torch.randn(2, 3, 4, 5, 6); assert is_copy_of(h.permute(0, 2, 3, 4, 1).reshape(8, 30, 3), h)
    auto tokens = h.permute({0, 2, 3, 4, 1}).reshape({B * T, H * W, C}); // EXPECT: tensor-reshape-non-contiguous
    auto sa = spatial_->forward(norm_s_->forward(tokens));
    h = h + sa.view({B, T, H, W, C}).permute({0, 4, 1, 2, 3});

    if (cfg_.temporal) {
      // temporal attention: every pixel is a sequence of T frames
      // FACT: h = torch.randn(2, 3, 4, 5, 6); assert is_contiguous(h.permute(0, 3, 4, 2, 1).contiguous())
      auto seq = h.permute({0, 3, 4, 2, 1}).contiguous().view({B * H * W, T, C}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
      auto ta = temporal_->forward(norm_t_->forward(seq));
      h = h + ta.view({B, H, W, T, C}).permute({0, 4, 3, 1, 2});
    }
    return x + proj_out_->forward(h);
  }

  VideoBlockConfig cfg_;
  nn::GroupNorm norm_{nullptr};
  nn::Linear film_{nullptr};
  nn::LayerNorm norm_s_{nullptr}, norm_t_{nullptr};
  SpatialAttention spatial_{nullptr};
  TemporalAttention temporal_{nullptr};
  nn::Conv3d proj_out_{nullptr};
};
TORCH_MODULE(SpatioTemporalBlock);

torch::Tensor timestep_embedding(const torch::Tensor& t, int64_t dim) {
  const auto half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, torch::TensorOptions().dtype(torch::kFloat).device(t.device())) *
                          (-std::log(10000.0) / half));
  auto args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

struct TinyVideoUNetImpl : nn::Module {
  explicit TinyVideoUNetImpl(const VideoBlockConfig& cfg, int64_t latent_ch = 4) : cfg_(cfg) {
    conv_in_ = register_module("conv_in", nn::Conv3d(nn::Conv3dOptions(latent_ch, cfg.channels, {1, 3, 3}).padding({0, 1, 1})));
    time_mlp_ = register_module("time_mlp", nn::Sequential(nn::Linear(cfg.channels, cfg.time_dim), nn::SiLU(),
                                                           nn::Linear(cfg.time_dim, cfg.time_dim)));
    text_proj_ = register_module("text_proj", nn::Linear(cfg.text_dim, cfg.time_dim));
    block_ = register_module("block", SpatioTemporalBlock(cfg));
    conv_out_ = register_module("conv_out", nn::Conv3d(nn::Conv3dOptions(cfg.channels, latent_ch, {1, 3, 3}).padding({0, 1, 1})));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& t, const torch::Tensor& text) {
    auto temb = time_mlp_->forward(timestep_embedding(t, cfg_.channels)) + text_proj_->forward(text);
    auto h = block_->forward(conv_in_->forward(x), temb);
    return conv_out_->forward(F::silu(h));
  }
  VideoBlockConfig cfg_;
  nn::Conv3d conv_in_{nullptr}, conv_out_{nullptr};
  nn::Sequential time_mlp_{nullptr};
  nn::Linear text_proj_{nullptr};
  SpatioTemporalBlock block_{nullptr};
};
TORCH_MODULE(TinyVideoUNet);

// Cosine schedule, with the EDM-style input scaling the network was trained with.
struct NoiseSchedule {
  explicit NoiseSchedule(int64_t steps) : train_steps(steps) {
    for (int64_t i = 0; i <= steps; ++i) {
      const double f = std::cos((double(i) / steps + 0.008) / 1.008 * M_PI / 2);
      alpha_bar_.push_back(f * f);
    }
  }
  double alpha_bar(int64_t t) const { return t < 0 ? 1.0 : alpha_bar_[t] / alpha_bar_[0]; }
  double input_scale(int64_t t) const { return std::sqrt(alpha_bar(t)); }
  int64_t train_steps;
  std::vector<double> alpha_bar_;
};

// Per-frame spatial contrast of a clip [B, C, T, H, W]: flicker diagnostics.
torch::Tensor frame_contrast(const torch::Tensor& clip) {
  const auto B = clip.size(0), C = clip.size(1), T = clip.size(2);
  // FACT: c = torch.randn(2, 3, 4, 5, 6); assert is_view_of(c.permute(0, 2, 1, 3, 4).reshape(2, 4, 3, 30), c)
  auto frames = clip.permute({0, 2, 1, 3, 4}).reshape({B, T, C, -1}); // LOOKALIKE: tensor-reshape-non-contiguous -- merges only H and W, which keep their strides: a view
  return frames.std(-1).mean(-1);  // [B, T]
}

torch::Tensor ddim_sample(TinyVideoUNet& net, const NoiseSchedule& sched, const torch::Tensor& text_emb,
                          const std::vector<int64_t>& shape, int64_t steps, torch::Device device,
                          std::vector<torch::Tensor>* previews = nullptr, int64_t n_previews = 4) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto B = shape[0];
  auto x = torch::randn(shape, torch::TensorOptions().device(device));
  auto ts = torch::linspace(double(sched.train_steps - 1), 0.0, steps).round().to(torch::kLong);
  auto preview_at = torch::empty({n_previews}, torch::kLong);
  preview_at.copy_(torch::linspace(0.0, double(steps - 1), n_previews)); // EXPECT: tensor-copy-narrowing
  auto ts_a = ts.accessor<int64_t, 1>();
  auto pv_a = preview_at.accessor<int64_t, 1>();
  int64_t next_preview = 0;

  for (int64_t i = 0; i < steps; ++i) {
    const int64_t t = ts_a[i];
    const int64_t t_prev = i + 1 < steps ? ts_a[i + 1] : -1;
    auto t_batch = torch::full({B}, t, torch::kLong).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new timestep tensor each step
    auto cond = text_emb.to(device); // EXPECT: tensor-clone-in-loop
    auto model_in = x.clone(); // EXPECT: tensor-unnecessary-clone
    model_in.mul_(sched.input_scale(t));
    auto eps = net->forward(model_in, t_batch, cond);

    const double a_t = sched.alpha_bar(t), a_prev = sched.alpha_bar(t_prev);
    auto x0 = (x - std::sqrt(1.0 - a_t) * eps) / std::sqrt(a_t);
    x0.clamp_(-1.0, 1.0); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded
    if (previews && next_preview < n_previews && i == pv_a[next_preview]) {
      previews->push_back(x0.cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations -- NoGradGuard: no graph to keep
      ++next_preview;
    }

    auto x_before = x;  // for the step-size monitor below
    // FACT: x = torch.randn(2, 3); xb = x; x.copy_(x * 0.5); assert shares_storage(xb, x)
    x.copy_(std::sqrt(a_prev) * x0 + std::sqrt(1.0 - a_prev) * eps); // EXPECT: tensor-alias-then-mutate
    if (i % 10 == 0) {
      auto delta = (x - x_before).abs().mean();
      std::cout << "ddim " << i << "/" << steps << " |dx| " << delta.item<float>()
                << " contrast " << frame_contrast(x0).mean().item<float>() << "\n";
    }
  }
  return x;
}

// Picks `n` evenly spaced conditioning keyframes out of a clip of `frames` frames.
torch::Tensor keyframe_indices(int64_t frames, int64_t n) {
  auto idx = torch::empty({n}, torch::kLong);
  idx.copy_(torch::linspace(0.0, double(frames - 1), n).round()); // LOOKALIKE: tensor-copy-narrowing -- rounded values are whole numbers
  return idx;
}
