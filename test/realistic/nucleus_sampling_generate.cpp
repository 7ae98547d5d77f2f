// Batched sampling for a small decoder-only language model behind a completion endpoint:
// temperature, top-k and nucleus (top-p) filtering, a CTRL-style repetition penalty, banned token
// ids, one key/value cache per layer, and per-row stop conditions (EOS, stop sequences, a token
// budget). Prompts are left-padded so that every row's newest token sits in the last column; rows
// that finish early keep emitting padding until the whole batch is done.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

struct LmConfig {
  int64_t vocab = 32000, dim = 768, heads = 12, layers = 12, max_positions = 2048;
};

struct GenConfig {
  int64_t max_new_tokens = 256, top_k = 50, eos_id = 2, pad_id = 0;
  double temperature = 0.7, top_p = 0.9, repetition_penalty = 1.15;
  std::vector<int64_t> banned_ids;                  // <unk>, <mask>, ... never emitted
  std::vector<std::vector<int64_t>> stop_sequences; // e.g. the ids of "\n\nUser:"
};

struct KvCache {
  torch::Tensor k, v; // [B, heads, T, head_dim], one column more per step
};

constexpr float kMaskValue = -1e9f; // finite, so a fully masked (padding) row stays finite

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const LmConfig &cfg) : heads_(cfg.heads), head_dim_(cfg.dim / cfg.heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(cfg.dim, 3 * cfg.dim));
    proj_ = register_module("proj", torch::nn::Linear(cfg.dim, cfg.dim));
  }

  // x [B, T, C]; bias broadcasts to [B, heads, T, T_cache]
  torch::Tensor forward(const torch::Tensor &x, KvCache &cache, const torch::Tensor &bias) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = qkv_(x).chunk(3, -1);
    // FACT: y = torch.nn.Linear(8, 24)(torch.randn(2, 5, 8)); q = y.chunk(3, -1)[0]; assert is_view_of(q.view(2, 5, 2, 4), y)
    auto q = qkv[0].view({B, T, heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the chunk is strided, but splitting its last dim is expressible
    auto k = qkv[1].view({B, T, heads_, head_dim_}).transpose(1, 2);
    auto v = qkv[2].view({B, T, heads_, head_dim_}).transpose(1, 2);
    cache.k = cache.k.defined() ? torch::cat({cache.k, k}, 2) : k;
    cache.v = cache.v.defined() ? torch::cat({cache.v, v}, 2) : v;
    auto att = torch::matmul(q, cache.k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    att = torch::softmax(att + bias, -1);
    auto y = torch::matmul(att, cache.v);
    // FACT: y = torch.randn(2, 3, 5, 4); c = y.transpose(1, 2).contiguous(); assert is_contiguous(c) and is_view_of(c.view(2, 5, 12), c)
    return proj_(y.transpose(1, 2).contiguous().view({B, T, C})); // LOOKALIKE: tensor-view-non-contiguous, tensor-reshape-non-contiguous -- contiguous() makes the copy explicit first
  }

  int64_t heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const LmConfig &cfg) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    attn_ = register_module("attn", CausalSelfAttention(cfg));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    fc_ = register_module("fc", torch::nn::Linear(cfg.dim, 4 * cfg.dim));
    out_ = register_module("out", torch::nn::Linear(4 * cfg.dim, cfg.dim));
  }
  torch::Tensor forward(torch::Tensor x, KvCache &cache, const torch::Tensor &bias) {
    x = x + attn_->forward(ln1_(x), cache, bias);
    return x + out_(torch::gelu(fc_(ln2_(x))));
  }
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Block);

struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(const LmConfig &cfg) {
    tok_ = register_module("tok", torch::nn::Embedding(cfg.vocab, cfg.dim));
    pos_ = register_module("pos", torch::nn::Embedding(cfg.max_positions, cfg.dim));
    for (int64_t i = 0; i < cfg.layers; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), Block(cfg)));
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.dim, cfg.vocab).bias(false)));
  }
  // ids, positions [B, T] -> logits of the last position [B, vocab]
  torch::Tensor forward(const torch::Tensor &ids, const torch::Tensor &positions, std::vector<KvCache> &caches,
                        const torch::Tensor &bias) {
    auto h = tok_(ids) + pos_(positions);
    for (size_t i = 0; i < blocks_.size(); ++i)
      h = blocks_[i]->forward(h, caches[i], bias);
    return head_(ln_f_(h.select(1, -1)));
  }
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TinyLm);

// One sampling step: logits [B, V], history [B, T] (int64) -> the next token of every row [B].
torch::Tensor sample_next(const torch::Tensor &logits, const torch::Tensor &history, const GenConfig &cfg) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (cfg.temperature <= 0)
    return logits.argmax(-1);
  auto scores = logits.to(torch::kFloat); // the model may be served in half precision
  // FACT: l = torch.randn(2, 10); l0 = l.clone(); s = l.to(torch.float); s.div_(0.7); assert shares_storage(s, l) and not torch.equal(l, l0)
  scores.div_(cfg.temperature); // EXPECT: tensor-alias-then-mutate -- float32 logits: to() returned the caller's tensor, whose log-probs the caller reads after this call

  // Repetition penalty (Keskar et al. 2019): seen tokens lose score whatever its sign.
  if (cfg.repetition_penalty != 1.0) {
    auto seen = scores.gather(1, history);
    seen = torch::where(seen > 0, seen / cfg.repetition_penalty, seen * cfg.repetition_penalty);
    scores = scores.scatter(1, history, seen);
  }
  if (cfg.top_k > 0 && cfg.top_k < scores.size(-1)) {
    auto kth = std::get<0>(scores.topk(cfg.top_k, -1)).narrow(1, cfg.top_k - 1, 1);
    scores = scores.masked_fill(scores < kth, neg_inf);
  }
  if (cfg.top_p < 1.0) {
    auto sorted = scores.sort(/*dim=*/-1, /*descending=*/true);
    auto sorted_scores = std::get<0>(sorted), sorted_idx = std::get<1>(sorted);
    auto cum = torch::softmax(sorted_scores, -1).cumsum(-1);
    auto drop_sorted = cum > cfg.top_p;
    const auto V = drop_sorted.size(1);
    // Keep the token that crosses the threshold: the mask moves one place to the right.
    // FACT: m = torch.tensor([[False, False, True, True]]); m.narrow(1, 1, 3).copy_(m.narrow(1, 0, 3).clone()); m[:, 0] = False; assert m.tolist() == [[False, False, False, True]]
    drop_sorted.narrow(1, 1, V - 1).copy_(drop_sorted.narrow(1, 0, V - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned first
    drop_sorted.select(1, 0).fill_(false);
    auto drop = drop_sorted.scatter(1, sorted_idx, drop_sorted);
    // FACT: s = torch.randn(2, 6); d = s > 0.5; f = s.clone(); f.masked_fill_(d, float('-inf')); assert torch.equal(f, s.masked_fill(d, float('-inf')))
    auto filtered = scores.clone(); // EXPECT: tensor-unnecessary-clone -- filled in place right after: scores.masked_fill(drop, -inf) is one pass
    filtered.masked_fill_(drop, neg_inf);
    scores = filtered;
  }
  return torch::multinomial(torch::softmax(scores, -1), 1).squeeze(1);
}

struct Generation {
  torch::Tensor tokens;   // [B, P + max_new] int64 on the host, padded after each row's end
  torch::Tensor logprobs; // [B, steps] log-probability of each sampled token (0 after the end)
  std::vector<int64_t> lengths;
};

class Generator {
public:
  Generator(TinyLm lm, const LmConfig &lm_cfg) : lm_(std::move(lm)), lm_cfg_(lm_cfg), device_(torch::kCUDA) {
    lm_->to(device_);
    lm_->eval();
  }

  Generation generate(const std::vector<std::vector<int64_t>> &prompts, const GenConfig &cfg) {
    torch::NoGradGuard no_grad;
    const auto B = static_cast<int64_t>(prompts.size());
    int64_t P = 0;
    for (const auto &p : prompts)
      P = std::max<int64_t>(P, static_cast<int64_t>(p.size()));
    std::vector<int64_t> flat, n_pad;
    for (const auto &p : prompts) {
      const auto pad = P - static_cast<int64_t>(p.size());
      n_pad.push_back(pad);
      flat.insert(flat.end(), static_cast<size_t>(pad), cfg.pad_id);
      flat.insert(flat.end(), p.begin(), p.end());
    }
    // FACT: f = torch.tensor([0, 0, 5, 7, 8, 9]); assert is_view_of(f.view(2, 3), f)
    auto ids = torch::tensor(flat).view({B, P}).to(device_); // LOOKALIKE: tensor-view-non-contiguous -- a fresh 1-D tensor
    auto tokens = torch::full({B, P + cfg.max_new_tokens}, cfg.pad_id, ids.options());
    tokens.narrow(1, 0, P).copy_(ids);

    // Position ids count from each row's first real token.
    auto offsets = torch::tensor(n_pad).to(device_);
    auto pos = torch::arange(P, ids.options()).unsqueeze(0).expand({B, P});
    // FACT: pos = torch.arange(5).unsqueeze(0).expand(3, 5); off = torch.tensor([0, 1, 2]); assert raises(lambda: pos.sub_(off.unsqueeze(1)), "more than one element of the written-to tensor refers to a single memory location")
    pos -= offsets.unsqueeze(1); // EXPECT: tensor-inplace-on-expanded -- the B rows of pos are one row of memory: expand copied nothing
    pos.clamp_min_(0);

    // Prefill: causal mask plus the left padding of each row.
    auto fopts = torch::TensorOptions().device(device_);
    auto causal = torch::full({P, P}, kMaskValue, fopts).triu(1);
    auto key_pad = ids.eq(cfg.pad_id);
    // FACT: k = torch.tensor([[1, 0, 3], [0, 0, 4]]).eq(0); assert is_view_of(k.view(2, 1, 1, 3), k)
    auto pad_bias = torch::zeros({B, 1, 1, P}, fopts).masked_fill(key_pad.view({B, 1, 1, P}), kMaskValue); // LOOKALIKE: tensor-view-non-contiguous -- a comparison's result is contiguous
    std::vector<KvCache> caches(static_cast<size_t>(lm_cfg_.layers));
    auto logits = lm_->forward(ids, pos, caches, causal + pad_bias);

    const float neg_inf = -std::numeric_limits<float>::infinity();
    auto banned = torch::tensor(cfg.banned_ids);
    std::vector<torch::Tensor> stops;
    for (const auto &s : cfg.stop_sequences)
      stops.push_back(torch::tensor(s));
    auto finished = torch::zeros({B}, ids.options().dtype(torch::kBool));
    auto lengths = torch::zeros({B}, ids.options());
    auto next_pos = pos.narrow(1, P - 1, 1) + 1;
    std::vector<torch::Tensor> step_logps;

    for (int64_t step = 0, cur = P; step < cfg.max_new_tokens; ++step, ++cur) {
      if (!cfg.banned_ids.empty())
        logits.index_fill_(1, banned.to(device_), neg_inf); // EXPECT: tensor-clone-in-loop -- the same banned ids go to the GPU at every step
      auto next = sample_next(logits, tokens.narrow(1, 0, cur), cfg);
      next = torch::where(finished, torch::full_like(next, cfg.pad_id), next); // LOOKALIKE: tensor-device-mismatch -- finished was made with the ids' options, on the GPU
      auto logp = torch::log_softmax(logits, -1).gather(1, next.unsqueeze(1)).squeeze(1);
      step_logps.push_back(logp.masked_fill(finished, 0)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
      tokens.select(1, cur).copy_(next); // LOOKALIKE: tensor-copy-narrowing -- multinomial gives int64, the buffer's dtype
      lengths += finished.logical_not().to(torch::kLong);
      finished |= next.eq(cfg.eos_id);
      for (const auto &stop : stops) {
        const auto L = stop.size(0);
        if (cur + 1 - L < P)
          continue;
        auto tail = tokens.narrow(1, cur + 1 - L, L);
        finished |= tail.eq(stop.unsqueeze(0)).all(1); // EXPECT: tensor-device-mismatch -- the stop sequences are host tensors, the token buffer is on the GPU
      }
      if (finished.all().item<bool>()) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop
        break;
      // The new column is never padding.
      pad_bias = torch::cat({pad_bias, torch::zeros({B, 1, 1, 1}, fopts)}, 3);
      logits = lm_->forward(next.unsqueeze(1), next_pos, caches, pad_bias);
      // FACT: p = torch.arange(4).unsqueeze(0).expand(3, 4); n = p.narrow(1, 3, 1) + 1; n.add_(1); assert n.stride() == (1, 1) and n.tolist() == [[5], [5], [5]]
      next_pos.add_(1); // LOOKALIKE: tensor-inplace-on-expanded -- a sum has memory of its own, although pos is expanded
    }

    Generation gen;
    gen.tokens = tokens.cpu();
    gen.logprobs = torch::stack(step_logps, 1).cpu();
    auto len_cpu = lengths.cpu();
    auto acc = len_cpu.accessor<int64_t, 1>();
    for (int64_t b = 0; b < B; ++b)
      gen.lengths.push_back(acc[b]);
    return gen;
  }

private:
  TinyLm lm_;
  LmConfig lm_cfg_;
  torch::Device device_;
};

void serve(Generator &gen, const std::vector<std::vector<std::vector<int64_t>>> &batches, const GenConfig &cfg) {
  for (const auto &prompts : batches) {
    auto out = gen.generate(prompts, cfg);
    for (size_t b = 0; b < prompts.size(); ++b) {
      const auto n = out.lengths[b];
      const auto mean_logp = n > 0 ? out.logprobs[b].sum().item<double>() / n : 0.0; // LOOKALIKE: tensor-sync-in-loop -- generate() returned host tensors
      std::cout << "request " << b << ": " << n << " tokens, mean log-prob " << mean_logp << "\n";
    }
  }
}
