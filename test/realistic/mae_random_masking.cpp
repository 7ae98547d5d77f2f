// Masked autoencoder (He et al. 2021) pretraining for a ViT: images are cut into 16x16 patches,
// 75% of them are dropped per image by a random shuffle, the encoder runs on the kept ones, a
// light decoder gets a shared mask token at every dropped position (unshuffled back into place
// with gather) and the loss is the MSE on the masked patches only, with per-patch normalised
// pixel targets. Fixed 2-D sin-cos position embeddings; a preview batch is written every epoch.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

struct MaeConfig {
  int64_t img_size = 224, patch = 16, in_chans = 3;
  int64_t dim = 768, depth = 12, heads = 12;
  int64_t dec_dim = 512, dec_depth = 8, dec_heads = 16;
  double mask_ratio = 0.75;
  bool norm_pix_loss = true;
  int64_t epochs = 400, warmup_epochs = 40, batch_size = 64, log_every = 100;
  double base_lr = 1.5e-4, weight_decay = 0.05;
};

// [1, 1 + grid * grid, dim]: a zero row for the cls token, then sin/cos of the row and column index.
torch::Tensor sincos_pos_embed(int64_t dim, int64_t grid) {
  auto omega = 1.0 / torch::pow(10000.0, torch::arange(dim / 4, torch::kDouble) / (dim / 4.0));
  auto coords = torch::arange(grid, torch::kDouble);
  auto axis = [&](const torch::Tensor &pos) {
    auto a = torch::outer(pos, omega);
    return torch::cat({torch::sin(a), torch::cos(a)}, 1);
  };
  auto emb = torch::cat({axis(coords.repeat_interleave(grid)), axis(coords.repeat({grid}))}, 1);
  return torch::cat({torch::zeros({1, dim}, torch::kDouble), emb}).to(torch::kFloat).unsqueeze(0);
}

// [N, C, H, W] -> [N, L, p * p * C]: patches in raster order, pixels (row, col, channel) inside.
torch::Tensor patchify(const torch::Tensor &imgs, int64_t p) {
  const auto N = imgs.size(0), C = imgs.size(1), h = imgs.size(2) / p, w = imgs.size(3) / p;
  // FACT: i = torch.randn(2, 3, 8, 8); assert is_view_of(i.view(2, 3, 2, 4, 2, 4), i)
  auto x = imgs.view({N, C, h, p, w, p}).permute({0, 2, 4, 3, 5, 1}); // LOOKALIKE: tensor-view-non-contiguous -- the image batch is contiguous
  // FACT: i = torch.randn(2, 3, 8, 8); x = i.view(2, 3, 2, 4, 2, 4).permute(0, 2, 4, 3, 5, 1); assert is_copy_of(x.reshape(2, 4, 48), i)
  return x.reshape({N, h * w, p * p * C}); // EXPECT: tensor-reshape-non-contiguous -- the permuted patches cannot be a view: the whole batch is copied
}

// [N, L, p * p * C] -> [N, C, H, W]
torch::Tensor unpatchify(const torch::Tensor &x, int64_t p, int64_t C) {
  const auto N = x.size(0);
  const auto h = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(x.size(1))))), w = h;
  auto y = x.view({N, h, w, p, p, C}).permute({0, 5, 1, 3, 2, 4});
  // FACT: x = torch.randn(2, 4, 48); y = x.view(2, 2, 2, 4, 4, 3).permute(0, 5, 1, 3, 2, 4); assert raises(lambda: y.view(2, 3, 8, 8), "view size is not compatible")
  return y.view({N, C, h * p, w * p}); // EXPECT: tensor-view-non-contiguous -- rows of different patches are not adjacent after the permute: view throws
}

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t dim, int64_t heads) : heads_(heads), scale_(1.0 / std::sqrt(static_cast<double>(dim / heads))) {
    norm1_ = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(1e-6)));
    qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj_ = register_module("proj", torch::nn::Linear(dim, dim));
    norm2_ = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}).eps(1e-6)));
    fc1_ = register_module("fc1", torch::nn::Linear(dim, 4 * dim));
    fc2_ = register_module("fc2", torch::nn::Linear(4 * dim, dim));
  }

  torch::Tensor forward(torch::Tensor x) {
    const auto B = x.size(0), N = x.size(1), D = x.size(2);
    // FACT: l = torch.nn.Linear(8, 24); y = l(torch.nn.LayerNorm(8)(torch.randn(2, 5, 8))); assert is_view_of(y.view(2, 5, 3, 2, 4), y)
    auto qkv = qkv_(norm1_(x)).view({B, N, 3, heads_, D / heads_}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale_, -1);
    // FACT: a = torch.softmax(torch.randn(2, 3, 5, 5), -1); v = torch.randn(2, 3, 5, 4); y = torch.matmul(a, v).transpose(1, 2); assert is_copy_of(y.reshape(2, 5, 12), y)
    auto y = torch::matmul(att, v).transpose(1, 2).reshape({B, N, D}); // EXPECT: tensor-reshape-non-contiguous -- merging the heads of the transposed output copies it
    x = x + proj_(y);
    return x + fc2_(torch::gelu(fc1_(norm2_(x))));
  }

  int64_t heads_;
  double scale_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Block);

struct Masking {
  torch::Tensor kept;        // [N, keep, D]
  torch::Tensor mask;        // [N, L], 1 = dropped
  torch::Tensor ids_restore; // [N, L]
};

// Per-sample masking by sorting uniform noise, as in the reference implementation.
Masking random_masking(const torch::Tensor &x, double ratio) {
  const auto N = x.size(0), L = x.size(1), D = x.size(2);
  const auto keep = static_cast<int64_t>(static_cast<double>(L) * (1.0 - ratio));
  auto noise = torch::rand({N, L}, x.options());
  auto ids_shuffle = torch::argsort(noise, /*dim=*/1, /*descending=*/false);
  auto ids_restore = torch::argsort(ids_shuffle, /*dim=*/1, /*descending=*/false);
  auto ids_keep = ids_shuffle.narrow(1, 0, keep);
  auto kept = torch::gather(x, 1, ids_keep.unsqueeze(-1).expand({N, keep, D})); // LOOKALIKE: tensor-device-mismatch -- the indices come from noise made with x's options, on x's device
  auto mask = torch::ones({N, L}, x.options());
  mask.narrow(1, 0, keep).zero_();
  mask = torch::gather(mask, 1, ids_restore);
  return {kept, mask, ids_restore};
}

struct MaeOutput {
  torch::Tensor pred; // [N, L, p * p * C]
  torch::Tensor mask; // [N, L]
};

struct MaskedAutoencoderImpl : torch::nn::Module {
  explicit MaskedAutoencoderImpl(const MaeConfig &cfg) : cfg_(cfg) {
    const auto grid = cfg.img_size / cfg.patch, L = grid * grid;
    patch_embed_ = register_module("patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_chans, cfg.dim, cfg.patch).stride(cfg.patch)));
    cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, cfg.dim}));
    pos_embed_ = register_parameter("pos_embed", torch::zeros({1, L + 1, cfg.dim}), /*requires_grad=*/false);
    for (int64_t i = 0; i < cfg.depth; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), Block(cfg.dim, cfg.heads)));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim}).eps(1e-6)));

    decoder_embed_ = register_module("decoder_embed", torch::nn::Linear(cfg.dim, cfg.dec_dim));
    mask_token_ = register_parameter("mask_token", torch::zeros({1, 1, cfg.dec_dim}));
    dec_pos_embed_ = register_parameter("dec_pos_embed", torch::zeros({1, L + 1, cfg.dec_dim}), /*requires_grad=*/false);
    for (int64_t i = 0; i < cfg.dec_depth; ++i)
      dec_blocks_.push_back(register_module("dec_block" + std::to_string(i), Block(cfg.dec_dim, cfg.dec_heads)));
    dec_norm_ = register_module("dec_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dec_dim}).eps(1e-6)));
    decoder_pred_ = register_module("decoder_pred", torch::nn::Linear(cfg.dec_dim, cfg.patch * cfg.patch * cfg.in_chans));

    // FACT: p = torch.nn.Parameter(torch.zeros(1, 5, 4), requires_grad=False); p.copy_(torch.randn(1, 5, 4)); assert p.is_leaf and not p.requires_grad
    pos_embed_.copy_(sincos_pos_embed(cfg.dim, grid)); // LOOKALIKE: tensor-inplace-on-leaf -- registered with requires_grad=false: a frozen table
    dec_pos_embed_.copy_(sincos_pos_embed(cfg.dec_dim, grid));
    // FACT: w = torch.nn.Conv2d(3, 8, 4, 4).weight; v = w.view(w.shape[0], -1); torch.nn.init.xavier_uniform_(v); assert is_view_of(v, w)
    torch::nn::init::xavier_uniform_(patch_embed_->weight.view({cfg.dim, -1})); // LOOKALIKE: tensor-view-non-contiguous, tensor-inplace-on-leaf -- a conv weight is contiguous; nn::init writes under no-grad
    torch::nn::init::normal_(cls_token_, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    // FACT: m = torch.nn.Parameter(torch.zeros(1, 1, 8)); assert raises(lambda: m.normal_(0.0, 0.02), "a leaf Variable that requires grad")
    mask_token_.normal_(0.0, 0.02); // EXPECT: tensor-inplace-on-leaf -- the mask token requires grad and the constructor runs with grad mode on
  }

  // imgs [N, C, H, W] -> latent [N, 1 + keep, D], mask [N, L], ids_restore [N, L]
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward_encoder(const torch::Tensor &imgs, double ratio) {
    auto x = patch_embed_(imgs).flatten(2).transpose(1, 2);
    x = x + pos_embed_.narrow(1, 1, x.size(1));
    auto m = random_masking(x, ratio);
    auto cls = cls_token_ + pos_embed_.narrow(1, 0, 1);
    // FACT: c = torch.randn(1, 1, 4); e = c.expand(3, -1, -1); y = torch.cat([e, torch.randn(3, 2, 4)], 1); assert is_copy_of(y, c) and e.stride(0) == 0
    x = torch::cat({cls.expand({x.size(0), -1, -1}), m.kept}, 1); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded cls token is only read by cat
    for (auto &b : blocks_)
      x = b(x);
    return {norm_(x), m.mask, m.ids_restore};
  }

  torch::Tensor forward_decoder(const torch::Tensor &latent, const torch::Tensor &ids_restore) {
    auto x = decoder_embed_(latent);
    const auto N = x.size(0), L = ids_restore.size(1), Dd = x.size(2);
    auto mask_tokens = mask_token_.repeat({N, L + 1 - x.size(1), 1});
    auto body = torch::cat({x.narrow(1, 1, x.size(1) - 1), mask_tokens}, 1);
    body = torch::gather(body, 1, ids_restore.unsqueeze(-1).expand({N, L, Dd}));
    x = torch::cat({x.narrow(1, 0, 1), body}, 1) + dec_pos_embed_;
    for (auto &b : dec_blocks_)
      x = b(x);
    return decoder_pred_(dec_norm_(x)).narrow(1, 1, L); // drop the cls position
  }

  MaeOutput forward(const torch::Tensor &imgs, double ratio) {
    auto [latent, mask, ids_restore] = forward_encoder(imgs, ratio);
    return {forward_decoder(latent, ids_restore), mask};
  }

  // MSE on the masked patches only; with norm_pix_loss each target patch is standardised.
  torch::Tensor loss(const torch::Tensor &imgs, const torch::Tensor &pred, const torch::Tensor &mask) {
    auto target = patchify(imgs, cfg_.patch);
    if (cfg_.norm_pix_loss) {
      auto mean = target.mean(-1, true);
      auto var = target.var({-1}, /*unbiased=*/true, /*keepdim=*/true);
      target = (target - mean) / (var + 1e-6).sqrt();
    }
    auto per_patch = (pred - target).pow(2).mean(-1);
    // FACT: p = torch.randn(2, 4, 6, requires_grad=True); t = torch.randn(2, 4, 6); m = (torch.rand(2, 4) < 0.75).float(); l = (p - t).pow(2).mean(-1); l.mul_(m); (l.sum() / m.sum()).backward(); assert p.grad is not None
    per_patch.mul_(mask); // LOOKALIKE: tensor-inplace-on-saved -- mean saves no tensor (pow saved its input, not this output)
    return per_patch.sum() / mask.sum();
  }

  MaeConfig cfg_;
  torch::nn::Conv2d patch_embed_{nullptr};
  torch::Tensor cls_token_, pos_embed_, mask_token_, dec_pos_embed_;
  std::vector<Block> blocks_, dec_blocks_;
  torch::nn::LayerNorm norm_{nullptr}, dec_norm_{nullptr};
  torch::nn::Linear decoder_embed_{nullptr}, decoder_pred_{nullptr};
};
TORCH_MODULE(MaskedAutoencoder);

// Center-cropped training images, uint8 [N, 3, S, S], decoded once by the preprocessing job.
struct ImageCache : torch::data::datasets::Dataset<ImageCache, torch::data::TensorExample> {
  explicit ImageCache(const std::string &path) {
    torch::load(images_, path);
    TORCH_CHECK(images_.scalar_type() == torch::kByte && images_.dim() == 4, "expected uint8 [N, 3, S, S] images");
  }
  torch::data::TensorExample get(size_t i) override { return torch::data::TensorExample(images_[i]); }
  torch::optional<size_t> size() const override { return images_.size(0); }
  torch::Tensor images_;
};

class MaeTrainer {
public:
  MaeTrainer(MaskedAutoencoder model, const MaeConfig &cfg, torch::Tensor preview)
      : model_(std::move(model)), cfg_(cfg), device_(torch::kCUDA), preview_(std::move(preview)),
        mean_(torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1})), std_(torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1})) {
    model_->to(device_);
  }

  void fit(ImageCache data) {
    const auto n_images = static_cast<int64_t>(*data.size());
    auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
        std::move(data).map(torch::data::transforms::Stack<torch::data::TensorExample>()),
        torch::data::DataLoaderOptions(cfg_.batch_size).drop_last(true).workers(8));
    const double lr = cfg_.base_lr * static_cast<double>(cfg_.batch_size) / 256.0;
    torch::optim::AdamW opt(model_->parameters(), torch::optim::AdamWOptions(lr).betas({0.9, 0.95}).weight_decay(cfg_.weight_decay));
    const auto steps_per_epoch = n_images / cfg_.batch_size;
    auto mean = mean_.to(device_), stdev = std_.to(device_);

    int64_t step = 0;
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      model_->train();
      auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device_));
      for (auto &batch : *loader) {
        const double e = static_cast<double>(step) / static_cast<double>(steps_per_epoch);
        const double f = e < cfg_.warmup_epochs ? e / cfg_.warmup_epochs
                                                 : 0.5 * (1.0 + std::cos(M_PI * (e - cfg_.warmup_epochs) / (cfg_.epochs - cfg_.warmup_epochs)));
        for (auto &group : opt.param_groups())
          group.options().set_lr(lr * f);

        auto x = batch.data.to(device_, torch::kFloat);
        // FACT: u = torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8); x = u.to(torch.float); x.div_(255).sub_(0.5); assert is_copy_of(x, u)
        x.div_(255).sub_(mean).div_(stdev); // LOOKALIKE: tensor-alias-then-mutate -- the loader's images are uint8: to(kFloat) made a copy
        auto flip = torch::rand({x.size(0), 1, 1, 1}, x.options()) < 0.5;
        x = torch::where(flip, x.flip({3}), x);

        auto target = x.clone(); // EXPECT: tensor-unnecessary-clone -- neither the batch nor the copy is written afterwards: forward() only reads it
        auto out = model_->forward(x, cfg_.mask_ratio);
        auto loss = model_->loss(target, out.pred, out.mask);
        opt.zero_grad();
        loss.backward();
        opt.step();

        epoch_loss += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
        if (++step % cfg_.log_every == 0)
          std::cout << "step " << step << " lr " << lr * f << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
      }
      std::cout << "epoch " << epoch << " mean loss " << (epoch_loss / steps_per_epoch).item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after its loop of steps
      save_previews(epoch);
      torch::save(model_, "mae_epoch" + std::to_string(epoch) + ".pt");
    }
  }

  // Originals, masked inputs and reconstructions with the visible patches pasted back, for a
  // fixed normalised batch kept on the host; stored as uint8 for the viewer.
  void save_previews(int64_t epoch) {
    torch::NoGradGuard no_grad;
    model_->eval();
    const auto P = cfg_.patch, C = cfg_.in_chans;
    auto out = model_->forward(preview_.to(device_), cfg_.mask_ratio);
    auto recon = unpatchify(out.pred, P, C);
    auto m = unpatchify(out.mask.unsqueeze(-1).repeat({1, 1, P * P * C}), P, C).cpu();
    auto masked = preview_ * (1 - m); // LOOKALIKE: tensor-device-mismatch -- the mask was brought to the host
    auto pasted = preview_ * (1 - m) + recon * m; // EXPECT: tensor-device-mismatch -- recon is still on the GPU, the preview batch and m on the host

    auto shown = preview_.contiguous();
    // FACT: p = torch.randn(2, 3, 4, 4); p0 = p.clone(); s = p.contiguous(); s.mul_(torch.full((1, 3, 1, 1), 0.2)).add_(torch.full((1, 3, 1, 1), 0.4)).clamp_(0, 1); assert shares_storage(s, p) and not torch.equal(p, p0)
    shown.mul_(std_).add_(mean_).clamp_(0, 1); // EXPECT: tensor-alias-then-mutate -- contiguous() returned preview_ itself: the preview batch is denormalised in place, again every epoch
    auto grid = torch::cat({shown, (masked * std_ + mean_).clamp(0, 1), (pasted * std_ + mean_).clamp(0, 1)});
    auto bytes = torch::empty(grid.sizes(), torch::kByte);
    // FACT: g = torch.rand(2, 3); b = torch.empty(2, 3, dtype=torch.uint8); b.copy_((g * 255).round()); assert torch.equal(b.float(), (g * 255).round())
    bytes.copy_((grid * 255).round()); // LOOKALIKE: tensor-copy-narrowing -- clamped to [0, 1] and rounded: every value is a whole number in uint8's range
    torch::save(bytes, "preview_epoch" + std::to_string(epoch) + ".pt");
  }

private:
  MaskedAutoencoder model_;
  MaeConfig cfg_;
  torch::Device device_;
  torch::Tensor preview_, mean_, std_;
};

int main(int argc, char **argv) {
  MaeConfig cfg;
  ImageCache data(argc > 1 ? argv[1] : "train_u8.pt");
  auto first = data.images_.narrow(0, 0, 8).to(torch::kFloat).div(255);
  auto mean = torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1}), stdev = torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1});
  MaeTrainer trainer(MaskedAutoencoder(cfg), cfg, (first - mean) / stdev);
  trainer.fit(std::move(data));
  return 0;
}
