// Mask2Former-style transformer decoder: learned queries cross-attend to multi-scale pixel
// features, each layer restricted to the foreground of the previous layer's mask prediction.
#include <torch/torch.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;

struct DecoderConfig {
  int64_t hidden = 256;
  int64_t nheads = 8;
  int64_t num_queries = 100;
  int64_t num_classes = 133;
  int64_t dec_layers = 9;
  int64_t dim_ff = 2048;
  int64_t num_levels = 3;
  double no_object_weight = 0.1;
  double class_weight = 2.0;
  double mask_weight = 5.0;
  double dice_weight = 5.0;
};

// DETR-style 2-D sine positional encoding, [B, 2 * npf, H, W].
Tensor sine_pos_embed(const Tensor& feat, int64_t npf) {
  const int64_t B = feat.size(0), H = feat.size(2), W = feat.size(3);
  const double eps = 1e-6, scale = 2 * M_PI;
  auto opts = feat.options();
  auto y_embed = torch::arange(1, H + 1, opts).view({1, H, 1}).expand({B, H, W});
  auto x_embed = torch::arange(1, W + 1, opts).view({1, 1, W}).expand({B, H, W});
  // FACT: y = torch.arange(1, 5.).view(1, 4, 1).expand(2, 4, 3); assert raises(lambda: y.mul_(0.5), "more than one element")
  y_embed.mul_(scale / (H + eps));  // EXPECT: tensor-inplace-on-expanded
  // FACT: x = torch.arange(1, 4.).view(1, 1, 3).expand(2, 4, 3); y = x * 0.5; assert is_copy_of(y, x) and is_contiguous(y)
  x_embed = x_embed * (scale / (W + eps));  // LOOKALIKE: tensor-inplace-on-expanded -- out-of-place multiply, the result owns its memory
  auto dim_t = torch::arange(npf, opts);
  dim_t = torch::pow(10000.0, 2 * torch::floor(dim_t / 2) / static_cast<double>(npf));
  auto pos_x = x_embed.unsqueeze(-1) / dim_t;
  auto pos_y = y_embed.unsqueeze(-1) / dim_t;
  pos_x = torch::stack({pos_x.slice(3, 0, npf, 2).sin(), pos_x.slice(3, 1, npf, 2).cos()}, 4).flatten(3);
  pos_y = torch::stack({pos_y.slice(3, 0, npf, 2).sin(), pos_y.slice(3, 1, npf, 2).cos()}, 4).flatten(3);
  return torch::cat({pos_y, pos_x}, 3).permute({0, 3, 1, 2});
}

class MaskedCrossAttentionImpl : public torch::nn::Module {
 public:
  MaskedCrossAttentionImpl(int64_t d_model, int64_t nheads) : nheads_(nheads), head_dim_(d_model / nheads) {
    q_proj_ = register_module("q_proj", torch::nn::Linear(d_model, d_model));
    k_proj_ = register_module("k_proj", torch::nn::Linear(d_model, d_model));
    v_proj_ = register_module("v_proj", torch::nn::Linear(d_model, d_model));
    out_proj_ = register_module("out_proj", torch::nn::Linear(d_model, d_model));
    norm_ = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  }

  // tgt [Q, B, C], memory [HW, B, C], attn_mask [B * nh, Q, HW] (true = blocked)
  Tensor forward(const Tensor& tgt, const Tensor& memory, const Tensor& attn_mask, const Tensor& pos,
                 const Tensor& query_pos) {
    const int64_t Q = tgt.size(0), B = tgt.size(1), C = tgt.size(2), L = memory.size(0);
    auto q = q_proj_(tgt + query_pos) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
    auto k = k_proj_(memory + pos);
    auto v = v_proj_(memory);
    // FACT: q = torch.randn(5, 2, 12); assert is_view_of(q.view(5, 6, 4), q)
    q = q.view({Q, B * nheads_, head_dim_}).transpose(0, 1);  // LOOKALIKE: tensor-view-non-contiguous -- the view runs on the fresh Linear output, before the transpose
    k = k.view({L, B * nheads_, head_dim_}).transpose(0, 1);
    v = v.view({L, B * nheads_, head_dim_}).transpose(0, 1);
    auto scores = torch::bmm(q, k.transpose(1, 2)).masked_fill(attn_mask, -INFINITY);
    auto out = torch::bmm(torch::softmax(scores, -1), v);  // [B * nh, Q, hd]
    // FACT: o = torch.randn(6, 5, 4); r = o.transpose(0, 1).reshape(5, 2, 12); assert is_copy_of(r, o)
    out = out.transpose(0, 1).reshape({Q, B, C});  // EXPECT: tensor-reshape-non-contiguous
    return norm_(tgt + out_proj_(out));
  }

 private:
  int64_t nheads_, head_dim_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, out_proj_{nullptr};
  torch::nn::LayerNorm norm_{nullptr};
};
TORCH_MODULE(MaskedCrossAttention);

class SelfAttnFFNImpl : public torch::nn::Module {
 public:
  SelfAttnFFNImpl(int64_t d_model, int64_t nheads, int64_t dim_ff) {
    attn_ = register_module("attn", torch::nn::MultiheadAttention(d_model, nheads));
    lin1_ = register_module("lin1", torch::nn::Linear(d_model, dim_ff));
    lin2_ = register_module("lin2", torch::nn::Linear(dim_ff, d_model));
    norm1_ = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    norm2_ = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
  }

  Tensor forward(const Tensor& tgt, const Tensor& query_pos) {
    auto q = tgt + query_pos;
    auto x = norm1_(tgt + std::get<0>(attn_->forward(q, q, tgt)));
    auto h = lin1_(x);
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output; relu_ records its own result
    return norm2_(x + lin2_(h));
  }

 private:
  torch::nn::MultiheadAttention attn_{nullptr};
  torch::nn::Linear lin1_{nullptr}, lin2_{nullptr};
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
};
TORCH_MODULE(SelfAttnFFN);

struct DecoderOutput {
  Tensor pred_logits;  // [B, Q, K + 1]
  Tensor pred_masks;   // [B, Q, H / 4, W / 4]
  std::vector<Tensor> aux_logits, aux_masks;
};

class MaskedDecoderImpl : public torch::nn::Module {
 public:
  MaskedDecoderImpl(const DecoderConfig& cfg, const std::vector<int64_t>& in_channels) : cfg_(cfg) {
    using namespace torch::nn;
    query_feat_ = register_module("query_feat", Embedding(cfg.num_queries, cfg.hidden));
    query_embed_ = register_module("query_embed", Embedding(cfg.num_queries, cfg.hidden));
    level_embed_ = register_module("level_embed", Embedding(cfg.num_levels, cfg.hidden));
    for (int64_t l = 0; l < cfg.num_levels; ++l)
      input_proj_.push_back(register_module("input_proj_" + std::to_string(l),
                                            Conv2d(Conv2dOptions(in_channels[l], cfg.hidden, 1))));
    for (int64_t i = 0; i < cfg.dec_layers; ++i) {
      cross_.push_back(register_module("cross_" + std::to_string(i), MaskedCrossAttention(cfg.hidden, cfg.nheads)));
      self_.push_back(register_module("self_" + std::to_string(i), SelfAttnFFN(cfg.hidden, cfg.nheads, cfg.dim_ff)));
    }
    norm_ = register_module("decoder_norm", LayerNorm(LayerNormOptions({cfg.hidden})));
    class_embed_ = register_module("class_embed", Linear(cfg.hidden, cfg.num_classes + 1));
    mask_mlp_ = register_module("mask_embed", Sequential(Linear(cfg.hidden, cfg.hidden), ReLU(),
                                                         Linear(cfg.hidden, cfg.hidden), ReLU(),
                                                         Linear(cfg.hidden, cfg.hidden)));
  }

  // Class logits, mask logits, and the attention mask for the next layer at `size`.
  std::tuple<Tensor, Tensor, Tensor> predict(const Tensor& output, const Tensor& mask_features,
                                             std::vector<int64_t> size) {
    auto decoder_output = norm_(output).transpose(0, 1);  // [B, Q, C]
    auto logits = class_embed_(decoder_output);
    auto mask_embed = mask_mlp_->forward(decoder_output);
    auto masks = torch::einsum("bqc,bchw->bqhw", {mask_embed, mask_features});
    // The attention mask needs probabilities only; no gradient flows through it.
    auto probs = masks.detach();
    probs.sigmoid_();  // EXPECT: tensor-inplace-on-detached
    auto small = F::interpolate(probs, F::InterpolateFuncOptions().size(size).mode(torch::kBilinear).align_corners(false));
    auto attn_mask = (small.flatten(2).unsqueeze(1).repeat({1, cfg_.nheads, 1, 1}).flatten(0, 1) < 0.5).detach();
    // A query whose mask is empty at this scale attends everywhere instead of nowhere.
    auto empty = attn_mask.sum(-1) == attn_mask.size(-1);
    attn_mask.masked_fill_(empty.unsqueeze(-1), false);  // LOOKALIKE: tensor-inplace-on-detached -- detach of a fresh comparison result that nothing else holds
    return {logits, masks, attn_mask};
  }

  DecoderOutput forward(const std::vector<Tensor>& feats, const Tensor& mask_features) {
    const int64_t B = mask_features.size(0);
    std::vector<Tensor> src, pos;
    std::vector<std::vector<int64_t>> sizes;
    for (int64_t l = 0; l < cfg_.num_levels; ++l) {
      const auto& x = feats[l];
      sizes.push_back({x.size(2), x.size(3)});
      // FACT: p = torch.randn(2, 4, 5, 6).permute(0, 3, 1, 2); assert is_view_of(p.flatten(2), p)
      pos.push_back(sine_pos_embed(x, cfg_.hidden / 2).flatten(2).permute({2, 0, 1}));  // LOOKALIKE: tensor-reshape-non-contiguous -- the embedding is [B, H, W, C] permuted; flatten(2) merges H and W, still adjacent: a view
      auto s = input_proj_[l](x).flatten(2) + level_embed_->weight[l].view({1, -1, 1});
      src.push_back(s.permute({2, 0, 1}));  // [HW, B, C]
    }
    auto query_pos = query_embed_->weight.unsqueeze(1).repeat({1, B, 1});
    auto output = query_feat_->weight.unsqueeze(1).repeat({1, B, 1});

    DecoderOutput out;
    Tensor logits, masks, attn_mask;
    std::tie(logits, masks, attn_mask) = predict(output, mask_features, sizes[0]);
    for (int64_t i = 0; i < cfg_.dec_layers; ++i) {
      out.aux_logits.push_back(logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- deep supervision: the aux losses differentiate every layer's prediction
      out.aux_masks.push_back(masks);
      const int64_t level = i % cfg_.num_levels;
      output = cross_[i]->forward(output, src[level], attn_mask, pos[level], query_pos);
      output = self_[i]->forward(output, query_pos);
      std::tie(logits, masks, attn_mask) = predict(output, mask_features, sizes[(i + 1) % cfg_.num_levels]);
    }
    out.pred_logits = logits;
    out.pred_masks = masks;
    return out;
  }

 private:
  DecoderConfig cfg_;
  torch::nn::Embedding query_feat_{nullptr}, query_embed_{nullptr}, level_embed_{nullptr};
  std::vector<torch::nn::Conv2d> input_proj_;
  std::vector<MaskedCrossAttention> cross_;
  std::vector<SelfAttnFFN> self_;
  torch::nn::LayerNorm norm_{nullptr};
  torch::nn::Linear class_embed_{nullptr};
  torch::nn::Sequential mask_mlp_{nullptr};
};
TORCH_MODULE(MaskedDecoder);

struct Target {
  Tensor labels;  // [N] int64
  Tensor masks;   // [N, H, W] float in {0, 1}
};

Tensor prob_bce(const Tensor& logits, const Tensor& targets) {
  auto p = torch::sigmoid(logits);
  p.clamp_(1e-6, 1.0 - 1e-6);  // EXPECT: tensor-inplace-on-saved
  return -(targets * torch::log(p) + (1 - targets) * torch::log(1 - p)).mean();
}

Tensor dice_loss(const Tensor& logits, const Tensor& targets) {
  auto p = logits.sigmoid();
  auto num = 2 * (p * targets).sum(-1);
  auto den = p.sum(-1) + targets.sum(-1);
  return (1 - (num + 1) / (den + 1)).mean();
}

// Hungarian-free: query i is matched to ground-truth instance i, the rest predict "no object".
Tensor set_loss(const Tensor& pred_logits, const Tensor& pred_masks, const std::vector<Target>& targets,
                const DecoderConfig& cfg) {
  const int64_t B = pred_logits.size(0), Q = pred_logits.size(1), K = cfg.num_classes;
  auto target_classes = torch::full({B, Q}, K, torch::kLong);
  std::vector<Tensor> src_masks, tgt_masks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = std::min<int64_t>(targets[b].labels.size(0), Q);
    target_classes[b].narrow(0, 0, n).copy_(targets[b].labels.narrow(0, 0, n));  // LOOKALIKE: tensor-copy-narrowing -- int64 labels into an int64 buffer
    src_masks.push_back(pred_masks[b].narrow(0, 0, n));
    tgt_masks.push_back(targets[b].masks.narrow(0, 0, n));
  }
  auto class_w = torch::ones({K + 1}, pred_logits.options());
  class_w[K] = cfg.no_object_weight;
  auto loss_ce = F::cross_entropy(pred_logits.transpose(1, 2), target_classes.to(pred_logits.device()),
                                  F::CrossEntropyFuncOptions().weight(class_w));
  auto tgt = torch::cat(tgt_masks);
  auto src = F::interpolate(torch::cat(src_masks).unsqueeze(1),
                            F::InterpolateFuncOptions()
                                .size(std::vector<int64_t>{tgt.size(1), tgt.size(2)})
                                .mode(torch::kBilinear)
                                .align_corners(false))
                 .squeeze(1);
  auto src_flat = src.flatten(1), tgt_flat = tgt.flatten(1);
  return cfg.class_weight * loss_ce + cfg.mask_weight * prob_bce(src_flat, tgt_flat) +
         cfg.dice_weight * dice_loss(src_flat, tgt_flat);
}

void train_step(MaskedDecoder& decoder, torch::optim::Optimizer& opt, const std::vector<Tensor>& feats,
                const Tensor& mask_features, const std::vector<Target>& targets, const DecoderConfig& cfg) {
  decoder->train();
  auto out = decoder->forward(feats, mask_features);
  auto loss = set_loss(out.pred_logits, out.pred_masks, targets, cfg);
  for (size_t i = 0; i < out.aux_logits.size(); ++i)
    loss = loss + set_loss(out.aux_logits[i], out.aux_masks[i], targets, cfg);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the summed loss is backpropagated just below
  opt.zero_grad();
  loss.backward();
  torch::nn::utils::clip_grad_norm_(decoder->parameters(), 0.01);
  opt.step();
}

// Per-pixel class scores [K, H, W] from one image's queries.
Tensor semantic_inference(const Tensor& mask_cls, const Tensor& mask_pred) {
  auto cls = F::softmax(mask_cls, -1).narrow(-1, 0, mask_cls.size(-1) - 1);
  auto masks = mask_pred;
  // FACT: m = torch.randn(3, 4, 4); a = m; a.sigmoid_(); assert shares_storage(a, m) and bool((m > 0).all())
  masks.sigmoid_();  // EXPECT: tensor-alias-then-mutate
  return torch::einsum("qc,qhw->chw", {cls, masks});
}

// Top-k (query, class) pairs for instance output.
std::pair<Tensor, Tensor> instance_topk(const Tensor& mask_cls, int64_t k) {
  const int64_t K = mask_cls.size(-1) - 1;
  auto scores = F::softmax(mask_cls, -1).narrow(-1, 0, K);  // [Q, K]
  // FACT: s = torch.randn(5, 4).softmax(-1)[:, :-1]; assert raises(lambda: s.view(-1), "view size is not compatible")
  auto flat = scores.view({-1});  // EXPECT: tensor-view-non-contiguous
  auto top = flat.topk(k);
  auto query_idx = torch::div(std::get<1>(top), K, "floor");
  return {std::get<0>(top), query_idx};
}

std::vector<Tensor> evaluate(MaskedDecoder& decoder, torch::nn::Sequential& backbone,
                             const std::vector<Tensor>& images) {
  torch::Device device(torch::kCUDA);
  decoder->to(device);
  backbone->to(device);
  decoder->eval();
  auto pixel_mean = torch::tensor({123.675, 116.28, 103.53}, torch::kFloat).view({1, 3, 1, 1});
  auto pixel_std = torch::tensor({58.395, 57.12, 57.375}, torch::kFloat).view({1, 3, 1, 1}).to(device);
  std::vector<Tensor> results;
  for (const auto& img : images) {
    auto x = img.unsqueeze(0).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different image every iteration
    auto mean = pixel_mean.to(device);  // EXPECT: tensor-clone-in-loop
    x = (x - mean) / pixel_std;
    auto f1 = backbone[0]->as<torch::nn::Conv2d>()->forward(x);
    auto f2 = backbone[1]->as<torch::nn::Conv2d>()->forward(f1);
    auto f3 = backbone[2]->as<torch::nn::Conv2d>()->forward(f2);
    auto out = decoder->forward({f3, f2, f1}, f1);
    results.push_back(semantic_inference(out.pred_logits[0], out.pred_masks[0]));  // EXPECT: tensor-graph-kept-across-iterations
  }
  return results;
}
