// Latent diffusion x8 super-resolution: the high-res image is diffused in the latent
// space of a frozen f=4 autoencoder, conditioned on the low-res image upsampled to
// the latent grid and noise-augmented to a random level (cf. the SD x4 upscaler).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

namespace sr {

namespace F = torch::nn::functional;
constexpr double kLatentScale = 0.18215;

struct Config {
  int64_t timesteps = 1000, max_noise_level = 350, infer_noise_level = 20;
  int64_t latent_ch = 4, width = 128, heads = 8, ddim_steps = 50, decode_tile = 32;
  int64_t epochs = 40, batch_size = 8, log_every = 50;
  double lr = 1e-4, cond_drop = 0.1, guidance = 3.0;
  std::string vae_path = "vae_f4.pt", pairs_path = "div2k_pairs.pt";
};

struct Schedule {
  torch::Tensor sqrt_ab, sqrt_one_minus_ab;
  Schedule(int64_t T, torch::Device device) {
    auto betas = torch::linspace(std::sqrt(0.00085), std::sqrt(0.012), T, torch::kFloat64).pow(2);
    auto ab = torch::cumprod(1 - betas, 0);
    sqrt_ab = ab.sqrt().to(device, torch::kFloat32);
    sqrt_one_minus_ab = (1 - ab).sqrt().to(device, torch::kFloat32);
  }
};

torch::Tensor extract(const torch::Tensor& coef, const torch::Tensor& idx) {
  return coef.index_select(0, idx).view({-1, 1, 1, 1});
}

torch::Tensor space_to_depth(const torch::Tensor& x, int64_t r) {
  const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  // FACT: x = torch.randn(1, 3, 8, 8); assert is_copy_of(x.view(1, 3, 4, 2, 4, 2).permute(0, 1, 3, 5, 2, 4).reshape(1, 12, 4, 4), x)
  return x.view({B, C, H / r, r, W / r, r}).permute({0, 1, 3, 5, 2, 4}).reshape({B, C * r * r, H / r, W / r});  // EXPECT: tensor-reshape-non-contiguous
}

// Frozen autoencoder; only loaded, never trained here.
struct VaeImpl : torch::nn::Module {
  explicit VaeImpl(int64_t latent_ch) {
    enc1 = register_module("enc1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 64, 3).padding(1)));
    enc2 = register_module("enc2", torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 128, 3).padding(1)));
    enc_out = register_module("enc_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(512, 2 * latent_ch, 1)));
    dec_in = register_module("dec_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(latent_ch, 512, 3).padding(1)));
    dec1 = register_module("dec1", torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).padding(1)));
    dec_out = register_module("dec_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 3, 3).padding(1)));
  }

  torch::Tensor encode(const torch::Tensor& x) {
    auto h = space_to_depth(torch::silu(enc1(x)), 2);
    h = space_to_depth(torch::silu(enc2(h)), 2);
    return enc_out(h).chunk(2, 1)[0] * kLatentScale;
  }

  torch::Tensor decode(const torch::Tensor& z) {
    auto h = torch::pixel_shuffle(torch::silu(dec_in(z)), 2);
    h = torch::pixel_shuffle(torch::silu(dec1(h)), 2);
    return torch::tanh(dec_out(h));
  }

  torch::nn::Conv2d enc1{nullptr}, enc2{nullptr}, enc_out{nullptr};
  torch::nn::Conv2d dec_in{nullptr}, dec1{nullptr}, dec_out{nullptr};
};
TORCH_MODULE(Vae);

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out, int64_t emb_dim) {
    norm1 = register_module("norm1", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, in)));
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    emb_proj = register_module("emb_proj", torch::nn::Linear(emb_dim, 2 * out));
    norm2 = register_module("norm2", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, out)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1)));
    skip = register_module("skip", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& emb) {
    auto h = conv1(torch::silu(norm1(x)));
    auto ss = emb_proj(torch::silu(emb)).unsqueeze(-1).unsqueeze(-1).chunk(2, 1);
    h = norm2(h);
    // FACT: assert not backward_fails(lambda: (x := torch.randn(2, 4, 3, 3, requires_grad=True), s := torch.randn(2, 4, 1, 1, requires_grad=True), h := torch.nn.functional.group_norm(x * 1, 2), h.mul_(1 + s).add_(s), h.sum().backward()))
    h.mul_(1 + ss[0]).add_(ss[1]);  // LOOKALIKE: tensor-inplace-on-saved -- group_norm saves its input, not its output
    return skip(x) + conv2(torch::silu(h));
  }

  torch::nn::GroupNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, skip{nullptr};
  torch::nn::Linear emb_proj{nullptr};
};
TORCH_MODULE(ResBlock);

struct UpscalerUNetImpl : torch::nn::Module {
  explicit UpscalerUNetImpl(const Config& cfg) : cfg_(cfg) {
    const auto w = cfg.width, e = 4 * cfg.width;
    t_mlp = register_module("t_mlp", torch::nn::Sequential(torch::nn::Linear(w, e), torch::nn::SiLU(), torch::nn::Linear(e, e)));
    conv_in = register_module("conv_in", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.latent_ch + 3 + 1, w, 3).padding(1)));
    down = register_module("down", ResBlock(w, w, e));
    mid = register_module("mid", ResBlock(w, 2 * w, e));
    mid_norm = register_module("mid_norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(32, 2 * w)));
    mha = register_module("mha", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(2 * w, cfg.heads)));
    up = register_module("up", ResBlock(3 * w, w, e));
    conv_out = register_module("conv_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(w, cfg.latent_ch, 3).padding(1)));
  }

  torch::Tensor forward(const torch::Tensor& z_t, const torch::Tensor& t, const torch::Tensor& cond,
                        const torch::Tensor& level) {
    const auto B = z_t.size(0);
    auto freqs = torch::exp(torch::arange(cfg_.width / 2, z_t.options()) * (-std::log(10000.0) / (cfg_.width / 2)));
    auto args = t.to(torch::kFloat32).unsqueeze(1) * freqs.unsqueeze(0);
    auto emb = t_mlp->forward(torch::cat({args.cos(), args.sin()}, 1));
    // FACT: assert raises(lambda: torch.ones(2, 1, 1, 1).expand(2, 1, 4, 4).div_(350.0), "more than one element")
    auto level_map = level.to(torch::kFloat32).view({-1, 1, 1, 1}).expand({B, 1, z_t.size(2), z_t.size(3)});
    level_map.div_(double(cfg_.max_noise_level));  // EXPECT: tensor-inplace-on-expanded
    auto h0 = down(conv_in(torch::cat({z_t, cond, level_map}, 1)), emb);
    auto h = mid(F::avg_pool2d(h0, F::AvgPool2dFuncOptions(2)), emb);
    const auto C = h.size(1), H = h.size(2), W = h.size(3);
    auto tokens = mid_norm(h).flatten(2).permute({2, 0, 1});
    auto attn = std::get<0>(mha(tokens, tokens, tokens));
    // FACT: o = torch.randn(12, 2, 3); assert is_view_of(o.permute(1, 2, 0).reshape(2, 3, 3, 4), o)
    h = h + attn.permute({1, 2, 0}).reshape({B, C, H, W});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the token dim is split, which strides can express
    h = F::interpolate(h, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2, 2}));
    return conv_out(torch::silu(up(torch::cat({h, h0}, 1), emb)));
  }

  Config cfg_;
  torch::nn::Sequential t_mlp{nullptr};
  torch::nn::Conv2d conv_in{nullptr}, conv_out{nullptr};
  ResBlock down{nullptr}, mid{nullptr}, up{nullptr};
  torch::nn::GroupNorm mid_norm{nullptr};
  torch::nn::MultiheadAttention mha{nullptr};
};
TORCH_MODULE(UpscalerUNet);

// Bicubic upsampling to the latent grid, then forward diffusion to `level`.
torch::Tensor augment_lowres(const Schedule& s, const torch::Tensor& lr, const torch::Tensor& level,
                             int64_t size) {
  auto lr_up = F::interpolate(lr, F::InterpolateFuncOptions()
                                      .size(std::vector<int64_t>{size, size})
                                      .mode(torch::kBicubic)
                                      .align_corners(false));
  auto aug_noise = torch::randn_like(lr_up);
  // FACT: assert not raises(lambda: torch.randn(2, 3, 4, 4).mul_(torch.ones(2, 1, 1, 1).expand(2, 3, 4, 4)))
  aug_noise.mul_(extract(s.sqrt_one_minus_ab, level).expand_as(aug_noise));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded coefficient is only read
  // FACT: x = torch.randn(1, 3, 4, 4); assert is_copy_of(torch.nn.functional.interpolate(x, size=(8, 8), mode="bicubic", align_corners=False), x)
  lr_up.mul_(extract(s.sqrt_ab, level)).add_(aug_noise);  // LOOKALIKE: tensor-alias-then-mutate -- interpolate wrote a new tensor
  return lr_up;
}

template <typename Loader>
void train(UpscalerUNet& unet, Vae& vae, const Schedule& s, Loader& loader, const Config& cfg,
           torch::Device device) {
  torch::optim::AdamW opt(unet->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-2));
  std::deque<torch::Tensor> window;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (auto& batch : loader) {
      torch::Tensor hr = batch.data.to(device), lr = batch.target.to(device);
      torch::Tensor z0;
      {
        torch::NoGradGuard no_grad;
        z0 = vae->encode(hr);
      }
      const auto B = z0.size(0);
      auto t = torch::randint(0, cfg.timesteps, {B}, z0.options().dtype(torch::kLong));
      auto level = torch::randint(0, cfg.max_noise_level + 1, {B}, t.options());
      auto noise = torch::randn_like(z0);
      auto a = extract(s.sqrt_ab, t), sg = extract(s.sqrt_one_minus_ab, t);
      auto z_t = a * z0 + sg * noise;
      auto cond = augment_lowres(s, lr, level, z0.size(2));
      auto keep = (torch::rand({B, 1, 1, 1}) >= cfg.cond_drop).to(torch::kFloat32);
      cond = cond * keep;  // EXPECT: tensor-device-mismatch
      auto v_pred = unet->forward(z_t, t, cond, level);
      torch::Tensor loss = torch::mse_loss(v_pred, a * noise - sg * z0);
      window.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (window.size() > 100) window.pop_front();
      if (++step % cfg.log_every == 0) {
        // FACT: assert backward_fails(lambda: (p := torch.randn(3, requires_grad=True) * 1, l := torch.nn.functional.mse_loss(p, torch.zeros(3)), p.mul_(2), l.backward()))
        auto x0_hat = v_pred.mul_(-sg).add_(a * z_t);  // EXPECT: tensor-inplace-on-saved
        auto rmse = (x0_hat - z0).pow(2).mean().sqrt();
        std::printf("step %lld loss(avg100) %.5f latent rmse %.4f\n", static_cast<long long>(step),
                    torch::stack(std::vector<torch::Tensor>(window.begin(), window.end())).mean().item<float>(),  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval
                    rmse.item<float>());
      }
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    torch::save(unet, "upscaler_unet.pt");
  }
}

// Images are HWC floats in [0, 1].
torch::Tensor normalize_lowres(const torch::Tensor& img) {
  auto x = img.to(torch::kFloat32);
  // FACT: x = torch.rand(4, 4, 3); assert shares_storage(x.to(torch.float32), x)
  x.mul_(2.0).sub_(1.0);  // EXPECT: tensor-alias-then-mutate
  return x.permute({2, 0, 1}).unsqueeze(0);
}

torch::Tensor upscale(UpscalerUNet& unet, const Schedule& s, const torch::Tensor& lowres,
                      const Config& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  unet->eval();
  auto lr = normalize_lowres(lowres).to(device);
  const auto size = 2 * lr.size(2);
  auto level = torch::full({2}, cfg.infer_noise_level, torch::kLong);
  auto cond = augment_lowres(s, lr, level.narrow(0, 0, 1).to(device), size);
  auto cond_pair = torch::cat({cond, torch::zeros_like(cond)}, 0);
  auto z = torch::randn({1, cfg.latent_ch, size, size}, lr.options());
  float peak = 0.f;
  const int64_t stride = cfg.timesteps / cfg.ddim_steps;
  for (int64_t t = cfg.timesteps - 1; t >= 0; t -= stride) {
    const int64_t t_prev = t - stride;
    auto tt = torch::full({2}, t, z.options().dtype(torch::kLong));
    auto v = unet->forward(torch::cat({z, z}, 0), tt, cond_pair, level.to(device)).chunk(2, 0);  // EXPECT: tensor-clone-in-loop
    auto v_hat = v[1] + cfg.guidance * (v[0] - v[1]);
    auto a = s.sqrt_ab[t], sg = s.sqrt_one_minus_ab[t];
    auto x0 = a * z - sg * v_hat;
    auto eps = sg * z + a * v_hat;
    z = t_prev >= 0 ? s.sqrt_ab[t_prev] * x0 + s.sqrt_one_minus_ab[t_prev] * eps : x0;
    peak = std::max(peak, x0.abs().max().item<float>());  // EXPECT: tensor-sync-in-loop
  }
  std::printf("max |x0| over the trajectory: %.3f\n", peak);
  return z;
}

torch::Tensor decode_tiled(Vae& vae, const torch::Tensor& latents, int64_t tile) {
  torch::NoGradGuard no_grad;
  auto z = latents.clone();  // EXPECT: tensor-unnecessary-clone
  const int64_t h = z.size(2), w = z.size(3), f = 4;
  auto canvas = torch::empty({z.size(0), 3, h * f, w * f}, torch::kHalf);
  for (int64_t y = 0; y < h; y += tile) {
    for (int64_t x = 0; x < w; x += tile) {
      const auto th = std::min(tile, h - y), tw = std::min(tile, w - x);
      auto zt = z.narrow(2, y, th).narrow(3, x, tw).contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a different tile every iteration
      canvas.narrow(2, y * f, th * f).narrow(3, x * f, tw * f).copy_(vae->decode(zt));  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
    }
  }
  return canvas;
}

class PairDataset : public torch::data::datasets::Dataset<PairDataset> {
 public:
  explicit PairDataset(const std::string& path) {
    std::vector<torch::Tensor> pair;
    torch::load(pair, path);
    hr_ = pair.at(0);
    lr_ = pair.at(1);
  }
  torch::data::Example<> get(size_t i) override { return {hr_[i], lr_[i]}; }
  torch::optional<size_t> size() const override { return hr_.size(0); }

 private:
  torch::Tensor hr_, lr_;
};

}  // namespace sr

int main() {
  using namespace sr;
  Config cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Schedule sched(cfg.timesteps, device);

  Vae vae(cfg.latent_ch);
  torch::load(vae, cfg.vae_path);
  vae->to(device);
  vae->eval();
  for (auto& p : vae->parameters()) p.requires_grad_(false);

  UpscalerUNet unet(cfg);
  unet->to(device);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      PairDataset(cfg.pairs_path).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(4));
  train(unet, vae, sched, *loader, cfg, device);

  // Fold the latent scale into the decoder once; decode() then takes raw latents.
  vae->dec_in->weight.div_(kLatentScale);  // LOOKALIKE: tensor-inplace-on-leaf -- the frozen VAE's weights no longer require grad

  torch::Tensor lowres;
  torch::load(lowres, "query_lowres_hwc.pt");
  auto z = upscale(unet, sched, lowres, cfg, device);
  auto sr_img = decode_tiled(vae, z, cfg.decode_tile);
  auto bicubic = F::interpolate(lowres.permute({2, 0, 1}).unsqueeze(0),
                                F::InterpolateFuncOptions()
                                    .scale_factor(std::vector<double>{8, 8})
                                    .mode(torch::kBicubic)
                                    .align_corners(false));
  torch::save(sr_img, "sr.pt");
  torch::save(bicubic, "bicubic.pt");
  return 0;
}
