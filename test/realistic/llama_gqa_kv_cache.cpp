// LLaMA-style decoder with grouped-query attention and a per-layer KV cache.
// Greedy decoding for left-padded prompt batches plus a small NLL evaluation helper.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct LlamaConfig {
  int64_t vocab_size = 32000, dim = 512, n_layers = 8;
  int64_t n_heads = 8, n_kv_heads = 2, ffn_hidden = 1376, max_seq_len = 1024;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool init_head_from_embedding = false;
};

struct GenerateConfig {
  int64_t max_new_tokens = 64;
  int64_t pad_id = 0;
  double repetition_penalty = 1.1;
  std::vector<int64_t> stop_ids{2};
};

struct RMSNormImpl : nn::Module {
  RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto xf = x.to(torch::kFloat);
    auto inv_rms = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
    return (xf * inv_rms).to(x.scalar_type()) * weight;
  }
  torch::Tensor weight;
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Rotates consecutive (even, odd) pairs of the head dimension. x: [B, heads, T, hd].
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  // FACT: x = torch.randn(2, 5, 3, 8).transpose(1, 2); assert not is_contiguous(x) and is_view_of(x.view(2, 3, 5, 4, 2), x)
  auto pairs = x.view({x.size(0), x.size(1), x.size(2), -1, 2}); // LOOKALIKE: tensor-view-non-contiguous -- only the innermost (stride-1) dim is split, a view for any layout
  auto even = pairs.select(-1, 0);
  auto odd = pairs.select(-1, 1);
  auto re = even * cos - odd * sin;
  auto im = even * sin + odd * cos;
  // FACT: a = torch.randn(2, 3, 4, 5); s = torch.stack([a, a], -1); assert is_view_of(s.flatten(3), s)
  return torch::stack({re, im}, -1).flatten(3); // LOOKALIKE: tensor-reshape-non-contiguous -- stack's result is contiguous
}

// [B, H_kv, S, D] -> [B, H_kv * n_rep, S, D]
torch::Tensor repeat_kv(const torch::Tensor& kv, int64_t n_rep) {
  if (n_rep == 1) return kv;
  const auto B = kv.size(0), H = kv.size(1), S = kv.size(2), D = kv.size(3);
  // FACT: kv = torch.randn(2, 2, 5, 4); e = kv.unsqueeze(2).expand(2, 2, 3, 5, 4); assert is_copy_of(e.reshape(2, 6, 5, 4), kv)
  return kv.unsqueeze(2).expand({B, H, n_rep, S, D}).reshape({B, H * n_rep, S, D}); // EXPECT: tensor-reshape-non-contiguous
}

// Per-sample rotary positions when prompts are left-padded: position 0 is the first real token.
torch::Tensor left_padded_positions(const torch::Tensor& pad_lens, int64_t start, int64_t len) {
  const auto batch = pad_lens.size(0);
  // FACT: p = torch.arange(5).unsqueeze(0).expand(3, 5); assert raises(lambda: p.sub_(torch.ones(3, 1, dtype=torch.long)), "more than one element")
  auto pos = torch::arange(start, start + len, pad_lens.options()).unsqueeze(0).expand({batch, len});
  pos.sub_(pad_lens.unsqueeze(1)); // EXPECT: tensor-inplace-on-expanded
  return pos.clamp_min(0);
}

torch::Tensor apply_repetition_penalty(const torch::Tensor& logits, const torch::Tensor& seen, double penalty) {
  // FACT: l = torch.randn(2, 7); assert shares_storage(l.contiguous(), l)
  auto scores = logits.contiguous();
  auto picked = scores.gather(1, seen);
  picked = torch::where(picked > 0, picked / penalty, picked * penalty);
  scores.scatter_(1, seen, picked); // EXPECT: tensor-alias-then-mutate
  return scores;
}

struct GQAttentionImpl : nn::Module {
  explicit GQAttentionImpl(const LlamaConfig& cfg)
      : n_heads_(cfg.n_heads), n_kv_heads_(cfg.n_kv_heads), head_dim_(cfg.dim / cfg.n_heads),
        max_seq_(cfg.max_seq_len) {
    wq_ = register_module("wq", nn::Linear(nn::LinearOptions(cfg.dim, n_heads_ * head_dim_).bias(false)));
    wk_ = register_module("wk", nn::Linear(nn::LinearOptions(cfg.dim, n_kv_heads_ * head_dim_).bias(false)));
    wv_ = register_module("wv", nn::Linear(nn::LinearOptions(cfg.dim, n_kv_heads_ * head_dim_).bias(false)));
    wo_ = register_module("wo", nn::Linear(nn::LinearOptions(n_heads_ * head_dim_, cfg.dim).bias(false)));
    scale_ = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  }

  void reset_cache(int64_t batch, torch::Device device) {
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
    cache_k_ = torch::zeros({batch, n_kv_heads_, max_seq_, head_dim_}, opts);
    cache_v_ = torch::zeros_like(cache_k_);
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias, int64_t start, bool use_cache) {
    const auto B = x.size(0), T = x.size(1);
    // FACT: y = torch.randn(2, 5, 32); assert is_view_of(y.view(2, 5, 4, 8), y)
    auto q = wq_(x).view({B, T, n_heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- Linear output is contiguous, the transpose comes after the view
    auto k = wk_(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
    auto v = wv_(x).view({B, T, n_kv_heads_, head_dim_}).transpose(1, 2);
    q = apply_rope(q, cos, sin);
    k = apply_rope(k, cos, sin);

    torch::Tensor keys = k;
    torch::Tensor values = v;
    if (use_cache) {
      const auto end = start + T;
      // FACT: c = torch.zeros(3, 2, 10, 4); c.narrow(0, 0, 2).narrow(2, 4, 3).copy_(torch.ones(2, 2, 3, 4)); assert c.sum() == 48
      cache_k_.narrow(0, 0, B).narrow(2, start, T).copy_(k); // LOOKALIKE: tensor-alias-then-mutate -- writing the cache through an explicit view is the point
      cache_v_.narrow(0, 0, B).narrow(2, start, T).copy_(v);
      keys = cache_k_.narrow(0, 0, B).narrow(2, 0, end);
      values = cache_v_.narrow(0, 0, B).narrow(2, 0, end);
    }
    const auto n_rep = n_heads_ / n_kv_heads_;
    keys = repeat_kv(keys, n_rep);
    values = repeat_kv(values, n_rep);

    auto scores = torch::matmul(q, keys.transpose(2, 3)) * scale_;
    // FACT: q = torch.randn(2, 3, 4, requires_grad=True); s = torch.matmul(q, q.transpose(1, 2)) * 0.5; s.add_(torch.ones(3, 3)); torch.softmax(s, -1).sum().backward()
    scores.add_(bias); // LOOKALIKE: tensor-inplace-on-saved -- the scalar multiply saves no tensor and matmul saved q and keys, not its output
    auto probs = torch::softmax(scores, -1);
    auto out = torch::matmul(probs, values);
    // FACT: o = torch.randn(2, 4, 3, 8); assert is_copy_of(o.transpose(1, 2).reshape(2, 3, 32), o)
    return wo_(out.transpose(1, 2).reshape({B, T, n_heads_ * head_dim_})); // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t n_heads_, n_kv_heads_, head_dim_, max_seq_;
  double scale_;
  nn::Linear wq_{nullptr}, wk_{nullptr}, wv_{nullptr}, wo_{nullptr};
  torch::Tensor cache_k_, cache_v_;
};
TORCH_MODULE(GQAttention);

struct BlockImpl : nn::Module {
  explicit BlockImpl(const LlamaConfig& cfg) {
    attn_norm_ = register_module("attn_norm", RMSNorm(cfg.dim, cfg.norm_eps));
    attn_ = register_module("attn", GQAttention(cfg));
    ffn_norm_ = register_module("ffn_norm", RMSNorm(cfg.dim, cfg.norm_eps));
    w1_ = register_module("w1", nn::Linear(nn::LinearOptions(cfg.dim, cfg.ffn_hidden).bias(false)));
    w2_ = register_module("w2", nn::Linear(nn::LinearOptions(cfg.ffn_hidden, cfg.dim).bias(false)));
    w3_ = register_module("w3", nn::Linear(nn::LinearOptions(cfg.dim, cfg.ffn_hidden).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& bias, int64_t start, bool use_cache) {
    auto h = x + attn_->forward(attn_norm_(x), cos, sin, bias, start, use_cache);
    auto g = ffn_norm_(h);
    return h + w2_(F::silu(w1_(g)) * w3_(g));
  }
  RMSNorm attn_norm_{nullptr}, ffn_norm_{nullptr};
  GQAttention attn_{nullptr};
  nn::Linear w1_{nullptr}, w2_{nullptr}, w3_{nullptr};
};
TORCH_MODULE(Block);

struct LlamaImpl : nn::Module {
  explicit LlamaImpl(const LlamaConfig& cfg) {
    tok_emb_ = register_module("tok_emb", nn::Embedding(cfg.vocab_size, cfg.dim));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      layers_.push_back(register_module("layer" + std::to_string(i), Block(cfg)));
    norm_ = register_module("norm", RMSNorm(cfg.dim, cfg.norm_eps));
    lm_head_ = register_module("lm_head", nn::Linear(nn::LinearOptions(cfg.dim, cfg.vocab_size).bias(false)));
    nn::init::normal_(tok_emb_->weight, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    if (cfg.init_head_from_embedding) {
      lm_head_->weight.copy_(tok_emb_->weight); // EXPECT: tensor-inplace-on-leaf
    }
    const auto hd = cfg.dim / cfg.n_heads;
    auto inv_freq = 1.0 / torch::pow(cfg.rope_theta, torch::arange(0, hd, 2, torch::kFloat) / static_cast<double>(hd));
    auto angles = torch::outer(torch::arange(cfg.max_seq_len, torch::kFloat), inv_freq);
    cos_ = register_buffer("rope_cos", angles.cos());
    sin_ = register_buffer("rope_sin", angles.sin());
  }

  void reset_cache(int64_t batch, torch::Device device) {
    for (auto& layer : layers_) layer->attn_->reset_cache(batch, device);
  }

  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& pad_lens, int64_t start,
                        bool use_cache, bool last_only) {
    const auto B = tokens.size(0), T = tokens.size(1), S = start + T;
    auto pos = left_padded_positions(pad_lens, start, T).flatten();
    auto cos = cos_.index_select(0, pos).view({B, 1, T, -1});
    auto sin = sin_.index_select(0, pos).view({B, 1, T, -1});

    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(tokens.device());
    auto key_pos = torch::arange(S, pad_lens.options());
    auto padded = key_pos.unsqueeze(0) < pad_lens.unsqueeze(1);
    auto bias = torch::zeros({B, 1, T, S}, opts);
    // FACT: b = torch.zeros(2, 1, 3, 4); m = torch.rand(2, 1, 1, 4) > 0.5; b.masked_fill_(m.expand_as(b), -1e9); assert b.stride(2) == 4
    bias.masked_fill_(padded.view({B, 1, 1, S}).expand_as(bias), -1e9); // LOOKALIKE: tensor-inplace-on-expanded -- the expanded mask is only read; bias owns its memory
    if (T > 1) bias = bias + torch::full({T, S}, -1e9, opts).triu(start + 1);

    auto h = tok_emb_(tokens);
    for (auto& layer : layers_) h = layer->forward(h, cos, sin, bias, start, use_cache);
    if (last_only) h = h.select(1, -1);
    return lm_head_(norm_(h));
  }

  nn::Embedding tok_emb_{nullptr};
  std::vector<Block> layers_;
  RMSNorm norm_{nullptr};
  nn::Linear lm_head_{nullptr};
  torch::Tensor cos_, sin_;
};
TORCH_MODULE(Llama);

struct GenerationResult {
  torch::Tensor tokens;
  double mean_logprob = 0.0;
  int64_t steps = 0;
};

GenerationResult greedy_generate(Llama& model, const torch::Tensor& prompt, const torch::Tensor& pad_lens,
                                 const GenerateConfig& gcfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const auto B = prompt.size(0), P = prompt.size(1);
  auto tokens = torch::full({B, P + gcfg.max_new_tokens}, gcfg.pad_id,
                            torch::TensorOptions().dtype(torch::kLong).device(device));
  tokens.narrow(1, 0, P).copy_(prompt); // LOOKALIKE: tensor-device-mismatch -- copy_ across devices is allowed
  auto pads = pad_lens.to(device);
  auto stop = torch::tensor(gcfg.stop_ids, torch::kLong);
  auto done = torch::zeros({B}, torch::TensorOptions().dtype(torch::kBool).device(device));
  model->reset_cache(B, device);

  std::vector<torch::Tensor> generated;
  double total_logprob = 0.0;
  int64_t start = 0, cur = P;
  for (int64_t step = 0; step < gcfg.max_new_tokens; ++step) {
    auto step_input = tokens.narrow(1, start, cur - start).contiguous(); // LOOKALIKE: tensor-clone-in-loop -- a different window of a buffer written every step
    auto logits = model->forward(step_input, pads, start, /*use_cache=*/true, /*last_only=*/true);
    auto scores = apply_repetition_penalty(logits, tokens.narrow(1, 0, cur), gcfg.repetition_penalty);
    auto next = scores.argmax(-1);
    next = torch::where(done, torch::full_like(next, gcfg.pad_id), next);
    auto logp = torch::log_softmax(logits, -1).gather(1, next.unsqueeze(1));
    total_logprob += logp.sum().item<double>(); // EXPECT: tensor-sync-in-loop
    tokens.narrow(1, cur, 1).copy_(next.unsqueeze(1)); // LOOKALIKE: tensor-copy-narrowing -- argmax is int64, like the token buffer
    generated.push_back(next); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, and argmax has no graph anyway
    done = done | torch::isin(next, stop.to(device)); // EXPECT: tensor-clone-in-loop
    start = cur;
    ++cur;
    if (done.all().item<bool>()) break; // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop
  }

  GenerationResult res;
  res.steps = static_cast<int64_t>(generated.size());
  res.tokens = tokens.narrow(1, 0, cur).cpu();
  res.mean_logprob = total_logprob / std::max<int64_t>(res.steps * B, 1);
  return res;
}

double evaluate_nll(Llama& model, const std::vector<torch::Tensor>& batches) {
  model->eval();
  torch::Tensor total = torch::zeros({});
  int64_t n = 0;
  for (const auto& seq : batches) {
    const auto T = seq.size(1);
    auto inputs = seq.narrow(1, 0, T - 1);
    auto targets = seq.narrow(1, 1, T - 1);
    auto pads = torch::zeros({seq.size(0)}, seq.options());
    auto logits = model->forward(inputs, pads, 0, /*use_cache=*/false, /*last_only=*/false);
    auto loss = F::cross_entropy(logits.transpose(1, 2), targets);
    total += loss; // EXPECT: tensor-graph-kept-across-iterations
    ++n;
  }
  return total.item<double>() / std::max<int64_t>(n, 1);
}

int main() {
  LlamaConfig cfg;
  cfg.vocab_size = 2048;
  cfg.dim = 256;
  cfg.n_layers = 4;
  cfg.ffn_hidden = 688;
  cfg.max_seq_len = 256;
  Llama model(cfg);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);

  auto prompt = torch::randint(3, cfg.vocab_size, {4, 16}, torch::kLong);
  auto pad_lens = torch::tensor({0, 3, 5, 0}, torch::kLong);
  for (int64_t b = 0; b < prompt.size(0); ++b)
    prompt[b].narrow(0, 0, pad_lens[b].item<int64_t>()).fill_(0);

  GenerateConfig gcfg;
  gcfg.max_new_tokens = 32;
  auto res = greedy_generate(model, prompt, pad_lens, gcfg);
  std::cout << "generated " << res.steps << " steps, mean logprob " << res.mean_logprob << "\n";

  std::vector<torch::Tensor> eval_batches;
  for (int i = 0; i < 4; ++i)
    eval_batches.push_back(torch::randint(3, cfg.vocab_size, {2, 64}, torch::kLong).to(device));
  std::cout << "eval nll " << evaluate_nll(model, eval_batches) << "\n";
  return 0;
}
