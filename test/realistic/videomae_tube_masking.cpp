// VideoMAE-style pretraining: cut clips into tubelet patches, hide ~90% of the
// spatial positions with one mask shared by every time slice (tube masking),
// run the ViT encoder on the visible tokens only and regress the pixels of all
// patches with a light decoder; the loss counts the masked patches only.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

struct MAEConfig {
  int64_t frames = 16;
  int64_t img = 224;
  int64_t tubelet = 2;
  int64_t patch = 16;
  int64_t enc_dim = 384, enc_depth = 12, enc_heads = 6;
  int64_t dec_dim = 192, dec_depth = 4, dec_heads = 3;
  double mask_ratio = 0.9;
  double drop = 0.0;
  bool norm_pix_loss = true;
  int64_t batch = 8;
  int64_t epochs = 20;
  int64_t steps_per_epoch = 400;
  int64_t log_every = 20;
  int64_t vis_every = 200;
  double lr = 1.5e-4;

  int64_t t_tokens() const { return frames / tubelet; }
  int64_t s_tokens() const { return (img / patch) * (img / patch); }
  int64_t n_tokens() const { return t_tokens() * s_tokens(); }
  int64_t patch_dim() const { return tubelet * patch * patch * 3; }
};

// ----------------------------------------------------------------------------
// data

torch::Tensor resize_frames(const torch::Tensor& frames, int64_t size) {
  namespace F = torch::nn::functional;
  return F::interpolate(frames, F::InterpolateFuncOptions()
                                    .size(std::vector<int64_t>{size, size})
                                    .mode(torch::kBicubic)
                                    .align_corners(false));
}

// Still images join the video data as static clips.
// FACT: f = torch.zeros(3, 8, 8); assert raises(lambda: f.unsqueeze(0).expand(4, -1, -1, -1).add_(torch.randn(4, 3, 8, 8)), "more than one element")
torch::Tensor image_to_clip(const torch::Tensor& frame, int64_t frames) {
  auto clip = frame.unsqueeze(0).expand({frames, -1, -1, -1});
  // a little per-frame noise so tubes are not trivially copyable across time
  clip.add_(torch::randn(clip.sizes()) * 2.0);  // EXPECT: tensor-inplace-on-expanded
  return clip;
}

// FACT: u = torch.zeros(4, 8, 8, 3, dtype=torch.uint8); assert is_copy_of(u.to(torch.float32), u)
torch::Tensor preprocess(const torch::Tensor& clip_u8, const torch::Tensor& mean, const torch::Tensor& std) {
  auto clip = clip_u8.to(torch::kFloat);
  clip.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float copies, the cached bytes stay intact
  return ((clip - mean) / std).permute({3, 0, 1, 2});
}

// Decoded, resized clips are cached as uint8 to fit the dataset in host memory.
class ClipStore {
 public:
  ClipStore(const MAEConfig& cfg, int64_t n_videos, int64_t n_images) : cfg_(cfg) {
    store_ = torch::empty({n_videos + n_images, cfg.frames, cfg.img, cfg.img, 3}, torch::kByte);
    batch_ = torch::empty({cfg.batch, 3, cfg.frames, cfg.img, cfg.img});
    mean_ = torch::tensor({0.485, 0.456, 0.406}, torch::kFloat);
    std_ = torch::tensor({0.229, 0.224, 0.225}, torch::kFloat);
    // stand-ins for the decoder output: raw frames at the source resolution
    for (int64_t i = 0; i < n_videos; ++i)
      put(i, resize_frames(torch::rand({cfg.frames, 3, 256, 340}) * 255, cfg.img));
    for (int64_t j = 0; j < n_images; ++j)
      put(n_videos + j, image_to_clip(resize_frames(torch::rand({1, 3, 256, 340}) * 255, cfg.img)[0], cfg.frames));
  }

  // FACT: u = torch.zeros(4, 8, 8, 3, dtype=torch.uint8); u[0].copy_(torch.full((8, 8, 3), 258.7)); assert u[0, 0, 0, 0] == 2
  void put(int64_t idx, const torch::Tensor& frames_tchw) {
    store_[idx].copy_(frames_tchw.permute({0, 2, 3, 1}));  // EXPECT: tensor-copy-narrowing
  }

  torch::Tensor next_batch() {
    auto idx = torch::randint(store_.size(0), {cfg_.batch}, torch::kLong);
    for (int64_t i = 0; i < cfg_.batch; ++i)
      batch_[i].copy_(preprocess(store_[idx[i].item<int64_t>()], mean_, std_));  // LOOKALIKE: tensor-copy-narrowing, tensor-sync-in-loop -- float into a float buffer; idx lives on the CPU
    return batch_;
  }

 private:
  MAEConfig cfg_;
  torch::Tensor store_, batch_, mean_, std_;
};

// ----------------------------------------------------------------------------
// patches and masks

// FACT: v = torch.randn(1, 3, 4, 8, 8); x = v.view(1, 3, 2, 2, 2, 4, 2, 4).permute(0, 2, 4, 6, 3, 5, 7, 1); assert is_copy_of(x.reshape(1, 8, 96), v)
torch::Tensor patchify(const torch::Tensor& video, int64_t t, int64_t p) {
  const int64_t B = video.size(0), C = video.size(1), T = video.size(2), H = video.size(3), W = video.size(4);
  auto x = video.view({B, C, T / t, t, H / p, p, W / p, p}).permute({0, 2, 4, 6, 3, 5, 7, 1});
  return x.reshape({B, (T / t) * (H / p) * (W / p), t * p * p * C});  // EXPECT: tensor-reshape-non-contiguous
}

// One random spatial mask per clip, repeated over every time slice. true = hidden.
// FACT: m = torch.ones(2, 6, dtype=torch.bool); e = m.unsqueeze(1).expand(2, 4, 6); assert is_copy_of(e.reshape(2, 24), m)
torch::Tensor tube_mask(int64_t B, int64_t t_tokens, int64_t s_tokens, double ratio) {
  const int64_t n_keep = s_tokens - static_cast<int64_t>(std::round(s_tokens * ratio));
  auto order = torch::rand({B, s_tokens}).argsort(/*dim=*/1, /*descending=*/false);
  auto mask2d = torch::ones({B, s_tokens}, torch::kBool);
  mask2d.scatter_(1, order.narrow(1, 0, n_keep), false);
  return mask2d.unsqueeze(1).expand({B, t_tokens, s_tokens}).reshape({B, t_tokens * s_tokens});  // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor sinusoid_table(int64_t n, int64_t d) {
  auto pos = torch::arange(n, torch::kFloat).unsqueeze(1);
  auto div = torch::exp(torch::arange(0, d, 2, torch::kFloat) * (-std::log(10000.0) / d));
  auto table = torch::zeros({n, d});
  table.slice(1, 0, d, 2).copy_(torch::sin(pos * div));
  table.slice(1, 1, d, 2).copy_(torch::cos(pos * div));
  return table.unsqueeze(0);
}

// ----------------------------------------------------------------------------
// model

struct ViTBlockImpl : torch::nn::Module {
  ViTBlockImpl(int64_t dim, int64_t heads, double drop) : drop_(drop) {
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    attn = register_module("attn", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(dim, heads)));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
    fc1 = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }
  // FACT: x = torch.randn(3, 4, requires_grad=True); h = torch.nn.functional.gelu(x * 2); torch.nn.functional.dropout(h, 0.5, True, inplace=True); h.sum().backward(); assert x.grad is not None
  torch::Tensor forward(torch::Tensor x) {
    auto h = norm1->forward(x).transpose(0, 1);
    x = x + std::get<0>(attn->forward(h, h, h, {}, /*need_weights=*/false)).transpose(0, 1);
    auto m = torch::gelu(fc1->forward(norm2->forward(x)));
    namespace F = torch::nn::functional;
    m = F::dropout(m, F::DropoutFuncOptions().p(drop_).training(is_training()).inplace(true));  // LOOKALIKE: tensor-inplace-on-saved -- GELU saves its input, not its output
    return x + fc2->forward(m);
  }
  double drop_;
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::MultiheadAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(ViTBlock);

struct MAEOutput {
  torch::Tensor pred;
  torch::Tensor latent;
};

struct VideoMAEImpl : torch::nn::Module {
  explicit VideoMAEImpl(const MAEConfig& cfg) : cfg_(cfg) {
    const int64_t N = cfg.n_tokens();
    patch_embed = register_module("patch_embed", torch::nn::Linear(cfg.patch_dim(), cfg.enc_dim));
    enc_pos_ = register_buffer("enc_pos", sinusoid_table(N, cfg.enc_dim));
    for (int64_t i = 0; i < cfg.enc_depth; ++i)
      encoder->push_back(ViTBlock(cfg.enc_dim, cfg.enc_heads, cfg.drop));
    register_module("encoder", encoder);
    enc_norm = register_module("enc_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.enc_dim})));

    enc_to_dec = register_module("enc_to_dec", torch::nn::Linear(cfg.enc_dim, cfg.dec_dim));
    mask_token_ = register_parameter("mask_token", torch::zeros({1, 1, cfg.dec_dim}));
    torch::nn::init::normal_(mask_token_, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
    // learnable, but started from the sin-cos table
    // FACT: w = torch.zeros(1, 6, 4, requires_grad=True); assert raises(lambda: w.copy_(torch.randn(1, 6, 4)), "a leaf Variable that requires grad")
    dec_pos_ = register_parameter("dec_pos", torch::zeros({1, N, cfg.dec_dim}));
    dec_pos_.copy_(sinusoid_table(N, cfg.dec_dim));  // EXPECT: tensor-inplace-on-leaf
    for (int64_t i = 0; i < cfg.dec_depth; ++i)
      decoder->push_back(ViTBlock(cfg.dec_dim, cfg.dec_heads, cfg.drop));
    register_module("decoder", decoder);
    dec_norm = register_module("dec_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dec_dim})));
    head = register_module("head", torch::nn::Linear(cfg.dec_dim, cfg.patch_dim()));
  }

  // FACT: x = torch.randn(2, 6, 4); m = torch.tensor([[True, False] * 3] * 2); v = x[~m]; assert is_contiguous(v) and is_copy_of(v, x) and v.view(2, -1, 4).shape[1] == 3
  MAEOutput forward(const torch::Tensor& patches, const torch::Tensor& mask) {
    const int64_t B = patches.size(0), N = patches.size(1);
    auto x = patch_embed->forward(patches) + enc_pos_;
    auto vis = x.index({mask.logical_not()}).view({B, -1, cfg_.enc_dim});  // LOOKALIKE: tensor-view-non-contiguous -- boolean indexing returns a fresh contiguous tensor
    for (const auto& blk : *encoder) vis = blk->as<ViTBlock>()->forward(vis);
    auto latent = enc_norm->forward(vis);

    auto y = enc_to_dec->forward(latent);
    auto full = torch::zeros({B, N, cfg_.dec_dim}, y.options()).index_put({mask.logical_not()}, y.reshape({-1, cfg_.dec_dim}));
    full = torch::where(mask.unsqueeze(-1), mask_token_, full) + dec_pos_;
    for (const auto& blk : *decoder) full = blk->as<ViTBlock>()->forward(full);
    return {head->forward(dec_norm->forward(full)), latent};
  }

  MAEConfig cfg_;
  torch::nn::Linear patch_embed{nullptr}, enc_to_dec{nullptr}, head{nullptr};
  torch::nn::ModuleList encoder, decoder;
  torch::nn::LayerNorm enc_norm{nullptr}, dec_norm{nullptr};
  torch::Tensor enc_pos_, dec_pos_, mask_token_;
};
TORCH_MODULE(VideoMAE);

// FACT: p = torch.randn(2, 5, 8, requires_grad=True); l = (p * 2).pow(2).mean(-1); l.mul_(torch.ones(2, 5)); l.sum().backward(); assert p.grad is not None
// FACT: p = torch.randn(2, 5, 8, requires_grad=True); e = p - torch.randn(2, 5, 8); l = e.pow(2).mean(-1); e.abs_(); assert backward_fails(lambda: l.sum().backward())
std::pair<torch::Tensor, torch::Tensor> reconstruction_loss(const torch::Tensor& pred, const torch::Tensor& target,
                                                            const torch::Tensor& mask) {
  auto err = pred - target;
  auto per_patch = err.pow(2).mean(-1);
  per_patch.mul_(mask);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-inplace-on-saved -- mean does not save its output
  auto loss = per_patch.sum() / mask.sum();
  auto mae = err.abs_().mean();  // EXPECT: tensor-inplace-on-saved
  return {loss, mae};
}

// ----------------------------------------------------------------------------
// training

int main() {
  torch::manual_seed(0);
  MAEConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  ClipStore data(cfg, /*n_videos=*/48, /*n_images=*/16);
  VideoMAE model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).betas({0.9, 0.95}).weight_decay(0.05));

  std::vector<torch::Tensor> recon_samples;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> epoch_losses;
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto video = data.next_batch().to(device);
      auto mask = tube_mask(cfg.batch, cfg.t_tokens(), cfg.s_tokens(), cfg.mask_ratio);

      // FACT: p = torch.randn(2, 8, 96); t = p; t.sub_(t.mean(-1, keepdim=True)); assert shares_storage(p, t) and p.mean(-1).abs().max() < 1e-5
      auto patches = patchify(video, cfg.tubelet, cfg.patch);
      auto target = patches;
      torch::Tensor patch_mean, patch_std;
      if (cfg.norm_pix_loss) {
        patch_mean = target.mean(-1, /*keepdim=*/true);
        patch_std = (target.var(-1, /*unbiased=*/true, /*keepdim=*/true) + 1e-6).sqrt();
        target.sub_(patch_mean).div_(patch_std);  // EXPECT: tensor-alias-then-mutate
      }

      auto out = model->forward(patches, mask.to(device));
      auto [loss, mae] = reconstruction_loss(out.pred, target, mask.to(torch::kFloat));

      // representation health: spread of the L2-normalised latents
      // FACT: x = torch.randn(2, 3, requires_grad=True); z = torch.layer_norm(x * 1, [3]); y = torch.nn.Linear(3, 4)(z); d = z.detach(); d.div_(2); assert backward_fails(lambda: y.sum().backward())
      auto z = out.latent.detach();
      z.div_(z.norm(2, -1, /*keepdim=*/true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
      auto latent_std = z.std(1).mean();

      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations

      if (step % cfg.log_every == 0) {
        const double mae_v = mae.item<double>(), spread = latent_std.item<double>();  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
        std::cout << "epoch " << epoch << " step " << step << " mae " << mae_v << " latent std " << spread << "\n";
      }
      if (step % cfg.vis_every == 0) {
        // FACT: p = torch.randn(2, 3, requires_grad=True); y = p.sigmoid(); v = y.detach().clone(); v.mul_(3); assert is_copy_of(v, y) and not backward_fails(lambda: y.sum().backward())
        auto vis = out.pred.detach().clone();
        if (cfg.norm_pix_loss) vis.mul_(patch_std).add_(patch_mean);  // LOOKALIKE: tensor-inplace-on-detached -- detach().clone() owns its storage
        recon_samples.push_back(vis.select(0, 0).cpu());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached copy, no graph
      }
    }
    const double mean_loss = torch::stack(epoch_losses).mean().item<double>();
    std::cout << "epoch " << epoch << " mean loss " << mean_loss << "\n";
    torch::save(model, "videomae_ep" + std::to_string(epoch) + ".pt");
  }
  torch::save(recon_samples, "recon_samples.pt");
  return 0;
}
