// Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes
// gamma tokens one at a time, the large target model scores all of them in a single forward pass,
// and modified rejection sampling keeps a prefix of the proposals plus one token drawn from the
// residual distribution, so the output is distributed exactly as the target's. Both models keep a
// per-layer KV cache that is rolled back past rejected tokens; the draft length adapts to the
// recent acceptance rate. The draft is first aligned to the target by distillation.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

struct LmConfig {
  int64_t vocab = 32000, d_model = 512, n_heads = 8, n_layers = 6, max_len = 2048;
};

struct SpecConfig {
  int64_t max_new_tokens = 256, gamma = 4, min_gamma = 1, max_gamma = 8, window = 16;
  double temperature = 0.8;
  double raise_above = 0.8, lower_below = 0.4; // acceptance rates that move gamma
};

// Keys and values of one layer: [B, H, max_len, D], the first `len` positions valid.
struct KVCache {
  torch::Tensor k, v;
  int64_t len = 0;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(int64_t d_model, int64_t n_heads) : n_heads_(n_heads), head_dim_(d_model / n_heads) {
    qkv_ = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj_ = register_module("proj", torch::nn::Linear(d_model, d_model));
  }

  // x [B, T, C]. With a cache, x continues the cached prefix and its keys/values are appended.
  torch::Tensor forward(const torch::Tensor &x, KVCache *cache) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto qkv = qkv_(x).chunk(3, -1);
    // FACT: y = torch.randn(2, 5, 24); q = y.chunk(3, -1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2, 5, 4, 2), y)
    auto q = qkv[0].view({B, T, n_heads_, head_dim_}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- a chunk of the last dim is not contiguous, but splitting that dim alone is still a view
    auto k = qkv[1].view({B, T, n_heads_, head_dim_}).transpose(1, 2);
    auto v = qkv[2].view({B, T, n_heads_, head_dim_}).transpose(1, 2);
    int64_t start = 0;
    if (cache) {
      start = cache->len;
      // FACT: c = torch.zeros(1, 2, 8, 3); k = torch.randn(1, 4, 2, 3).transpose(1, 2); c.narrow(2, 2, 4).copy_(k); assert torch.equal(c[:, :, 2:6], k) and is_copy_of(c, k)
      cache->k.narrow(2, start, T).copy_(k); // LOOKALIKE: tensor-inplace-overlap -- the new keys are a tensor of their own, not a slice of the cache
      cache->v.narrow(2, start, T).copy_(v);
      cache->len = start + T;
      k = cache->k.narrow(2, 0, cache->len);
      v = cache->v.narrow(2, 0, cache->len);
    }
    const auto L = start + T;
    auto att = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    auto qpos = torch::arange(start, L, x.options().dtype(torch::kLong));
    auto kpos = torch::arange(L, qpos.options());
    att = att.masked_fill(kpos.unsqueeze(0) > qpos.unsqueeze(1), -std::numeric_limits<float>::infinity()); // LOOKALIKE: tensor-device-mismatch -- the positions are made with x's options, on x's device
    auto y = torch::softmax(att, -1).matmul(v); // [B, H, T, D]
    // FACT: y = torch.randn(2, 4, 5, 8); assert is_copy_of(y.transpose(1, 2).reshape(2, 5, 32), y)
    return proj_(y.transpose(1, 2).reshape({B, T, C})); // EXPECT: tensor-reshape-non-contiguous -- heads and head dims are not adjacent after the transpose: a full copy whenever T > 1 (verification, distillation)
  }

  int64_t n_heads_, head_dim_;
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t h) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    attn_ = register_module("attn", CausalSelfAttention(d, h));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc_ = register_module("fc", torch::nn::Linear(d, 4 * d));
    out_ = register_module("out", torch::nn::Linear(4 * d, d));
  }
  torch::Tensor forward(const torch::Tensor &x, KVCache *cache) {
    auto h = x + attn_->forward(ln1_(x), cache);
    return h + out_(torch::gelu(fc_(ln2_(h))));
  }
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  CausalSelfAttention attn_{nullptr};
  torch::nn::Linear fc_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Block);

struct TinyLMImpl : torch::nn::Module {
  explicit TinyLMImpl(const LmConfig &c) : cfg_(c) {
    tok_ = register_module("tok", torch::nn::Embedding(c.vocab, c.d_model));
    pos_ = register_module("pos", torch::nn::Embedding(c.max_len, c.d_model));
    for (int64_t i = 0; i < c.n_layers; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), Block(c.d_model, c.n_heads)));
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    head_ = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
  }

  std::vector<KVCache> new_cache(int64_t batch, torch::Device device) const {
    std::vector<KVCache> caches(blocks_.size());
    for (auto &c : caches) {
      c.k = torch::zeros({batch, cfg_.n_heads, cfg_.max_len, cfg_.d_model / cfg_.n_heads}, torch::TensorOptions().device(device));
      c.v = torch::zeros_like(c.k);
    }
    return caches;
  }

  // ids [B, T] -> logits [B, T, vocab]
  torch::Tensor forward(const torch::Tensor &ids, std::vector<KVCache> *caches = nullptr) {
    const int64_t start = caches ? caches->front().len : 0;
    auto pos = torch::arange(start, start + ids.size(1), ids.options());
    auto x = tok_(ids) + pos_(pos);
    for (size_t i = 0; i < blocks_.size(); ++i)
      x = blocks_[i]->forward(x, caches ? &(*caches)[i] : nullptr);
    return head_(ln_f_(x));
  }

  // Forget every position from `len` on (the slots are overwritten by the next forward).
  static void rollback(std::vector<KVCache> &caches, int64_t len) {
    for (auto &c : caches)
      c.len = len;
  }

  LmConfig cfg_;
  torch::nn::Embedding tok_{nullptr}, pos_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_f_{nullptr};
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TinyLM);

struct SpecStats {
  int64_t rounds = 0, proposed = 0, accepted = 0;
  std::vector<torch::Tensor> accept_probs; // min(1, p/q) per proposal, one host tensor per round
  double acceptance() const { return proposed ? static_cast<double>(accepted) / proposed : 0.0; }
};

class SpeculativeDecoder {
public:
  SpeculativeDecoder(TinyLM draft, TinyLM target, const SpecConfig &cfg)
      : draft_(std::move(draft)), target_(std::move(target)), cfg_(cfg), device_(torch::kCUDA), gamma_(cfg.gamma) {
    draft_->to(device_);
    target_->to(device_);
    recent_ = torch::full({cfg.window}, 0.5);
  }

  // Align the draft with the target: KL(target || draft) on the target's temperature-scaled
  // distributions over unlabelled text (token batches [B, T]).
  void distill(const std::vector<torch::Tensor> &batches, int64_t epochs, double lr) {
    torch::optim::AdamW opt(draft_->parameters(), torch::optim::AdamWOptions(lr).weight_decay(0.01));
    draft_->train();
    target_->eval();
    std::vector<torch::Tensor> kl_hist;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double kl_running = 0;
      int64_t steps = 0;
      for (const auto &batch : batches) {
        auto ids = batch.to(device_); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
        torch::Tensor p_t;
        {
          torch::NoGradGuard no_grad;
          auto t_logits = target_->forward(ids);
          t_logits.div_(cfg_.temperature); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded for backward
          p_t = torch::softmax(t_logits, -1);
        }
        auto log_q = torch::log_softmax(draft_->forward(ids) / cfg_.temperature, -1);
        // FACT: q = torch.log_softmax(torch.randn(2, 5, 7), -1); assert is_view_of(q.flatten(0, 1), q)
        auto kl = torch::nn::functional::kl_div(log_q.flatten(0, 1), p_t.flatten(0, 1), // LOOKALIKE: tensor-reshape-non-contiguous -- log_softmax's output is contiguous: flatten is a view
                                                torch::nn::functional::KLDivFuncOptions().reduction(torch::kBatchMean));
        opt.zero_grad();
        kl.backward();
        opt.step();
        kl_running += kl.item<double>(); // EXPECT: tensor-sync-in-loop -- the KL is on the GPU: every step waits for it only to add it up
        kl_hist.push_back(kl.detach()); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
        ++steps;
      }
      std::cout << "distill epoch " << epoch << " kl " << kl_running / std::max<int64_t>(steps, 1) << "\n";
    }
    if (!kl_hist.empty())
      std::cout << "kl " << kl_hist.front().item<double>() << " -> " << kl_hist.back().item<double>() << "\n";
  }

  // prompt [1, P] token ids; generation stops after max_new_tokens or at any of stop_tokens.
  torch::Tensor generate(const torch::Tensor &prompt, const torch::Tensor &stop_tokens, SpecStats &stats) {
    torch::NoGradGuard no_grad;
    draft_->eval();
    target_->eval();
    TORCH_CHECK(prompt.size(0) == 1, "speculative decoding runs one sequence at a time");
    const int64_t P = prompt.size(1);
    const int64_t total = std::min(P + cfg_.max_new_tokens, target_->cfg_.max_len - 1);
    auto out = torch::zeros({1, total + 1}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    out.narrow(1, 0, P).copy_(prompt); // LOOKALIKE: tensor-copy-narrowing -- the prompt holds token ids, int64 like out

    // Prefill: both caches hold everything but the last prompt token.
    auto dcache = draft_->new_cache(1, device_);
    auto tcache = target_->new_cache(1, device_);
    auto ids = prompt.to(device_);
    if (P > 1) {
      draft_->forward(ids.narrow(1, 0, P - 1), &dcache);
      target_->forward(ids.narrow(1, 0, P - 1), &tcache);
    }
    auto last = ids.narrow(1, P - 1, 1); // newest token, in neither cache yet
    auto pending = last;                 // tokens the draft cache has not seen
    int64_t cur = P;

    while (cur < total) {
      const int64_t gamma = std::min(gamma_, total - cur);

      // 1. The draft proposes gamma tokens.
      std::vector<torch::Tensor> q_rows, proposals;
      auto inp = pending;
      for (int64_t j = 0; j < gamma; ++j) {
        auto q = probs_from_logits(draft_->forward(inp, &dcache).select(1, -1)); // [1, V]
        auto tok = torch::multinomial(q, 1);
        q_rows.push_back(q); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph at all
        proposals.push_back(tok);
        inp = tok;
      }
      auto cand = torch::cat(proposals, 1); // [1, gamma]
      auto q_all = torch::cat(q_rows, 0);   // [gamma, V]

      // 2. The target scores the newest token and every proposal in one pass.
      auto p_all = probs_from_logits(target_->forward(torch::cat({last, cand}, 1), &tcache)).squeeze(0); // [gamma + 1, V]

      // 3. Accept proposal j with probability min(1, p(x_j) / q(x_j)), up to the first rejection.
      auto idx = cand.view({gamma, 1});
      auto p_tok = p_all.narrow(0, 0, gamma).gather(1, idx).squeeze(1);
      auto q_tok = q_all.gather(1, idx).squeeze(1);
      auto ratio = (p_tok / q_tok).clamp_max(1.0);
      auto u = torch::rand({gamma});
      auto accepted = u <= ratio; // EXPECT: tensor-device-mismatch -- the uniforms are drawn on the host, the ratios live on the GPU
      // FACT: c = torch.multinomial(torch.rand(1, 10), 4); a = torch.zeros_like(c[0]); a.copy_(torch.tensor([0.3, 1.0, 0.7, 0.95])); assert a.dtype == torch.int64 and a.tolist() == [0, 1, 0, 0]
      auto alpha = torch::zeros_like(cand.squeeze(0));
      alpha.copy_(ratio); // EXPECT: tensor-copy-narrowing -- alpha copies the int64 token tensor's dtype: the probabilities are truncated to 0 or 1
      stats.accept_probs.push_back(alpha.cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- a new tensor every round, kept as data
      auto rejected = accepted.logical_not();
      const int64_t n_acc = rejected.any().item<bool>() ? rejected.to(torch::kLong).argmax().item<int64_t>() : gamma; // LOOKALIKE: tensor-sync-in-loop -- the accepted length decides what is kept: it has to reach the host

      // 4. One more token: from the residual max(0, p - q) after a rejection, else from p.
      torch::Tensor next;
      if (n_acc < gamma) {
        // FACT: p = torch.rand(5, 10); q = torch.rand(4, 10); r = p[1] - q[1]; r.clamp_min_(0); assert is_copy_of(r, p) and is_copy_of(r, q)
        auto residual = p_all[n_acc] - q_all[n_acc];
        residual.clamp_min_(0); // LOOKALIKE: tensor-alias-then-mutate -- the difference is a new tensor: p and q are untouched
        next = torch::multinomial(residual / residual.sum().clamp_min(1e-12), 1).view({1, 1});
      } else {
        next = torch::multinomial(p_all[gamma], 1).view({1, 1});
      }

      // 5. Commit, and roll the caches back to the accepted prefix.
      if (n_acc > 0)
        out.narrow(1, cur, n_acc).copy_(cand.narrow(1, 0, n_acc));
      out.narrow(1, cur + n_acc, 1).copy_(next);
      cur += n_acc + 1;
      TinyLMImpl::rollback(tcache, cur - 1);
      if (n_acc == gamma) { // the draft never ran on its own last proposal
        TinyLMImpl::rollback(dcache, cur - 2);
        pending = torch::cat({cand.narrow(1, gamma - 1, 1), next}, 1);
      } else {
        TinyLMImpl::rollback(dcache, cur - 1);
        pending = next;
      }
      last = next;
      stats.rounds++;
      stats.proposed += gamma;
      stats.accepted += n_acc;

      // 6. Adapt the draft length to the acceptance rate of the last `window` rounds.
      // FACT: r = torch.rand(8); assert raises(lambda: r.narrow(0, 0, 7).copy_(r.narrow(0, 1, 7)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
      recent_.narrow(0, 0, cfg_.window - 1).copy_(recent_.narrow(0, 1, cfg_.window - 1)); // EXPECT: tensor-inplace-overlap -- shifting the window inside one buffer: rows 0..W-2 and 1..W-1 overlap
      recent_[cfg_.window - 1] = static_cast<double>(n_acc) / static_cast<double>(gamma);
      const double rate = recent_.mean().item<double>();
      if (rate > cfg_.raise_above)
        gamma_ = std::min(gamma_ + 1, cfg_.max_gamma);
      else if (rate < cfg_.lower_below)
        gamma_ = std::max(gamma_ - 1, cfg_.min_gamma);

      auto hit = (next.view({-1, 1}) == stop_tokens.to(device_)).any(); // EXPECT: tensor-clone-in-loop -- the same stop list is uploaded to the GPU every round
      if (hit.item<bool>())
        break;
    }
    return out.narrow(1, 0, cur);
  }

private:
  torch::Tensor probs_from_logits(const torch::Tensor &logits) const {
    // FACT: l = torch.randn(3, 5); s = l.clone(); s.div_(0.8); assert torch.equal(s, l / 0.8)
    auto scaled = logits.clone(); // EXPECT: tensor-unnecessary-clone -- divided in place right away: logits / temperature is one pass
    scaled.div_(cfg_.temperature);
    return torch::softmax(scaled, -1);
  }

  TinyLM draft_, target_;
  SpecConfig cfg_;
  torch::Device device_;
  int64_t gamma_;
  torch::Tensor recent_; // acceptance rate of the last rounds, on the host
};

void run_benchmark(SpeculativeDecoder &dec, const std::vector<torch::Tensor> &prompts, const torch::Tensor &stop_tokens) {
  SpecStats stats;
  int64_t generated = 0;
  for (const auto &p : prompts) {
    auto out = dec.generate(p, stop_tokens, stats);
    generated += out.size(1) - p.size(1);
  }
  std::cout << "generated " << generated << " tokens in " << stats.rounds << " target calls, acceptance "
            << stats.acceptance() << "\n";
  if (!stats.accept_probs.empty()) {
    auto all = torch::cat(stats.accept_probs).to(torch::kFloat);
    std::cout << "mean min(1, p/q) " << all.mean().item<double>() << "\n";
  }
}
