// Longformer-style self-attention: every token attends to a band of 2w+1 neighbours,
// computed chunk by chunk (query chunks of w tokens against the 3w keys of the previous,
// current and next chunk), plus a handful of leading global tokens ([CLS], question
// tokens) that attend to, and are attended by, the whole sequence.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct LongformerConfig {
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t window = 256;   // one-sided window w
  int64_t num_global = 4; // leading tokens with global attention
  int64_t ffn = 3072;
  int64_t layers = 2;
  double dropout = 0.1;
  int64_t batch = 2;
  int64_t max_len = 4096;
};

// Pads dim 1 of a [B, T, ...] tensor up to a multiple of `multiple`.
torch::Tensor pad_to_multiple(const torch::Tensor& x, int64_t multiple, double value) {
  const int64_t T = x.size(1);
  const int64_t pad = (multiple - T % multiple) % multiple;
  if (pad == 0) return x;
  std::vector<int64_t> spec(2 * (x.dim() - 1), 0);  // last dim first, dim 1 last
  spec.back() = pad;
  return F::pad(x, F::PadFuncOptions(spec).value(value));
}

// [B, T, C] -> [B, H, T, D], contiguous so that the sequence can be chunked with view().
torch::Tensor split_heads(const torch::Tensor& x, int64_t heads) {
  const auto B = x.size(0), T = x.size(1), C = x.size(2);
  // FACT: x = torch.randn(2, 8, 12); assert is_view_of(x.view(2, 8, 3, 4), x)
  return x.view({B, T, heads, C / heads}).transpose(1, 2).contiguous();  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
}

struct LongformerSelfAttentionImpl : torch::nn::Module {
  explicit LongformerSelfAttentionImpl(const LongformerConfig& cfg)
      : cfg_(cfg), head_dim_(cfg.hidden / cfg.heads),
        scale_(1.0 / std::sqrt(static_cast<double>(cfg.hidden / cfg.heads))) {
    TORCH_CHECK(cfg.hidden % cfg.heads == 0, "hidden must be divisible by heads");
    query = register_module("query", torch::nn::Linear(cfg.hidden, cfg.hidden));
    key = register_module("key", torch::nn::Linear(cfg.hidden, cfg.hidden));
    value = register_module("value", torch::nn::Linear(cfg.hidden, cfg.hidden));
    query_global = register_module("query_global", torch::nn::Linear(cfg.hidden, cfg.hidden));
    key_global = register_module("key_global", torch::nn::Linear(cfg.hidden, cfg.hidden));
    value_global = register_module("value_global", torch::nn::Linear(cfg.hidden, cfg.hidden));
    out_proj = register_module("out_proj", torch::nn::Linear(cfg.hidden, cfg.hidden));
    dropout = register_module("dropout", torch::nn::Dropout(cfg.dropout));
  }

  // x: [B, T, C] with T a multiple of the window; attention_mask: [B, T], 1 = token, 0 = pad;
  // global_attention_mask: [B, T], 1 on the global tokens.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& attention_mask,
                        const torch::Tensor& global_attention_mask) {
    const int64_t w = cfg_.window, H = cfg_.heads, D = head_dim_, G = cfg_.num_global;
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    const int64_t nb = T / w;
    TORCH_CHECK(T % w == 0, "sequence length must be padded to a multiple of the window");

    // Longformer convention: 0 = padding, 1 = local attention, 2 = global attention.
    // FACT: m = torch.ones(2, 6); mask = m; mask.mul_(torch.zeros(2, 6) + 2); assert shares_storage(mask, m) and m.max() == 2
    torch::Tensor mask = attention_mask;
    mask.mul_(global_attention_mask + 1);  // EXPECT: tensor-alias-then-mutate
    auto key_is_pad = mask.eq(0);
    auto key_outside_window = key_is_pad.logical_or(mask.eq(2));  // global keys get their own columns

    auto q = query->forward(x);
    q.mul_(scale_);  // LOOKALIKE: tensor-inplace-on-saved -- Linear keeps its input, not its output
    auto qh = split_heads(q, H);
    auto kh = split_heads(key->forward(x), H);
    auto vh = split_heads(value->forward(x), H);

    // ---- local band: query chunks of w against 3w keys ----
    // FACT: t = torch.randn(2, 8, 12).view(2, 8, 3, 4).transpose(1, 2).contiguous(); assert is_view_of(t.view(2, 3, 2, 4, 4), t)
    auto qc = qh.view({B, H, nb, w, D});  // LOOKALIKE: tensor-view-non-contiguous -- split_heads returns a contiguous tensor
    auto kwin = F::pad(kh, F::PadFuncOptions({0, 0, w, w})).unfold(2, 3 * w, w);  // [B, H, nb, D, 3w]
    auto vwin = F::pad(vh, F::PadFuncOptions({0, 0, w, w})).unfold(2, 3 * w, w);
    auto local_scores = torch::einsum("bhcqd,bhcdk->bhcqk", {qc, kwin});

    auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(x.device());
    auto qi = torch::arange(w, long_opts).unsqueeze(1);
    auto kj = torch::arange(3 * w, long_opts).unsqueeze(0);
    auto outside_band = (kj - w - qi).abs() > w;  // [w, 3w]
    auto key_blocked = F::pad(key_outside_window.to(torch::kFloat), F::PadFuncOptions({w, w}).value(1.0))
                           .unfold(1, 3 * w, w)
                           .gt(0.5)
                           .view({B, 1, nb, 1, 3 * w});
    // FACT: q = torch.randn(2, 3, 4, requires_grad=True); s = torch.einsum('btd,bsd->bts', q, q); s.masked_fill_(s > 0, -1e4); s.softmax(-1).sum().backward()
    local_scores.masked_fill_(key_blocked.logical_or(outside_band), -1e4);  // LOOKALIKE: tensor-inplace-on-saved -- einsum's result is not kept for backward

    // every token also attends to the global tokens
    auto to_global = torch::einsum("bhcqd,bhgd->bhcqg", {qc, kh.narrow(2, 0, G)});
    auto probs = torch::softmax(torch::cat({to_global, local_scores}, -1), -1);
    auto query_is_pad = key_is_pad.view({B, 1, nb, w, 1});
    probs.masked_fill_(query_is_pad, 0.0);  // EXPECT: tensor-inplace-on-saved
    probs = dropout->forward(probs);

    auto ctx = torch::einsum("bhcqg,bhgd->bhcqd", {probs.narrow(-1, 0, G), vh.narrow(2, 0, G)}) +
               torch::einsum("bhcqk,bhcdk->bhcqd", {probs.narrow(-1, G, 3 * w), vwin});
    // FACT: c = torch.randn(2, 3, 4, 5, 6); assert is_copy_of(c.permute(0, 2, 3, 1, 4).reshape(2, 20, 18), c)
    auto out = ctx.permute({0, 2, 3, 1, 4}).reshape({B, T, C});  // EXPECT: tensor-reshape-non-contiguous

    // ---- global tokens: separate projections, attend to the whole sequence ----
    auto gq = query_global->forward(x.narrow(1, 0, G)).mul(scale_);
    auto gqh = gq.view({B, G, H, D}).transpose(1, 2);  // [B, H, G, D]
    auto gkh = key_global->forward(x).view({B, T, H, D}).transpose(1, 2);
    auto gvh = value_global->forward(x).view({B, T, H, D}).transpose(1, 2);
    auto gscores = torch::matmul(gqh, gkh.transpose(-1, -2));  // [B, H, G, T]

    // FACT: b = torch.ones(2, 1, 1, 5).expand(2, 3, 4, 5); assert raises(lambda: b.mul_(-1e4), "more than one element of the written-to tensor")
    auto pad_bias = key_is_pad.to(torch::kFloat).view({B, 1, 1, T}).expand({B, H, G, T});
    pad_bias.mul_(-1e4);  // EXPECT: tensor-inplace-on-expanded
    // FACT: s = torch.randn(2, 3, 4, 5); s.add_(torch.ones(2, 1, 1, 5).expand(2, 3, 4, 5))
    gscores.add_(pad_bias);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is only read

    auto gprobs = torch::softmax(gscores, -1);
    auto gattn = gprobs.clone();  // EXPECT: tensor-unnecessary-clone
    gattn.masked_fill_(key_is_pad.view({B, 1, 1, T}), 0.0);
    // FACT: p = torch.randn(2, 3, 4, 5); assert is_view_of(p.permute(2, 0, 1, 3).reshape(4, 6, 5), p)
    last_global_attn_ = gattn.detach().permute({2, 0, 1, 3}).reshape({G, B * H, T});  // LOOKALIKE: tensor-reshape-non-contiguous -- B and H stay adjacent and in order: a view

    auto gctx = torch::matmul(dropout->forward(gattn), gvh);  // [B, H, G, D]
    // FACT: g = torch.randn(2, 3, 4, 5); assert raises(lambda: g.transpose(1, 2).view(2, 4, 15), "view size is not compatible")
    auto gout = gctx.transpose(1, 2).view({B, G, C});  // EXPECT: tensor-view-non-contiguous

    // global tokens' rows come from the global path
    // FACT: o = torch.randn(2, 16, 12); g = o.narrow(1, 0, 3); assert is_view_of(g, o)
    auto global_rows = out.narrow(1, 0, G);
    global_rows.copy_(gout);  // LOOKALIKE: tensor-alias-then-mutate -- writing the global rows of out through an explicit view is intended
    return out_proj->forward(out);
  }

  LongformerConfig cfg_;
  int64_t head_dim_;
  double scale_;
  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};
  torch::nn::Linear query_global{nullptr}, key_global{nullptr}, value_global{nullptr};
  torch::nn::Linear out_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::Tensor last_global_attn_;  // [G, B * H, T], for inspection
};
TORCH_MODULE(LongformerSelfAttention);

struct LongformerLayerImpl : torch::nn::Module {
  explicit LongformerLayerImpl(const LongformerConfig& cfg) {
    attn = register_module("attn", LongformerSelfAttention(cfg));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    fc1 = register_module("fc1", torch::nn::Linear(cfg.hidden, cfg.ffn));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.ffn, cfg.hidden));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
  }

  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& mask,
                        const torch::Tensor& global_mask) {
    auto a = ln1->forward(h + attn->forward(h, mask, global_mask));
    return ln2->forward(a + fc2->forward(F::gelu(fc1->forward(a))));
  }

  LongformerSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(LongformerLayer);

struct LongformerEncoderImpl : torch::nn::Module {
  explicit LongformerEncoderImpl(const LongformerConfig& cfg) : cfg_(cfg) {
    for (int64_t i = 0; i < cfg.layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), LongformerLayer(cfg)));
  }

  // hidden: [B, T, C] embeddings, attention_mask: [B, T] (1 = token, 0 = padding)
  torch::Tensor forward(const torch::Tensor& hidden, const torch::Tensor& attention_mask) {
    const int64_t T = hidden.size(1);
    auto h = pad_to_multiple(hidden, cfg_.window, 0.0);
    auto mask = pad_to_multiple(attention_mask, cfg_.window, 0.0);
    auto global_mask = torch::zeros_like(mask);
    global_mask.narrow(1, 0, cfg_.num_global).fill_(1);
    for (auto& layer : layers) h = layer->forward(h, mask, global_mask);
    return h.narrow(1, 0, T);
  }

  LongformerConfig cfg_;
  std::vector<LongformerLayer> layers;
};
TORCH_MODULE(LongformerEncoder);

void smoke_test(const LongformerConfig& cfg) {
  torch::NoGradGuard no_grad;
  LongformerEncoder enc(cfg);
  enc->eval();
  enc->to(torch::kCUDA);

  const int64_t len = cfg.max_len - cfg.window / 3;  // deliberately not a multiple of w
  const int64_t n_pad = cfg.window / 8;
  auto tokens = torch::ones({cfg.batch, len}, torch::kLong).to(torch::kCUDA);
  auto pad_cols = torch::zeros({cfg.batch, n_pad}, tokens.options());
  auto mask = torch::cat({tokens, pad_cols}, 1);  // LOOKALIKE: tensor-device-mismatch -- pad_cols made with tokens.options(), same device
  auto hidden = torch::randn({cfg.batch, len + n_pad, cfg.hidden});
  auto out = enc->forward(hidden, mask);  // EXPECT: tensor-device-mismatch
  std::cout << "output " << out.sizes() << " finite: " << out.isfinite().all().item<bool>()
            << "\n";
}

int main() {
  LongformerConfig cfg;
  cfg.window = 64;
  cfg.max_len = 1024;
  smoke_test(cfg);
  return 0;
}
