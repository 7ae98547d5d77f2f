// DeBERTa-style encoder with disentangled attention: content-to-content,
// content-to-position and position-to-content scores over log-bucketed
// relative positions, fine-tuned for sentence-pair classification.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct DebertaConfig {
  int64_t vocab_size = 128100;
  int64_t hidden = 384;
  int64_t heads = 6;
  int64_t layers = 6;
  int64_t intermediate = 1536;
  int64_t max_position = 512;
  int64_t position_buckets = 256;
  int64_t num_labels = 3;
  double dropout = 0.1;
  bool use_xsoftmax = true;
};

// DeBERTa-v2 log buckets: exact near the diagonal, logarithmic further out.
torch::Tensor make_log_bucket_position(const torch::Tensor& rel_pos, int64_t bucket_size, int64_t max_position) {
  const int64_t mid = bucket_size / 2;
  auto sign = torch::sign(rel_pos);
  auto near = rel_pos.lt(mid).logical_and(rel_pos.gt(-mid));
  auto abs_pos = torch::where(near, torch::full_like(rel_pos, mid - 1), rel_pos.abs()).to(torch::kFloat);
  auto log_pos = torch::log(abs_pos / mid) / std::log((max_position - 1.0) / mid) * (mid - 1) + mid;
  return torch::where(abs_pos.le(mid), rel_pos.to(torch::kFloat), log_pos * sign);
}

torch::Tensor build_relative_position(int64_t len, int64_t buckets, int64_t max_position) {
  auto ids = torch::arange(len, torch::kLong);
  auto rel = ids.unsqueeze(-1) - ids.unsqueeze(0);
  // FACT: r = torch.zeros(3, dtype=torch.long); r.copy_(torch.tensor([1.7, -1.7, 2.5])); assert r.tolist() == [1, -1, 2]
  rel.copy_(make_log_bucket_position(rel, buckets, max_position));  // EXPECT: tensor-copy-narrowing
  return rel.unsqueeze(0);
}

// Masked softmax that zeroes masked rows and computes its own gradient.
struct XSoftmax : public torch::autograd::Function<XSoftmax> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor mask, int64_t dim) {
    auto rmask = mask.logical_not();
    auto out = torch::softmax(input.masked_fill(rmask, std::numeric_limits<float>::lowest()), dim);
    out.masked_fill_(rmask, 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- inside a custom Function's forward; saved after the write
    ctx->save_for_backward({out});
    ctx->saved_data["dim"] = dim;
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto out = ctx->get_saved_variables()[0];
    const auto dim = ctx->saved_data["dim"].toInt();
    auto g = grad_out[0];
    return {out * (g - (g * out).sum(dim, /*keepdim=*/true)), torch::Tensor(), torch::Tensor()};
  }
};

class DisentangledSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit DisentangledSelfAttentionImpl(const DebertaConfig& cfg)
      : heads_(cfg.heads), head_dim_(cfg.hidden / cfg.heads), att_span_(cfg.position_buckets),
        use_xsoftmax_(cfg.use_xsoftmax),
        query_proj(cfg.hidden, cfg.hidden), key_proj(cfg.hidden, cfg.hidden), value_proj(cfg.hidden, cfg.hidden),
        pos_key_proj(cfg.hidden, cfg.hidden), pos_query_proj(cfg.hidden, cfg.hidden), drop(cfg.dropout) {
    register_module("query_proj", query_proj);
    register_module("key_proj", key_proj);
    register_module("value_proj", value_proj);
    register_module("pos_key_proj", pos_key_proj);
    register_module("pos_query_proj", pos_query_proj);
    register_module("drop", drop);
  }

  torch::Tensor split_heads(const torch::Tensor& x) const {
    const auto B = x.size(0), L = x.size(1);
    // FACT: x = torch.nn.functional.linear(torch.randn(2, 5, 8), torch.randn(8, 8)); assert is_view_of(x.view(2, 5, 2, 4), x)
    auto h = x.view({B, L, heads_, head_dim_});  // LOOKALIKE: tensor-view-non-contiguous -- projection outputs are contiguous
    // FACT: x = torch.randn(2, 5, 8); y = x.view(2, 5, 2, 4).permute(0, 2, 1, 3).reshape(4, 5, 4); assert is_copy_of(y, x)
    return h.permute({0, 2, 1, 3}).reshape({B * heads_, L, head_dim_});  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::Tensor split_rel_heads(const torch::Tensor& r) const {
    const auto span = r.size(0);
    auto h = r.view({1, span, heads_, head_dim_}).permute({0, 2, 1, 3});
    // FACT: p = torch.randn(6, 8); r = p.view(1, 6, 2, 4).permute(0, 2, 1, 3).reshape(2, 6, 4); assert is_view_of(r, p)
    return h.reshape({heads_, span, head_dim_});  // LOOKALIKE: tensor-reshape-non-contiguous -- only a size-1 dim is merged, still a view
  }

  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& mask4d,
                        const torch::Tensor& relative_pos, const torch::Tensor& rel_embeddings) {
    const auto B = hidden.size(0), L = hidden.size(1), BH = B * heads_;
    const double scale_factor = 3.0;  // c2c + c2p + p2c
    auto scale = torch::sqrt(torch::tensor(static_cast<float>(head_dim_ * scale_factor)));
    auto q = split_heads(query_proj(hidden)) / scale;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may meet a CUDA one
    auto k = split_heads(key_proj(hidden));
    auto v = split_heads(value_proj(hidden));

    auto pos_key = split_rel_heads(pos_key_proj(rel_embeddings)).repeat({B, 1, 1});
    auto pos_query = split_rel_heads(pos_query_proj(rel_embeddings)).repeat({B, 1, 1}) / scale;

    auto scores = torch::bmm(q, k.transpose(-1, -2));

    // content -> position
    // FACT: full = (torch.arange(6).unsqueeze(-1) - torch.arange(6)).unsqueeze(0); r = full.narrow(1, 0, 4).narrow(2, 0, 4); c = r; c.add_(3).clamp_(0, 5); assert shares_storage(c, full) and int(full[0, 0, 0]) == 3
    auto c2p_pos = relative_pos;
    c2p_pos.add_(att_span_).clamp_(0, 2 * att_span_ - 1);  // EXPECT: tensor-alias-then-mutate
    auto c2p_att = torch::bmm(q, pos_key.transpose(-1, -2));
    // FACT: i = torch.zeros(1, 3, 3, dtype=torch.long).expand(2, 3, 3); x = torch.randn(2, 3, 6); assert is_copy_of(torch.gather(x, -1, i), x) and i.stride(0) == 0
    auto c2p = torch::gather(c2p_att, -1, c2p_pos.expand({BH, L, L}));  // LOOKALIKE: tensor-inplace-on-expanded -- gather only reads the expanded index
    scores.add_(c2p);

    // position -> content
    auto p2c_pos = torch::clamp(-relative_pos + att_span_, 0, 2 * att_span_ - 1);
    auto p2c_att = torch::bmm(k, pos_query.transpose(-1, -2));
    auto p2c = torch::gather(p2c_att, -1, p2c_pos.expand({BH, L, L}));  // LOOKALIKE: tensor-device-mismatch -- relative positions are a registered buffer, moved with the model
    // FACT: s = torch.randn(4, 3, 3); p = torch.gather(torch.randn(4, 3, 6), -1, torch.zeros(4, 3, 3, dtype=torch.long)); s.add_(p.transpose(-1, -2)); assert not shares_storage(s, p)
    scores.add_(p2c.transpose(-1, -2));  // LOOKALIKE: tensor-inplace-overlap -- p2c is its own tensor, no overlap with scores

    auto s4 = scores.view({B, heads_, L, L});
    torch::Tensor probs;
    if (use_xsoftmax_) {
      probs = XSoftmax::apply(s4, mask4d, -1);
    } else {
      auto rmask = mask4d.logical_not();
      probs = torch::softmax(s4.masked_fill(rmask, std::numeric_limits<float>::lowest()), -1);
      // FACT: s = torch.randn(2, 3, requires_grad=True); m = torch.tensor([[False, True, False], [False, False, True]]); assert backward_fails(lambda: (lambda p: (p.masked_fill_(m, 0.0), p.sum().backward()))(torch.softmax(s, -1)))
      probs.masked_fill_(rmask, 0.0);  // EXPECT: tensor-inplace-on-saved
    }
    auto ctx_layer = torch::bmm(drop(probs).view({BH, L, L}), v);
    // FACT: c = torch.randn(4, 5, 4); assert raises(lambda: c.view(2, 2, 5, 4).permute(0, 2, 1, 3).view(2, 5, 8), 'view size is not compatible')
    return ctx_layer.view({B, heads_, L, head_dim_}).permute({0, 2, 1, 3}).view({B, L, heads_ * head_dim_});  // EXPECT: tensor-view-non-contiguous
  }

 private:
  int64_t heads_, head_dim_, att_span_;
  bool use_xsoftmax_;
  torch::nn::Linear query_proj, key_proj, value_proj, pos_key_proj, pos_query_proj;
  torch::nn::Dropout drop;
};
TORCH_MODULE(DisentangledSelfAttention);

class DebertaLayerImpl : public torch::nn::Module {
 public:
  explicit DebertaLayerImpl(const DebertaConfig& cfg)
      : attn(cfg), attn_out(cfg.hidden, cfg.hidden), attn_norm(torch::nn::LayerNormOptions({cfg.hidden})),
        ffn_in(cfg.hidden, cfg.intermediate), ffn_out(cfg.intermediate, cfg.hidden),
        ffn_norm(torch::nn::LayerNormOptions({cfg.hidden})), drop(cfg.dropout) {
    register_module("attn", attn);
    register_module("attn_out", attn_out);
    register_module("attn_norm", attn_norm);
    register_module("ffn_in", ffn_in);
    register_module("ffn_out", ffn_out);
    register_module("ffn_norm", ffn_norm);
    register_module("drop", drop);
  }
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& mask4d, const torch::Tensor& rel_pos,
                        const torch::Tensor& rel_emb) {
    auto a = attn_norm(h + drop(attn_out(attn(h, mask4d, rel_pos, rel_emb))));
    return ffn_norm(a + drop(ffn_out(F::gelu(ffn_in(a)))));
  }
  DisentangledSelfAttention attn;
  torch::nn::Linear attn_out;
  torch::nn::LayerNorm attn_norm;
  torch::nn::Linear ffn_in, ffn_out;
  torch::nn::LayerNorm ffn_norm;
  torch::nn::Dropout drop;
};
TORCH_MODULE(DebertaLayer);

torch::Tensor get_attention_mask(const torch::Tensor& mask) {
  const auto B = mask.size(0), L = mask.size(1);
  auto ext = mask.unsqueeze(1).expand({B, L, L});
  // FACT: m = torch.ones(2, 5, dtype=torch.long); e = m.unsqueeze(1).expand(2, 5, 5); assert raises(lambda: e.mul_(m.unsqueeze(-1)), 'more than one element')
  ext.mul_(mask.unsqueeze(-1));  // EXPECT: tensor-inplace-on-expanded
  return ext.unsqueeze(1).to(torch::kBool);
}

class DebertaClassifierImpl : public torch::nn::Module {
 public:
  explicit DebertaClassifierImpl(const DebertaConfig& cfg)
      : word(torch::nn::EmbeddingOptions(cfg.vocab_size, cfg.hidden).padding_idx(0)),
        position(cfg.max_position, cfg.hidden), emb_norm(torch::nn::LayerNormOptions({cfg.hidden})),
        rel_embeddings(2 * cfg.position_buckets, cfg.hidden), rel_norm(torch::nn::LayerNormOptions({cfg.hidden})),
        pooler(cfg.hidden, cfg.hidden), classifier(cfg.hidden, cfg.num_labels), drop(cfg.dropout) {
    register_module("word", word);
    register_module("position", position);
    register_module("emb_norm", emb_norm);
    register_module("rel_embeddings", rel_embeddings);
    register_module("rel_norm", rel_norm);
    register_module("pooler", pooler);
    register_module("classifier", classifier);
    register_module("drop", drop);
    for (int64_t i = 0; i < cfg.layers; ++i) {
      layers.push_back(register_module("layer" + std::to_string(i), DebertaLayer(cfg)));
    }
    rel_pos_ = register_buffer("rel_pos", build_relative_position(cfg.max_position, cfg.position_buckets, cfg.max_position));
  }

  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& mask) {
    const auto L = ids.size(1);
    auto position_ids = torch::arange(L);
    auto h = word(ids) + position(position_ids);  // EXPECT: tensor-device-mismatch
    h = drop(emb_norm(h) * mask.unsqueeze(-1).to(h.dtype()));
    auto mask4d = get_attention_mask(mask);
    auto rel_pos = rel_pos_.narrow(1, 0, L).narrow(2, 0, L);
    auto rel_emb = rel_norm(rel_embeddings->weight);
    for (auto& layer : layers) h = layer(h, mask4d, rel_pos, rel_emb);
    auto pooled = F::gelu(pooler(drop(h.select(1, 0))));
    return classifier(drop(pooled));
  }

  torch::nn::Embedding word, position;
  torch::nn::LayerNorm emb_norm;
  torch::nn::Embedding rel_embeddings;
  torch::nn::LayerNorm rel_norm;
  std::vector<DebertaLayer> layers;
  torch::nn::Linear pooler, classifier;
  torch::nn::Dropout drop;

 private:
  torch::Tensor rel_pos_;
};
TORCH_MODULE(DebertaClassifier);

struct PairBatch {
  torch::Tensor ids, mask, labels;
};

PairBatch synthetic_batch(const DebertaConfig& cfg, int64_t B, int64_t L) {
  auto ids = torch::randint(1, cfg.vocab_size, {B, L}, torch::kLong);
  auto lens = torch::randint(L / 2, L + 1, {B, 1}, torch::kLong);
  auto mask = torch::arange(L).unsqueeze(0).lt(lens).to(torch::kLong);
  return {ids * mask, mask, torch::randint(0, cfg.num_labels, {B}, torch::kLong)};
}

void finetune(const DebertaConfig& cfg, torch::Device device, int64_t steps, int64_t accum) {
  DebertaClassifier model(cfg), ema(cfg);
  model->to(device);
  ema->to(device);
  ema->eval();
  auto params = model->parameters();
  auto ema_params = ema->parameters();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) ema_params[i].copy_(params[i]);
  }
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(2e-5).weight_decay(0.01));
  auto class_weights = torch::tensor({1.0f, 1.4f, 0.8f});
  const double decay = 0.999;
  std::vector<torch::Tensor> losses;

  for (int64_t step = 1; step <= steps; ++step) {
    auto batch = synthetic_batch(cfg, 16, 128);
    auto ids = batch.ids.to(device);
    auto mask = batch.mask.to(device);
    auto labels = batch.labels.to(device);
    auto logits = model->forward(ids, mask);
    auto w = class_weights.to(device);  // EXPECT: tensor-clone-in-loop
    auto loss = F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().weight(w));
    loss.backward();
    losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations

    if (step % accum != 0) continue;
    for (auto& p : params) {
      if (!p.grad().defined()) continue;
      // FACT: p = torch.ones(3, requires_grad=True); p.sum().backward(); g = p.grad; g.div_(2); assert shares_storage(g, p.grad) and float(p.grad[0]) == 0.5
      auto g = p.grad();
      g.div_(static_cast<double>(accum));  // LOOKALIKE: tensor-alias-then-mutate -- averaging the accumulated gradient in place is the point
    }
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();
    opt.zero_grad();
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        ema_params[i].mul_(decay).add_(params[i], 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-leaf -- EMA update under NoGradGuard
      }
    }
    if (step % (accum * 50) == 0) {
      auto mean_loss = torch::stack(losses).mean().item<double>();
      std::cout << "step " << step << " loss " << mean_loss << std::endl;
      losses.clear();
    }
  }
  torch::save(ema, "deberta_ema.pt");
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  DebertaConfig cfg;
  finetune(cfg, device, 2000, 4);
  return 0;
}
