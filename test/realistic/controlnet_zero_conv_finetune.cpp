// ControlNet-style fine-tuning of a latent-diffusion UNet: the base encoder/decoder is locked,
// a trainable copy of the encoder reads a conditioning image and feeds the base through
// zero-initialised 1x1 convolutions. Trained with gradient accumulation and an EMA of the copy.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;
using torch::Tensor;

struct ControlNetConfig {
  int64_t latent_channels = 4, time_dim = 1280, hint_channels = 3, timesteps = 1000, grad_accum = 4;
  std::vector<int64_t> channels = {320, 640, 1280};
  double beta_start = 0.00085, beta_end = 0.012;
  double lr = 1e-5, ema_decay = 0.9999, control_scale = 1.0;
};

Tensor timestep_embedding(const Tensor& t, int64_t dim) {
  const int64_t half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, t.options().dtype(torch::kFloat)) * (-std::log(10000.0) / half));
  auto args = t.to(torch::kFloat).unsqueeze(1) * freqs.unsqueeze(0);
  return torch::cat({torch::cos(args), torch::sin(args)}, -1);
}

nn::Conv2d zero_conv(int64_t in_c, int64_t out_c) {
  auto conv = nn::Conv2d(nn::Conv2dOptions(in_c, out_c, 1));
  nn::init::zeros_(conv->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under its own no-grad guard
  conv->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  return conv;
}

class ResBlockImpl : public nn::Module {
 public:
  ResBlockImpl(int64_t in_c, int64_t out_c, int64_t time_dim) {
    norm1_ = register_module("norm1", nn::GroupNorm(32, in_c));
    conv1_ = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in_c, out_c, 3).padding(1)));
    emb_proj_ = register_module("emb_proj", nn::Linear(time_dim, out_c));
    norm2_ = register_module("norm2", nn::GroupNorm(32, out_c));
    conv2_ = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out_c, out_c, 3).padding(1)));
    if (in_c != out_c) skip_ = register_module("skip", nn::Conv2d(nn::Conv2dOptions(in_c, out_c, 1)));
  }

  Tensor forward(const Tensor& x, const Tensor& emb) {
    auto h = conv1_(F::silu(norm1_(x)));
    h += emb_proj_(F::silu(emb)).unsqueeze(-1).unsqueeze(-1);
    h = conv2_(F::silu(norm2_(h)));
    return (skip_ ? skip_(x) : x) + h;
  }

 private:
  nn::GroupNorm norm1_{nullptr}, norm2_{nullptr};
  nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, skip_{nullptr};
  nn::Linear emb_proj_{nullptr};
};
TORCH_MODULE(ResBlock);

// Encoder half of the UNet: conv_in, one ResBlock per level (+ downsampling), middle block.
class UNetEncoderImpl : public nn::Module {
 public:
  explicit UNetEncoderImpl(const ControlNetConfig& cfg) : cfg_(cfg) {
    const auto& ch = cfg.channels;
    time_mlp_ = register_module("time_mlp", nn::Sequential(nn::Linear(ch[0], cfg.time_dim), nn::SiLU(),
                                                          nn::Linear(cfg.time_dim, cfg.time_dim)));
    conv_in_ = register_module("conv_in", nn::Conv2d(nn::Conv2dOptions(cfg.latent_channels, ch[0], 3).padding(1)));
    int64_t prev = ch[0];
    for (size_t i = 0; i < ch.size(); ++i) {
      res_.push_back(register_module("res_" + std::to_string(i), ResBlock(prev, ch[i], cfg.time_dim)));
      if (i + 1 < ch.size())
        down_.push_back(register_module("down_" + std::to_string(i),
                                        nn::Conv2d(nn::Conv2dOptions(ch[i], ch[i], 3).stride(2).padding(1))));
      prev = ch[i];
    }
    mid_ = register_module("mid", ResBlock(prev, prev, cfg.time_dim));
  }

  Tensor time_embed(const Tensor& t) { return time_mlp_->forward(timestep_embedding(t, cfg_.channels[0])); }

  Tensor forward(const Tensor& x, const Tensor& emb, std::vector<Tensor>& skips, const Tensor& guided = {}) {
    auto h = conv_in_(x);
    if (guided.defined()) h += guided;  // LOOKALIKE: tensor-inplace-on-saved -- a conv output; the conv saved only its input
    for (size_t i = 0; i < res_.size(); ++i) {
      h = res_[i](h, emb);
      skips.push_back(h);
      if (i < down_.size()) h = down_[i](h);
    }
    return mid_(h, emb);
  }

 private:
  ControlNetConfig cfg_;
  nn::Sequential time_mlp_{nullptr};
  nn::Conv2d conv_in_{nullptr};
  std::vector<ResBlock> res_;
  std::vector<nn::Conv2d> down_;
  ResBlock mid_{nullptr};
};
TORCH_MODULE(UNetEncoder);

// Conditioning image (edges, depth, pose) at pixel resolution -> features at latent resolution.
class HintEncoderImpl : public nn::Module {
 public:
  HintEncoderImpl(int64_t hint_channels, int64_t out_c) {
    const std::vector<int64_t> widths = {16, 32, 96, 256};
    int64_t prev = hint_channels;
    for (size_t i = 0; i < widths.size(); ++i) {
      const int64_t stride = i == 0 ? 1 : 2;
      convs_.push_back(register_module("conv_" + std::to_string(i),
                                       nn::Conv2d(nn::Conv2dOptions(prev, widths[i], 3).stride(stride).padding(1))));
      prev = widths[i];
    }
    out_ = register_module("out", zero_conv(prev, out_c));
  }

  Tensor forward(const Tensor& hint) {
    auto h = hint;
    for (auto& conv : convs_) {
      h = conv(h);
      // SiLU without a second activation buffer.
      auto act = torch::sigmoid(h);
      act.mul_(h);  // EXPECT: tensor-inplace-on-saved
      h = act;
    }
    return out_(h);
  }

 private:
  std::vector<nn::Conv2d> convs_;
  nn::Conv2d out_{nullptr};
};
TORCH_MODULE(HintEncoder);

class ControlledUNetImpl : public nn::Module {
 public:
  explicit ControlledUNetImpl(const ControlNetConfig& cfg) : cfg_(cfg) {
    const auto& ch = cfg.channels;
    base_enc_ = register_module("base_enc", UNetEncoder(cfg));
    control_ = register_module("control", UNetEncoder(cfg));
    hint_ = register_module("hint", HintEncoder(cfg.hint_channels, ch[0]));
    for (size_t i = 0; i < ch.size(); ++i)
      zero_convs_.push_back(register_module("zero_" + std::to_string(i), zero_conv(ch[i], ch[i])));
    mid_zero_ = register_module("mid_zero", zero_conv(ch.back(), ch.back()));
    for (int64_t i = static_cast<int64_t>(ch.size()) - 1; i >= 0; --i) {
      const int64_t in_c = (i + 1 < static_cast<int64_t>(ch.size()) ? ch[i + 1] : ch[i]) + ch[i];
      up_.insert(up_.begin(), register_module("up_" + std::to_string(i), ResBlock(in_c, ch[i], cfg.time_dim)));
    }
    out_norm_ = register_module("out_norm", nn::GroupNorm(32, ch[0]));
    conv_out_ = register_module("conv_out", nn::Conv2d(nn::Conv2dOptions(ch[0], cfg.latent_channels, 3).padding(1)));
  }

  // The base UNet is locked; the control copy starts from its weights.
  void init_control_from_base() {
    torch::NoGradGuard no_grad;
    auto dst = control_->named_parameters();
    for (const auto& item : base_enc_->named_parameters())
      if (auto* p = dst.find(item.key())) p->copy_(item.value());  // LOOKALIKE: tensor-inplace-on-leaf -- weight copy under NoGradGuard
    for (auto& p : base_enc_->parameters()) p.set_requires_grad(false);
    for (auto& blk : up_)
      for (auto& p : blk->parameters()) p.set_requires_grad(false);
    for (auto& p : out_norm_->parameters()) p.set_requires_grad(false);
    for (auto& p : conv_out_->parameters()) p.set_requires_grad(false);
  }

  std::vector<Tensor> trainable_parameters() {
    std::vector<Tensor> out;
    for (auto& p : parameters())
      if (p.requires_grad()) out.push_back(p);
    return out;
  }

  Tensor forward(const Tensor& x, const Tensor& t, const Tensor& hint) {
    // Trainable copy: control residuals through the zero convs.
    std::vector<Tensor> feats;
    auto c_mid = control_->forward(x, control_->time_embed(t), feats, hint_(hint));
    std::vector<Tensor> ctrl;
    for (size_t i = 0; i < feats.size(); ++i) {
      auto r = zero_convs_[i](feats[i]);
      r.mul_(cfg_.control_scale);  // LOOKALIKE: tensor-inplace-on-saved -- a conv output; the conv saved only its input
      ctrl.push_back(r);
    }
    // Locked encoder: nothing to differentiate there.
    std::vector<Tensor> skips;
    Tensor emb, h;
    {
      torch::NoGradGuard no_grad;
      emb = base_enc_->time_embed(t);
      h = base_enc_->forward(x, emb, skips);
    }
    h = h + mid_zero_(c_mid) * cfg_.control_scale;
    for (int64_t i = static_cast<int64_t>(up_.size()) - 1; i >= 0; --i) {
      h = up_[i](torch::cat({h, skips[i] + ctrl[i]}, 1), emb);
      if (i > 0) h = F::interpolate(h, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    }
    return conv_out_(F::silu(out_norm_(h)));
  }

 private:
  ControlNetConfig cfg_;
  UNetEncoder base_enc_{nullptr}, control_{nullptr};
  HintEncoder hint_{nullptr};
  std::vector<nn::Conv2d> zero_convs_;
  nn::Conv2d mid_zero_{nullptr}, conv_out_{nullptr};
  std::vector<ResBlock> up_;
  nn::GroupNorm out_norm_{nullptr};
};
TORCH_MODULE(ControlledUNet);

struct NoiseSchedule {
  Tensor sqrt_ac, sqrt_1m_ac;  // [T] float32, host
  explicit NoiseSchedule(const ControlNetConfig& cfg) {
    auto betas = torch::linspace(std::sqrt(cfg.beta_start), std::sqrt(cfg.beta_end), cfg.timesteps, torch::kFloat64);
    auto ac = torch::cumprod(1.0 - betas.pow(2), 0);
    sqrt_ac = ac.sqrt().to(torch::kFloat);
    sqrt_1m_ac = (1.0 - ac).sqrt().to(torch::kFloat);
  }
};

class EmaWeights {
 public:
  EmaWeights(const std::vector<Tensor>& params, double decay) : decay_(decay) {
    for (const auto& p : params) shadow_.push_back(p.detach().clone());
  }
  void update(const std::vector<Tensor>& params) {
    torch::NoGradGuard no_grad;
    ++updates_;
    const double d = std::min(decay_, (1.0 + updates_) / (10.0 + updates_));
    for (size_t i = 0; i < params.size(); ++i) shadow_[i].mul_(d).add_(params[i].detach(), 1.0 - d);
  }
  void copy_to(const std::vector<Tensor>& params) const {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i)
      params[i].detach().copy_(shadow_[i]);  // LOOKALIKE: tensor-inplace-on-detached -- a direct chain under no-grad, meant to write the parameter
  }

 private:
  double decay_;
  int64_t updates_ = 0;
  std::vector<Tensor> shadow_;
};

// Edge maps arrive from the image decoder as uint8 [B, 3, H, W].
Tensor preprocess_hint(const Tensor& edge_u8) {
  TORCH_CHECK(edge_u8.scalar_type() == torch::kByte, "hint must be uint8");
  auto hint = edge_u8.to(torch::kFloat);
  // FACT: e = torch.zeros(2, 3, 4, 4, dtype=torch.uint8); h = e.to(torch.float32); assert is_copy_of(h, e)
  hint.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- the input is asserted uint8, so to(kFloat) makes a new tensor
  return hint;
}

struct Sample {
  Tensor latents;  // [B, 4, h, w], already scaled
  Tensor hint;     // [B, 3, 8h, 8w] uint8
};

void train_controlnet(ControlledUNet& model, const std::vector<Sample>& data, const ControlNetConfig& cfg, int epochs) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->init_control_from_base();
  NoiseSchedule sched(cfg);
  auto params = model->trainable_parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.0));
  EmaWeights ema(params, cfg.ema_decay);
  int64_t micro = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double epoch_loss = 0.0;
    auto window_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto& s : data) {
      auto latents = s.latents.to(device);
      auto hint = preprocess_hint(s.hint).to(device);
      const int64_t B = latents.size(0);
      auto t = torch::randint(0, cfg.timesteps, {B}, torch::kLong);
      auto noise = torch::randn_like(latents);
      auto coef_signal = sched.sqrt_ac.index_select(0, t).view({-1, 1, 1, 1});
      auto coef_noise = sched.sqrt_1m_ac.index_select(0, t).view({-1, 1, 1, 1}).to(device);  // LOOKALIKE: tensor-clone-in-loop -- gathered at new random timesteps every step
      auto noisy = coef_signal * latents + coef_noise * noise;  // EXPECT: tensor-device-mismatch
      auto target = noise.clone();  // EXPECT: tensor-unnecessary-clone
      auto pred = model->forward(noisy, t.to(device), hint);
      auto loss = F::mse_loss(pred, target) / static_cast<double>(cfg.grad_accum);
      loss.backward();
      window_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph kept
      epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      if (++micro % cfg.grad_accum == 0) {
        nn::utils::clip_grad_norm_(params, 1.0);
        opt.step();
        opt.zero_grad();
        ema.update(params);
        std::cout << "update " << micro / cfg.grad_accum << " loss " << window_loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- once per optimizer update, under the condition
        window_loss.zero_();
      }
    }
    std::cout << "epoch " << epoch << " mean loss " << epoch_loss * cfg.grad_accum / data.size() << "\n";
  }
  ema.copy_to(params);
}

double validate(ControlledUNet& model, const std::vector<Sample>& val, const NoiseSchedule& sched) {
  torch::Device device(torch::kCUDA);
  model->eval();
  const auto& first = val.front().latents;
  auto fixed_noise = torch::randn(first.sizes());  // same noise for every preview
  const int64_t t_mid = sched.sqrt_ac.size(0) / 2;
  const double a = sched.sqrt_ac[t_mid].item<double>();
  const double s = sched.sqrt_1m_ac[t_mid].item<double>();
  auto t = torch::full({first.size(0)}, t_mid, torch::TensorOptions().dtype(torch::kLong).device(device));
  std::vector<Tensor> losses;
  for (const auto& v : val) {
    auto noise = fixed_noise.to(device);  // EXPECT: tensor-clone-in-loop
    auto latents = v.latents.to(device);
    auto pred = model->forward(latents * a + noise * s, t, preprocess_hint(v.hint).to(device));
    losses.push_back(F::mse_loss(pred, noise));  // EXPECT: tensor-graph-kept-across-iterations
  }
  return torch::stack(losses).mean().item<double>();
}
