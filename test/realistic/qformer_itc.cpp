// Stage-1 Q-Former pretraining (image-text contrastive objective only), after BLIP-2.
// A frozen ViT produces patch features; a small set of learned queries reads them through
// cross-attention and is aligned with the [CLS] state of the text branch.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct QFormerConfig {
  int64_t image_size = 224, patch = 16, vision_width = 384, vision_depth = 4;
  int64_t hidden = 256, heads = 8, num_queries = 32, num_layers = 4, cross_every = 2;
  int64_t vocab = 30522, max_text_len = 32, embed_dim = 128;
  double init_temp = 0.07, itc_smoothing = 0.1, lr = 1e-4;
  int64_t batch_size = 32, steps_per_epoch = 200, epochs = 10, log_every = 50;
};

// Stand-in for the frozen image tower (EVA-CLIP in the paper).
struct FrozenViTImpl : torch::nn::Module {
  explicit FrozenViTImpl(const QFormerConfig& c) {
    patch_embed = register_module("patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(
                                                     3, c.vision_width, c.patch).stride(c.patch)));
    const int64_t grid = c.image_size / c.patch;
    pos = register_parameter("pos", torch::randn({1, grid * grid, c.vision_width}) * 0.02);
    for (int64_t i = 0; i < c.vision_depth; ++i)
      blocks->push_back(torch::nn::Linear(c.vision_width, c.vision_width));
    register_module("blocks", blocks);
  }

  torch::Tensor forward(const torch::Tensor& images) {
    // FACT: (lambda y: is_view_of(y.flatten(2), y))(torch.randn(2, 8, 4, 4))
    auto x = patch_embed(images).flatten(2).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- the conv output is contiguous, flatten(2) is a view
    x = x + pos;
    for (auto& blk : *blocks) x = x + torch::gelu(blk->as<torch::nn::Linear>()->forward(x));
    return x;
  }

  torch::nn::Conv2d patch_embed{nullptr};
  torch::Tensor pos;
  torch::nn::ModuleList blocks;
};
TORCH_MODULE(FrozenViT);

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t dim, int64_t kv_dim, int64_t heads) : heads_(heads), head_dim_(dim / heads) {
    q_proj = register_module("q_proj", torch::nn::Linear(dim, dim));
    k_proj = register_module("k_proj", torch::nn::Linear(kv_dim, dim));
    v_proj = register_module("v_proj", torch::nn::Linear(kv_dim, dim));
    out_proj = register_module("out_proj", torch::nn::Linear(dim, dim));
  }

  torch::Tensor split_heads(const torch::Tensor& x) const {
    // FACT: (lambda y: is_view_of(y.view(2, 5, 4, 8), y))(torch.nn.Linear(16, 32)(torch.randn(2, 5, 16)))
    return x.view({x.size(0), x.size(1), heads_, head_dim_}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous
  }

  // key_mask: true where the key is a real token. Undefined for image keys.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& kv, const torch::Tensor& key_mask = {}) {
    const auto B = x.size(0), N = x.size(1);
    auto q = split_heads(q_proj(x));
    auto k = split_heads(k_proj(kv));
    auto v = split_heads(v_proj(kv));
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    torch::Tensor pad;
    if (key_mask.defined()) {
      pad = key_mask.logical_not().view({B, 1, 1, -1});
      // FACT: (lambda a: not backward_fails(lambda: (lambda s: (s.masked_fill_(torch.tensor([False, True]), -1e4), s.softmax(-1).pow(2).sum().backward()))(torch.matmul(a, a.t()) / 2.0)))(torch.randn(2, 3, requires_grad=True))
      scores.masked_fill_(pad, -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-inplace-on-saved -- the scaled scores are not saved by anything yet
    }
    auto attn = torch::softmax(scores, -1);
    if (pad.defined()) {
      // FACT: backward_fails(lambda: (lambda s: (s.masked_fill_(torch.tensor([[False, True, False]]), 0.0), (s * torch.randn(2, 3)).sum().backward()))(torch.randn(2, 3, requires_grad=True).softmax(-1)))
      attn.masked_fill_(pad, 0.0);  // EXPECT: tensor-inplace-on-saved
    }
    last_attn_ = attn.detach();
    auto ctx = torch::matmul(attn, v);
    // FACT: (lambda c: is_copy_of(c.transpose(1, 2).reshape(2, 5, -1), c))(torch.randn(2, 4, 5, 8))
    return out_proj(ctx.transpose(1, 2).reshape({B, N, -1}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads_, head_dim_;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  torch::Tensor last_attn_;
};
TORCH_MODULE(Attention);

struct QFormerLayerImpl : torch::nn::Module {
  QFormerLayerImpl(const QFormerConfig& c, bool with_cross) {
    self_attn = register_module("self_attn", Attention(c.hidden, c.hidden, c.heads));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    if (with_cross) {
      cross_attn = register_module("cross_attn", Attention(c.hidden, c.vision_width, c.heads));
      ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    }
    ffn = register_module("ffn", torch::nn::Sequential(torch::nn::Linear(c.hidden, 4 * c.hidden), torch::nn::GELU(),
                                                       torch::nn::Linear(4 * c.hidden, c.hidden)));
    ln3 = register_module("ln3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
  }

  // Queries see the image through cross-attention; text passes (no image) skip it.
  torch::Tensor forward(torch::Tensor x, const torch::Tensor& image_embeds, const torch::Tensor& mask) {
    auto residual = x;
    x = ln1(residual + self_attn(x, x, mask));
    if (!cross_attn.is_empty() && image_embeds.defined()) x = ln2(x + cross_attn(x, image_embeds));
    return ln3(x + ffn->forward(x));
  }

  Attention self_attn{nullptr}, cross_attn{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, ln3{nullptr};
  torch::nn::Sequential ffn{nullptr};
};
TORCH_MODULE(QFormerLayer);

struct QFormerImpl : torch::nn::Module {
  explicit QFormerImpl(const QFormerConfig& c) : cfg(c) {
    query_tokens = register_parameter("query_tokens", torch::empty({1, c.num_queries, c.hidden}));
    query_tokens.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
    word_emb = register_module("word_emb", torch::nn::Embedding(c.vocab, c.hidden));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(c.max_text_len, c.hidden));
    emb_ln = register_module("emb_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    for (int64_t l = 0; l < c.num_layers; ++l)
      layers->push_back(QFormerLayer(c, l % c.cross_every == 0));
    register_module("layers", layers);
  }

  torch::Tensor encode_queries(const torch::Tensor& image_embeds) {
    // FACT: (lambda q: (lambda e: e.stride(0) == 0 and is_copy_of(e + 0, q))(q.expand(4, -1, -1)))(torch.randn(1, 3, 8))
    auto x = query_tokens.expand({image_embeds.size(0), -1, -1});  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded queries are only read; every layer builds new tensors
    for (auto& m : *layers) x = m->as<QFormerLayer>()->forward(x, image_embeds, {});
    return x;
  }

  torch::Tensor encode_text(const torch::Tensor& ids, const torch::Tensor& mask) {
    auto pos = torch::arange(ids.size(1), ids.options());
    auto x = emb_ln(word_emb(ids) + pos_emb(pos));
    for (auto& m : *layers) x = m->as<QFormerLayer>()->forward(x, {}, mask);
    return x.select(1, 0);
  }

  // Per-query cross-attention over the patch grid of the last cross layer, for the notebook.
  std::pair<torch::Tensor, torch::Tensor> cross_attention_maps() {
    torch::Tensor attn;
    for (auto& m : *layers) {
      auto layer = m->as<QFormerLayer>();
      if (!layer->cross_attn.is_empty()) attn = layer->cross_attn->last_attn_;
    }
    const auto B = attn.size(0), H = attn.size(1), Q = attn.size(2);
    const auto g = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(attn.size(3)))));
    // FACT: raises(lambda: torch.rand(2, 4, 3, 16).permute(0, 2, 1, 3).view(2, 3, 16, 4), "view size is not compatible")
    // FACT: (lambda a: is_contiguous(a.mean(1)) and a.mean(1).view(2, 3, 4, 4) is not None)(torch.rand(2, 4, 3, 16))
    auto per_head = attn.permute({0, 2, 1, 3}).view({B, Q, H * g, g});  // EXPECT: tensor-view-non-contiguous
    auto averaged = attn.mean(1).view({B, Q, g, g});  // LOOKALIKE: tensor-view-non-contiguous -- mean() returns a fresh contiguous tensor
    return {per_head, averaged};
  }

  QFormerConfig cfg;
  torch::Tensor query_tokens;
  torch::nn::Embedding word_emb{nullptr}, pos_emb{nullptr};
  torch::nn::LayerNorm emb_ln{nullptr};
  torch::nn::ModuleList layers;
};
TORCH_MODULE(QFormer);

// Label-smoothed identity targets for the in-batch contrastive loss.
torch::Tensor smoothed_targets(int64_t n, double eps, const torch::TensorOptions& opts) {
  auto t = torch::full({1, n}, eps / static_cast<double>(n - 1), opts).expand({n, n});
  // FACT: (lambda t: (t.fill_diagonal_(0.9), bool((t == 0.9).all()))[1])(torch.full((1, 4), 0.1).expand(4, 4))
  t.fill_diagonal_(1.0 - eps);  // EXPECT: tensor-inplace-on-expanded
  return t;
}

torch::Tensor soft_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return -(targets * torch::log_softmax(logits, 1)).sum(1).mean();
}

struct ITCOutput { torch::Tensor loss, hardest_negative, image_embeds; };

struct Blip2ITCImpl : torch::nn::Module {
  explicit Blip2ITCImpl(const QFormerConfig& c) : cfg(c) {
    vision = register_module("vision", FrozenViT(c));
    for (auto& p : vision->parameters()) p.set_requires_grad(false);
    qformer = register_module("qformer", QFormer(c));
    vision_proj = register_module("vision_proj", torch::nn::Linear(c.hidden, c.embed_dim));
    text_proj = register_module("text_proj", torch::nn::Linear(c.hidden, c.embed_dim));
    temp = register_parameter("temp", torch::full({}, c.init_temp));
  }

  std::pair<torch::Tensor, torch::Tensor> features(const torch::Tensor& image_embeds,
                                                   const torch::Tensor& ids, const torch::Tensor& mask) {
    auto img = F::normalize(vision_proj(qformer->encode_queries(image_embeds)),
                            F::NormalizeFuncOptions().dim(-1));
    auto txt = F::normalize(text_proj(qformer->encode_text(ids, mask)),
                            F::NormalizeFuncOptions().dim(-1));
    return {img, txt};
  }

  ITCOutput forward(const torch::Tensor& images, const torch::Tensor& ids, const torch::Tensor& mask) {
    torch::Tensor image_embeds;
    {
      torch::NoGradGuard no_grad;
      vision->eval();
      image_embeds = vision->forward(images);
    }
    // ln_vision without affine; the tower may run in half precision
    auto kv = image_embeds.to(torch::kFloat);
    // FACT: (lambda e: shares_storage(e.to(torch.float), e))(torch.randn(2, 5, 8))
    kv.sub_(kv.mean(-1, true)).div_(kv.std({-1}, true, true) + 1e-6);  // EXPECT: tensor-alias-then-mutate

    auto [img_feats, text_feat] = features(kv, ids, mask);
    // best-matching query for every (image, text) pair
    auto sim_i2t = std::get<0>(torch::einsum("iqd,jd->ijq", {img_feats, text_feat}).max(-1));
    auto targets = smoothed_targets(sim_i2t.size(0), cfg.itc_smoothing, sim_i2t.options());
    auto loss = 0.5 * (soft_cross_entropy(sim_i2t / temp, targets) +
                       soft_cross_entropy(sim_i2t.t() / temp, targets));

    auto neg = sim_i2t.detach();
    // FACT: backward_fails(lambda: (lambda s, t: (s.detach().fill_diagonal_(-1.0), (s / t).sum().backward()))(torch.randn(4, 3, requires_grad=True).mm(torch.randn(3, 4)), torch.tensor(0.07, requires_grad=True)))
    neg.fill_diagonal_(-1.0);  // EXPECT: tensor-inplace-on-detached
    return {loss, std::get<0>(neg.max(1)).mean(), image_embeds};
  }

  QFormerConfig cfg;
  FrozenViT vision{nullptr};
  QFormer qformer{nullptr};
  torch::nn::Linear vision_proj{nullptr}, text_proj{nullptr};
  torch::Tensor temp;
};
TORCH_MODULE(Blip2ITC);

struct CaptionBatch { torch::Tensor images, ids, mask; };

// The real pipeline reads COCO/CC3M shards; this one synthesises batches of the same form.
struct CaptionStream {
  explicit CaptionStream(const QFormerConfig& c) : cfg(c) {}
  CaptionBatch next() const {
    auto images = torch::rand({cfg.batch_size, 3, cfg.image_size, cfg.image_size});
    auto ids = torch::randint(1, cfg.vocab, {cfg.batch_size, cfg.max_text_len}, torch::kLong);
    auto lengths = torch::randint(4, cfg.max_text_len + 1, {cfg.batch_size, 1}, torch::kLong);
    auto mask = torch::arange(cfg.max_text_len, torch::kLong).unsqueeze(0).lt(lengths);
    return {images, ids, mask};
  }
  QFormerConfig cfg;
};

double recall_at_1(Blip2ITC& model, const CaptionStream& stream, int64_t batches,
                   const torch::Tensor& mean, const torch::Tensor& std, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto mean_d = mean.to(device), std_d = std.to(device);
  std::vector<torch::Tensor> img_bank, txt_bank;
  for (int64_t b = 0; b < batches; ++b) {
    auto batch = stream.next();
    auto images = (batch.images.to(device) - mean_d) / std_d;
    auto kv = model->vision->forward(images);
    kv = (kv - kv.mean(-1, true)) / (kv.std({-1}, true, true) + 1e-6);
    auto feats = model->features(kv, batch.ids.to(device), batch.mask.to(device));
    img_bank.push_back(feats.first);  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed under NoGradGuard, no graph attached
    txt_bank.push_back(feats.second);
  }
  auto img = torch::cat(img_bank), txt = torch::cat(txt_bank);
  auto sim = std::get<0>(torch::einsum("iqd,jd->ijq", {img, txt}).max(-1));
  auto gt = torch::arange(sim.size(0));
  return sim.argmax(1).eq(gt).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-device-mismatch
}

int main() {
  QFormerConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);

  Blip2ITC model(cfg);
  model->to(device);
  std::vector<torch::Tensor> trainable;
  for (auto& p : model->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.05));

  const auto pixel_mean = torch::tensor({0.4815f, 0.4578f, 0.4082f}).view({1, 3, 1, 1});
  const auto pixel_std = torch::tensor({0.2686f, 0.2613f, 0.2758f}).view({1, 3, 1, 1});
  CaptionStream stream(cfg);
  std::vector<torch::Tensor> cached_vit_features;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->qformer->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto batch = stream.next();
      auto images = batch.images.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      images = (images - pixel_mean.to(device)) / pixel_std.to(device);  // EXPECT: tensor-clone-in-loop
      auto out = model->forward(images, batch.ids.to(device), batch.mask.to(device));

      opt.zero_grad();
      out.loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        model->temp.clamp_(0.001, 0.5);  // LOOKALIKE: tensor-inplace-on-leaf -- clamped under NoGradGuard, as BLIP-2 does
      }
      // FACT: (lambda t, l: (t.add_(l), kept_nodes(t) > 0)[1])(torch.zeros(()), (torch.randn(3, requires_grad=True) * 2).sum())
      epoch_loss += out.loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (epoch == 0 && step < 8)
        cached_vit_features.push_back(out.image_embeds);  // LOOKALIKE: tensor-graph-kept-across-iterations -- produced under NoGradGuard by the frozen tower
      if (step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " itc "
                  << out.loss.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
                  << " hardest-neg " << out.hardest_negative.item<double>() << '\n';
    }
    std::cout << "epoch " << epoch << " mean itc " << epoch_loss.item<double>() / cfg.steps_per_epoch
              << " recall@1 " << recall_at_1(model, stream, 4, pixel_mean, pixel_std, device) << '\n';
  }

  auto maps = model->qformer->cross_attention_maps();
  torch::save(maps.second.cpu(), "qformer_attention.pt");
  torch::save(model, "qformer_stage1.pt");
  return 0;
}
