// ViT-S/16 style classifier: conv patch embedding, class token + learned position
// embedding, pre-norm transformer blocks with hand-written multi-head attention, and a
// training epoch with mixup / cutmix / patch-shuffle augmentation on soft targets.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct ViTConfig {
  int64_t image_size = 224;
  int64_t patch_size = 16;
  int64_t in_chans = 3;
  int64_t embed_dim = 384;
  int64_t depth = 12;
  int64_t num_heads = 6;
  double mlp_ratio = 4.0;
  double attn_drop = 0.1;
  int64_t num_classes = 1000;
  double mixup_alpha = 0.8;
  double cutmix_prob = 0.5;
  double shuffle_prob = 0.1;
  double label_smoothing = 0.1;
};

struct PatchEmbedImpl : nn::Module {
  explicit PatchEmbedImpl(const ViTConfig& cfg)
      : proj(nn::Conv2dOptions(cfg.in_chans, cfg.embed_dim, cfg.patch_size).stride(cfg.patch_size)) {
    register_module("proj", proj);
  }

  torch::Tensor forward(const torch::Tensor& images) {
    auto x = proj(images);  // [B, D, gh, gw]
    // FACT: x = torch.randn(2, 8, 4, 4); assert is_view_of(x.flatten(2), x)
    return x.flatten(2).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- the conv output is contiguous, flatten(2) is a view
  }

  nn::Conv2d proj{nullptr};
};
TORCH_MODULE(PatchEmbed);

struct AttentionImpl : nn::Module {
  AttentionImpl(int64_t dim, int64_t heads, double attn_drop)
      : num_heads(heads), head_dim(dim / heads), drop_p(attn_drop),
        scale(1.0 / std::sqrt(static_cast<double>(dim / heads))) {
    qkv = register_module("qkv", nn::Linear(dim, dim * 3));
    proj = register_module("proj", nn::Linear(dim, dim));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), N = x.size(1), C = x.size(2);
    // FACT: y = torch.randn(2, 5, 3 * 8); assert is_view_of(y.reshape(2, 5, 3, 2, 4), y)
    auto qkv_out = qkv(x).reshape({B, N, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});  // LOOKALIKE: tensor-reshape-non-contiguous -- splits the contiguous Linear output: a view
    auto q = qkv_out[0], k = qkv_out[1], v = qkv_out[2];

    auto attn = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) * scale, -1);
    if (is_training() && drop_p > 0.0) {
      auto keep = torch::bernoulli(torch::full_like(attn, 1.0 - drop_p));
      attn.mul_(keep).div_(1.0 - drop_p);  // EXPECT: tensor-inplace-on-saved
    }
    auto out = torch::matmul(attn, v);  // [B, H, N, hd]
    // FACT: o = torch.randn(2, 3, 5, 4); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 12), o)
    out = out.transpose(1, 2).reshape({B, N, C});  // EXPECT: tensor-reshape-non-contiguous
    return proj(out);
  }

  int64_t num_heads, head_dim;
  double drop_p, scale;
  nn::Linear qkv{nullptr}, proj{nullptr};
};
TORCH_MODULE(Attention);

struct BlockImpl : nn::Module {
  explicit BlockImpl(const ViTConfig& cfg) {
    const auto D = cfg.embed_dim;
    const auto hidden = static_cast<int64_t>(D * cfg.mlp_ratio);
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({D}).eps(1e-6)));
    attn = register_module("attn", Attention(D, cfg.num_heads, cfg.attn_drop));
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({D}).eps(1e-6)));
    fc1 = register_module("fc1", nn::Linear(D, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, D));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = attn(norm1(x));
    y += x;  // LOOKALIKE: tensor-inplace-on-saved -- the output projection is a Linear, which does not save its output
    auto h = F::gelu(fc1(norm2(y)));
    return y + fc2(h);
  }

  nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  Attention attn{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

// Bicubic resize of a checkpoint's [1, 1 + g*g, D] position table to our grid.
torch::Tensor resize_grid_embed(const torch::Tensor& pos, int64_t new_grid) {
  const auto D = pos.size(2);
  const auto old_grid = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(pos.size(1) - 1))));
  auto cls_pos = pos.narrow(1, 0, 1);
  auto grid_pos = pos.narrow(1, 1, old_grid * old_grid).reshape({1, old_grid, old_grid, D}).permute({0, 3, 1, 2});
  grid_pos = F::interpolate(grid_pos, F::InterpolateFuncOptions()
                                          .size(std::vector<int64_t>{new_grid, new_grid})
                                          .mode(torch::kBicubic)
                                          .align_corners(false));
  // FACT: g = torch.randn(1, 8, 3, 3); assert is_view_of(g.permute(0, 2, 3, 1).reshape(1, 9, 8), g)
  grid_pos = grid_pos.permute({0, 2, 3, 1}).reshape({1, new_grid * new_grid, D});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the adjacent H and W dims merge: a view
  return torch::cat({cls_pos, grid_pos}, 1);
}

struct VisionTransformerImpl : nn::Module {
  explicit VisionTransformerImpl(const ViTConfig& cfg)
      : grid(cfg.image_size / cfg.patch_size), embed_dim(cfg.embed_dim) {
    patch_embed = register_module("patch_embed", PatchEmbed(cfg));
    cls_token = register_parameter("cls_token", torch::zeros({1, 1, cfg.embed_dim}));
    pos_embed = register_parameter("pos_embed", torch::zeros({1, grid * grid + 1, cfg.embed_dim}));
    nn::init::normal_(pos_embed, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    for (int64_t i = 0; i < cfg.depth; ++i)
      blocks.push_back(register_module("blocks." + std::to_string(i), Block(cfg)));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({cfg.embed_dim}).eps(1e-6)));
    head = register_module("head", nn::Linear(cfg.embed_dim, cfg.num_classes));
  }

  void load_pretrained_embeddings(const torch::Tensor& ckpt_cls, const torch::Tensor& ckpt_pos) {
    {
      torch::NoGradGuard no_grad;
      cls_token.copy_(ckpt_cls);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    auto resized = resize_grid_embed(ckpt_pos, grid);
    pos_embed.copy_(resized);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward_features(const torch::Tensor& images) {
    auto x = patch_embed(images);
    const auto B = x.size(0);
    // FACT: c = torch.zeros(1, 1, 8); e = c.expand(3, -1, -1); y = torch.cat([e, torch.randn(3, 4, 8)], 1); assert y.stride(0) != 0 and is_copy_of(y, c)
    auto cls = cls_token.expand({B, -1, -1});  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded token is only read by cat
    x = torch::cat({cls, x}, 1) + pos_embed;
    for (auto& blk : blocks) x = blk(x);
    return norm(x);
  }

  torch::Tensor forward(const torch::Tensor& images) { return head(forward_features(images).select(1, 0)); }

  // Dense [B, D, g, g] features for linear probing on segmentation.
  torch::Tensor patch_feature_map(const torch::Tensor& images) {
    auto tokens = forward_features(images).narrow(1, 1, grid * grid);
    // FACT: x = torch.randn(2, 17, 8); t = x.narrow(1, 1, 16); assert is_view_of(t.transpose(1, 2).view(2, 8, 4, 4), x)
    return tokens.transpose(1, 2).view({tokens.size(0), embed_dim, grid, grid});  // LOOKALIKE: tensor-view-non-contiguous -- only the token dim is split: strides allow it
  }

  int64_t grid, embed_dim;
  PatchEmbed patch_embed{nullptr};
  torch::Tensor cls_token, pos_embed;
  std::vector<Block> blocks;
  nn::LayerNorm norm{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(VisionTransformer);

struct Normalizer {
  torch::Tensor mean, stdv;  // [1, 3, 1, 1]
  torch::Tensor operator()(const torch::Tensor& images) const {
    // FACT: x = torch.rand(2, 3, 4, 4); assert shares_storage(x.contiguous(), x)
    auto x = images.contiguous();
    x.sub_(mean).div_(stdv);  // EXPECT: tensor-alias-then-mutate
    return x;
  }
};

torch::Tensor patchify(const torch::Tensor& imgs, int64_t p) {
  const auto B = imgs.size(0), C = imgs.size(1), gh = imgs.size(2) / p, gw = imgs.size(3) / p;
  // FACT: x = torch.randn(2, 3, 8, 8); v = x.view(2, 3, 2, 4, 2, 4); assert is_copy_of(v.permute(0, 2, 4, 3, 5, 1).reshape(2, 4, 48), x)
  auto x = imgs.view({B, C, gh, p, gw, p});  // LOOKALIKE: tensor-view-non-contiguous -- splits dims of a contiguous image batch
  return x.permute({0, 2, 4, 3, 5, 1}).reshape({B, gh * gw, p * p * C});  // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor unpatchify(const torch::Tensor& patches, int64_t p, int64_t gh, int64_t gw) {
  const auto B = patches.size(0), C = patches.size(2) / (p * p);
  auto x = patches.view({B, gh, gw, p, p, C}).permute({0, 5, 1, 3, 2, 4});
  // FACT: y = torch.randn(2, 4, 48).view(2, 2, 2, 4, 4, 3).permute(0, 5, 1, 3, 2, 4); assert raises(lambda: y.view(2, 3, 8, 8), "view size is not compatible")
  return x.view({B, C, gh * p, gw * p});  // EXPECT: tensor-view-non-contiguous
}

struct MixedBatch {
  torch::Tensor images;
  torch::Tensor targets;
};

MixedBatch mix_batch(const torch::Tensor& images, const torch::Tensor& soft, const ViTConfig& cfg, std::mt19937& rng) {
  const auto B = images.size(0), H = images.size(2), W = images.size(3);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  std::gamma_distribution<double> gam(cfg.mixup_alpha, 1.0);
  const double g1 = gam(rng), g2 = gam(rng);
  double lam = g1 / (g1 + g2);

  auto perm = torch::randperm(B, torch::TensorOptions().dtype(torch::kLong).device(images.device()));
  auto shuffled = images.index_select(0, perm);

  const double r = uni(rng);
  if (r < cfg.shuffle_prob) {
    const auto p = cfg.patch_size, gh = H / p, gw = W / p;
    auto patches = patchify(images, p);
    auto order = torch::argsort(torch::rand({B, gh * gw}, images.options()), /*dim=*/int64_t{1});
    auto idx = order.unsqueeze(-1).expand({B, gh * gw, patches.size(2)});
    return {unpatchify(torch::gather(patches, 1, idx), p, gh, gw), soft};
  }
  if (r < cfg.shuffle_prob + cfg.cutmix_prob) {
    const auto ch = static_cast<int64_t>(H * std::sqrt(1.0 - lam));
    const auto cw = static_cast<int64_t>(W * std::sqrt(1.0 - lam));
    const auto y0 = static_cast<int64_t>(uni(rng) * (H - ch)), x0 = static_cast<int64_t>(uni(rng) * (W - cw));
    auto mixed = images.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written through a view; images must stay intact
    mixed.narrow(2, y0, ch).narrow(3, x0, cw).copy_(shuffled.narrow(2, y0, ch).narrow(3, x0, cw));
    lam = 1.0 - static_cast<double>(ch * cw) / static_cast<double>(H * W);
    return {mixed, soft * lam + soft.index_select(0, perm) * (1.0 - lam)};
  }
  auto mixed = images.clone();  // EXPECT: tensor-unnecessary-clone
  mixed.mul_(lam);
  mixed.add_(shuffled, 1.0 - lam);
  return {mixed, soft * lam + soft.index_select(0, perm) * (1.0 - lam)};
}

torch::Tensor soft_target_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return (-targets * torch::log_softmax(logits, -1)).sum(-1).mean();
}

using Batch = torch::data::Example<>;

double train_one_epoch(VisionTransformer& model, torch::optim::AdamW& opt, const std::vector<Batch>& batches,
                       const Normalizer& normalize, const ViTConfig& cfg, torch::Device device, int epoch) {
  model->train();
  std::mt19937 rng(static_cast<unsigned>(epoch) * 7919u + 1u);
  torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t steps = 0, seen = 0;

  for (const auto& batch : batches) {
    auto images = normalize(batch.data.to(device));
    auto labels = batch.target.to(device);
    auto soft = torch::one_hot(labels, cfg.num_classes).to(torch::kFloat) * (1.0 - cfg.label_smoothing) +
                cfg.label_smoothing / static_cast<double>(cfg.num_classes);

    auto mixed = mix_batch(images, soft, cfg, rng);
    auto logits = model->forward(mixed.images);
    auto loss = soft_target_cross_entropy(logits, mixed.targets);

    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();

    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    correct += (logits.argmax(1) == labels).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison does not require grad
    seen += labels.size(0);
    if (++steps % 100 == 0)
      std::cout << "epoch " << epoch << " step " << steps << " loss " << loss.item<float>() << "\n";
  }
  const double mean_loss = epoch_loss.item<double>() / std::max<int64_t>(steps, 1);
  std::cout << "epoch " << epoch << " loss " << mean_loss << " mix-acc "
            << correct.item<double>() / std::max<int64_t>(seen, 1) << "\n";
  return mean_loss;
}
