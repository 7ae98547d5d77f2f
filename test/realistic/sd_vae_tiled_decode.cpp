// Stable Diffusion VAE decoding in overlapping tiles, so that 2048 x 2048 images decode within a
// fixed amount of GPU memory: latents are cut into windows, each window is decoded on its own and
// the decoded tiles are cross-faded with linear ramps over the overlaps.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct VaeConfig {
  int64_t latent_channels = 4;
  int64_t base_channels = 128;
  std::vector<int64_t> channel_mult = {1, 2, 4, 4};
  int64_t groups = 32;
};

struct TileConfig {
  int64_t tile = 64;     // latent pixels per tile side
  int64_t overlap = 16;  // latent pixels shared by neighbouring tiles
  int64_t upscale = 8;   // spatial factor of the decoder
  double scaling_factor = 0.18215;
  bool verbose = false;
};

class ResnetBlockImpl : public nn::Module {
 public:
  ResnetBlockImpl(int64_t in_ch, int64_t out_ch, int64_t groups) {
    norm1 = register_module("norm1", nn::GroupNorm(nn::GroupNormOptions(groups, in_ch).eps(1e-6)));
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 3).padding(1)));
    norm2 = register_module("norm2", nn::GroupNorm(nn::GroupNormOptions(groups, out_ch).eps(1e-6)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out_ch, out_ch, 3).padding(1)));
    if (in_ch != out_ch) nin_shortcut = register_module("nin_shortcut", nn::Conv2d(nn::Conv2dOptions(in_ch, out_ch, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = conv1(F::silu(norm1(x)));
    h = conv2(F::silu(norm2(h)));
    h += nin_shortcut ? nin_shortcut(x) : x;  // LOOKALIKE: tensor-inplace-on-saved -- a convolution does not save its output
    return h;
  }
  nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, nin_shortcut{nullptr};
};
TORCH_MODULE(ResnetBlock);

// Single-head self-attention over the pixels of the lowest-resolution feature map.
class AttnBlockImpl : public nn::Module {
 public:
  AttnBlockImpl(int64_t ch, int64_t groups) {
    norm = register_module("norm", nn::GroupNorm(nn::GroupNormOptions(groups, ch).eps(1e-6)));
    q = register_module("q", nn::Conv2d(nn::Conv2dOptions(ch, ch, 1)));
    k = register_module("k", nn::Conv2d(nn::Conv2dOptions(ch, ch, 1)));
    v = register_module("v", nn::Conv2d(nn::Conv2dOptions(ch, ch, 1)));
    proj_out = register_module("proj_out", nn::Conv2d(nn::Conv2dOptions(ch, ch, 1)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    auto h = norm(x);
    // FACT: q = torch.randn(2, 4, 3, 5); v = q.permute(0, 2, 3, 1).view(2, 15, 4); assert is_view_of(v, q)
    auto query = q(h).permute({0, 2, 3, 1}).view({B, H * W, C});  // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent and in order, so they merge
    auto key = k(h).view({B, C, H * W});
    auto value = v(h).view({B, C, H * W});
    auto w = torch::softmax(torch::bmm(query, key) / std::sqrt(static_cast<double>(C)), 2);
    auto out = torch::bmm(w, value.transpose(1, 2));  // [B, HW, C]
    // FACT: o = torch.randn(2, 12, 5); r = o.transpose(1, 2).reshape(2, 5, 3, 4); assert is_view_of(r, o)
    auto restored = out.transpose(1, 2).reshape({B, C, H, W});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the HW dim: a view
    return x + proj_out(restored);
  }
  nn::GroupNorm norm{nullptr};
  nn::Conv2d q{nullptr}, k{nullptr}, v{nullptr}, proj_out{nullptr};
};
TORCH_MODULE(AttnBlock);

class VaeDecoderImpl : public nn::Module {
 public:
  explicit VaeDecoderImpl(const VaeConfig& c) {
    int64_t ch = c.base_channels * c.channel_mult.back();
    post_quant_conv = register_module("post_quant_conv", nn::Conv2d(nn::Conv2dOptions(c.latent_channels, c.latent_channels, 1)));
    conv_in = register_module("conv_in", nn::Conv2d(nn::Conv2dOptions(c.latent_channels, ch, 3).padding(1)));
    mid1 = register_module("mid1", ResnetBlock(ch, ch, c.groups));
    mid_attn = register_module("mid_attn", AttnBlock(ch, c.groups));
    mid2 = register_module("mid2", ResnetBlock(ch, ch, c.groups));
    for (int64_t i = static_cast<int64_t>(c.channel_mult.size()) - 1; i >= 0; --i) {
      const int64_t out_ch = c.base_channels * c.channel_mult[i];
      res_blocks.push_back(register_module("up_res_" + std::to_string(i), ResnetBlock(ch, out_ch, c.groups)));
      ch = out_ch;
      if (i > 0) up_convs.push_back(register_module("up_conv_" + std::to_string(i), nn::Conv2d(nn::Conv2dOptions(ch, ch, 3).padding(1))));
    }
    norm_out = register_module("norm_out", nn::GroupNorm(nn::GroupNormOptions(c.groups, ch).eps(1e-6)));
    conv_out = register_module("conv_out", nn::Conv2d(nn::Conv2dOptions(ch, 3, 3).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    auto h = conv_in(post_quant_conv(z));
    h = mid2(mid_attn(mid1(h)));
    for (size_t i = 0; i < res_blocks.size(); ++i) {
      h = res_blocks[i](h);
      if (i < up_convs.size())
        h = up_convs[i](F::interpolate(h, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest)));
    }
    return conv_out(F::silu(norm_out(h)));
  }
  nn::Conv2d post_quant_conv{nullptr}, conv_in{nullptr}, conv_out{nullptr};
  ResnetBlock mid1{nullptr}, mid2{nullptr};
  AttnBlock mid_attn{nullptr};
  nn::GroupNorm norm_out{nullptr};
  std::vector<ResnetBlock> res_blocks;
  std::vector<nn::Conv2d> up_convs;
};
TORCH_MODULE(VaeDecoder);

// 1-D weights along one tile side: a linear ramp over the overlap on each side with a neighbour.
torch::Tensor edge_ramp(int64_t n, int64_t overlap, bool ramp_in, bool ramp_out) {
  auto w = torch::ones({n});
  const int64_t ov = std::min(overlap, n / 2);
  if (ov > 0) {
    auto up = torch::linspace(1.0 / (ov + 1), 1.0 - 1.0 / (ov + 1), ov);
    if (ramp_in) w.narrow(0, 0, ov).copy_(up);
    if (ramp_out) w.narrow(0, n - ov, ov).copy_(up.flip(0));
  }
  return w;
}

// 2-D cross-fade weights of one tile: the outer product of its row and column ramps.
torch::Tensor blend_weights(int64_t h, int64_t w, int64_t overlap, bool top, bool bottom, bool left, bool right) {
  auto wy = edge_ramp(h, overlap, top, bottom);
  auto wx = edge_ramp(w, overlap, left, right);
  // FACT: wy = torch.rand(6); m = wy.unsqueeze(1).expand(6, 5); assert raises(lambda: m.mul_(torch.rand(5)), "more than one element")
  auto weights = wy.unsqueeze(1).expand({h, w});
  weights.mul_(wx);  // EXPECT: tensor-inplace-on-expanded
  return weights;
}

class TiledVaeDecoder {
 public:
  TiledVaeDecoder(VaeDecoder vae, TileConfig cfg) : vae_(std::move(vae)), cfg_(cfg), device_(torch::kCUDA) {
    vae_->to(device_);
    vae_->eval();
  }

  // latents [B, 4, h, w] as the sampler leaves them -> image in [-1, 1], [B, 3, 8h, 8w]
  torch::Tensor decode(const torch::Tensor& latents) {
    torch::NoGradGuard no_grad;
    torch::Tensor z = latents;
    // FACT: l = torch.randn(1, 4, 8, 8); z = l; z /= 0.18215; assert shares_storage(l, z)
    if (cfg_.scaling_factor != 1.0) z /= cfg_.scaling_factor;  // EXPECT: tensor-alias-then-mutate
    z = z.to(device_);
    const int64_t B = z.size(0), H = z.size(2), W = z.size(3), f = cfg_.upscale;
    const int64_t tile = std::min({cfg_.tile, H, W});
    const int64_t ov = std::min(cfg_.overlap, tile / 2);
    const int64_t stride = tile - ov;

    auto image = torch::zeros({B, 3, H * f, W * f}, z.options());
    auto weight = torch::zeros({1, 1, H * f, W * f}, z.options());
    const auto interior = blend_weights(tile * f, tile * f, ov * f, true, true, true, true);
    double clipped = 0.0;
    int64_t n_tiles = 0;
    for (int64_t y0 = 0;; y0 += stride) {
      const int64_t ys = std::min(y0, H - tile);
      for (int64_t x0 = 0;; x0 += stride) {
        const int64_t xs = std::min(x0, W - tile);
        auto window = z.narrow(2, ys, tile).narrow(3, xs, tile).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a different window every iteration
        auto dec = vae_->forward(window);
        const bool top = ys > 0, left = xs > 0, bottom = ys + tile < H, right = xs + tile < W;
        torch::Tensor w;
        if (top && bottom && left && right) {
          w = interior.to(device_);  // EXPECT: tensor-clone-in-loop
        } else {
          w = blend_weights(tile * f, tile * f, ov * f, top, bottom, left, right).to(device_);
        }
        // FACT: d = torch.randn(1, 3, 4, 4); w = torch.rand(4, 4); o = torch.zeros(1, 3, 4, 4); o.addcmul_(d, w.expand_as(d)); assert torch.allclose(o, d * w)
        image.narrow(2, ys * f, tile * f).narrow(3, xs * f, tile * f).addcmul_(dec, w.expand_as(dec));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded weights are only read
        // FACT: o = torch.zeros(1, 1, 8, 8); o.narrow(2, 2, 4).narrow(3, 0, 4).add_(1); assert o.sum() == 16
        weight.narrow(2, ys * f, tile * f).narrow(3, xs * f, tile * f).add_(w);  // LOOKALIKE: tensor-alias-then-mutate -- writes a window of the weight map on purpose
        clipped += (dec.abs() > 1.0).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop
        ++n_tiles;
        if (cfg_.verbose) std::cout << "tile (" << ys << ", " << xs << ") std " << dec.std().item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only when verbose
        if (xs + tile >= W) break;
      }
      if (ys + tile >= H) break;
    }
    last_clip_fraction_ = clipped / static_cast<double>(std::max<int64_t>(n_tiles, 1));
    return image / weight;
  }

  double last_clip_fraction() const { return last_clip_fraction_; }

 private:
  VaeDecoder vae_;
  TileConfig cfg_;
  torch::Device device_;
  double last_clip_fraction_ = 0.0;
};

// Cheap preview while sampling: a fixed linear map from the 4 latent channels to RGB.
torch::Tensor latent_preview(const torch::Tensor& latents) {
  const torch::Device device(torch::kCUDA);
  auto z = latents.to(device);
  auto coeffs = torch::tensor({0.298f, 0.207f, 0.208f, 0.187f, 0.286f, 0.173f,
                               -0.158f, 0.189f, 0.264f, -0.184f, -0.271f, -0.473f}).view({4, 3});
  auto rgb = z.permute({0, 2, 3, 1}).matmul(coeffs);  // EXPECT: tensor-device-mismatch
  auto offset = torch::tensor({0.02f, -0.01f, 0.03f}).to(device);
  rgb = rgb + offset;  // LOOKALIKE: tensor-device-mismatch -- the offset was moved to the same device
  return rgb.permute({0, 3, 1, 2}).clamp(-1.0, 1.0);
}

// Per-channel mean and std over a batch, used to match the tiles' colours to the preview.
std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& image) {
  // FACT: o = torch.randn(2, 3, 8, 8); p = o.permute(0, 2, 3, 1).reshape(-1, 3); assert is_copy_of(p, o)
  auto pixels = image.permute({0, 2, 3, 1}).reshape({-1, image.size(1)});  // EXPECT: tensor-reshape-non-contiguous
  return {pixels.mean(0), pixels.std(0)};
}

torch::Tensor match_colors(const torch::Tensor& image, const torch::Tensor& reference) {
  auto [mu, sd] = channel_stats(image);
  auto [ref_mu, ref_sd] = channel_stats(reference);
  auto scale = (ref_sd / sd.clamp_min(1e-5)).view({1, -1, 1, 1});
  return (image - mu.view({1, -1, 1, 1})) * scale + ref_mu.view({1, -1, 1, 1});
}

// image in [-1, 1] -> uint8 [B, H, W, 3] on the host
torch::Tensor to_uint8_hwc(const torch::Tensor& image) {
  auto hwc = ((image + 1.0) / 2.0).clamp(0.0, 1.0).permute({0, 2, 3, 1}).cpu();
  auto out = torch::empty({image.size(0), image.size(2), image.size(3), 3}, torch::kByte);
  // FACT: x = torch.tensor([0.999]); o = torch.zeros(1, dtype=torch.uint8); o.copy_(x * 255.0); assert o.item() == 254
  out.copy_(hwc * 255.0);  // EXPECT: tensor-copy-narrowing
  return out;
}

// One contiguous byte buffer per image, row-major HWC, for the PNG encoder.
std::vector<std::vector<uint8_t>> pack_for_png(const torch::Tensor& image) {
  auto u8 = torch::empty(image.sizes(), torch::kByte);
  u8.copy_(((image.cpu() + 1.0) * 127.5).round().clamp(0, 255));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to 0..255 first
  auto hwc = u8.permute({0, 2, 3, 1});
  // FACT: u = torch.zeros(2, 3, 4, 5, dtype=torch.uint8); assert raises(lambda: u.permute(0, 2, 3, 1).view(2, -1), "view size is not compatible")
  auto flat = hwc.view({u8.size(0), -1});  // EXPECT: tensor-view-non-contiguous
  std::vector<std::vector<uint8_t>> buffers;
  for (int64_t b = 0; b < flat.size(0); ++b) {
    auto row = flat[b];
    buffers.emplace_back(row.data_ptr<uint8_t>(), row.data_ptr<uint8_t>() + row.numel());
  }
  return buffers;
}

torch::Tensor decode_to_image(TiledVaeDecoder& decoder, const torch::Tensor& latents, bool color_match) {
  auto image = decoder.decode(latents);
  if (color_match) image = match_colors(image, F::interpolate(latent_preview(latents),
      F::InterpolateFuncOptions().scale_factor(std::vector<double>{8.0, 8.0}).mode(torch::kBilinear).align_corners(false)));
  if (decoder.last_clip_fraction() > 0.05)
    std::cerr << "warning: " << 100.0 * decoder.last_clip_fraction() << "% of decoded values out of range\n";
  return to_uint8_hwc(image);
}
