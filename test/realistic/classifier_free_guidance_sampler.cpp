// Text-to-image sampling for a small latent diffusion model (the C++ inference service of an
// asset-generation tool). A transformer text encoder turns token ids into a context sequence; the
// empty prompt gives the unconditional context. Each step runs the conditional and unconditional
// halves as one batch of 2B through the half-precision denoiser and mixes them with classifier-
// free guidance (one scale per prompt, plus the std rescale of Lin et al. 2023). Two samplers:
// deterministic DDIM over evenly spaced timesteps, and Euler/Heun in sigma space. The latents are
// decoded by the VAE decoder into 8-bit RGB, tiled into a contact sheet and written as PPM files.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace nn = torch::nn;

struct SamplerConfig {
  int64_t vocab = 49408, max_len = 77, text_dim = 512, text_layers = 6, pad_id = 0;
  int64_t latent_channels = 4, latent_size = 64, width = 320, heads = 8;
  int64_t train_steps = 1000, steps = 50, grid_cols = 4;
  double beta_start = 0.00085, beta_end = 0.012, latent_scale = 0.18215, guidance_rescale = 0.7;
  std::vector<double> guidance = {7.5, 7.5, 7.5, 7.5}; // one per prompt
  bool euler = true, heun = true;
};

torch::Tensor timestep_embedding(const torch::Tensor &t, int64_t dim) {
  const auto half = dim / 2;
  auto freqs = torch::exp(torch::arange(half, t.options()) * (-std::log(10000.0) / static_cast<double>(half)));
  auto args = t.unsqueeze(1) * freqs.unsqueeze(0); // LOOKALIKE: tensor-device-mismatch -- freqs is made with t's options, on t's device
  return torch::cat({torch::cos(args), torch::sin(args)}, 1);
}

struct TextEncoderImpl : nn::Module {
  explicit TextEncoderImpl(const SamplerConfig &c) {
    tok = register_module("tok", nn::Embedding(c.vocab, c.text_dim));
    pos = register_parameter("pos", torch::zeros({1, c.max_len, c.text_dim}));
    auto layer = nn::TransformerEncoderLayerOptions(c.text_dim, 8).dim_feedforward(4 * c.text_dim).activation(torch::kGELU);
    encoder = register_module("encoder", nn::TransformerEncoder(nn::TransformerEncoderOptions(layer, c.text_layers)));
    ln = register_module("ln", nn::LayerNorm(nn::LayerNormOptions({c.text_dim})));
  }
  torch::Tensor forward(const torch::Tensor &ids) { // [B, L] -> [B, L, D]
    auto h = tok(ids) + pos.narrow(1, 0, ids.size(1));
    h = encoder(h.transpose(0, 1)).transpose(0, 1); // the encoder is sequence-first
    return ln(h);
  }
  nn::Embedding tok{nullptr};
  nn::TransformerEncoder encoder{nullptr};
  nn::LayerNorm ln{nullptr};
  torch::Tensor pos;
};
TORCH_MODULE(TextEncoder);

struct ResBlockImpl : nn::Module {
  ResBlockImpl(int64_t ch, int64_t temb_dim) {
    norm1 = register_module("norm1", nn::GroupNorm(32, ch));
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1)));
    temb_proj = register_module("temb_proj", nn::Linear(temb_dim, ch));
    norm2 = register_module("norm2", nn::GroupNorm(32, ch));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &temb) {
    auto h = conv1(torch::silu(norm1(x)));
    // FACT: c = torch.nn.Conv2d(4, 4, 3, padding=1); x = torch.randn(2, 4, 5, 5); h = c(x); h.add_(torch.randn(2, 4, 1, 1)); h.sum().backward(); assert c.weight.grad is not None
    h.add_(temb_proj(torch::silu(temb)).unsqueeze(-1).unsqueeze(-1)); // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input, not its output
    h = conv2(torch::silu(norm2(h)));
    return x + h;
  }
  nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::Linear temb_proj{nullptr};
};
TORCH_MODULE(ResBlock);

// Spatial tokens attend to the text context.
struct CrossAttentionImpl : nn::Module {
  CrossAttentionImpl(int64_t ch, int64_t ctx_dim, int64_t heads) : heads_(heads) {
    norm = register_module("norm", nn::GroupNorm(32, ch));
    to_q = register_module("to_q", nn::Linear(nn::LinearOptions(ch, ch).bias(false)));
    to_k = register_module("to_k", nn::Linear(nn::LinearOptions(ctx_dim, ch).bias(false)));
    to_v = register_module("to_v", nn::Linear(nn::LinearOptions(ctx_dim, ch).bias(false)));
    to_out = register_module("to_out", nn::Linear(ch, ch));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &ctx) {
    const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), L = ctx.size(1);
    const auto dh = C / heads_;
    auto tokens = norm(x).flatten(2).transpose(1, 2); // [B, HW, C]
    // FACT: l = torch.nn.Linear(8, 8, bias=False); t = torch.randn(2, 8, 6).transpose(1, 2); q = l(t); assert is_contiguous(q) and is_view_of(q.view(2, 6, 2, 4), q)
    auto q = to_q(tokens).view({B, H * W, heads_, dh}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- Linear writes a fresh contiguous output even for transposed tokens
    auto k = to_k(ctx).view({B, L, heads_, dh}).transpose(1, 2);
    auto v = to_v(ctx).view({B, L, heads_, dh}).transpose(1, 2);
    auto attn = torch::softmax(q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(dh)), -1);
    // FACT: o = torch.randn(2, 4, 6, 8); r = o.transpose(1, 2).reshape(2, 6, 32); assert is_copy_of(r, o)
    auto out = attn.matmul(v).transpose(1, 2).reshape({B, H * W, C}); // EXPECT: tensor-reshape-non-contiguous -- heads and head dims are apart after the transpose: a full copy in every attention call of every step
    out = to_out(out);
    // FACT: o = torch.randn(2, 12, 8); t = o.transpose(1, 2); assert not is_contiguous(t) and is_view_of(t.view(2, 8, 3, 4), o)
    return x + out.transpose(1, 2).view({B, C, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- only the token dim is split: strides express it
  }
  int64_t heads_;
  nn::GroupNorm norm{nullptr};
  nn::Linear to_q{nullptr}, to_k{nullptr}, to_v{nullptr}, to_out{nullptr};
};
TORCH_MODULE(CrossAttention);

struct DenoiserImpl : nn::Module {
  explicit DenoiserImpl(const SamplerConfig &c) : width_(c.width) {
    const auto temb = 4 * c.width;
    time_mlp = register_module("time_mlp", nn::Sequential(nn::Linear(c.width, temb), nn::SiLU(), nn::Linear(temb, temb)));
    conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dOptions(c.latent_channels, c.width, 3).padding(1)));
    res1 = register_module("res1", ResBlock(c.width, temb));
    attn = register_module("attn", CrossAttention(c.width, c.text_dim, c.heads));
    res2 = register_module("res2", ResBlock(c.width, temb));
    norm_out = register_module("norm_out", nn::GroupNorm(32, c.width));
    conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dOptions(c.width, c.latent_channels, 3).padding(1)));
  }
  // Noise prediction for latents [N, 4, h, w] at timesteps [N] under contexts [N, L, D].
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &t, const torch::Tensor &ctx) {
    auto temb = time_mlp->forward(timestep_embedding(t, width_));
    auto h = res1(conv_in(x), temb);
    h = res2(attn(h, ctx), temb);
    return conv_out(torch::silu(norm_out(h)));
  }
  int64_t width_;
  nn::Sequential time_mlp{nullptr};
  nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  ResBlock res1{nullptr}, res2{nullptr};
  CrossAttention attn{nullptr};
  nn::GroupNorm norm_out{nullptr};
};
TORCH_MODULE(Denoiser);

class GuidedSampler {
public:
  GuidedSampler(Denoiser unet, TextEncoder text, nn::Sequential decoder, const SamplerConfig &cfg)
      : unet_(std::move(unet)), text_(std::move(text)), decoder_(std::move(decoder)), cfg_(cfg), device_(torch::kCUDA) {
    opts_ = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    unet_->to(device_, torch::kHalf);
    decoder_->to(device_, torch::kHalf);
    text_->to(device_);
    auto betas = torch::linspace(std::sqrt(cfg.beta_start), std::sqrt(cfg.beta_end), cfg.train_steps, torch::kDouble).pow(2);
    alphas_cumprod_ = (1.0 - betas).cumprod(0); // host schedule, float64
  }

  // Contexts [P, L, D] for P prompts of token ids (the tokenizer adds BOS/EOS).
  torch::Tensor encode_prompts(const std::vector<std::vector<int64_t>> &prompts) {
    torch::NoGradGuard no_grad;
    text_->eval();
    std::vector<torch::Tensor> embs;
    for (const auto &ids : prompts) {
      const auto n = std::min<int64_t>(static_cast<int64_t>(ids.size()), cfg_.max_len);
      auto tok = torch::full({1, cfg_.max_len}, cfg_.pad_id, torch::kLong);
      // FACT: t = torch.full((1, 6), 0, dtype=torch.long); t.narrow(1, 0, 3).copy_(torch.tensor([49406, 320, 49407])); assert t.dtype == torch.long and t[0, :3].tolist() == [49406, 320, 49407]
      tok.narrow(1, 0, n).copy_(torch::tensor(std::vector<int64_t>(ids.begin(), ids.begin() + n))); // LOOKALIKE: tensor-copy-narrowing -- int64 ids into an int64 row
      embs.push_back(text_->forward(tok.to(device_))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph is recorded
    }
    return torch::cat(embs);
  }

  // Mixes the conditional and unconditional halves of eps [2B, ...] with scales [B, 1, 1, 1].
  torch::Tensor guide(const torch::Tensor &eps, const torch::Tensor &scales) const {
    const auto B = eps.size(0) / 2;
    auto eps_c = eps.narrow(0, 0, B), eps_u = eps.narrow(0, B, B);
    auto guided = eps_c;
    // FACT: e = torch.randn(4, 2, 3, 3); c, u = e.narrow(0, 0, 2), e.narrow(0, 2, 2); g = c; g.sub_(u).mul_(7.5).add_(u); assert shares_storage(g, c) and torch.equal(g, c)
    guided.sub_(eps_u).mul_(scales).add_(eps_u); // EXPECT: tensor-alias-then-mutate -- guided is eps_c: the rescale below reads the guided values as the conditional ones
    if (cfg_.guidance_rescale > 0) {
      auto std_c = eps_c.std({1, 2, 3}, /*unbiased=*/true, /*keepdim=*/true);
      auto std_g = guided.std({1, 2, 3}, /*unbiased=*/true, /*keepdim=*/true);
      guided = cfg_.guidance_rescale * guided * (std_c / std_g) + (1.0 - cfg_.guidance_rescale) * guided;
    }
    return guided;
  }

  torch::Tensor sample_ddim(torch::Tensor latents, const torch::Tensor &context, const torch::Tensor &scales) {
    const auto B = latents.size(0);
    const auto stride = cfg_.train_steps / cfg_.steps;
    const auto t_start = stride * (cfg_.steps - 1);
    auto t_in = torch::full({1}, static_cast<double>(t_start), opts_.dtype(torch::kHalf)).expand({2 * B});
    for (int64_t t = t_start, i = 0; t >= 0; t -= stride, ++i) {
      const double a_t = alphas_cumprod_[t].item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the schedule is a host tensor
      const double a_prev = t - stride >= 0 ? alphas_cumprod_[t - stride].item<double>() : 1.0;
      auto x_in = torch::cat({latents, latents}).to(torch::kHalf); // LOOKALIKE: tensor-clone-in-loop -- the latents change every step
      auto ctx_in = context.to(torch::kHalf); // EXPECT: tensor-clone-in-loop -- the same context is converted to half precision at every step
      auto eps = guide(unet_->forward(x_in, t_in, ctx_in).to(torch::kFloat), scales);
      auto x0 = latents.clone(); // EXPECT: tensor-unnecessary-clone -- clone then rewrite: (latents - eps * c) / s is one pass
      x0.sub_(eps, std::sqrt(1.0 - a_t)).div_(std::sqrt(a_t));
      latents = x0 * std::sqrt(a_prev) + eps * std::sqrt(1.0 - a_prev);
      std::cout << "ddim " << i + 1 << "/" << cfg_.steps << " t=" << t << " x0 std " << x0.std().item<float>() << "\n"; // EXPECT: tensor-sync-in-loop -- a GPU wait every step for a progress line
      // FACT: t = torch.full((1,), 980.0).expand(4); assert raises(lambda: t.sub_(20), "more than one element of the written-to tensor refers to a single memory location")
      t_in.sub_(stride); // EXPECT: tensor-inplace-on-expanded -- all 2B timesteps are one element: PyTorch refuses the write
    }
    return latents;
  }

  torch::Tensor sample_euler(const torch::Tensor &noise, const torch::Tensor &context, const torch::Tensor &scales) {
    const auto B = noise.size(0);
    auto ts = torch::linspace(cfg_.train_steps - 1, 0, cfg_.steps, torch::kDouble).round().to(torch::kLong);
    auto sigmas = ((1.0 - alphas_cumprod_) / alphas_cumprod_).sqrt().index_select(0, ts);
    sigmas = torch::cat({sigmas, torch::zeros({1}, torch::kDouble)});
    auto ctx_half = context.to(torch::kHalf);
    auto t_in = torch::empty({1}, opts_.dtype(torch::kHalf)).expand({2 * B});
    auto eps_at = [&](const torch::Tensor &x, double sigma, double t) {
      // FACT: t = torch.empty(1).expand(4); t.fill_(981.0); assert t.tolist() == [981.0] * 4 and t.stride() == (0,)
      t_in.fill_(t); // LOOKALIKE: tensor-inplace-on-expanded -- fill_ writes one value everywhere: PyTorch accepts it
      auto x_in = torch::cat({x, x}) / std::sqrt(sigma * sigma + 1.0);
      return guide(unet_->forward(x_in.to(torch::kHalf), t_in, ctx_half).to(torch::kFloat), scales);
    };
    // FACT: n = torch.randn(1, 4, 3, 3).expand(2, -1, -1, -1); x = n * 14.6; x.add_(torch.randn(2, 4, 3, 3), alpha=-0.3); assert is_copy_of(x, n) and 0 not in x.stride()
    auto x = noise * sigmas[0].item<double>();
    for (int64_t i = 0; i < cfg_.steps; ++i) {
      const double sigma = sigmas[i].item<double>(), sigma_next = sigmas[i + 1].item<double>();
      const double dt = sigma_next - sigma;
      auto d = eps_at(x, sigma, ts[i].item<double>());
      if (cfg_.heun && sigma_next > 0) {
        auto x_start = x.clone(); // LOOKALIKE: tensor-unnecessary-clone -- x is stepped in place below while the start point is still needed
        x.add_(d, dt);
        auto d2 = eps_at(x, sigma_next, ts[i + 1].item<double>());
        x = x_start + (d + d2) * (0.5 * dt);
      } else {
        x.add_(d, dt); // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-expanded -- x came out of noise * sigma: a full tensor of its own, not the shared noise
      }
    }
    return x;
  }

  // Latents [B, 4, h, w] -> [B, H, W, 3] uint8 in pinned host memory.
  torch::Tensor decode_to_uint8(const torch::Tensor &latents) {
    torch::NoGradGuard no_grad;
    auto img = decoder_->forward((latents / cfg_.latent_scale).to(torch::kHalf)).to(torch::kFloat);
    auto hwc = img.clamp(-1.0, 1.0).add(1.0).mul(127.5).permute({0, 2, 3, 1});
    auto out = torch::empty(hwc.sizes(), torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
    // FACT: o = torch.empty(3, dtype=torch.uint8); o.copy_(torch.tensor([254.9, 127.5, 0.6])); assert o.tolist() == [254, 127, 0]
    out.copy_(hwc); // EXPECT: tensor-copy-narrowing -- float to uint8 truncates: every pixel rounds down
    return out;
  }

  // Quick RGB preview of latents without the decoder (a fixed linear map), into the buffer the
  // UI thread reads.
  const torch::Tensor &preview(const torch::Tensor &latents, const torch::Tensor &latent_rgb) {
    auto rgb = torch::einsum("bchw,cr->bhwr", {latents, latent_rgb.to(device_)});
    auto bytes = ((rgb.clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch::kByte).cpu();
    if (!preview_buf_.defined() || preview_buf_.sizes() != bytes.sizes())
      preview_buf_ = torch::empty(bytes.sizes(), torch::kByte);
    preview_buf_.copy_(bytes); // LOOKALIKE: tensor-copy-narrowing -- bytes into bytes: the conversion was explicit
    return preview_buf_;
  }

  std::vector<torch::Tensor> generate(const std::vector<std::vector<int64_t>> &prompts, uint64_t seed, bool euler) {
    torch::NoGradGuard no_grad;
    torch::manual_seed(seed);
    const auto B = static_cast<int64_t>(prompts.size());
    auto cond = encode_prompts(prompts);
    auto uncond = encode_prompts({std::vector<int64_t>{}});
    auto context = torch::cat({cond, uncond.expand({B, -1, -1})});
    auto scales = torch::tensor(cfg_.guidance, opts_).narrow(0, 0, B).view({B, 1, 1, 1}); // LOOKALIKE: tensor-device-mismatch -- the scales are made with the device options
    auto noise = torch::randn({B, cfg_.latent_channels, cfg_.latent_size, cfg_.latent_size}, opts_);
    auto latents = euler ? sample_euler(noise, context, scales) : sample_ddim(noise, context, scales);
    auto images = decode_to_uint8(latents);
    return images.unbind(0);
  }

private:
  Denoiser unet_;
  TextEncoder text_;
  nn::Sequential decoder_;
  SamplerConfig cfg_;
  torch::Device device_;
  torch::TensorOptions opts_;
  torch::Tensor alphas_cumprod_, preview_buf_;
};

// Tiles B images [H, W, 3] into a rows x cols contact sheet.
torch::Tensor contact_sheet(const std::vector<torch::Tensor> &images, int64_t cols) {
  auto imgs = torch::stack(images); // [B, H, W, 3]
  const auto B = imgs.size(0), H = imgs.size(1), W = imgs.size(2);
  const auto rows = B / cols;
  // FACT: s = torch.stack([torch.zeros(5, 7, 3, dtype=torch.uint8)] * 6); assert is_view_of(s.view(2, 3, 5, 7, 3), s)
  auto tiles = imgs.narrow(0, 0, rows * cols).view({rows, cols, H, W, 3}); // LOOKALIKE: tensor-view-non-contiguous -- stack output is contiguous, narrow keeps whole images
  // FACT: t = torch.zeros(2, 3, 5, 7, 3, dtype=torch.uint8); assert raises(lambda: t.permute(0, 2, 1, 3, 4).view(10, 21, 3), "view size is not compatible")
  return tiles.permute({0, 2, 1, 3, 4}).view({rows * H, cols * W, 3}); // EXPECT: tensor-view-non-contiguous -- after the permute neither rows*H nor cols*W is one stride: it throws
}

void write_ppm(const std::string &path, const torch::Tensor &img) { // [H, W, 3] uint8
  auto c = img.contiguous();
  FILE *f = std::fopen(path.c_str(), "wb");
  if (!f)
    return;
  std::fprintf(f, "P6\n%lld %lld\n255\n", static_cast<long long>(c.size(1)), static_cast<long long>(c.size(0)));
  std::fwrite(c.data_ptr<uint8_t>(), 1, static_cast<size_t>(c.numel()), f);
  std::fclose(f);
}

void render_prompts(GuidedSampler &sampler, const std::vector<std::vector<int64_t>> &prompts, uint64_t seed,
                    const SamplerConfig &cfg, const std::string &out_dir) {
  auto images = sampler.generate(prompts, seed, cfg.euler);
  for (size_t i = 0; i < images.size(); ++i)
    write_ppm(out_dir + "/sample_" + std::to_string(i) + ".ppm", images[i]);
  if (static_cast<int64_t>(images.size()) >= cfg.grid_cols)
    write_ppm(out_dir + "/sheet.ppm", contact_sheet(images, cfg.grid_cols));
}
