// Perceiver (Jaegle et al. 2021) image classifier. Images of different aspect ratios are padded
// to one size per batch; each image becomes a byte array of p x p pixel patches plus 2-D Fourier
// position features, and a keep mask marks the patches that hold real pixels. A learned latent
// array cross-attends to the byte array (iteratively, weights shared), then runs a stack of
// latent self-attention blocks; the class comes from the mean latent.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace F = torch::nn::functional;

struct PerceiverConfig {
  int64_t in_channels = 3, patch = 4, num_latents = 256, latent_dim = 512;
  int64_t cross_heads = 1, self_heads = 8, self_per_cross = 6, num_cross = 2;
  int64_t num_freq_bands = 6, num_classes = 1000, ff_mult = 4;
  double max_freq = 10.0, lr = 4e-4, weight_decay = 0.1, label_smoothing = 0.1, clip = 1.0;
  int64_t epochs = 90, batch_size = 64, warmup_steps = 2000, log_every = 100;
};

// Fourier features of an h x w grid over [-1, 1]^2: [h * w, 2 * (2 * bands + 1)].
torch::Tensor fourier_positions(int64_t h, int64_t w, int64_t bands, double max_freq) {
  auto ys = torch::linspace(-1.0, 1.0, h), xs = torch::linspace(-1.0, 1.0, w);
  // FACT: ys = torch.linspace(-1, 1, 3); xs = torch.linspace(-1, 1, 4); g = torch.stack(torch.meshgrid(ys, xs, indexing='ij'), -1); assert is_view_of(g.reshape(12, 2), g)
  auto grid = torch::stack(torch::meshgrid({ys, xs}, "ij"), -1).reshape({h * w, 2}); // LOOKALIKE: tensor-reshape-non-contiguous -- stack writes a fresh contiguous tensor: a view
  auto freqs = torch::linspace(1.0, max_freq / 2.0, bands);
  auto scaled = grid.unsqueeze(-1) * freqs * M_PI; // [hw, 2, bands]
  auto enc = torch::cat({scaled.sin(), scaled.cos(), grid.unsqueeze(-1)}, -1);
  // FACT: e = torch.cat([torch.randn(12, 2, 3), torch.randn(12, 2, 1)], -1); assert is_view_of(e.flatten(1), e)
  return enc.flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- cat's result is contiguous: flatten is a view
}

// Multi-head attention from queries [B, N, q_dim] to a context [B, M, kv_dim].
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t q_dim, int64_t kv_dim, int64_t heads, int64_t head_dim)
      : heads_(heads), head_dim_(head_dim), scale_(1.0 / std::sqrt(static_cast<double>(head_dim))) {
    to_q = register_module("to_q", torch::nn::Linear(torch::nn::LinearOptions(q_dim, heads * head_dim).bias(false)));
    to_kv = register_module("to_kv", torch::nn::Linear(torch::nn::LinearOptions(kv_dim, 2 * heads * head_dim).bias(false)));
    to_out = register_module("to_out", torch::nn::Linear(heads * head_dim, q_dim));
  }

  // keep [B, M] bool: false for padding patches (undefined when nothing is padded).
  torch::Tensor forward(const torch::Tensor &q_in, const torch::Tensor &ctx, const torch::Tensor &keep = {}) {
    const auto B = q_in.size(0), N = q_in.size(1), M = ctx.size(1);
    // FACT: l = torch.nn.Linear(4, 8); q = l(torch.randn(2, 5, 4)); assert is_view_of(q.view(2, 5, 2, 4), q)
    auto q = to_q(q_in).view({B, N, heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto kv = to_kv(ctx).chunk(2, -1);
    // FACT: t = torch.randn(2, 5, 16); k = t.chunk(2, -1)[0]; v = k.view(2, 5, 2, 4); assert not is_contiguous(k) and shares_storage(v, t)
    auto k = kv[0].view({B, M, heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- splitting the last dim of a chunk keeps its unit stride: a view
    auto v = kv[1].view({B, M, heads_, head_dim_}).transpose(1, 2);
    auto scores = torch::matmul(q, k.transpose(-2, -1));
    // FACT: lq = torch.nn.Linear(4, 4); q = lq(torch.randn(3, 4)); sc = torch.matmul(q, q.t()); sc.mul_(0.5); torch.softmax(sc, -1).sum().backward(); assert lq.weight.grad is not None
    scores.mul_(scale_); // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
    auto att = torch::softmax(scores, -1); // [B, h, N, M]
    if (keep.defined()) {
      // FACT: lq = torch.nn.Linear(4, 4); s = torch.softmax(lq(torch.randn(2, 3, 4)), -1); s.mul_(torch.tensor([True, True, False, True])); assert backward_fails(lambda: s.sum().backward())
      att.mul_(keep.view({B, 1, 1, M})); // EXPECT: tensor-inplace-on-saved -- softmax saved its result: the training step's backward() fails on padded batches
      att.div_(att.sum(-1, true).clamp_min(1e-6));
    }
    auto out = torch::matmul(att, v); // [B, h, N, head_dim]
    // FACT: o = torch.randn(2, 8, 5, 4); assert raises(lambda: o.transpose(1, 2).view(2, 5, -1), "view size is not compatible")
    return to_out(out.transpose(1, 2).view({B, N, heads_ * head_dim_})); // EXPECT: tensor-view-non-contiguous -- heads and tokens swapped: with 8 latent heads the merge cannot be a view
  }

  int64_t heads_, head_dim_;
  double scale_;
  torch::nn::Linear to_q{nullptr}, to_kv{nullptr}, to_out{nullptr};
};
TORCH_MODULE(Attention);

torch::nn::Sequential feed_forward(int64_t dim, int64_t mult) {
  return torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})),
                               torch::nn::Linear(dim, dim * mult), torch::nn::GELU(),
                               torch::nn::Linear(dim * mult, dim));
}

// The cross-attention and its MLP; the Perceiver adds the residuals itself.
struct CrossBlockImpl : torch::nn::Module {
  CrossBlockImpl(const PerceiverConfig &cfg, int64_t byte_dim) {
    norm_q = register_module("norm_q", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.latent_dim})));
    norm_kv = register_module("norm_kv", torch::nn::LayerNorm(torch::nn::LayerNormOptions({byte_dim})));
    attn = register_module("attn", Attention(cfg.latent_dim, byte_dim, cfg.cross_heads, cfg.latent_dim / cfg.cross_heads));
    ff = register_module("ff", feed_forward(cfg.latent_dim, cfg.ff_mult));
  }
  torch::nn::LayerNorm norm_q{nullptr}, norm_kv{nullptr};
  Attention attn{nullptr};
  torch::nn::Sequential ff{nullptr};
};
TORCH_MODULE(CrossBlock);

struct LatentBlockImpl : torch::nn::Module {
  explicit LatentBlockImpl(const PerceiverConfig &cfg) {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.latent_dim})));
    attn = register_module("attn", Attention(cfg.latent_dim, cfg.latent_dim, cfg.self_heads, cfg.latent_dim / cfg.self_heads));
    ff = register_module("ff", feed_forward(cfg.latent_dim, cfg.ff_mult));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = norm(x);
    auto y = x + attn(h, h);
    return y + ff->forward(y);
  }
  torch::nn::LayerNorm norm{nullptr};
  Attention attn{nullptr};
  torch::nn::Sequential ff{nullptr};
};
TORCH_MODULE(LatentBlock);

struct PerceiverImpl : torch::nn::Module {
  PerceiverImpl(const PerceiverConfig &cfg, int64_t height, int64_t width) : patch_(cfg.patch), num_cross_(cfg.num_cross) {
    latents_ = register_parameter("latents", torch::empty({cfg.num_latents, cfg.latent_dim}));
    // FACT: p = torch.nn.Parameter(torch.empty(4, 3)); torch.nn.init.normal_(p, 0.0, 0.02); assert p.is_leaf and p.requires_grad
    torch::nn::init::normal_(latents_, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    pos_ = register_buffer("pos", fourier_positions(height / cfg.patch, width / cfg.patch, cfg.num_freq_bands, cfg.max_freq));
    const auto byte_dim = cfg.in_channels * cfg.patch * cfg.patch + pos_.size(1);
    cross_ = register_module("cross", CrossBlock(cfg, byte_dim));
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.self_per_cross; ++i)
      blocks_->push_back(LatentBlock(cfg));
    head_norm_ = register_module("head_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.latent_dim})));
    head_ = register_module("head", torch::nn::Linear(cfg.latent_dim, cfg.num_classes));
  }

  // [B, C, H, W] -> [B, (H / p) * (W / p), C * p * p + F], patches in raster order.
  torch::Tensor bytes_of(const torch::Tensor &images) {
    const auto B = images.size(0), C = images.size(1);
    auto patches = images.unfold(2, patch_, patch_).unfold(3, patch_, patch_); // [B, C, gh, gw, p, p]
    // FACT: x = torch.randn(2, 3, 8, 8); u = x.unfold(2, 4, 4).unfold(3, 4, 4); r = u.permute(0, 2, 3, 1, 4, 5).reshape(2, -1, 48); assert is_copy_of(r, x)
    auto flat = patches.permute({0, 2, 3, 1, 4, 5}).reshape({B, -1, C * patch_ * patch_}); // EXPECT: tensor-reshape-non-contiguous -- channels moved between the patch grid and the pixels: the whole batch is copied
    // FACT: p = torch.randn(6, 5); e = p.unsqueeze(0).expand(2, -1, -1); c = torch.cat([torch.randn(2, 6, 3), e], -1); assert is_copy_of(c, p) and e.stride(0) == 0
    auto pos = pos_.unsqueeze(0).expand({B, -1, -1}); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded positions are only read by cat
    return torch::cat({flat, pos}, -1); // LOOKALIKE: tensor-device-mismatch -- pos is a registered buffer: model->to(device) moved it
  }

  torch::Tensor forward(const torch::Tensor &images, const torch::Tensor &keep = {}) {
    auto bytes = bytes_of(images);
    auto x = latents_.unsqueeze(0).expand({images.size(0), -1, -1});
    for (int64_t i = 0; i < num_cross_; ++i) {
      // FACT: p = torch.nn.Parameter(torch.randn(4, 3)); x = p.unsqueeze(0).expand(2, -1, -1); y = x + torch.randn(2, 4, 3); assert not shares_storage(y, p)
      x = x + cross_->attn(cross_->norm_q(x), cross_->norm_kv(bytes), keep); // LOOKALIKE: tensor-inplace-on-expanded -- out of place: the expanded latents are only read
      x = x + cross_->ff->forward(x);
      for (const auto &blk : *blocks_)
        x = blk->as<LatentBlock>()->forward(x);
    }
    return head_(head_norm_(x.mean(1)));
  }

  // Export path (no autograd): the first cross-attention's residual is added in place.
  torch::Tensor pooled_latents(const torch::Tensor &images) {
    torch::NoGradGuard no_grad;
    auto bytes = bytes_of(images);
    auto x = latents_.unsqueeze(0).expand({images.size(0), -1, -1});
    // FACT: p = torch.nn.Parameter(torch.randn(4, 3)); f = lambda: torch.no_grad()(lambda: p.unsqueeze(0).expand(2, -1, -1).add_(torch.randn(2, 4, 3)))(); assert raises(f, "more than one element of the written-to tensor")
    x += cross_->attn(cross_->norm_q(x), cross_->norm_kv(bytes)); // EXPECT: tensor-inplace-on-expanded -- x is the latent array broadcast over the batch (stride 0): PyTorch refuses the write
    x = x + cross_->ff->forward(x);
    for (const auto &blk : *blocks_)
      x = blk->as<LatentBlock>()->forward(x);
    return head_norm_(x.mean(1));
  }

  int64_t patch_, num_cross_;
  torch::Tensor latents_, pos_;
  CrossBlock cross_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  torch::nn::LayerNorm head_norm_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(Perceiver);

// Per-channel standardisation; mean and stdev are [C, 1, 1].
torch::Tensor standardize(const torch::Tensor &images, const torch::Tensor &mean, const torch::Tensor &stdev) {
  auto x = images.contiguous();
  // FACT: d = torch.rand(10, 3, 4, 4); b = d.narrow(0, 2, 4); x = b.contiguous(); x.sub_(0.5).div_(0.2); assert shares_storage(x, d) and is_contiguous(b)
  x.sub_(mean).div_(stdev); // EXPECT: tensor-alias-then-mutate -- contiguous() returns the caller's batch: evaluate() normalises its validation set in place, again every epoch
  return x;
}

double evaluate(Perceiver &model, const torch::Tensor &val_x, const torch::Tensor &val_y, const torch::Tensor &val_keep,
                const torch::Tensor &mean, const torch::Tensor &stdev, const PerceiverConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  const int64_t n = val_x.size(0);
  for (int64_t s = 0; s < n; s += cfg.batch_size) {
    const auto len = std::min(cfg.batch_size, n - s);
    auto x = standardize(val_x.narrow(0, s, len), mean, stdev).to(device); // normalised on the host, then uploaded
    auto logits = model->forward(x, val_keep.narrow(0, s, len).to(device));
    correct += logits.argmax(-1).eq(val_y.narrow(0, s, len).to(device)).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and an integer count
  }
  return correct.item<double>() / static_cast<double>(n);
}

void train(Perceiver &model, const torch::Tensor &train_x, const torch::Tensor &train_y, const torch::Tensor &train_keep,
           const torch::Tensor &val_x, const torch::Tensor &val_y, const torch::Tensor &val_keep,
           const torch::Tensor &mean, const torch::Tensor &stdev, const PerceiverConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  const int64_t n = train_x.size(0);
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto running = torch::zeros({}, torch::TensorOptions().device(device));
    auto perm = torch::randperm(n);
    for (int64_t s = 0; s + cfg.batch_size <= n; s += cfg.batch_size) {
      const double lr = cfg.lr * std::min(1.0, static_cast<double>(step + 1) / cfg.warmup_steps);
      for (auto &group : opt.param_groups())
        static_cast<torch::optim::AdamWOptions &>(group.options()).lr(lr);
      auto idx = perm.narrow(0, s, cfg.batch_size);
      auto images = train_x.index_select(0, idx).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new minibatch every step
      auto keep = train_keep.index_select(0, idx).to(device);
      auto x = standardize(images, mean.to(device), stdev.to(device)); // EXPECT: tensor-clone-in-loop -- the same channel statistics are uploaded to the GPU at every step
      auto logits = model->forward(x, keep);
      auto loss = F::cross_entropy(logits, train_y.index_select(0, idx).to(device),
                                   F::CrossEntropyFuncOptions().label_smoothing(cfg.label_smoothing));
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      running += loss.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: only the value is summed
      if (++step % cfg.log_every == 0)
        std::printf("step %lld  loss %.4f  lr %.2e\n", static_cast<long long>(step), loss.item<double>(), lr); // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    const double train_loss = running.item<double>() / static_cast<double>(std::max<int64_t>(1, n / cfg.batch_size)); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the loop of steps
    std::printf("epoch %lld  train %.4f  val acc %.4f\n", static_cast<long long>(epoch), train_loss,
                evaluate(model, val_x, val_y, val_keep, mean, stdev, cfg, device));
  }
}
