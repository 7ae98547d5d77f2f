// RetNet language model: multi-scale retention with xPos, a parallel form for
// training, a chunkwise form for long prompts and a recurrent form for decoding.
// A short causal depthwise conv mixes neighbouring tokens before retention; in
// streaming mode it keeps the last K inputs in a cache.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RetNetConfig {
  int64_t vocab = 32000;
  int64_t dim = 512;
  int64_t heads = 8;
  int64_t layers = 6;
  int64_t ffn_mult = 2;
  int64_t conv_kernel = 4;
  double scale_base = 512.0;
};

struct RetentionState {
  torch::Tensor kv;   // [B, H, Dh, Dh]
  int64_t offset = 0; // tokens seen so far
};

torch::Tensor rotate_every_two(const torch::Tensor& x) {
  auto x1 = x.slice(-1, 0, x.size(-1), 2);
  auto x2 = x.slice(-1, 1, x.size(-1), 2);
  // FACT: a = torch.randn(2, 3, 4)[..., ::2]; st = torch.stack([-a, a], -1); assert is_contiguous(st) and is_view_of(st.flatten(-2), st)
  return torch::stack({-x2, x1}, -1).flatten(-2);  // LOOKALIKE: tensor-reshape-non-contiguous -- stack makes a fresh contiguous tensor, flatten is a view
}

// xPos: rotary angles plus a per-frequency scale that decays with distance.
std::pair<torch::Tensor, torch::Tensor> apply_xpos(const torch::Tensor& q, const torch::Tensor& k,
                                                   int64_t offset, double scale_base) {
  const auto len = q.size(2);
  const auto head_dim = q.size(3);
  const auto half = head_dim / 2;
  auto pos = torch::arange(offset, offset + len, q.options());
  auto base = (torch::arange(0, head_dim, 2, q.options()) + 0.4 * head_dim) / (1.4 * head_dim);
  auto scale = base.unsqueeze(0).expand({len, half});
  // FACT: b = torch.rand(4); s = b.unsqueeze(0).expand(3, 4); assert raises(lambda: s.pow_((torch.arange(3.) / 512).unsqueeze(1)), "more than one element")
  scale.pow_((pos / scale_base).unsqueeze(1));  // EXPECT: tensor-inplace-on-expanded
  auto inv_freq = 1.0 / torch::pow(10000.0, torch::arange(0, head_dim, 2, q.options()) / head_dim);
  auto ang = torch::outer(pos, inv_freq);
  auto sin = ang.sin().repeat_interleave(2, -1);
  auto cos = ang.cos().repeat_interleave(2, -1);
  auto sc = scale.repeat_interleave(2, -1);
  auto q_rot = q.clone();  // EXPECT: tensor-unnecessary-clone
  q_rot.mul_(cos * sc);
  q_rot.add_(rotate_every_two(q) * sin * sc);
  auto k_rot = k * (cos / sc) + rotate_every_two(k) * (sin / sc);
  return {q_rot, k_rot};
}

class MultiScaleRetentionImpl : public nn::Module {
 public:
  explicit MultiScaleRetentionImpl(const RetNetConfig& cfg)
      : heads_(cfg.heads), head_dim_(cfg.dim / cfg.heads), kernel_(cfg.conv_kernel), scale_base_(cfg.scale_base) {
    q_proj = register_module("q_proj", nn::Linear(nn::LinearOptions(cfg.dim, cfg.dim).bias(false)));
    k_proj = register_module("k_proj", nn::Linear(nn::LinearOptions(cfg.dim, cfg.dim).bias(false)));
    v_proj = register_module("v_proj", nn::Linear(nn::LinearOptions(cfg.dim, cfg.dim).bias(false)));
    g_proj = register_module("g_proj", nn::Linear(nn::LinearOptions(cfg.dim, cfg.dim).bias(false)));
    out_proj = register_module("out_proj", nn::Linear(nn::LinearOptions(cfg.dim, cfg.dim).bias(false)));
    norm = register_module("norm", nn::GroupNorm(nn::GroupNormOptions(cfg.heads, cfg.dim).affine(false)));
    conv_weight_ = register_parameter("conv_weight", torch::randn({kernel_, cfg.dim}) / std::sqrt(static_cast<double>(kernel_)));
    auto gamma = 1.0 - torch::pow(2.0, -5.0 - torch::arange(cfg.heads, torch::kFloat));
    decay_ = register_buffer("decay", gamma);
    log_decay_ = register_buffer("log_decay", gamma.log());
    conv_cache_ = register_buffer("conv_cache", torch::zeros({kernel_, 1, cfg.dim}));
  }

  // Parallel form, x: [B, T, D]
  torch::Tensor forward(const torch::Tensor& x) {
    const auto batch = x.size(0);
    const auto len = x.size(1);
    auto mixed = short_conv(x);
    // FACT: y = torch.nn.Linear(8, 8)(torch.randn(2, 5, 8)); assert is_view_of(y.view(2, 5, 2, 4), y)
    auto q = q_proj(mixed).view({batch, len, heads_, head_dim_}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous; the transpose comes after the view
    auto k = k_proj(mixed).view({batch, len, heads_, head_dim_}).transpose(1, 2);
    auto v = v_proj(x).view({batch, len, heads_, head_dim_}).transpose(1, 2);
    std::tie(q, k) = apply_xpos(q, k, 0, scale_base_);
    auto attn = q.matmul(k.transpose(-1, -2));
    attn.mul_(decay_mask(len, x.options()));  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
    attn = attn / attn.abs().sum(-1, true).clamp_min(1.0);
    auto o = attn.matmul(v);  // [B, H, T, Dh]
    // FACT: o = torch.randn(2, 3, 5, 4); assert raises(lambda: o.transpose(1, 2).view(2, 5, -1), "view size is not compatible")
    auto y = o.transpose(1, 2).view({batch, len, -1});  // EXPECT: tensor-view-non-contiguous
    return gate_and_project(x, y);
  }

  // Chunkwise form for long prompts; len must be a multiple of chunk.
  torch::Tensor forward_chunkwise(const torch::Tensor& x, int64_t chunk) {
    const auto batch = x.size(0);
    const auto len = x.size(1);
    TORCH_CHECK(len % chunk == 0, "sequence length must be a multiple of the chunk size");
    const auto n_chunks = len / chunk;
    auto mixed = short_conv(x);
    auto q = q_proj(mixed).view({batch, len, heads_, head_dim_}).transpose(1, 2);
    auto k = k_proj(mixed).view({batch, len, heads_, head_dim_}).transpose(1, 2);
    auto v = v_proj(x).view({batch, len, heads_, head_dim_}).transpose(1, 2);
    std::tie(q, k) = apply_xpos(q, k, 0, scale_base_);
    // FACT: q = torch.randn(2, 6, 3, 4).transpose(1, 2); assert is_view_of(q.view(2, 3, 2, 3, 4), q)
    auto qc = q.view({batch, heads_, n_chunks, chunk, head_dim_});  // LOOKALIKE: tensor-view-non-contiguous -- splitting one dim is always a view
    auto kc = k.view({batch, heads_, n_chunks, chunk, head_dim_});
    auto vc = v.reshape({batch, heads_, n_chunks, chunk, head_dim_});  // LOOKALIKE: tensor-reshape-non-contiguous -- splitting the time dim keeps it a view
    auto inner = (qc.matmul(kc.transpose(-1, -2)) * decay_mask(chunk, x.options())).matmul(vc);

    auto steps = torch::arange(chunk, x.options());
    auto query_decay = decay_.view({-1, 1}).pow(steps + 1).view({1, heads_, chunk, 1});
    auto key_decay = decay_.view({-1, 1}).pow(chunk - 1 - steps).view({1, heads_, chunk, 1});
    auto chunk_decay = decay_.pow(chunk).view({1, heads_, 1, 1});
    auto state = torch::zeros({batch, heads_, head_dim_, head_dim_}, x.options());
    std::vector<torch::Tensor> cross;
    for (int64_t c = 0; c < n_chunks; ++c) {
      cross.push_back((qc.select(2, c) * query_decay).matmul(state));  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the output that backward runs through
      state = state * chunk_decay + (kc.select(2, c) * key_decay).transpose(-1, -2).matmul(vc.select(2, c));
    }
    auto o = inner + torch::stack(cross, 2);  // [B, H, nC, C, Dh]
    // FACT: o = torch.randn(2, 3, 4, 5, 6); assert is_copy_of(o.permute(0, 2, 3, 1, 4).reshape(2, 20, -1), o)
    auto y = o.permute({0, 2, 3, 1, 4}).reshape({batch, len, -1});  // EXPECT: tensor-reshape-non-contiguous
    return gate_and_project(x, y);
  }

  // Recurrent form, x: [B, 1, D].
  std::pair<torch::Tensor, RetentionState> step(const torch::Tensor& x, const RetentionState& prev) {
    const auto batch = x.size(0);
    auto mixed = short_conv_step(x.squeeze(1)).unsqueeze(1);
    auto q = q_proj(mixed).view({batch, 1, heads_, head_dim_}).transpose(1, 2);
    auto k = k_proj(mixed).view({batch, 1, heads_, head_dim_}).transpose(1, 2);
    auto v = v_proj(x).view({batch, 1, heads_, head_dim_}).transpose(1, 2);
    std::tie(q, k) = apply_xpos(q, k, prev.offset, scale_base_);
    torch::Tensor s = prev.kv;
    // FACT: kv = torch.zeros(2, 3, 4, 4); s = kv; s.mul_(torch.rand(1, 3, 1, 1)).add_(torch.randn(2, 3, 4, 4)); assert shares_storage(s, kv)
    s.mul_(decay_.view({1, -1, 1, 1})).add_(k.transpose(-1, -2).matmul(v));  // EXPECT: tensor-alias-then-mutate
    auto o = q.matmul(s);  // [B, H, 1, Dh]
    // FACT: o = torch.randn(2, 3, 1, 4); assert is_view_of(o.transpose(1, 2).reshape(2, 1, -1), o)
    auto y = o.transpose(1, 2).reshape({batch, 1, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- the swapped time dim has size 1, so this is a view
    return {gate_and_project(x, y), RetentionState{s, prev.offset + 1}};
  }

  RetentionState initial_state(int64_t batch, const torch::TensorOptions& opts) const {
    return {torch::zeros({batch, heads_, head_dim_, head_dim_}, opts), 0};
  }

  void reset_cache(int64_t batch) {
    torch::NoGradGuard no_grad;
    conv_cache_.resize_({kernel_, batch, conv_weight_.size(1)}).zero_();
  }

  // Drops the newest n cached inputs (speculative tokens that were rejected).
  void rewind_cache(int64_t n) {
    torch::NoGradGuard no_grad;
    // FACT: c = torch.randn(4, 2, 3); assert not raises(lambda: c.narrow(0, 1, 3).copy_(c.narrow(0, 0, 3).clone()))
    conv_cache_.narrow(0, n, kernel_ - n).copy_(conv_cache_.narrow(0, 0, kernel_ - n).clone());  // LOOKALIKE: tensor-inplace-overlap -- the source is cloned first
    conv_cache_.narrow(0, 0, n).zero_();
  }

  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr}, out_proj{nullptr};
  nn::GroupNorm norm{nullptr};

 private:
  torch::Tensor decay_mask(int64_t len, const torch::TensorOptions& opts) const {
    auto idx = torch::arange(len, opts);
    auto dist = idx.unsqueeze(1) - idx.unsqueeze(0);
    auto mask = (log_decay_.view({-1, 1, 1}) * dist.clamp_min(0)).exp();
    return mask.masked_fill(dist < 0, 0.0);
  }

  torch::Tensor short_conv(const torch::Tensor& x) {  // causal depthwise conv over time
    auto w = conv_weight_.t().flip({1}).unsqueeze(1);  // [D, 1, K]
    auto padded = F::pad(x.transpose(1, 2), F::PadFuncOptions({kernel_ - 1, 0}));
    return F::conv1d(padded, w, F::Conv1dFuncOptions().groups(x.size(2))).transpose(1, 2);
  }

  torch::Tensor short_conv_step(const torch::Tensor& x_t) {  // [B, D]
    // FACT: c = torch.randn(4, 2, 3); assert raises(lambda: c.narrow(0, 0, 3).copy_(c.narrow(0, 1, 3)), "some elements of the input tensor")
    conv_cache_.narrow(0, 0, kernel_ - 1).copy_(conv_cache_.narrow(0, 1, kernel_ - 1));  // EXPECT: tensor-inplace-overlap
    conv_cache_.select(0, kernel_ - 1).copy_(x_t);
    return (conv_cache_ * conv_weight_.flip({0}).unsqueeze(1)).sum(0);
  }

  torch::Tensor gate_and_project(const torch::Tensor& x, const torch::Tensor& y) {
    const auto batch = y.size(0);
    const auto len = y.size(1);
    auto normed = norm(y.reshape({batch * len, -1})).view({batch, len, -1});
    return out_proj(F::silu(g_proj(x)) * normed);
  }

  int64_t heads_, head_dim_, kernel_;
  double scale_base_;
  torch::Tensor conv_weight_, decay_, log_decay_, conv_cache_;
};
TORCH_MODULE(MultiScaleRetention);

class RetNetLMImpl : public nn::Module {
 public:
  explicit RetNetLMImpl(const RetNetConfig& cfg) {
    embed = register_module("embed", nn::Embedding(cfg.vocab, cfg.dim));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      blocks.push_back(register_module("ret" + std::to_string(i), MultiScaleRetention(cfg)));
      ffns.push_back(register_module("ffn" + std::to_string(i), nn::Sequential(
          nn::LayerNorm(nn::LayerNormOptions({cfg.dim})), nn::Linear(cfg.dim, cfg.ffn_mult * cfg.dim),
          nn::GELU(), nn::Linear(cfg.ffn_mult * cfg.dim, cfg.dim))));
    }
    head = register_module("head", nn::Linear(cfg.dim, cfg.vocab));
  }

  // Runs the prompt in chunks and returns the last logits with each layer's state.
  std::pair<torch::Tensor, std::vector<RetentionState>> prefill(const torch::Tensor& ids) {
    std::vector<RetentionState> states;
    for (auto& blk : blocks) {
      blk->reset_cache(ids.size(0));
      states.push_back(blk->initial_state(ids.size(0), embed->weight.options()));
    }
    torch::Tensor logits;
    for (int64_t t = 0; t < ids.size(1); ++t) std::tie(logits, states) = step(ids.narrow(1, t, 1), states);
    return {logits, states};
  }

  std::pair<torch::Tensor, std::vector<RetentionState>> step(const torch::Tensor& tok,
                                                             const std::vector<RetentionState>& states) {
    auto h = embed(tok);  // [B, 1, D]
    std::vector<RetentionState> next;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto out = blocks[i]->step(h, states[i]);
      h = h + out.first;
      h = h + ffns[i]->forward(h);
      next.push_back(out.second);
    }
    return {head(h).squeeze(1), next};
  }

  nn::Embedding embed{nullptr};
  std::vector<MultiScaleRetention> blocks;
  std::vector<nn::Sequential> ffns;
  nn::Linear head{nullptr};
};
TORCH_MODULE(RetNetLM);

// Several sampled continuations of one prompt, sharing the prompt's prefill.
std::vector<std::vector<int64_t>> sample_continuations(RetNetLM& lm, const std::vector<int64_t>& prompt,
                                                       const std::vector<int64_t>& banned_ids, int64_t num_samples,
                                                       int64_t max_new, double temperature, int64_t eos) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  lm->to(device);
  auto banned = torch::tensor(banned_ids, torch::kLong);
  auto ids = torch::tensor(prompt, torch::kLong).unsqueeze(0).to(device);
  auto prefilled = lm->prefill(ids);
  std::vector<std::vector<int64_t>> outs;
  for (int64_t s = 0; s < num_samples; ++s) {
    auto states = prefilled.second;
    auto logits = prefilled.first;
    std::vector<int64_t> seq;
    for (int64_t t = 0; t < max_new; ++t) {
      auto masked = logits.index_fill(-1, banned.to(device), -1e9);  // EXPECT: tensor-clone-in-loop
      auto next = torch::multinomial(torch::softmax(masked / temperature, -1), 1);
      const auto tok = next.item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the token steers the loop and is kept
      if (tok == eos) break;
      seq.push_back(tok);
      std::tie(logits, states) = lm->step(next, states);
    }
    outs.push_back(seq);
  }
  return outs;
}
